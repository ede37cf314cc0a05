#!/usr/bin/env bash
# The MPI test main's exit status is the process's verdict (Note [process
# verdict] in tests/mpi/mpi_gtest_main.cpp): a test that fails beside one that
# skips must fail the process, and only a process whose every test skipped may
# report "skipped" (77) to CTest.
# Usage: verdict_test.sh MPIEXEC VERDICT_SELFTEST
set -uo pipefail
mpiexec=$1 bin=$2
failures=0
expect() {  # expect STATUS WHAT ENV... -- ARGS...
  local want=$1 what=$2; shift 2
  local envs=()
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" "$mpiexec" -n 2 --oversubscribe --bind-to none -x DDP_VERDICT -x DDP_VERDICT_RANK \
    "$bin" "$@" >/dev/null 2>&1
  local got=$?
  if [[ $got -eq $want ]]; then
    echo "ok: $what: exit $got"
  else
    echo "FAIL: $what: exit $got, expected $want"
    failures=$((failures + 1))
  fi
}
expect 77 "every test skipped" DDP_VERDICT=skip DDP_VERDICT_RANK=0 --
expect 0 "one test passed, one skipped" DDP_VERDICT=pass DDP_VERDICT_RANK=0 --
expect 1 "one test failed on rank 0, one skipped" DDP_VERDICT=fail DDP_VERDICT_RANK=0 --
expect 1 "one test failed on rank 1 only, one skipped" DDP_VERDICT=fail DDP_VERDICT_RANK=1 --
expect 1 "a filter that matches no test" DDP_VERDICT=pass DDP_VERDICT_RANK=0 -- --gtest_filter='NoSuchSuite.*'
exit $((failures > 0))
