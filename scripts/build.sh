#!/usr/bin/env bash
# Installs what is missing (scripts/install-deps.sh), configures and builds
# into build/ (or $DDP_BUILD_DIR). Extra arguments go to cmake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
"$root/scripts/install-deps.sh"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
grep -E "^-- ddp:" "$build/configure.log" || true
cmake --build "$build" -j "$(nproc)"
