#!/usr/bin/env bash
# mpirun with the defaults ddp_train wants on one node:
#  - one rank per GPU when there are GPUs and no -np/-n is given (each rank
#    takes the GPU of its local rank); without GPUs mpirun's own default;
#  - more ranks than cores is allowed (--oversubscribe);
#  - no core binding (--bind-to none): each rank runs GEMM threads, a loader
#    thread and a communication thread, which a one-core binding would starve;
#  - the NCCL and Open MPI variables users set most are passed on to every
#    rank (-x), also to other nodes;
#  - as root (containers, CI machines) Open MPI's refusal is lifted.
# Usage: launch/mpirun.sh [-np N] [mpirun options] build/bin/ddp_train [ddp_train flags]
set -euo pipefail

args=()
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
has_np=0
for a in "$@"; do
  case "$a" in -np|-n|--np|-c|--n) has_np=1 ;; esac
done
if ((!has_np)) && command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if ((gpus > 0)); then args+=(-np "$gpus"); fi
fi
for v in NCCL_DEBUG NCCL_DEBUG_SUBSYS NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_P2P_DISABLE \
         NCCL_IB_HCA NCCL_NET_GDR_LEVEL OMP_NUM_THREADS OPENBLAS_NUM_THREADS; do
  if [[ -n "${!v:-}" ]]; then args+=(-x "$v"); fi
done
exec mpirun --oversubscribe --bind-to none "${args[@]}" "$@"
