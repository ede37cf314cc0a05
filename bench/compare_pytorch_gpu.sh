#!/usr/bin/env bash
# The GPU benchmark: ddp_train and PyTorch DDP side by side on one GPU, world
# size 1, NCCL, one of d2l's recipes (LeNet: batch 256, lr 0.2; ResNet-18:
# batch 256, lr 0.1; plain SGD) at the full Fashion-MNIST size
# (--synthetic 60000), the two alternating so machine noise
# hits both alike. Prints seconds per epoch and samples/s of both (medians
# over repetitions of each run's median epoch) and the ratio.
#
# Like with like, by --precision:
#   fp32       our strict fp32 against PyTorch with TF32 off;
#   tf32       our --precision tf32 against PyTorch's default (TF32
#              convolutions);
#   bf16|fp16  our mixed precision against PyTorch's best: autocast (and, for
#              fp16, GradScaler) with channels_last and cudnn.benchmark.
# --ours "FLAGS" adds flags to our side (e.g. --cudnn-benchmark).
#
# Usage: bench/compare_pytorch_gpu.sh [--model lenet|resnet18] [--precision fp32|tf32|bf16|fp16]
#        [--ours "FLAGS"] [reps (3)] [epochs per run (5)]
# Needs a CUDA device, a ddp_train built with the CUDA backend ($DDP_TRAIN, or
# build/bin/ddp_train) and a python3 with torch and CUDA ($PYTHON, or python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=lenet
precision=fp32
ours=""
while [[ "${1:-}" == --* ]]; do
  case $1 in
    --model) model=$2 ;;
    --precision) precision=$2 ;;
    --ours) ours=$2 ;;
    *) echo "compare_pytorch_gpu.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
case $precision in
  fp32) torch_precision=fp32 torch_flags="--tf32 off" ;;
  tf32) torch_precision=fp32 torch_flags="" ;;
  bf16 | fp16) torch_precision=$precision torch_flags="--channels-last --cudnn-benchmark" ;;
  *) echo "compare_pytorch_gpu.sh: --precision fp32, tf32, bf16 or fp16, not '$precision'" >&2; exit 2 ;;
esac
case $model in
  lenet) lr=0.2 ;;
  resnet18) lr=0.1 ;;
  *) echo "compare_pytorch_gpu.sh: --model lenet or resnet18, not '$model'" >&2; exit 2 ;;
esac
reps=${1:-3}
epochs=${2:-5}
bin=${DDP_TRAIN:-$root/build/bin/ddp_train}
py=${PYTHON:-python3}
n=${DDP_BENCH_IMAGES:-60000}  # --synthetic: the full Fashion-MNIST size
[[ -x $bin ]] || { echo "compare_pytorch_gpu: no ddp_train at $bin (set DDP_TRAIN)" >&2; exit 1; }
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
  || { echo "compare_pytorch_gpu: $py has no torch with a CUDA device" >&2; exit 1; }

field() { "$py" -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
median() { "$py" -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }

gpu=$(nvidia-smi -L 2>/dev/null | head -1 || echo "GPU")
echo "ddp_train vs PyTorch $("$py" -c 'import torch; print(torch.__version__)') DDP (nccl), world size 1, $gpu"
echo "$model, --synthetic $n, batch 256, lr $lr, $epochs epochs x $reps reps"
echo "ddp_train --precision $precision $ours; PyTorch $torch_precision ${torch_flags:-(its defaults)}"
ours_s=() ours_r=() theirs_s=() theirs_r=()
for ((i = 0; i < reps; i++)); do
  out=$("$bin" --device cuda --backend nccl --model "$model" --synthetic $n --epochs "$epochs" --batch-size 256 \
          --lr "$lr" --precision "$precision" $ours --quiet)
  ours_s+=("$(field epoch_sec_median <<<"$out")"); ours_r+=("$(field samples_per_sec <<<"$out")")
  out=$("$py" "$root/bench/torch_ddp.py" --device cuda --world-size 1 --model "$model" --synthetic $n \
          --epochs "$epochs" --batch-size 256 --lr "$lr" --precision "$torch_precision" $torch_flags)
  theirs_s+=("$(field epoch_sec_median <<<"$out")"); theirs_r+=("$(field samples_per_sec <<<"$out")")
done
os=$(median "${ours_s[@]}"); or=$(median "${ours_r[@]}")
ts=$(median "${theirs_s[@]}"); tr=$(median "${theirs_r[@]}")
printf "%-10s %12s %12s\n" "" "s/epoch" "samples/s"
printf "%-10s %12.3f %12.0f\n" ddp_train "$os" "$or" pytorch "$ts" "$tr"
printf "ratio (ddp_train / pytorch samples/s): %.2f\n" "$("$py" -c "print($or/$tr)")"
