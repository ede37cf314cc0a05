#!/usr/bin/env python3
"""One line per flag set of `scripts/gpu-check.sh profile`'s profile.txt: the
run's median step and samples/s (its summary record; one short epoch, so
samples/s includes the start-up's first steps), and each set's speed by
median step against the plain `--precision fp32` set (for `--deterministic`,
the fraction of the plain GPU run it keeps).

Usage: bench/profile_summary.py OUT/profile.txt
"""
import json
import sys

HEADER = "=== ResNet-18, batch 256, "


def sections(lines):
    """(flags, summary record or None) per section, in order."""
    out, flags, summary = [], None, None
    for line in lines:
        if line.startswith(HEADER):
            if flags is not None:
                out.append((flags, summary))
            flags, summary = line[len(HEADER):].strip(), None
        elif flags is not None and line.startswith('{"event":"summary"'):
            summary = json.loads(line)
    if flags is not None:
        out.append((flags, summary))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    with open(sys.argv[1]) as f:
        runs = sections(f.read().splitlines())
    plain = next((s for flags, s in runs if flags == "--precision fp32" and s), None)
    print("flag set | step ms (median) | samples/s | speed against --precision fp32 (median steps)")
    for flags, s in runs:
        if not s or "step_ms" not in s:
            print(f"{flags} | failed | | ")
            continue
        ratio = f"{plain['step_ms'] / s['step_ms']:.2f}" if plain and "step_ms" in plain else ""
        print(f"{flags} | {s['step_ms']:.1f} | {s['samples_per_sec']:,.0f} | {ratio}")


if __name__ == "__main__":
    main()
