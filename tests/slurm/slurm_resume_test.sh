#!/usr/bin/env bash
# End to end under a real (local) Slurm: a job of launch/slurm/ddp_train.sbatch
# on 2 nodes x 2 ranks is scancel'ed after it wrote a checkpoint, the same
# submission is made again, and the resumed job's final parameters must equal,
# bitwise, those of the same job run without interruption. Also: the mpirun
# variant (launch/slurm/ddp_train_mpirun.sbatch), uninterrupted, gives the
# same parameters too.
#
# The cluster (slurm_up.sh) is munged + slurmctld + two slurmd as nodes n1 and
# n2, all on this machine, all under a fresh scratch directory, and is always
# stopped (slurm_down.sh, by recorded pid) however the test ends. Every wait
# is bounded; the whole test gives up after DDP_SLURM_TEST_DEADLINE seconds
# (default 240), below CTest's TIMEOUT so that the cleanup still runs.
#
# Bitwise equality is expected: same world size, same placement of ranks on
# nodes, same transport, so every all-reduce adds in the same order, and the
# resume restores parameters, momentum, sampler position and step exactly.
#
# Why OMPI_MCA_btl=self,tcp: both fake nodes are this one host, and Open MPI's
# shared-memory transport (vader) names its backing files after the host name,
# the job and the local rank; with 2 ranks per fake node the files of n1's and
# n2's ranks collide and ranks crash. TCP has no such files. On a real cluster
# nodes have distinct host names and this setting is not needed.
#
# Usage: slurm_resume_test.sh DDP_TRAIN      (needs root: exit 77 = skipped)
#   DDP_SLURM_TEST_KEEP=1 keeps the scratch directory (logs, checkpoints).
set -uo pipefail
bin=$(readlink -f "${1:?usage: slurm_resume_test.sh DDP_TRAIN}")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
deadline=$((SECONDS + ${DDP_SLURM_TEST_DEADLINE:-240}))

fail() { echo "FAIL: slurm_resume: $*"; exit 1; }
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: slurm_resume needs root (slurmd, munged as user munge)"
  exit 77
fi
for exe in sbatch squeue scontrol scancel; do
  command -v $exe >/dev/null || fail "$exe missing: install slurm-wlm and munge (scripts/install-deps.sh)"
done
[[ -x $bin ]] || fail "$bin is not an executable"
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  fail "needs Debian's python3 with numpy (scripts/install-deps.sh)"
fi

