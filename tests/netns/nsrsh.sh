#!/usr/bin/env bash
# A fake ssh for Open MPI (--mca plm_rsh_agent): "nsrsh.sh HOST COMMAND..."
# runs COMMAND (an orted) inside the namespace that plays HOST. With
# NSRSH_UTS=1 it also gets a private UTS namespace whose hostname is the
# namespace's name, so that the two fake hosts have distinct names (the real
# hostname is not changed).
host=$1
shift
source "$(dirname "$0")/common.sh"
case "$host" in
  "$NETNS_IP_A"|"$NETNS_A") ns=$NETNS_A ;;
  "$NETNS_IP_B"|"$NETNS_B") ns=$NETNS_B ;;
  *) echo "nsrsh.sh: unknown host '$host' (known: $NETNS_IP_A, $NETNS_IP_B)" >&2; exit 255 ;;
esac
if [[ "${NSRSH_UTS:-1}" == 1 ]]; then
  exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
else
  exec ip netns exec "$ns" /bin/sh -c "$*"
fi
