#!/usr/bin/env python3
"""Compares the tensors of two safetensors files (ddp_train --output-model).

Usage: compare_models.py EXPECTED ACTUAL [--rtol R]
Without --rtol every tensor must be bitwise equal (same names, dtypes, shapes,
bytes). With --rtol, |a - e| <= R * max(|e|, tiny) element by element.
Prints one line per differing tensor and a summary; exit 0 when equal.
Needs numpy only (Debian's python3-numpy).
"""
import argparse
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
          "I64": np.int64, "I32": np.int32, "U8": np.uint8}


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), data[a:b])
    return out


def main(argv):
    parser = argparse.ArgumentParser(description="Compares the tensors of two safetensors files.")
    parser.add_argument("expected")
    parser.add_argument("actual")
    parser.add_argument("--rtol", type=float, default=None,
                        help="allowed relative difference (default: bitwise equality)")
    opts = parser.parse_args(argv[1:])
    rtol = opts.rtol
    args = [opts.expected, opts.actual]
    exp, act = read(args[0]), read(args[1])
    if sorted(exp) != sorted(act):
        print(f"tensor names differ: only in {args[0]}: {sorted(set(exp) - set(act))}, "
              f"only in {args[1]}: {sorted(set(act) - set(exp))}")
        return 1
    bad = 0
    worst = 0.0
    for name in sorted(exp):
        (dt_e, sh_e, raw_e), (dt_a, sh_a, raw_a) = exp[name], act[name]
        if (dt_e, sh_e) != (dt_a, sh_a):
            print(f"{name}: {dt_e}{list(sh_e)} vs {dt_a}{list(sh_a)}")
            bad += 1
            continue
        if raw_e == raw_a:
            continue
        e = np.frombuffer(raw_e, DTYPES[dt_e]).astype(np.float64)
        a = np.frombuffer(raw_a, DTYPES[dt_a]).astype(np.float64)
        rel = np.abs(a - e) / np.maximum(np.abs(e), 1e-30)
        i = int(np.argmax(rel))
        worst = max(worst, float(rel[i]))
        differing = int(np.count_nonzero(raw_view(raw_e, dt_e) != raw_view(raw_a, dt_a)))
        ok = rtol is not None and float(rel[i]) <= rtol
        print(f"{name}: {differing} of {e.size} elements differ bitwise; worst relative "
              f"difference {rel[i]:.3g} at {i} ({e[i]!r} vs {a[i]!r}){' (within rtol)' if ok else ''}")
        if not ok:
            bad += 1
    n = len(exp)
    if bad:
        print(f"{bad} of {n} tensors differ" + (f" beyond rtol {rtol}" if rtol is not None else " (bitwise)"))
        return 1
    print(f"{n} tensors equal" + ("" if worst == 0 else f" within rtol {rtol} (worst {worst:.3g})")
          + (" bitwise" if worst == 0 else ""))
    return 0


def raw_view(raw, dt):
    return np.frombuffer(raw, DTYPES[dt])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
