#!/usr/bin/env bash
# mpirun with the defaults ddp_train wants on one node:
#  - more ranks than cores is allowed (--oversubscribe);
#  - no core binding (--bind-to none): each rank runs GEMM threads and a
#    loader thread, which a one-core binding would starve;
#  - as root (containers, these test machines) Open MPI's refusal is lifted.
# Usage: launch/mpirun.sh -np 4 build/bin/ddp_train [ddp_train flags]
set -euo pipefail
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun --oversubscribe --bind-to none "$@"
