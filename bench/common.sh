# Sourced by the CPU benchmark scripts: where the repository, the data, the
# ddp_train binary and the PyTorch venv are (each overridable), Open MPI
# allowed as root, and the helpers every script reads its runs with.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data=${DDP_DATA_DIR:-$root/../shared/data/fashion-mnist-subset}
bin=${DDP_TRAIN:-$root/build/bin/ddp_train}
venv=${DDP_BENCH_VENV:-$root/../.ddp-bench-venv}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# The Debian packages, and ddp_train built if it is not there yet.
bench_setup() {
  "$root/scripts/install-deps.sh"
  [[ -x $bin ]] || "$root/scripts/build.sh"
}

# field NAME: NAME of the last JSON line on stdin (ddp_train's summary).
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
# median X...: the median of the numbers.
median() { /usr/bin/python3 -c "import statistics,sys; print(statistics.median(map(float, sys.argv[1:])))" "$@"; }
