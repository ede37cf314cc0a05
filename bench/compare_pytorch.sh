#!/usr/bin/env bash
# Side by side, in one run: ddp_train and PyTorch DDP (gloo) on one of d2l's
# recipes over the Fashion-MNIST subset, at world sizes 1 and 2, alternating
# the runs so machine noise hits every side alike, the same threads per rank
# (cores / ranks) on every side. Two PyTorch peers: the newest PyTorch that
# pip installs (into a venv outside the repository, made here on first use:
# $DDP_BENCH_VENV, default <repo>/../.ddp-bench-venv) and Debian's
# python3-torch (a second row). Prints samples/s (median over repetitions of
# each run's median epoch) and the ratios; for LeNet also ddp_train's step
# time with overlapped vs deferred all-reduce.
#
# With DDP_BENCH_JSON=FILE it also appends one JSON line per world size to
# FILE, the table's medians for `ddp_plot --bench FILE` to draw as bars:
#   {"model": "lenet", "np": 1, "date": "…", "cores": 2,
#    "samples_per_sec": {"ddp_train": …, "PyTorch <v> (pip)": …, "PyTorch <v> (Debian)": …}}
#
# Usage: bench/compare_pytorch.sh [--model lenet|resnet18] [reps (3)] [epochs per run]
#   lenet:    batch 256, lr 0.2, the whole subset, 6 epochs a run
#   resnet18: batch 256, lr 0.1, its first 512 images (--train-limit), 3 epochs a run
#             (the median epoch then leaves out each side's first, which
#             allocates: ddp_train's first ResNet-18 step faults in 1.6 GB)
set -euo pipefail
source "$(dirname "$0")/common.sh"
model=lenet
if [[ "${1:-}" == "--model" ]]; then
  model=$2
  shift 2
fi
case $model in
  lenet) recipe="--batch-size 256 --lr 0.2" default_epochs=6 ;;
  resnet18) recipe="--batch-size 256 --lr 0.1 --train-limit 512" default_epochs=3 ;;
  *) echo "compare_pytorch.sh: --model lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
reps=${1:-3}
epochs=${2:-$default_epochs}
bench_setup
if [[ ! -x $venv/bin/python ]]; then
  echo "making $venv with the newest PyTorch from pip"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch numpy
fi
args="--model $model --data-dir $data --epochs $epochs $recipe"

ratio() { /usr/bin/python3 -c "print(f'{$1/$2:.2f}')"; }
torch_rate() {  # PYTHON NP
  "$1" "$root/bench/torch_ddp.py" --world-size "$2" $args | field samples_per_sec
}

new=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
old=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')
echo "ddp_train vs PyTorch DDP (gloo), $model: $args, $reps reps, $(nproc) cores, $(date -u +%F)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
# The kernels each side runs: ddp_train's start-up table names its BLAS;
# PyTorch's convolutions run oneDNN at the vector width it reports.
echo "ddp_train:$("$bin" --model "$model" --synthetic 256 --batch-size 256 --epochs 1 --train-limit 256 2>&1 | grep -m1 ' BLAS: ' | sed 's/^ BLAS://')"
torch_kernels() {
  "$1" - <<'PY'
import re, torch
blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
cpu = getattr(torch.backends, "cpu", None)  # Debian's 1.13 has no get_cpu_capability
width = cpu.get_cpu_capability() if cpu else "its build's"
print(f"PyTorch {torch.__version__}: {width} kernels, "
      f"oneDNN {torch.backends.mkldnn.is_available()}, BLAS {blas.group(1) if blas else 'unknown'}")
PY
}
torch_kernels "$venv/bin/python"
torch_kernels /usr/bin/python3
printf "%-4s %14s %16s %7s %16s %7s\n" np "ddp samples/s" "torch $new" ratio "torch $old" ratio
for np in 1 2; do
  ours=() newer=() older=()
  for ((i = 0; i < reps; i++)); do
    ours+=("$(mpirun -np "$np" --oversubscribe --bind-to none "$bin" $args --quiet | field samples_per_sec)")
    newer+=("$(torch_rate "$venv/bin/python" "$np")")
    older+=("$(torch_rate /usr/bin/python3 "$np")")
  done
  o=$(median "${ours[@]}") n=$(median "${newer[@]}") d=$(median "${older[@]}")
  printf "%-4s %14.1f %16.1f %7s %16.1f %7s\n" "$np" "$o" "$n" "$(ratio "$o" "$n")" "$d" "$(ratio "$o" "$d")"
  if [[ -n ${DDP_BENCH_JSON:-} ]]; then
    /usr/bin/python3 -c '
import json, sys
model, np, date, cores, ours, new, newer, old, older = sys.argv[1:]
print(json.dumps({"model": model, "np": int(np), "date": date, "cores": int(cores),
                  "samples_per_sec": {"ddp_train": float(ours), f"PyTorch {new} (pip)": float(newer),
                                      f"PyTorch {old} (Debian)": float(older)}}))' \
      "$model" "$np" "$(date -u +%F)" "$(nproc)" "$o" "$new" "$n" "$old" "$d" >>"$DDP_BENCH_JSON"
  fi
done

[[ $model == lenet ]] || exit 0
# Overlap: small buckets so several all-reduces run during backward.
echo
echo "ddp_train -np 2, --bucket-cap-mb 0.1: step time with all-reduce during backward vs after it"
printf "%-10s %12s\n" mode "ms/step"
for mode in overlap deferred; do
  flag=""; [[ $mode == deferred ]] && flag="--no-overlap"
  times=()
  for ((i = 0; i < reps; i++)); do
    out=$(mpirun -np 2 --oversubscribe --bind-to none "$bin" $args --bucket-cap-mb 0.1 $flag --quiet)
    times+=("$(/usr/bin/python3 -c "import json,sys; s=json.loads(sys.argv[1].splitlines()[-1]); print(1000*s['epoch_sec_median']/s['steps_per_epoch'])" "$out")")
  done
  printf "%-10s %12.2f\n" "$mode" "$(median "${times[@]}")"
done
