#!/usr/bin/env bash
# What seeing a run costs: ddp_train's samples/s plain, with --trace recording
# every step (the window covering the whole run: its worst case), with
# --tensorboard (scalars every step) and with --debug-collectives (a check
# before every collective), alternating the runs so machine noise
# hits each alike. Prints the median samples/s over repetitions and the ratio
# to plain; ratios near 1 are within this machine's noise (a few percent).
#
# Usage: bench/observe_cost.sh [--model lenet|resnet18] [reps (5)] [np (2)]
#   lenet:    the subset, batch 256, lr 0.2, 4 epochs a run
#   resnet18: its first 512 images, batch 256, lr 0.1, 2 epochs a run
set -euo pipefail
source "$(dirname "$0")/common.sh"
model=lenet
if [[ "${1:-}" == "--model" ]]; then
  model=$2
  shift 2
fi
case $model in
  lenet) recipe="--batch-size 256 --lr 0.2 --epochs 4" ;;
  resnet18) recipe="--batch-size 256 --lr 0.1 --train-limit 512 --epochs 2" ;;
  *) echo "observe_cost.sh: --model lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
reps=${1:-5}
np=${2:-2}
bench_setup
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args="--model $model --data-dir $data $recipe --quiet"

declare -A flags=([plain]="" [trace]="--trace $tmp/t.json --trace-steps 1:1000000" [tensorboard]="--tensorboard $tmp/tb"
                  [debug-collectives]="--debug-collectives")
modes=(plain trace tensorboard debug-collectives)
declare -A rates
for ((i = 0; i < reps; i++)); do
  for m in "${modes[@]}"; do
    rm -rf "$tmp/tb" "$tmp"/t.*
    rates[$m]+=" $(mpirun -np "$np" --oversubscribe --bind-to none "$bin" $args ${flags[$m]} | field samples_per_sec)"
  done
done
echo "ddp_train -np $np, $model: $args, $reps reps, $(nproc) cores, $(date -u +%F)"
printf "%-18s %14s %7s\n" mode "samples/s" ratio
base=$(median ${rates[plain]})
for m in "${modes[@]}"; do
  r=$(median ${rates[$m]})
  printf "%-18s %14.1f %7.3f\n" "$m" "$r" "$(/usr/bin/python3 -c "print($r/$base)")"
done
