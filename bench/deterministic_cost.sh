#!/usr/bin/env bash
# What --deterministic costs: ddp_train's samples/s and test accuracy without
# and with it, at each world size, the runs alternating so that machine noise
# hits both alike; and the bytes each rank all-reduces per step. Prints
# medians over repetitions and the ratio of the medians (deterministic / plain).
#
# Usage: bench/deterministic_cost.sh [--model lenet|resnet18] [--shards K] [--images N] [reps (5)]
#          [world sizes ("1 2 4")]
#   --shards K: --deterministic-shards K (default: ddp_train's, 16 halved until it divides the batch)
#   lenet:    the d2l recipe on the subset, batch 256, lr 0.2, 10 epochs a run
#   resnet18: the subset's first 256 images (--images N: N), batch 128, lr 0.05, 1 epoch a
#             run, --sync-bn in both modes (--deterministic needs it with BatchNorm). The
#             rate is the epoch's, so with 2 steps it holds the first step's set-up
#             (buffers touched for the first time, more of them with --deterministic's
#             lanes); --images 1024 measures 8 steps.
set -euo pipefail
source "$(dirname "$0")/common.sh"
model=lenet
shards=""
images=256
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --model) model=$2 ;;
    --shards) shards="--deterministic-shards $2" ;;
    --images) images=$2 ;;
    *) echo "deterministic_cost.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift 2
done
case $model in
  lenet) recipe="--batch-size 256 --lr 0.2 --epochs 10" ;;
  resnet18) recipe="--batch-size 128 --lr 0.05 --train-limit $images --epochs 1 --sync-bn" ;;
  *) echo "deterministic_cost.sh: --model lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
reps=${1:-5}
worlds=${2:-"1 2 4"}
bench_setup
args="--model $model --data-dir $data $recipe --quiet"

declare -A flags=([plain]="" [deterministic]="--deterministic $shards")
echo "ddp_train $model: $args${shards:+ ($shards)}, $reps reps, $(nproc) cores, $(date -u +%F)"
printf "%3s  %-14s %10s %8s %9s %16s\n" np mode "samples/s" ratio test_acc "bytes/step/rank"
for np in $worlds; do
  declare -A rates=() accs=() bytes=()
  for ((i = 0; i < reps; i++)); do
    for m in plain deterministic; do
      s=$(mpirun -np "$np" --oversubscribe --bind-to none "$bin" $args ${flags[$m]} | tail -1)
      rates[$m]+=" $(field samples_per_sec <<<"$s")"
      accs[$m]+=" $(field test_acc <<<"$s")"
      bytes[$m]=$(field allreduce_bytes_per_step <<<"$s")
    done
  done
  base=$(median ${rates[plain]})
  for m in plain deterministic; do
    r=$(median ${rates[$m]})
    printf "%3s  %-14s %10.1f %8.3f %9.4f %16.0f\n" "$np" "$m" "$r" "$(/usr/bin/python3 -c "print($r/$base)")" \
      "$(median ${accs[$m]})" "${bytes[$m]}"
  done
done
