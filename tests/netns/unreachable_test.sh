#!/usr/bin/env bash
# A 2-host job whose hosts cannot reach each other on MPI's data path must end
# within --preflight-timeout (+ 30 s of slack) with a non-zero status and
# "ddp_train: error: ..." naming the likely causes - never hang.
#
# How the peer is made unreachable (netns_block.sh): Open MPI's out-of-band
# channel (orted start-up, MPI_Init's exchange of addresses) runs on the veth
# subnet and works; its TCP BTL (every MPI message) is pointed at a second
# subnet where each side's frames to the other are silently dropped, as a
# firewall with a DROP rule would. Without a timeout of ours this job hangs:
# measured with Open MPI 4.1.4, the ranks sit in the first collective between
# the hosts; once TCP gives up connecting (about 2 minutes: 6 SYN retries,
# net.ipv4.tcp_syn_retries) Open MPI prints "WARNING: Open MPI failed to TCP
# connect to a peer MPI process ... Your Open MPI job may now hang or fail"
# and keeps hanging (still running when killed at 400 s).
#
# Where the check must sit: before ddp_train's first collective, which is
# MPI_Comm_split_type in init_world (runtime/world.cpp), not in train::run.
# On a hang this script prints the stack of one rank of host A.
#
# Usage: unreachable_test.sh DDP_TRAIN [PREFLIGHT_TIMEOUT_SEC (default 5)]
#        (root; exit 77 = skipped)
set -euo pipefail
bin=$(realpath "$1")
preflight=${2:-5}
export NETNS_A=${NETNS_A:-ddpuA} NETNS_B=${NETNS_B:-ddpuB}
source "$(dirname "$0")/common.sh"
netns_require

netns_test_begin
"$NETNS_DIR/netns_block.sh"

bound=$((preflight + 30))
t0=$(date +%s.%N)
NETNS_BTL_SUBNET=$NETNS_DEAD_SUBNET NETNS_TIMEOUT=$((bound + 60)) \
  mpirun_two_hosts 2 -- "$bin" --synthetic 1200 --epochs 1 --batch-size 64 --quiet \
    --preflight-timeout "$preflight" >"$work/run.out" 2>"$work/run.err" &
job=$!
while kill -0 "$job" 2>/dev/null; do
  if awk -v t0="$t0" -v now="$(date +%s.%N)" -v b="$bound" 'BEGIN {exit !(now - t0 > b)}'; then
    # Hung: say where the ranks of host A are, then end the job.
    echo "the job is still running after $bound s; where host A's ranks are:"
    for pid in $(ip netns pids "$NETNS_A"); do
      [[ "$(cat /proc/"$pid"/comm 2>/dev/null)" == ddp_train ]] || continue
      if command -v gdb >/dev/null; then
        gdb -p "$pid" -batch -ex bt 2>/dev/null | grep -E '^#' | grep -vE ' (poll|opal_progress|ompi_sync_wait|sendrecv|epoll)' |
          head -n 12 | sed "s/^/  [$pid] /"
      else
        echo "  [$pid] $(cat /proc/"$pid"/wchan)"
      fi
      break
    done
    # SIGTERM lets mpirun end its job and clean up; netns_down.sh kills the rest.
    for pid in $(ip netns pids "$NETNS_A"); do
      [[ "$(cat /proc/"$pid"/comm 2>/dev/null)" == mpirun ]] && kill -TERM "$pid" 2>/dev/null
    done
    timeout 10 tail --pid="$job" -f /dev/null || true
    fail "no error within $bound s (--preflight-timeout $preflight): the job hangs"
  fi
  sleep 0.2
done
rc=0
wait "$job" || rc=$?
job=""
elapsed=$(awk -v t0="$t0" -v now="$(date +%s.%N)" 'BEGIN {printf "%.1f", now - t0}')
echo "exit $rc after $elapsed s (--preflight-timeout $preflight, bound $bound s)"
[[ $rc -ne 0 ]] || fail "the job succeeded although its hosts cannot reach each other"
line=$(grep -m 1 "^ddp_train: error: " "$work/run.err" || true)
[[ -n "$line" ]] || fail "no 'ddp_train: error:' line on stderr"
echo "stderr: $line"
for needle in "cannot reach each other" "firewall" "btl_tcp_if_include" "oob_tcp_if_include" \
              "NCCL_SOCKET_IFNAME" "NCCL_P2P_DISABLE" "died or never started"; do
  [[ "$line" == *"$needle"* ]] || fail "the error lacks '$needle'"
done
echo "PASS: unreachable peer: exit $rc after $elapsed s with the likely causes named"
