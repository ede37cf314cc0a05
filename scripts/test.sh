#!/usr/bin/env bash
# Sets up a fresh machine, builds, and runs every test (unit, MPI at -np 2
# and -np 4, end-to-end runs of ddp_train) through CTest. Extra arguments go
# to ctest: scripts/test.sh -L fast runs the unit and MPI tests alone (a few
# minutes; the tier to run before each commit).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_BUILD_DIR:-$root/build}
t0=$SECONDS
"$root/scripts/build.sh"
echo "test.sh: set-up and build took $((SECONDS - t0)) s"
cd "$build"
# Root may run mpirun here, and tests run more ranks than cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
t0=$SECONDS
status=0
ctest --output-on-failure --timeout 900 "$@" || status=$?
echo "test.sh: ctest took $((SECONDS - t0)) s"
exit $status
