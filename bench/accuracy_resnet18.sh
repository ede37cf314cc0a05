#!/usr/bin/env bash
# d2l's ResNet-18 recipe (batch 256, lr 0.1) at -np 2 on the whole
# Fashion-MNIST subset, ddp_train and PyTorch DDP (the newest pip PyTorch,
# the venv compare_pytorch.sh makes) for the same number of epochs: the test
# accuracy each reaches, and the difference.
# Usage: bench/accuracy_resnet18.sh [epochs (10)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
epochs=${1:-10}
data=${DDP_DATA_DIR:-$root/../shared/data/fashion-mnist-subset}
bin=${DDP_TRAIN:-$root/build/bin/ddp_train}
venv=${DDP_BENCH_VENV:-$root/../.ddp-bench-venv}
[[ -x $venv/bin/python ]] || { echo "no $venv: run bench/compare_pytorch.sh once to make it" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args="--model resnet18 --data-dir $data --epochs $epochs --batch-size 256 --lr 0.1"
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
ours=$(mpirun -np 2 --oversubscribe --bind-to none "$bin" $args --quiet)
theirs=$("$venv/bin/python" "$root/bench/torch_ddp.py" --world-size 2 $args)
a=$(field test_acc <<<"$ours") b=$(field test_acc <<<"$theirs")
echo "resnet18, -np 2, $args ($(date -u +%F))"
echo "ddp_train:                           test_acc $a  train_loss $(field train_loss <<<"$ours")  $(field samples_per_sec <<<"$ours") samples/s"
echo "PyTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') DDP (gloo):           test_acc $b  $(field samples_per_sec <<<"$theirs") samples/s"
/usr/bin/python3 -c "print(f'difference: {abs($a - $b):.4f}')"
