#!/usr/bin/env python3
"""Every translation unit that reaches core/simd.hpp compiles for each vector ISA.

The build targets its own machine (-march=native), so the AVX-512 branches of
the CPU kernels compile only on AVX-512 machines, the AVX2 ones only on AVX2
machines, and the scalar ones on neither. This check compiles (syntax and
templates, no code) each such unit as the build does, once for AVX-512, once
for AVX2 and once for plain x86-64, wherever it runs.

Usage: check_isas.py BUILD_DIR   (a configured build with compile_commands.json)
"""
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# The ISAs and what they select in core/simd.hpp.
TARGETS = {"skylake-avx512": "AVX-512", "haswell": "AVX2+FMA", "x86-64": "no vector path"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def reaches_simd(path, include_dirs, seen):
    """Whether path includes core/simd.hpp, directly or through project headers."""
    if path in seen:
        return seen[path]
    seen[path] = False
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return False
    for name in INCLUDE.findall(text):
        if name.endswith("core/simd.hpp"):
            seen[path] = True
            return True
        for d in [os.path.dirname(path)] + include_dirs:
            candidate = os.path.join(d, name)
            if os.path.isfile(candidate):
                if reaches_simd(os.path.normpath(candidate), include_dirs, seen):
                    seen[path] = True
                    return True
                break
    return False


def syntax_only(entry, march):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("-march=") or a.startswith("-mno-avx512"):
            continue
        out.append(a)
    out[1:1] = ["-march=" + march, "-fsyntax-only"]
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = sys.argv[1]
    db = os.path.join(build, "compile_commands.json")
    if not os.path.isfile(db):
        sys.exit(f"check_isas: {db} not found (configure the build first)")
    entries = [e for e in json.load(open(db)) if e["file"].endswith(".cpp")]
    seen = {}
    units = []
    for e in entries:
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        dirs = [a[2:] for a in args if a.startswith("-I")]
        dirs += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-isystem"]
        if reaches_simd(os.path.normpath(e["file"]), dirs, seen):
            units.append(e)
    if not units:
        sys.exit("check_isas: no translation unit reaches core/simd.hpp: the scan is broken")

    jobs = [(e, m) for m in TARGETS for e in units]

    def run(job):
        e, march = job
        r = subprocess.run(syntax_only(e, march), cwd=e["directory"], capture_output=True, text=True)
        return e["file"], march, r.returncode, r.stderr

    failed = 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for path, march, rc, err in pool.map(run, jobs):
            if rc != 0:
                failed += 1
                print(f"check_isas: {os.path.relpath(path)} does not compile for -march={march} "
                      f"({TARGETS[march]}):\n{err}", file=sys.stderr)
    print(f"check_isas: {len(units)} units x {len(TARGETS)} ISAs ({', '.join(TARGETS)}): "
          f"{len(jobs) - failed} compiled, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
