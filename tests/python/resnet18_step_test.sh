#!/usr/bin/env bash
# One training step of resnet18 (model_step) and the same step in PyTorch
# (resnet18_step.py) from the same initial state, on a batch of 64 and of 256.
# Usage: resnet18_step_test.sh MODEL_STEP DATA_DIR
set -euo pipefail
step=$1 data=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for n in 64 256; do
  "$step" resnet18 3 "$data" $n 0.1 "$dir/init.safetensors" "$dir/after.safetensors"
  /usr/bin/python3 "$(dirname "$0")/resnet18_step.py" "$dir/init.safetensors" "$dir/after.safetensors" "$data" $n 0.1
done
