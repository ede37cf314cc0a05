#!/usr/bin/env bash
# Makes the two fake hosts unreachable to each other on a second subnet,
# 10.231.1.0/24, while the veth subnet keeps working: both namespaces get an
# address on it, but each has a permanent neighbour entry giving the other's
# address a MAC address that nobody has, so every frame between them is
# dropped silently by the receiving side - what a firewall with a DROP rule
# does (no reset, no ICMP). Point MPI's TCP BTL at it (NETNS_BTL_SUBNET) and
# keep Open MPI's out-of-band channel on the veth subnet: the job then starts
# (orted, MPI_Init) and hangs at the first message between the hosts.
set -euo pipefail
source "$(dirname "$0")/common.sh"
ip -n "$NETNS_A" addr add "$NETNS_DEAD_IP_A/24" dev veth0
ip -n "$NETNS_B" addr add "$NETNS_DEAD_IP_B/24" dev veth0
ip -n "$NETNS_A" neigh replace "$NETNS_DEAD_IP_B" lladdr 02:00:00:00:de:ad dev veth0 nud permanent
ip -n "$NETNS_B" neigh replace "$NETNS_DEAD_IP_A" lladdr 02:00:00:00:de:ad dev veth0 nud permanent
