#!/usr/bin/env bash
# Trains resnet18 briefly (so its BatchNorm running statistics and counters
# move), then checks its --output-model in PyTorch (resnet18_torch.py): loaded
# strictly into d2l's definition, it gives our eval-mode logits.
# Usage: resnet18_torch_test.sh DDP_TRAIN MODEL_LOGITS DATA_DIR
set -euo pipefail
bin=$1 logits=$2 data=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpiexec -np 2 --oversubscribe --bind-to none "$bin" --model resnet18 --data-dir "$data" --train-limit 256 \
  --batch-size 32 --epochs 1 --lr 0.1 --quiet --output-model "$dir/model.safetensors"
"$logits" resnet18 "$dir/model.safetensors" "$data" "$dir/ours.bin"
/usr/bin/python3 "$(dirname "$0")/resnet18_torch.py" "$dir/model.safetensors" "$data" "$dir/ours.bin"
