#!/usr/bin/env python3
"""Where a GPU rank's time goes, from `ddp_train --trace FILE` on a GPU: the
device's spans (GPU tracks: kernels, copies, memsets) summed by name, the
largest first, with each one's share of the device's busy time and its
milliseconds per step of the trace's window.

Usage: bench/gpu_kernels.py TRACE.rankR.json [--top N]
"""
import argparse
import collections
import json
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    steps = sum(1 for e in events if e.get("cat") == "step")
    total = collections.Counter()
    calls = collections.Counter()
    for e in events:
        cat = e.get("cat", "")
        if not cat.startswith("gpu "):
            continue
        key = (cat[4:], e["name"])
        total[key] += e["dur"]
        calls[key] += 1
    busy = sum(total.values())
    if not busy:
        sys.exit(f"gpu_kernels: {a.trace} has no GPU spans (was it a GPU run with --trace?)")
    per = max(steps, 1)
    print(f"{a.trace}: {steps} steps, GPU busy {busy / 1000 / per:.2f} ms a step (streams summed)")
    print(f"{'share':>6} {'ms/step':>8} {'calls/step':>10}  kind    name")
    for (kind, name), us in total.most_common(a.top):
        print(f"{100 * us / busy:5.1f}% {us / 1000 / per:8.3f} {calls[(kind, name)] / per:10.1f}  {kind:7} {name}")


if __name__ == "__main__":
    main()
