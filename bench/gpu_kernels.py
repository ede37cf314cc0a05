#!/usr/bin/env python3
"""Where a GPU rank's time goes, from `ddp_train --trace FILE` on a GPU: the
device's spans (GPU tracks: kernels, copies, memsets) summed by name, the
largest first, with each one's share of the device's busy time and its
milliseconds per step of the trace's window; then the same by kind of work
(cuDNN and cuBLAS, our BatchNorm, 16-bit and layout conversions, NCCL, ...);
and the device's time a step: from its first recorded activity to its last,
over the steps, with how much of it the device was busy at all (any stream):
what is left is the device waiting for launches or for the host.

The host's spans of the steps are not the step's time on a GPU: the host
issues up to a few steps ahead of the device, so a window's host spans can
add up to half its device time (ResNet-18 fp32, H200, 2026-11-28: 19.0 ms a
step by the host's spans, 38 ms of kernels a step, 38.7 ms a step by the
benchmark's epochs). They are printed beside it. The recorded activities are
the window's steps' alone where the device had caught up when the window
began (each step's kernel count says so).

Usage: bench/gpu_kernels.py TRACE.rankR.json [--top N]
"""
import argparse
import collections
import json
import re
import sys

# The kind of work a span is, by its name. Ours are in namespace ddp (the
# tracer demangles names); anything else but NCCL's is cuDNN's or cuBLAS's,
# whose names say "nhwckrsc", "bias" or "norm" too. Ours by the first
# pattern that matches the name without its template arguments (they name
# types, such as a reader of 16-bit values, not the work).
OURS = [
    ("BatchNorm (ours)", r"\bbn_"),
    ("16-bit and layout conversions", r"half_kernel|_16_kernel|krsc_kernel|planes_from|round"),
    ("sums for --deterministic", r"::deterministic::|quantize|exact|shard|differ_kernel"),
    ("optimizer", r"::optim::"),
    ("loss", r"entropy|softmax|count_correct|loss"),
    ("elementwise and sums (ours)", r"."),
]


def kind_of(span_kind, name):
    if span_kind != "kernel":
        return span_kind  # memcpy, memset
    if re.search(r"nccl", name, re.IGNORECASE):
        return "NCCL"
    if not name.startswith("ddp::"):
        return "cuDNN and cuBLAS"
    base = re.sub(r"<.*>", "", name)
    for kind, pattern in OURS:
        if re.search(pattern, base):
            return kind
    return "elementwise and sums (ours)"


def union_us(intervals):
    """The time covered by (start, end) intervals, overlaps counted once."""
    covered, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        covered += e - max(s, end)
        end = e
    return covered


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args()
    with open(a.trace) as f:
        events = json.load(f)["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    total = collections.Counter()
    calls = collections.Counter()
    spans = []
    for e in events:
        cat = e.get("cat", "")
        if not cat.startswith("gpu "):
            continue
        key = (cat[4:], e["name"])
        total[key] += e["dur"]
        calls[key] += 1
        spans.append((e["ts"], e["ts"] + e["dur"]))
    busy = sum(total.values())
    if not busy:
        sys.exit(f"gpu_kernels: {a.trace} has no GPU spans (was it a GPU run with --trace?)")
    per = max(len(steps), 1)
    launches = sum(n for (kind, _), n in calls.items() if kind == "kernel")
    print(f"{a.trace}: {len(steps)} steps, GPU busy {busy / 1000 / per:.2f} ms a step (streams summed), "
          f"{launches / per:.0f} kernels a step")
    device = max(t for _, t in spans) - min(s for s, _ in spans)
    covered = union_us(spans)
    print(f"the device's time {device / 1000 / per:.2f} ms a step (its first activity to its last), busy "
          f"(any stream) {100 * covered / device:.1f}% of it, idle {(device - covered) / 1000 / per:.2f} ms a step")
    if steps:
        host = sum(e["dur"] for e in steps)
        print(f"the host's spans of the steps {host / 1000 / per:.2f} ms a step (launches and waits: the host runs "
              f"ahead of the device)")
    print(f"{'share':>6} {'ms/step':>8} {'calls/step':>10}  kind    name")
    for (kind, name), us in total.most_common(a.top):
        print(f"{100 * us / busy:5.1f}% {us / 1000 / per:8.3f} {calls[(kind, name)] / per:10.1f}  {kind:7} {name}")
    by_kind = collections.Counter()
    kind_calls = collections.Counter()
    for (kind, name), us in total.items():
        k = kind_of(kind, name)
        by_kind[k] += us
        kind_calls[k] += calls[(kind, name)]
    print(f"\n{'share':>6} {'ms/step':>8} {'calls/step':>10}  kind of work")
    for k, us in by_kind.most_common():
        print(f"{100 * us / busy:5.1f}% {us / 1000 / per:8.3f} {kind_calls[k] / per:10.1f}  {k}")


if __name__ == "__main__":
    main()
