#!/usr/bin/env bash
# d2l's ResNet-18 recipe (batch 256, lr 0.1) at -np 2 on the whole
# Fashion-MNIST subset, ddp_train and PyTorch DDP (the newest pip PyTorch,
# the venv compare_pytorch.sh makes), for the same epochs and seeds: each
# run's test accuracy after every epoch, the final accuracies, their means
# over seeds, and the difference of the means.
#
# At 11 steps an epoch with lr 0.1, BatchNorm's running statistics lag the
# weights, and one run's eval-mode accuracy jumps by up to 0.2 between
# epochs on either side; compare means over seeds, not single runs.
#
# Usage: bench/accuracy_resnet18.sh [epochs (10)] [seeds (5)]
set -euo pipefail
source "$(dirname "$0")/common.sh"
epochs=${1:-10}
seeds=${2:-5}
[[ -x $venv/bin/python ]] || { echo "no $venv: run bench/compare_pytorch.sh once to make it" >&2; exit 1; }
args="--model resnet18 --data-dir $data --epochs $epochs --batch-size 256 --lr 0.1"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((seed = 0; seed < seeds; ++seed)); do
  mpirun -np 2 --oversubscribe --bind-to none "$bin" $args --seed $seed --quiet --metrics-out "$out/ddp_$seed.jsonl" \
    > /dev/null
  "$venv/bin/python" "$root/bench/torch_ddp.py" --world-size 2 $args --seed $seed --each-epoch > "$out/torch_$seed.jsonl"
done
echo "resnet18, -np 2, $args, seeds 0-$((seeds - 1)) ($(date -u +%F))"
/usr/bin/python3 - "$out" "$seeds" "$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" <<'EOF'
import json, statistics, sys
out, seeds, version = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def curve(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    return [r["test_acc"] for r in rows if r.get("event") in ("epoch", "summary") or "event" not in r]
finals = {"ddp_train": [], f"PyTorch {version}": []}
for seed in range(seeds):
    for name, path in (("ddp_train", f"{out}/ddp_{seed}.jsonl"), (f"PyTorch {version}", f"{out}/torch_{seed}.jsonl")):
        c = curve(path)
        finals[name].append(c[-1])
        print(f"seed {seed} {name:>16}: " + " ".join(f"{a:.3f}" for a in c))
means = {k: statistics.mean(v) for k, v in finals.items()}
for k, v in finals.items():
    print(f"{k:>16}: final test_acc " + " ".join(f"{a:.3f}" for a in v) + f"  mean {means[k]:.4f}")
a, b = means.values()
print(f"difference of the means: {abs(a - b):.4f}")
EOF
