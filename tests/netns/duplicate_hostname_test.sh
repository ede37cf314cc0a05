#!/usr/bin/env bash
# Two fake hosts that keep the machine's hostname (no private UTS namespace):
# ddp_train must say, once, on stderr, that two different nodes report the
# same hostname, and still train. One rank per host: with two per host,
# Open MPI's vader segments (named by hostname) collide and the ranks crash
# in MPI_Comm_split_type inside MPI start-up, before ddp_train can say
# anything (README, "Errors and troubleshooting").
#
# Usage: duplicate_hostname_test.sh DDP_TRAIN    (root; exit 77 = skipped)
set -euo pipefail
bin=$(realpath "$1")
export NETNS_A=${NETNS_A:-ddphA} NETNS_B=${NETNS_B:-ddphB}
source "$(dirname "$0")/common.sh"
netns_require

netns_test_begin

host=$(hostname)
t0=$SECONDS
rc=0
NETNS_UTS=0 NETNS_TIMEOUT=60 mpirun_two_hosts 1 -- "$bin" --synthetic 1200 --epochs 1 --batch-size 64 --quiet \
  >"$work/run.out" 2>"$work/run.err" || rc=$?
echo "2 hosts x 1 rank, both named '$host': exit $rc, $((SECONDS - t0)) s"
[[ $rc -eq 0 ]] || fail "the run exited $rc"

table=$(awk '/^ rank  host/ {on = 1; next} on && $1 ~ /^[0-9]+$/ {print $1, $2, $3}' "$work/run.out")
echo "start-up table (rank host local):"
echo "$table" | sed 's/^/  /'
[[ "$table" == "0 $host 0/1"$'\n'"1 $host 0/1" ]] ||
  fail "expected ranks 0 and 1 each alone on a node named '$host'"

warnings=$(grep -c "^ddp_train: warning: " "$work/run.err" || true)
line=$(grep "^ddp_train: warning: " "$work/run.err" || true)
echo "stderr: ${line:0:160}..."
[[ $warnings -eq 1 ]] || fail "expected one warning line, got $warnings"
for needle in "2 different nodes report the same hostname '$host'" "ranks [0] and [1]" "vader" "NCCL" \
              "unshare --uts"; do
  [[ "$line" == *"$needle"* ]] || fail "the warning lacks '$needle'"
done
echo "PASS: two nodes named '$host' are reported with a warning, and the job still trains"
