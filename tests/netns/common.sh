# Shared settings of the netns tests (sourced, not run). Two fake "hosts" are
# two network namespaces joined by a veth pair; see netns_up.sh.
#
# Override per test so that tests never share namespaces:
#   NETNS_A, NETNS_B   namespace names (default ddpA, ddpB)
# The subnet is private to the two namespaces (nothing else can reach it), so
# every test uses the same addresses inside its own pair.
: "${NETNS_A:=ddpA}"
: "${NETNS_B:=ddpB}"
NETNS_SUBNET=10.231.0.0/24
NETNS_IP_A=10.231.0.1
NETNS_IP_B=10.231.0.2
# A second subnet on the same veth pair, used only by netns_block.sh: its
# addresses exist on both sides but no packet between them is delivered.
NETNS_DEAD_SUBNET=10.231.1.0/24
NETNS_DEAD_IP_A=10.231.1.1
NETNS_DEAD_IP_B=10.231.1.2
export NETNS_A NETNS_B NETNS_IP_A NETNS_IP_B

NETNS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Exit 77 (CTest: skipped) when this machine cannot make namespaces.
netns_require() {
  local why=""
  if [[ $(id -u) -ne 0 ]]; then
    why="needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for ip netns and unshare --uts)"
  elif ! command -v ip >/dev/null; then
    why="needs iproute2 (ip); scripts/install-deps.sh installs it"
  elif ! command -v unshare >/dev/null; then
    why="needs unshare (util-linux)"
  elif ! command -v mpirun >/dev/null; then
    why="needs mpirun (Open MPI)"
  fi
  if [[ -n "$why" ]]; then
    echo "SKIP: $why"
    exit 77
  fi
}

# netns_test_begin: the set-up every test here shares. $work becomes a scratch
# folder; the namespaces come up (exit 77, skipped, where that is not possible
# here) and go down again, with $work, when the test exits, after waiting for
# the background job $job if the test set one. fail MSG prints the logs in
# $work and exits 1.
netns_test_begin() {
  work=$(mktemp -d)
  job=""
  trap netns_test_end EXIT
  if ! "$NETNS_DIR/netns_up.sh" 2>"$work/up.err"; then
    echo "SKIP: cannot create network namespaces here: $(cat "$work/up.err")"
    exit 77
  fi
}
netns_test_end() {
  # Kills whatever is left in the namespaces (mpirun, orted, ranks), which
  # also ends a background job.
  "$NETNS_DIR/netns_down.sh"
  if [[ -n "$job" ]]; then wait "$job" 2>/dev/null || true; fi
  rm -rf "$work"
}
fail() {
  echo "FAIL: $*"
  local f
  for f in "$work"/*.out "$work"/*.err; do
    [[ -s "$f" ]] && { echo "--- $(basename "$f")"; tail -n 40 "$f"; }
  done
  exit 1
}

# mpirun_two_hosts RANKS_PER_HOST [mpirun options...] -- PROGRAM ARGS...
# Runs mpirun inside namespace A (the root namespace cannot reach the veth
# subnet); Open MPI starts the orted of host B through nsrsh.sh. With
# NETNS_UTS=1 (the default) each fake host gets its own hostname, its
# namespace's name ($NETNS_A, $NETNS_B), in a private UTS namespace;
# NETNS_UTS=0 leaves both with the real hostname. (Hostnames unique to the
# test also keep its vader segments, /dev/shm/vader_segment.<hostname>.*,
# apart from every other job's; netns_down.sh removes leftovers.) NETNS_BTL_SUBNET (default the veth subnet) is where MPI's TCP BTL
# may go; the out-of-band channel (orted, start-up) always uses the veth subnet.
# NETNS_TIMEOUT (seconds, default 120) bounds the whole mpirun: it gets
# SIGTERM then, SIGKILL 5 s later, and the function returns 124 or 137.
mpirun_two_hosts() {
  local n=$1; shift
  local opts=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do opts+=("$1"); shift; done
  shift
  local hostfile
  hostfile=$(mktemp)
  printf '%s slots=%d\n%s slots=%d\n' "$NETNS_IP_A" "$n" "$NETNS_IP_B" "$n" >"$hostfile"
  local uts=${NETNS_UTS:-1}
  local wrap=(timeout -k 5 "${NETNS_TIMEOUT:-120}" ip netns exec "$NETNS_A")
  if [[ "$uts" == 1 ]]; then
    wrap+=(unshare --uts /bin/bash -c 'hostname "$1" && shift && exec "$@"' _ "$NETNS_A")
  fi
  local rc=0
  NSRSH_UTS=$uts OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "${wrap[@]}" mpirun --hostfile "$hostfile" -np $((2 * n)) --bind-to none \
      --mca plm_rsh_agent "$NETNS_DIR/nsrsh.sh" --mca plm_rsh_no_tree_spawn 1 \
      --mca oob_tcp_if_include "$NETNS_SUBNET" \
      --mca btl_tcp_if_include "${NETNS_BTL_SUBNET:-$NETNS_SUBNET}" \
      "${opts[@]}" "$@" || rc=$?
  rm -f "$hostfile"
  return $rc
}
