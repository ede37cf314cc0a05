#!/usr/bin/env bash
# What --deterministic costs: ddp_train's samples/s and test accuracy without
# and with it, at each world size, the runs alternating so that machine noise
# hits both alike; and the bytes each rank all-reduces per step. Prints
# medians over repetitions and the ratio of the medians (deterministic / plain).
#
# Usage: bench/deterministic_cost.sh [--model lenet|resnet18] [reps (5)] [world sizes ("1 2 4")]
#   lenet:    the d2l recipe on the subset, batch 256, lr 0.2, 10 epochs a run
#   resnet18: the subset's first 256 images, batch 128, lr 0.05, 1 epoch a run,
#             --sync-bn in both modes (--deterministic needs it with BatchNorm)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=lenet
if [[ "${1:-}" == "--model" ]]; then
  model=$2
  shift 2
fi
case $model in
  lenet) recipe="--batch-size 256 --lr 0.2 --epochs 10" ;;
  resnet18) recipe="--batch-size 128 --lr 0.05 --train-limit 256 --epochs 1 --sync-bn" ;;
  *) echo "deterministic_cost.sh: --model lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
reps=${1:-5}
worlds=${2:-"1 2 4"}
data=${DDP_DATA_DIR:-$root/../shared/data/fashion-mnist-subset}
bin=${DDP_TRAIN:-$root/build/bin/ddp_train}
"$root/scripts/install-deps.sh"
[[ -x $bin ]] || "$root/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args="--model $model --data-dir $data $recipe --quiet"

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
median() { /usr/bin/python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }
declare -A flags=([plain]="" [deterministic]="--deterministic")
echo "ddp_train $model: $args, $reps reps, $(nproc) cores, $(date -u +%F)"
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
