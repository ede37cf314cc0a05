#!/usr/bin/env bash
# On a terminal, rank 0's progress is one line redrawn in place ("\r\e[K"
# before each), and the epoch line replaces it. Runs `mpiexec -np 2
# ddp_train` under a pseudo-terminal made by script(1).
# Usage: progress_tty_test.sh MPIEXEC DDP_TRAIN
set -euo pipefail
mpiexec=$1 train=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# 125 steps an epoch, each a few milliseconds: several redraws per epoch.
script -qfec "$mpiexec -np 2 --oversubscribe --bind-to none $train --synthetic 4000 --batch-size 32 --epochs 2" \
  /dev/null >"$dir/out" </dev/null
/usr/bin/python3 - "$dir/out" <<'PY'
import re, sys
raw = open(sys.argv[1], "rb").read().decode()
clear = "\r\x1b[K"
for e in (1, 2):
    redraws = re.findall(re.escape(clear) + rf"step (\d+)/125  epoch {e}/2  loss [0-9.]+  \d+ samples/s  elapsed", raw)
    assert len(redraws) >= 2, f"epoch {e}: {len(redraws)} live redraws in:\n{raw!r}"
    steps = [int(s) for s in redraws]
    assert steps == sorted(steps), f"epoch {e}: steps out of order {steps}"
    # The epoch line replaces the live line: a clear, then the line, then a newline.
    assert re.search(re.escape(clear) + rf"epoch {e}/2  train_loss [0-9.]+ .*\r?\n", raw), \
        f"epoch {e}: no epoch line after a clear in:\n{raw!r}"
print(f"ok: live line redrawn in place, then the epoch line ({raw.count(clear)} redraws)")
PY
