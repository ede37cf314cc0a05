#!/usr/bin/env python3
"""Checks that every #include "ddp/..." in src/ and include/ goes down the
layering docs/ARCHITECTURE.md draws: an area may include its own headers and
those of the areas below it in LAYERS, nothing else. Prints each include that
goes against it (file:line, the two areas) and exits 1; exits 0 when none
does. Usage: scripts/check_layers.py [repo root]."""
import os
import re
import sys

# Each area and the areas it may include (besides its own). The same table
# stands in docs/ARCHITECTURE.md; CMake's links follow it (an area's library
# links the libraries of what it includes).
LAYERS = {
    "core": [],
    "runtime": ["core"],
    "data": ["core"],
    "checkpoint": ["core"],
    "observe": ["core"],
    "plot": ["core"],
    "comm": ["core", "runtime"],
    "nn": ["core"],
    "nn/cpu": ["core", "nn"],
    "nn/cuda": ["core", "runtime", "nn"],
    "reducer": ["core", "comm"],
    "optim": ["core", "runtime", "nn"],
    "deterministic": ["core", "runtime", "comm", "nn", "nn/cpu", "nn/cuda"],
    "train": ["core", "runtime", "data", "checkpoint", "observe", "comm", "nn", "nn/cpu", "nn/cuda", "reducer",
              "optim", "deterministic"],
    "cli": ["core", "runtime", "nn", "train"],
}
# src/main.cpp and src/plot_main.cpp: the programs, above every area.
PROGRAMS = {"main.cpp", "plot_main.cpp"}
INCLUDE = re.compile(r'\s*#\s*include\s+"ddp/([^"]+)"')


def area_of(parts):
    """The area of a path below src/ or include/ddp/, as LAYERS names it."""
    if len(parts) > 2 and parts[0] == "nn" and parts[1] in ("cpu", "cuda"):
        return "nn/" + parts[1]
    return parts[0]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad, files = [], 0
    for top, strip in (("src", 1), (os.path.join("include", "ddp"), 2)):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".cpp", ".hpp", ".cu", ".cuh", ".h")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                parts = rel.split(os.sep)[strip:]
                if len(parts) == 1:
                    if name in PROGRAMS:
                        continue
                    bad.append(f"{rel}: not in an area's folder")
                    continue
                area = area_of(parts)
                if area not in LAYERS:
                    bad.append(f"{rel}: area '{area}' is not in the layering (scripts/check_layers.py)")
                    continue
                files += 1
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        to = area_of(m.group(1).split("/"))
                        if to != area and to not in LAYERS[area]:
                            bad.append(f"{rel}:{number}: {area} includes {to} (ddp/{m.group(1)}), "
                                       f"which is not below it")
    for line in bad:
        print("check_layers: " + line)
    if bad:
        return 1
    print(f"check_layers: {files} files, every include goes down the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
