#!/usr/bin/env bash
# Installs what is missing (scripts/install-deps.sh), configures and builds
# into build/ (or $DDP_BUILD_DIR). Extra arguments go to cmake's configure.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
"$root/scripts/install-deps.sh"
mkdir -p "$build"
# Where the CUDA toolkit is installed its backend must build (a GPU is not
# needed for that): a toolkit that is there but unusable is an error here,
# not a silent CPU-only build.
cuda=()
if [[ -x /usr/local/cuda/bin/nvcc || -n ${CUDACXX:-} ]] || command -v nvcc >/dev/null; then
  cuda=(-DDDP_REQUIRE_CUDA=ON)
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" "$@" >"$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
grep -E "^-- ddp:" "$build/configure.log" || true
cmake --build "$build" -j "$(nproc)"
