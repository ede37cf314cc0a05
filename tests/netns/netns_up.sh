#!/usr/bin/env bash
# Creates two fake hosts: network namespaces $NETNS_A and $NETNS_B (default
# ddpA, ddpB) joined by a veth pair, 10.231.0.1/24 in A and 10.231.0.2/24 in B.
# Only these two namespaces hold the addresses; nothing outside them is
# touched. Leftovers of an earlier run under the same names are removed first.
# Needs root. Undo with netns_down.sh.
set -euo pipefail
source "$(dirname "$0")/common.sh"
"$NETNS_DIR/netns_down.sh"
ip netns add "$NETNS_A"
ip netns add "$NETNS_B"
# Created directly inside the namespaces: no interface ever appears in the
# root namespace, so two tests with different namespace names cannot collide.
ip -n "$NETNS_A" link add veth0 type veth peer name veth0 netns "$NETNS_B"
ip -n "$NETNS_A" addr add "$NETNS_IP_A/24" dev veth0
ip -n "$NETNS_B" addr add "$NETNS_IP_B/24" dev veth0
for ns in "$NETNS_A" "$NETNS_B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set veth0 up
done