scratch=$(mktemp -d /tmp/ddp-slurm-test.XXXXXX)
cleanup() {
  local rc=$?
  "$here/slurm_down.sh" "$scratch" >"$scratch.down.log" 2>&1 \
    || { echo "slurm_resume: slurm_down reported:"; cat "$scratch.down.log"; rc=1; }
  rm -f "$scratch.down.log"
  if ((rc != 0)); then
    echo "slurm_resume: logs of the failed run:"
    for f in "$scratch"/work/*.out "$scratch"/log/slurmctld.log; do
      [[ -f $f ]] && { echo "---- $f"; tail -n 40 "$f"; }
    done
  fi
  if [[ -n ${DDP_SLURM_TEST_KEEP:-} ]]; then echo "slurm_resume: kept $scratch"; else rm -rf "$scratch"; fi
  exit $rc
}
trap cleanup EXIT
trap 'echo "FAIL: slurm_resume: interrupted"; exit 1' INT TERM

# Ports: the first free base from a pseudo-random start, so that two runs at
# once (two checkouts testing on one machine) do not meet; a port taken
# between the check and slurmctld's bind makes slurm_up fail, and we retry.
up=0
for _ in 1 2 3 4 5; do
  base=$((20000 + (RANDOM % 400) * 10))
  if DDP_SLURM_PORT_BASE=$base "$here/slurm_up.sh" "$scratch" >"$scratch/up.log" 2>&1; then
    up=1
    break
  fi
  "$here/slurm_down.sh" "$scratch" >/dev/null 2>&1
done
((up)) || { cat "$scratch/up.log"; fail "the Slurm cluster did not come up"; }
cat "$scratch/up.log"
export SLURM_CONF=$scratch/slurm.conf

# What every job gets from this environment (sbatch passes it on).
export OMPI_MCA_btl=self,tcp
export DDP_TRAIN=$bin
# Open MPI's session directories under a TMPDIR of our own: job ids restart at
# 1 in every test cluster, so two runs at once would share /tmp/ompi.* names.
export TMPDIR=$scratch/tmp
mkdir -p "$TMPDIR" "$scratch/work"
cd "$scratch/work" || fail "cannot enter $scratch/work"

# 48 steps per epoch, 144 in all; a checkpoint every 8 steps. Momentum makes
# the optimizer state part of what a resume must restore.
train=(--synthetic 3072 --batch-size 64 --epochs 3 --lr 0.05 --momentum 0.9 --seed 3
       --checkpoint-every 8)
total_steps=144
shape=(-N 2 --ntasks-per-node=2)

left() { echo $((deadline - SECONDS)); }
# job_state ID: JobState of a job slurmctld still knows (MinJobAge 600 s).
# Client commands are bounded too: a stuck slurmctld must not hang the test.
job_state() { timeout 20 scontrol show job -o "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
job_field() { timeout 20 scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
# wait_job ID: until the job has ended and its nodes are free again.
wait_job() {
  local st
  while ((SECONDS < deadline)); do
    st=$(job_state "$1")
    case $st in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)
        if ! timeout 20 scontrol show job -o "$1" | grep -q 'COMPLETING'; then echo "$st"; return 0; fi ;;
    esac
    sleep 0.3
  done
  echo "TIMEOUT_WAITING(last state ${st:-unknown})"
  return 1
}
submit() {  # submit NAME SCRIPT ARGS...: prints the job id
  local name=$1 script=$2
  shift 2
  timeout 30 sbatch --parsable "${shape[@]}" --job-name="$name" -o "$scratch/work/%x-%j.out" "$script" "$@" \
    | cut -d';' -f1
}
t0=$SECONDS

# 1. The reference: the same job, never interrupted.
ref=$(submit reference "$repo/launch/slurm/ddp_train.sbatch" "${train[@]}" --output-model ref.safetensors) \
  || fail "sbatch of the reference job failed"
st=$(wait_job "$ref") || fail "reference job $ref: $st after $((SECONDS - t0)) s"
[[ $st == COMPLETED && $(job_field "$ref" ExitCode) == 0:0 ]] \
  || fail "reference job $ref ended $st, exit $(job_field "$ref" ExitCode)"
[[ -f ref.safetensors ]] || fail "reference job wrote no ref.safetensors"
[[ -d checkpoints/reference ]] \
  || fail "no default checkpoint directory checkpoints/reference under the submit directory"
echo "slurm_resume: reference job $ref done at $((SECONDS - t0)) s"

# 2. The same job, cancelled as soon as its first checkpoint exists.
job1=$(submit resumed "$repo/launch/slurm/ddp_train.sbatch" "${train[@]}" --output-model resumed.safetensors) \
  || fail "sbatch of the first job failed"
while ((SECONDS < deadline)); do
  compgen -G "checkpoints/resumed/ckpt-*.safetensors" >/dev/null && break
  st=$(job_state "$job1")
  [[ $st == PENDING || $st == RUNNING ]] || fail "job $job1 ended ($st) before it wrote a checkpoint"
  sleep 0.1
done
compgen -G "checkpoints/resumed/ckpt-*.safetensors" >/dev/null || fail "no checkpoint from job $job1 in time"
timeout 20 scancel "$job1" || fail "scancel $job1 failed"
st=$(wait_job "$job1") || fail "job $job1 after scancel: $st"
[[ $st == CANCELLED ]] || fail "job $job1 ended $st, not CANCELLED: it finished before scancel reached it"
[[ ! -e resumed.safetensors ]] || fail "job $job1 wrote its final model although it was cancelled"
log1=resumed-$job1.out
grep -q '"event":"summary"' "$log1" && fail "job $job1 finished its training although it was cancelled"
grep -q 'ddp_train: stopped by signal' "$log1" \
  || fail "job $job1: no 'stopped by signal' line (the ranks did not checkpoint on SIGTERM)"
newest=$(printf '%s\n' checkpoints/resumed/ckpt-*.safetensors | sort | tail -n 1)
step=$((10#$(basename "$newest" .safetensors | sed 's/ckpt-//')))
((step > 0 && step < total_steps)) || fail "newest checkpoint $newest is not mid-run (0 < step < $total_steps)"
echo "slurm_resume: job $job1 cancelled at step $step of $total_steps ($(grep -o 'stopped by signal [0-9]*' "$log1")), at $((SECONDS - t0)) s"

# 3. The same submission again: it must resume and finish.
job2=$(submit resumed "$repo/launch/slurm/ddp_train.sbatch" "${train[@]}" --output-model resumed.safetensors) \
  || fail "sbatch of the second job failed"
st=$(wait_job "$job2") || fail "job $job2: $st"
[[ $st == COMPLETED && $(job_field "$job2" ExitCode) == 0:0 ]] \
  || fail "job $job2 ended $st, exit $(job_field "$job2" ExitCode)"
grep -q "ddp_train: resuming from $PWD/checkpoints/resumed/ckpt-0*$step.safetensors" "resumed-$job2.out" \
  || fail "job $job2 did not resume from $newest"
echo "slurm_resume: job $job2 resumed from step $step and finished at $((SECONDS - t0)) s"

# 4. The mpirun variant of the script, uninterrupted, same shape.
job3=$(submit mpirun "$repo/launch/slurm/ddp_train_mpirun.sbatch" "${train[@]}" --output-model mpirun.safetensors) \
  || fail "sbatch of the mpirun job failed"
st=$(wait_job "$job3") || fail "mpirun job $job3: $st"
[[ $st == COMPLETED && $(job_field "$job3" ExitCode) == 0:0 ]] \
  || fail "mpirun job $job3 ended $st, exit $(job_field "$job3" ExitCode)"
echo "slurm_resume: mpirun job $job3 done at $((SECONDS - t0)) s"

echo "slurm_resume: resumed vs reference:"
/usr/bin/python3 "$here/compare_models.py" ref.safetensors resumed.safetensors \
  || fail "the resumed job's parameters differ from the uninterrupted job's"
echo "slurm_resume: mpirun variant vs reference:"
/usr/bin/python3 "$here/compare_models.py" ref.safetensors mpirun.safetensors \
  || fail "the mpirun variant's parameters differ from the srun job's"
echo "PASS: slurm_resume: cancelled at step $step/$total_steps, resumed, bitwise equal to the uninterrupted job; mpirun variant equal too ($((SECONDS - t0)) s of jobs, $SECONDS s in all, $(left) s to spare)"
