#!/usr/bin/env bash
# The tests again under sanitizers, each build in its own directory:
#   asan: build-asan, AddressSanitizer + UBSan: the unit tests, the MPI tests
#         (np 2 and 4) and the fuzz regression inputs;
#   tsan: build-tsan, ThreadSanitizer: the tests of what runs threads, the
#         communicator (tests/mpi/comm: its communication thread, the
#         watchdog's thread), the watchdog's bookkeeping (tests/unit/comm),
#         the deterministic sums' lanes (tests/unit/deterministic,
#         tests/mpi/deterministic) and the loader (tests/unit/data: its
#         prefetch thread).
# usage: scripts/sanitize.sh [asan] [tsan]   (default: both)
# Any sanitizer report ends its process with an error, so the test fails.
# Suppressions (tests/sanitize/) name third-party libraries only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kinds=("$@")
((${#kinds[@]})) || kinds=(asan tsan)
jobs=$(($(nproc) < 2 ? $(nproc) : 2))
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# configure DIR SANITIZERS: a build there (once), CPU only. -O1 and line
# tables only (-g1): what the sanitizers' reports need (function, file and
# line of every frame); this script took 810 s that way on the AVX2 EPYC
# (2026-11-27), 1420 s with -O2 -g.
configure() {
  mkdir -p "$1"
  if [[ ! -f $1/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_CUDA=OFF \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DDDP_SANITIZE="$2" >"$1/configure.log" 2>&1 || { cat "$1/configure.log"; exit 1; }
  fi
}

# build DIR TARGET...
build() {
  local dir=$1
  shift
  echo "sanitize: building $* in $dir"
  cmake --build "$dir" -j "$jobs" --target "$@" >"$dir/build.log" 2>&1 || { tail -50 "$dir/build.log"; exit 1; }
}

for kind in "${kinds[@]}"; do
  case $kind in
    asan)
      dir=$root/build-asan
      configure "$dir" address,undefined
      # Every unit and MPI test binary there is (the end-to-end ones, test_cli,
      # run ddp_train: not here), and the fuzz regression replays.
      mapfile -t targets < <(cmake --build "$dir" --target help |
        sed -n 's/^\.\.\. \(test_[a-z0-9_]*\|mpi_test_[a-z0-9_]*\|fuzz_replay_[a-z0-9_]*\)$/\1/p' | grep -vx test_cli)
      build "$dir" "${targets[@]}"
      # Leaks: see tests/sanitize/lsan.supp for the slow unwinder.
      export ASAN_OPTIONS="halt_on_error=1:exitcode=23:detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1"
      export LSAN_OPTIONS="suppressions=$root/tests/sanitize/lsan.supp:print_suppressions=0"
      export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
      # One test measures its own speed (not a sanitizer's business): left out.
      GTEST_FILTER='-Synthetic.SixtyThousandImagesAreQuick' \
        ctest --test-dir "$dir" --output-on-failure -R '^(unit_|mpi_|fuzz_regressions_)'
      unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
      ;;
    tsan)
      dir=$root/build-tsan
      configure "$dir" thread
      build "$dir" test_data test_comm test_deterministic test_nn mpi_test_comm mpi_test_deterministic
      # OpenBLAS's own threads are not instrumented: one thread, so their
      # work is not taken for races on our buffers.
      export OPENBLAS_NUM_THREADS=1
      # history_size=7: the longest history, so that the stack of an old
      # access (Open MPI's progress engine writing a receive buffer from
      # another thread) is still there to match the suppressions; with the
      # default, a loaded machine loses it ("failed to restore the stack")
      # and Open MPI's own write was reported as ours.
      export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:history_size=7:suppressions=$root/tests/sanitize/tsan.supp"
      # Of the data tests, the loader's run a thread; the IDX and synthetic
      # ones are single-threaded (and one of them is timed).
      GTEST_FILTER='Loader.*' ctest --test-dir "$dir" --output-on-failure -R '^unit_data$'
      ctest --test-dir "$dir" --output-on-failure -R '^(unit_comm|unit_deterministic|mpi_(comm|deterministic)_np[24])$'
      # --deterministic's lanes: micro-shards on the model's threads at once
      # (Note [lanes] in nn/device.hpp), and the pool under the kernels.
      GTEST_FILTER='Model.MicroShards*:Model.ResultsDoNotDependOnThreads:ThreadPool.*' \
        ctest --test-dir "$dir" --output-on-failure -R '^unit_nn$'
      unset TSAN_OPTIONS OPENBLAS_NUM_THREADS
      ;;
    *)
      echo "sanitize: unknown build '$kind' (asan, tsan)" >&2
      exit 2
      ;;
  esac
done
