#!/usr/bin/env bash
# Stops the cluster slurm_up.sh SCRATCH started: cancels its jobs (so that no
# slurmstepd or rank outlives the daemons), then SIGTERM to each pid recorded
# in SCRATCH/run (both slurmd, then slurmctld, then munged), waiting for them
# to exit and SIGKILL after 15 s. A pid is signalled only while it still runs the
# program it was recorded for (a recycled pid is left alone). Nothing is
# stopped by name. Safe to run twice, or after a partial start.
# Usage: slurm_down.sh SCRATCH
set -uo pipefail
scratch=${1:?usage: slurm_down.sh SCRATCH}
S=$(cd "$scratch" 2>/dev/null && pwd) || { echo "slurm_down: no $scratch"; exit 0; }
status=0

alive() {  # alive PIDFILE EXE: prints the pid when it runs EXE
  local pid exe
  exe=$(readlink -f "$2")  # Debian's slurmd is an alternatives link to slurmd-wlm
  [[ -f $1 ]] || return 1
  pid=$(cat "$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$exe" ]] || return 1
  echo "$pid"
}

# Jobs first, while slurmctld and slurmd can still end them.
if [[ -f $S/slurm.conf ]] && alive "$S/run/slurmctld.pid" /usr/sbin/slurmctld >/dev/null; then
  export SLURM_CONF=$S/slurm.conf
  jobs=$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ')
  if [[ -n ${jobs// /} ]]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 60); do
      [[ -z $(timeout 10 squeue -h -o '%i' 2>/dev/null) ]] && break
      sleep 0.5
    done
    left=$(timeout 10 squeue -h -o '%i %T' 2>/dev/null | tr '\n' ' ')
    if [[ -n $left ]]; then
      echo "slurm_down: jobs still in the queue after 30 s: $left" >&2
      status=1
    fi
  fi
fi

stop() {  # stop EXE NAME...: SIGTERM to each, then wait for all of them
  local exe=$1 pid pids=() names=() i
  shift
  for name in "$@"; do
    pid=$(alive "$S/run/$name.pid" "$exe") || continue
    kill -TERM "$pid" 2>/dev/null
    pids+=("$pid")
    names+=("$name")
  done
  for _ in $(seq 150); do
    for i in "${!pids[@]}"; do
      kill -0 "${pids[$i]}" 2>/dev/null || { unset "pids[$i]"; }
    done
    ((${#pids[@]} == 0)) && return 0
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    echo "slurm_down: ${names[$i]} (pid ${pids[$i]}) still running 15 s after SIGTERM; SIGKILL" >&2
    kill -KILL "${pids[$i]}" 2>/dev/null
  done
  sleep 0.5
  status=1
}
stop /usr/sbin/slurmd slurmd-n1 slurmd-n2
stop /usr/sbin/slurmctld slurmctld
stop /usr/sbin/munged munged
exit $status
