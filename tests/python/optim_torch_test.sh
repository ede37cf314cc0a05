#!/usr/bin/env bash
# Our optimizers and schedules (optim_trace) against torch.optim and
# torch.optim.lr_scheduler (optim_torch.py), step by step, for each set of
# flags below. Usage: optim_torch_test.sh OPTIM_TRACE
set -euo pipefail
trace=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
check() {
  local steps=$1
  shift
  "$trace" "$steps" "$@" >"$dir/trace.json"
  /usr/bin/python3 "$(dirname "$0")/optim_torch.py" "$dir/trace.json" "$steps" "$@"
}
check 5 --optimizer adamw --lr 0.01 --weight-decay 0
check 5 --optimizer adamw --lr 0.01 --weight-decay 0.1
check 5 --optimizer adamw --lr 0.003 --betas 0.8,0.99 --eps 1e-6 --no-decay-norm-bias
check 5 --momentum 0.9 --weight-decay 0.01 --lr 0.1
check 5 --momentum 0.9 --nesterov --weight-decay 0.01 --no-decay-norm-bias --lr 0.1
check 12 --lr 0.1 --lr-schedule step --lr-step-size 3 --lr-gamma 0.5
check 12 --lr 0.1 --lr-schedule step --lr-step-size 4 --warmup-steps 3
check 12 --optimizer adamw --lr 0.01 --lr-schedule cosine
check 12 --optimizer adamw --lr 0.01 --lr-schedule cosine --warmup-steps 4 --lr-min 0.001
check 12 --lr 0.1 --warmup-steps 5
check 8 --optimizer adamw --lr 0.01 --clip-grad-norm 0.5
check 8 --momentum 0.9 --lr 0.1 --clip-grad-norm 1.0 --lr-schedule cosine --warmup-steps 2
