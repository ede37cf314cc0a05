#!/usr/bin/env python3
"""One line per flag set of `scripts/gpu-check.sh profile`'s profile.txt: the
run's median step and samples/s (its summary record; one short epoch, so
samples/s includes the start-up's first steps), each set's speed by median
step against the plain `--precision fp32` set (for `--deterministic`, the
fraction of the plain GPU run it keeps), and from its kernel table
(bench/gpu_kernels.py) the kernels a step and how much of the traced steps'
wall time the device was busy.

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
            m = re.search(r"the device busy \(any stream\) ([\d.]+)% of it", line)
            if m:
                table["busy"] = m.group(1) + "%"
    if flags is not None:
        out.append((flags, summary, table))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(sys.argv[1]) as f:
        runs = sections(f.read().splitlines())
    plain = next((s for flags, s, _ in runs if flags == "--precision fp32" and s), None)
    print("flag set | step ms (median) | samples/s | speed against --precision fp32 (median steps) | "
          "kernels a step | device busy")
    for flags, s, table in runs:
        if not s or "step_ms" not in s:
            print(f"{flags} | failed | | | |")
            continue
        ratio = f"{plain['step_ms'] / s['step_ms']:.2f}" if plain and "step_ms" in plain else ""
        print(f"{flags} | {s['step_ms']:.1f} | {s['samples_per_sec']:,.0f} | {ratio} | "
              f"{table.get('kernels', '')} | {table.get('busy', '')}")


if __name__ == "__main__":
    main()
