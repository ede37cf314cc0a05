#!/usr/bin/env bash
# Removes the namespaces netns_up.sh made (the veth pair goes with them).
# Processes still inside them (an orted or rank left by a killed job: they
# would keep running after the namespace's name is gone) are killed first;
# only the tests start processes in these namespaces. Safe to run when the
# namespaces do not exist.
set -uo pipefail
source "$(dirname "$0")/common.sh"
for ns in "$NETNS_A" "$NETNS_B"; do
  if ip netns list | awk '{print $1}' | grep -qx "$ns"; then
    pids=$(ip netns pids "$ns" 2>/dev/null)
    if [[ -n "$pids" ]]; then
      kill -9 $pids 2>/dev/null
      sleep 0.2
    fi
    ip netns del "$ns"
  fi
  # Segments of ranks that were killed (named by the hostname the fake host
  # had, which is its namespace's name: no other job's).
  rm -f /dev/shm/vader_segment."$ns".*
done
exit 0
