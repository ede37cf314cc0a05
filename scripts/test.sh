#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test (unit, MPI at -np 2
# and -np 4, end-to-end runs of ddp_train) through CTest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
"$root/scripts/build.sh"
cd "$build"
# Root may run mpirun here, and tests run more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ctest --output-on-failure --timeout 900 "$@"
