#!/usr/bin/env bash
# ddp_train --tensorboard read back by the tensorboard package's own readers
# (tensorboard_dump.py): every per-step scalar at every global step, every
# per-epoch scalar at each epoch's last step with the value of the epoch's
# --metrics-out record (as float32), and a run resumed from a checkpoint
# adding its steps in a file of its own. Usage: tensorboard_train_test.sh DDP_TRAIN MPIEXEC
set -euo pipefail
train=$1
mpiexec=$2
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/../../scripts/python-venv.sh")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# 2048 images at batch 128: 16 steps an epoch; 2 epochs, then a third resumed.
args=(--synthetic 2048 --batch-size 128 --lr 0.05 --clip-grad-norm 1 --quiet
      --tensorboard "$dir/tb" --metrics-out "$dir/m.jsonl" --checkpoint-dir "$dir/ckpt")
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --epochs 2 >"$dir/out1"
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" "${args[@]}" --epochs 3 --resume auto >"$dir/out2"
files=$(ls "$dir"/tb/events.out.tfevents.* | wc -l)
[[ $files == 2 ]] || { echo "expected 2 events files (a run and its resumption), found $files" >&2; exit 1; }

"$py" "$here/tensorboard_dump.py" "$dir/tb" >"$dir/tb.json"
"$py" - "$dir/tb.json" "$dir/m.jsonl" <<'PY'
import json, struct, sys
tb = json.load(open(sys.argv[1]))
records = [json.loads(l) for l in open(sys.argv[2])]
f32 = lambda v: struct.unpack("f", struct.pack("f", v))[0]
steps, epochs = 16, 3
errors = []
step_tags = ["step/loss", "step/accuracy", "step/lr", "step/samples_per_sec", "step/grad_norm"] + [
    "step/time_ms/" + p for p in ("data", "forward", "backward", "comm", "optimizer")]
for tag in step_tags:
    got = [s for s, _ in tb.get(tag, [])]
    if got != list(range(1, steps * epochs + 1)):
        errors.append(f"{tag}: steps {got[:5]}... ({len(got)}), expected 1..{steps * epochs} once each")
for tag in ("step/lr",):
    bad = [(s, v) for s, v in tb.get(tag, []) if v != f32(0.05)]
    if bad: errors.append(f"{tag}: {bad[:3]} is not the constant 0.05")
for tag in ("step/loss",):
    bad = [(s, v) for s, v in tb.get(tag, []) if not 0 < v < 10]
    if bad: errors.append(f"{tag}: {bad[:3]} is no softmax cross-entropy of 10 classes")
metric_of = {"epoch/train_loss": "train_loss", "epoch/train_acc": "train_acc", "epoch/test_acc": "test_acc",
             "epoch/samples_per_sec": "samples_per_sec", "epoch/lr": "lr", "epoch/epoch": "epoch",
             "epoch/grad_norm": "grad_norm", "epoch/step_ms": "step_ms", "epoch/comm_hidden_frac": "comm_hidden_frac",
             "epoch/time_ms/forward": "forward_ms", "epoch/time_ms/comm": "comm_ms"}
for tag, key in metric_of.items():
    points = tb.get(tag, [])
    want = [[steps * (e + 1), f32(records[e][key])] for e in range(epochs)]
    if points != want:
        errors.append(f"{tag}: {points} != metrics' {key} {want}")
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"{len(tb)} tags, {sum(len(v) for v in tb.values())} points: every step and epoch as written")
PY

# --precision fp16 from a scale that overflows: the scaler skips the first
# steps, which take no norm (0 on the board); the epoch's grad_norm is the
# mean over the steps that took one.
"$mpiexec" -np 2 --oversubscribe --bind-to none "$train" --synthetic 2048 --batch-size 128 --lr 0.05 \
  --clip-grad-norm 1 --precision fp16 --init-scale 268435456 --epochs 1 --quiet \
  --tensorboard "$dir/tb16" --metrics-out "$dir/m16.jsonl" >"$dir/out3"
"$py" "$here/tensorboard_dump.py" "$dir/tb16" >"$dir/tb16.json"
"$py" - "$dir/tb16.json" "$dir/m16.jsonl" <<'PY'
import json, sys
tb = json.load(open(sys.argv[1]))
record = json.loads(open(sys.argv[2]).readline())
norms = [v for _, v in tb["step/grad_norm"]]
taken = [v for v in norms if v > 0]
skipped = record["skipped_steps"]
if not 0 < skipped < len(norms) or len(norms) - len(taken) != skipped:
    sys.exit(f"{skipped} skipped steps, {len(norms) - len(taken)} of {len(norms)} step norms 0: expected some of each")
mean = sum(taken) / len(taken)
if abs(record["grad_norm"] - mean) > 1e-6 * mean:
    sys.exit(f"epoch grad_norm {record['grad_norm']} is not the mean {mean} of the {len(taken)} steps that took a norm")
print(f"fp16: {skipped} of {len(norms)} steps skipped; grad_norm {record['grad_norm']:.6g} is the others' mean")
PY
