#!/usr/bin/env bash
# Trains briefly with checkpoints and --output-model, then reads both files
# from Python (Debian's python3 and numpy only).
# Usage: model_file_test.sh DDP_TRAIN
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mpiexec -np 2 --oversubscribe --bind-to none "$bin" --synthetic 1200 --batch-size 64 --epochs 2 \
  --momentum 0.9 --lr 0.05 --quiet --checkpoint-dir "$dir/ck" --output-model "$dir/model.safetensors"
newest=$(ls "$dir"/ck/ckpt-*.safetensors | sort | tail -n 1)
/usr/bin/python3 "$(dirname "$0")/check_model_file.py" "$dir/model.safetensors" "$newest"
