#!/usr/bin/env python3
"""One line per flag set of `scripts/gpu-check.sh profile`'s profile.txt: from
its kernel table (bench/gpu_kernels.py) the device's time a step over the
traced steps, each set's speed by that time against the plain
`--precision fp32` set (for `--deterministic`, the fraction of the plain GPU
run it keeps), the kernels a step and how much of the device's time it was
busy; from the run's summary record the host's median step (launches and
waits: on a GPU the host runs ahead, so it is not the step's time) and
samples/s (one short epoch: the start-up's first steps included).

Usage: bench/profile_summary.py OUT/profile.txt
"""
import json
import re
import sys

HEADER = "=== ResNet-18, batch 256, "


def sections(lines):
    """(flags, summary record or None, {"kernels", "busy"} from the kernel
    table) per section, in order."""
    out, flags, summary, table = [], None, None, {}
    for line in lines:
        if line.startswith(HEADER):
            if flags is not None:
                out.append((flags, summary, table))
            flags, summary, table = line[len(HEADER):].strip(), None, {}
        elif flags is not None and line.startswith('{"event":"summary"'):
            summary = json.loads(line)
        elif flags is not None:
            m = re.search(r", (\d+) kernels a step$", line)
            if m:
                table["kernels"] = m.group(1)
            m = re.search(r"the device's time ([\d.]+) ms a step .*, busy \(any stream\) ([\d.]+)% of it", line)
            if m:
                table["device_ms"] = float(m.group(1))
                table["busy"] = m.group(2) + "%"
    if flags is not None:
        out.append((flags, summary, table))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(sys.argv[1]) as f:
        runs = sections(f.read().splitlines())
    plain = next((t["device_ms"] for flags, _, t in runs if flags == "--precision fp32" and "device_ms" in t), None)
    print("flag set | device ms a step | speed against --precision fp32 (device time) | kernels a step | "
          "device busy | host's median step ms | samples/s")
    for flags, s, table in runs:
        if not s or "step_ms" not in s:
            print(f"{flags} | failed | | | | |")
            continue
        device = table.get("device_ms")
        ratio = f"{plain / device:.2f}" if plain and device else ""
        print(f"{flags} | {device if device else ''} | {ratio} | {table.get('kernels', '')} | "
              f"{table.get('busy', '')} | {s['step_ms']:.1f} | {s['samples_per_sec']:,.0f}")


if __name__ == "__main__":
    main()
