#!/usr/bin/env bash
# Side by side, in one run: ddp_train and PyTorch DDP (gloo) on d2l's LeNet
# recipe (batch 256, lr 0.2, plain SGD) over the Fashion-MNIST subset, at
# world sizes 1 and 2, alternating the two so machine noise hits both alike.
# Prints samples/s (median over repetitions of each run's median epoch) and
# the ratio; then ddp_train's step time with overlapped vs deferred
# all-reduce. Usage: bench/compare_pytorch.sh [reps (3)] [epochs per run (6)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
reps=${1:-3}
epochs=${2:-6}
data=${DDP_DATA_DIR:-$root/../shared/data/fashion-mnist-subset}
bin=${DDP_TRAIN:-$root/build/bin/ddp_train}
"$root/scripts/install-deps.sh" --bench
[[ -x $bin ]] || "$root/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
recipe="--model lenet --data-dir $data --epochs $epochs --batch-size 256 --lr 0.2"

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
median() { /usr/bin/python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }

echo "ddp_train vs PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') DDP (gloo), LeNet, batch 256, $epochs epochs x $reps reps, $(nproc) cores"
printf "%-6s %14s %14s %8s\n" np "ddp samples/s" "torch samples/s" ratio
for np in 1 2; do
  ours=() theirs=()
  for ((i = 0; i < reps; i++)); do
    ours+=("$(mpirun -np "$np" --oversubscribe --bind-to none "$bin" $recipe --quiet | field samples_per_sec)")
    theirs+=("$(/usr/bin/python3 "$root/bench/torch_ddp_lenet.py" --world-size "$np" --data-dir "$data" \
                 --epochs "$epochs" --batch-size 256 --lr 0.2 | field samples_per_sec)")
  done
  o=$(median "${ours[@]}"); t=$(median "${theirs[@]}")
  printf "%-6s %14.0f %14.0f %8.2f\n" "$np" "$o" "$t" "$(/usr/bin/python3 -c "print($o/$t)")"
done

# Overlap: small buckets so several all-reduces run during backward.
echo
echo "ddp_train -np 2, --bucket-cap-mb 0.1: step time with all-reduce during backward vs after it"
printf "%-10s %12s\n" mode "ms/step"
for mode in overlap deferred; do
  flag=""; [[ $mode == deferred ]] && flag="--no-overlap"
  times=()
  for ((i = 0; i < reps; i++)); do
    out=$(mpirun -np 2 --oversubscribe --bind-to none "$bin" $recipe --bucket-cap-mb 0.1 $flag --quiet)
    times+=("$(/usr/bin/python3 -c "import json,sys; s=json.loads(sys.argv[1].splitlines()[-1]); print(1000*s['epoch_sec_median']/s['steps_per_epoch'])" "$out")")
  done
  printf "%-10s %12.2f\n" "$mode" "$(median "${times[@]}")"
done
