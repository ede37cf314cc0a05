#!/usr/bin/env bash
# Two fake hosts (network namespaces joined by a veth pair) x 2 ranks each,
# Open MPI over TCP between them, against 4 ranks on one host: both runs must
# end with bitwise the same parameters, and the start-up table of the 2-host
# run must show two distinct hosts, two ranks each.
#
# Why bitwise: the sampler makes the samples of every step independent of
# placement (Note [global step] in data/sampler.hpp), both runs give every rank 1 GEMM thread (2 cores,
# 2 or 4 ranks per node), and Open MPI's tuned component chooses the
# all-reduce algorithm from the communicator size and message size only
# (4 ranks, same buckets in both runs), so every sum is added in the same
# order. Only the transport differs (vader+tcp vs vader), and it moves bytes.
#
# Usage: two_hosts_test.sh DDP_TRAIN    (root; exit 77 = skipped)
set -euo pipefail
bin=$(realpath "$1")
export NETNS_A=${NETNS_A:-ddpA} NETNS_B=${NETNS_B:-ddpB}
source "$(dirname "$0")/common.sh"
netns_require

netns_test_begin

# What this test is about is the bitwise equality below. The runs also train
# for real, in several buckets so that all-reduces overlap backward across the
# hosts, on a recipe with margin (Training.LearnsTheSyntheticDataset's): test
# accuracy 0.99-1.0 for seeds 0-3 and 7 at np 2 and 4, with OpenBLAS's
# Haswell and SkylakeX kernels and with core/simd.hpp's AVX-512 path compiled
# out; the check below asks for 0.9, so no last-bit difference between CPUs
# decides it.
args=(--synthetic 3000 --epochs 4 --batch-size 32 --lr 0.03 --momentum 0.9 --seed 7 --bucket-cap-mb 0.2 --quiet)
rx_bytes() { ip netns exec "$NETNS_A" cat /sys/class/net/veth0/statistics/rx_bytes; }

# 2 hosts x 2 ranks.
rx0=$(rx_bytes)
t0=$SECONDS
rc=0
NETNS_TIMEOUT=60 mpirun_two_hosts 2 -- "$bin" "${args[@]}" --output-model "$work/two.safetensors" \
  >"$work/two.out" 2>"$work/two.err" || rc=$?
echo "2 hosts x 2 ranks: exit $rc, $((SECONDS - t0)) s"
[[ $rc -eq 0 ]] || fail "2-host run exited $rc"
rx=$(( $(rx_bytes) - rx0 ))

# 4 ranks on this host, root namespace.
t0=$SECONDS
rc=0
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 60 \
  mpirun -np 4 --oversubscribe --bind-to none "$bin" "${args[@]}" --output-model "$work/one.safetensors" \
  >"$work/one.out" 2>"$work/one.err" || rc=$?
echo "1 host x 4 ranks: exit $rc, $((SECONDS - t0)) s"
[[ $rc -eq 0 ]] || fail "1-host run exited $rc"

# The start-up table: " rank  host  local ..." then one line per rank.
table=$(awk '/^ rank  host/ {on = 1; next} on && NF >= 3 && $1 ~ /^[0-9]+$/ {print $1, $2, $3} on && $1 !~ /^[0-9]+$/ {on = 0}' "$work/two.out")
echo "start-up table of the 2-host run (rank host local):"
echo "$table" | sed 's/^/  /'
[[ $(echo "$table" | wc -l) -eq 4 ]] || fail "the 2-host run's start-up table does not list 4 ranks"
hosts=$(echo "$table" | awk '{print $2}' | sort -u | tr '\n' ' ')
[[ "$hosts" == "$NETNS_A $NETNS_B " ]] || fail "expected hosts $NETNS_A and $NETNS_B in the table, got: $hosts"
expected="0 $NETNS_A 0/2"$'\n'"1 $NETNS_A 1/2"$'\n'"2 $NETNS_B 0/2"$'\n'"3 $NETNS_B 1/2"
[[ "$table" == "$expected" ]] || fail "expected ranks 0-1 on $NETNS_A and 2-3 on $NETNS_B (local 0/2, 1/2)"
for run in two one; do
  acc=$(sed -n 's/.*"event":"summary".*"test_acc":\([0-9.]*\).*/\1/p' "$work/$run.out")
  echo "$run: test_acc $acc"
  awk -v a="$acc" 'BEGIN {exit !(a >= 0.9)}' || fail "the $run run did not learn (test_acc '$acc')"
done
if grep -q "ddp_train: warning" "$work/two.err" "$work/one.err"; then
  fail "a run with distinct hostnames printed a warning"
fi

# The all-reduces crossed the veth pair: at least one 516 KB bucket per step
# (93 steps x 4 epochs) came in on host A's side.
echo "veth rx on host A during the 2-host run: $rx bytes"
((rx > 50000000)) || fail "only $rx bytes crossed the veth pair: the ranks did not talk over TCP between the hosts"

if cmp -s "$work/two.safetensors" "$work/one.safetensors"; then
  echo "PASS: 2 hosts x 2 ranks over TCP and 1 host x 4 ranks end with bitwise the same parameters ($(stat -c %s "$work/one.safetensors") bytes)"
  exit 0
fi
# Not bitwise: say by how much, for the report.
# Debian's python3 (with python3-numpy), not whatever python3 is first on PATH.
if [[ -x /usr/bin/python3 ]]; then
  /usr/bin/python3 - "$work/two.safetensors" "$work/one.safetensors" <<'PY' || true
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4") for k, v in h.items()}
a, b = load(sys.argv[1]), load(sys.argv[2])
for k in sorted(a):
    d = np.abs(a[k].astype(np.float64) - b[k]) / np.maximum(np.abs(b[k]), 1e-12)
    print(f"  {k}: max relative difference {d.max():.3g}")
PY
fi
fail "the parameters of the 2-host run differ from the 1-host run"
