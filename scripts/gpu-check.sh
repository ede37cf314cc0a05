#!/usr/bin/env bash
# The GPU tests and the GPU benchmark on a machine that has a GPU but neither
# Open MPI nor this project's build tools: everything is built here and
# carried there in one folder (default .devdeps, which .gitignore keeps out
# of the repo).
#
#   scripts/gpu-check.sh prepare [DIR]   here: Debian's Open MPI and OpenBLAS
#       (../shared/tools/device-bundle.sh), a CUDA build, the binaries the
#       GPU tests run, and the data subset, into DIR.
#   scripts/gpu-check.sh run [DIR] [OUT] there, in the repo root with DIR
#       in it: the GPU tests (test_cuda; mpi_test_cuda at the world sizes
#       CTest runs it; test_cli's GpuTraining.* but its two learning tests)
#       into OUT (default $OUT, else DIR/out): device.txt, tests.log,
#       summary.txt (a line per test binary); the exit status is the tests'.
#       The NCCL suites also run at np 2 and 4 on one GPU, each rank its
#       own host to NCCL (launch/nccl-host-per-rank), and whole ddp_train
#       runs of the kernels not yet proven over such ranks
#       (On/DeterministicNext.*, On/SyncBatchNorm.*/nccl_on_one_gpu).
#   scripts/gpu-check.sh learn [DIR] [OUT] there: GpuTraining's learning
#       tests (24 training runs), in a device call of their own.
#       GPU_TEST_KERNELS=next: test_cli's GPU runs (run, learn, nccl) with
#       --gpu-kernels next where a test names no --gpu-kernels.
#   scripts/gpu-check.sh nccl [DIR] [OUT] there: whole ddp_train runs over
#       NCCL ranks sharing the GPU (test_cli's */nccl_on_one_gpu and
#       NcclOnOneGpu.*): --deterministic bitwise at np 1, 2, 4 and across a
#       kill and a resume, compression and SyncBatchNorm, a killed, a stopped
#       and a misconfigured rank; within 5 minutes.
#   scripts/gpu-check.sh bench [DIR] [OUT] there: bench/compare_pytorch_gpu.sh
#       for ResNet-18 and LeNet, each precision against PyTorch's like
#       (fp32 against TF32 off, tf32 against its default, bf16 and fp16
#       against autocast + channels_last + cudnn.benchmark), on 20480
#       synthetic images (DDP_BENCH_IMAGES), into OUT/bench.txt, then
#       what `profile` does.
#   scripts/gpu-check.sh profile [DIR] [OUT] there: where ResNet-18's GPU
#       step goes, from --trace's GPU tracks (bench/gpu_kernels.py), for each
#       of GPU_PROFILE's flag sets (';'-separated), into OUT/profile.txt,
#       and each set's device time a step against plain fp32 into
#       OUT/profile-summary.txt; seconds, not Nsight's minutes. The first
#       set that fails and takes pieces of Note [next kernels] (the default,
#       proven, does; --gpu-kernels reference does not) is narrowed down to
#       the piece without which it passes (GPU_BISECT=0: not), and later
#       sets leave that piece out.
#   scripts/gpu-check.sh all [DIR] [OUT] there: one device call for a
#       whole lent session, as its machine goes back 30 s after a call:
#       the stages GPU_ALL_STAGES (default `run profile bench nccl`; bench
#       without its profile) one after another within GPU_ALL_S seconds
#       (default 560), run within GPU_RUN_S (240) and profile within
#       GPU_PROFILE_S (150) of them, each step bounded by what is left (its
#       exit status 1 where a stage failed or was not reached). OUT holds
#       all.txt (a line a stage), the stages' summaries (run-summary.txt,
#       profile-summary.txt, bench.txt, ...; each updated as the stage goes)
#       and, after each stage, logs.tgz (every log, no traces): what a call
#       stopped at its limit returns.
#       GPU_NCCL_FILTER (a gtest filter) runs a part of `nccl`. A piece
#       that the profile found failing is left out of the benchmark's runs
#       after it (GPU_NEXT_CUT).
#
# The test binaries carry the absolute paths they were built with (the
# ddp_train they start, the data, mpiexec); `run` makes those paths lead to
# DIR's copies where they do not exist there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:?usage: gpu-check.sh prepare|run|learn|bench|nccl|profile|all [DIR] [OUT]}
dir=$(realpath -m "${2:-$root/.devdeps}")

# What a step cut at its limit may leave behind: a test's training job
# runs in a session of its own (setsid) and mpirun's ranks in process
# groups of their own, beyond timeout's reach; they would hold the GPU
# through the steps after it. Only DIR's binaries and the Open MPI that
# device-env.sh unpacks (/opt/ddp-deps) are killed.
reap() {
  local p e
  for p in /proc/[0-9]*; do
    e=$(readlink "$p/exe" 2>/dev/null) || continue
    case $e in
    "$dir"/bin/* | /opt/ddp-deps/usr/bin/*)
      kill -9 "${p#/proc/}" 2>/dev/null || true
      ;;
    esac
  done
}

case $mode in
prepare)
  build=${DDP_BUILD_DIR:-$root/build}
  [[ -f $dir/device-env.sh ]] || "$root/../shared/tools/device-bundle.sh" "$dir"
  # ddp_train's TensorBoard writer links Protocol Buffers, which the bundle
  # does not carry.
  ls "$dir"/debs/libprotobuf32_*.deb >/dev/null 2>&1 || (cd "$dir/debs" && apt-get download libprotobuf32 >/dev/null)
  "$root/scripts/build.sh"
  mkdir -p "$dir/bin" "$dir/data"
  cp "$build/bin/ddp_train" "$build/tests/test_cuda" "$build/tests/mpi_test_cuda" "$build/tests/test_cli" "$dir/bin/"
  rm -rf "$dir/launch" && cp -r "$root/launch" "$dir/launch"
  data=$(realpath "$root/../shared/data/fashion-mnist-subset")
  cp "$data"/* "$dir/data/"
  # Where each binary will look, and what should be found there.
  {
    echo "$build/bin/ddp_train bin/ddp_train"
    echo "$data data"
    echo "$root/launch launch"
    echo "$(command -v mpiexec) mpiexec"
  } >"$dir/paths"
  echo "gpu-check: $(du -sh "$dir" | cut -f1) in $dir; there: scripts/gpu-check.sh run $(basename "$dir")"
  ;;
run | learn | bench | nccl | profile)
  out=$(realpath -m "${3:-${OUT:-$dir/out}}")
  mkdir -p "$out"
  # GPU_TEST_KERNELS: test_cli's GPU runs take --gpu-kernels this where a
  # test names none (e.g. `GPU_TEST_KERNELS=next ... learn`).
  if [[ -n ${GPU_TEST_KERNELS:-} ]]; then export DDP_TEST_GPU_KERNELS=$GPU_TEST_KERNELS; fi
  # shellcheck disable=SC1091
  source "$dir/device-env.sh" "$dir"
  while read -r path what; do
    target=$dir/$what
    [[ $what == mpiexec ]] && target=$(command -v mpiexec)
    if [[ ! -e $path ]]; then
      mkdir -p "$(dirname "$path")"
      ln -s "$target" "$path"
    fi
  done <"$dir/paths"
  # And where CUPTI is (--trace's GPU tracks, the profile's kernel tables).
  {
    nvidia-smi -L || echo "no nvidia-smi"
    date -u +%F
    ldconfig -p | grep -o 'libcupti.so[.0-9]* => .*' || true
    ls "$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || echo /nonexistent)"/*/lib/libcupti.so* \
      2>/dev/null || echo "no libcupti in Python's CUDA packages"
  } | tee "$out/device.txt"
  # A library missing there ends the call at once, naming it.
  missing=$(for b in "$dir"/bin/*; do ldd "$b" | sed -n "s|^\s*\(\S*\) => not found|$(basename "$b"): \1|p"; done)
  if [[ -n $missing ]]; then
    echo "gpu-check: libraries not found there:" "$missing" | tee -a "$out/device.txt" >&2
    exit 3
  fi
  # No step may hold the call past its limit: each check and benchmark run
  # has its own (seconds), and none runs past GPU_CHECK_DEADLINE (seconds
  # since the epoch, where set: `all`'s stage).
  step=${GPU_CHECK_STEP_S:-300}
  # The next step's limit; fails where under 10 s are left.
  limit() {
    local s=$step
    if [[ -n ${GPU_CHECK_DEADLINE:-} ]]; then
      local left=$((GPU_CHECK_DEADLINE - $(date +%s)))
      ((left < s)) && s=$left
    fi
    ((s >= 10)) && echo "$s"
  }
  # Flags $1 with pieces $2 (",-NAME,...") left out (Note [next kernels]):
  # of next where $1 takes next, else of proven, the default (step-graphs
  # is none of its pieces); the reference has none to leave out.
  without() {
    local f=$1 cut=$2
    case $f in
    *"--gpu-kernels next"*) echo "${f/--gpu-kernels next/--gpu-kernels next$cut}" ;;
    *"--gpu-kernels reference"*) echo "$f" ;;
    *)
      cut=${cut//,-step-graphs/}
      if [[ -z $cut ]]; then
        echo "$f"
      elif [[ $f == *"--gpu-kernels proven"* ]]; then
        echo "${f/--gpu-kernels proven/--gpu-kernels proven$cut}"
      else
        echo "$f --gpu-kernels proven$cut"
      fi
      ;;
    esac
  }
  # Under `all`: OUT's file $2 is this stage's $1 so far, so that a call
  # stopped in the middle of a stage still returns what the stage did.
  keep() {
    if [[ -n ${GPU_ALL_OUT:-} && -f $out/$1 ]]; then cp "$out/$1" "$GPU_ALL_OUT/$2"; fi
  }
  if [[ $mode == bench ]]; then
    # Within a device call's 10 minutes: ResNet-18 over fewer epochs.
    # GPU_BENCH: model:precision:reps:epochs[:our flags, comma-separated],
    # most wanted first (compare_pytorch_gpu.sh's pairs: each precision
    # against PyTorch's like).
    for spec in ${GPU_BENCH:-resnet18:fp32:1:3 resnet18:tf32:1:3:--cudnn-benchmark resnet18:bf16:1:3:--cudnn-benchmark,--channels-last resnet18:fp32:1:3:--channels-last resnet18:tf32:1:3:--cudnn-benchmark,--channels-last resnet18:fp16:1:3:--cudnn-benchmark,--channels-last lenet:fp16:3:5 lenet:bf16:3:5 lenet:fp32:3:5 resnet18:bf16:1:3:--cudnn-benchmark,--gpu-kernels,next,--channels-last}; do
      IFS=: read -r model p reps epochs flag <<<"$spec"
      flag=${flag//,/ }
      # GPU_NEXT_CUT: a piece of next that failed (`all`'s profile stage).
      flag=$(without "$flag" "${GPU_NEXT_CUT:-}")
      if ! bound=$(limit); then
        echo "bench $model $p ${flag:-}: not run, the call's time is spent" >>"$out/bench.txt"
        continue
      fi
      DDP_BENCH_IMAGES=${DDP_BENCH_IMAGES:-20480} DDP_TRAIN=$dir/bin/ddp_train timeout -k 10 "$bound" \
        "$root/bench/compare_pytorch_gpu.sh" --model "$model" --precision "$p" --ours "${flag:-}" "$reps" "$epochs" >>"$out/bench.txt" 2>&1 \
        || echo "bench $model $p ${flag:-} failed ($?)" >>"$out/bench.txt"
      keep bench.txt bench.txt
    done
    cat "$out/bench.txt"
  fi
  # The benchmark ends with the kernel breakdown of our step (not in `all`,
  # which profiles in a stage of its own).
  if [[ $mode == profile || ($mode == bench && ${GPU_BENCH_PROFILE:-1} == 1) ]]; then
    IFS=';' read -r -a sets <<<"${GPU_PROFILE:---precision fp32;--precision fp32 --gpu-kernels reference;--precision fp32 --channels-last;--precision tf32 --cudnn-benchmark;--precision tf32 --cudnn-benchmark --channels-last;--precision bf16 --cudnn-benchmark --channels-last;--precision bf16 --cudnn-benchmark --gpu-kernels next --channels-last;--deterministic --sync-bn;--deterministic --sync-bn --gpu-kernels reference}"
    # ResNet-18 with flags $1 (images $2), its output to $3.
    # A run is bounded by GPU_PROFILE_STEP_S (90 s: 5120 images take a
    # few seconds), so that one that hangs leaves the stage its time.
    resnet() {
      local bound
      bound=$(limit) || { echo "not run, the call's time is spent" >>"$3"; return 125; }
      ((bound > ${GPU_PROFILE_STEP_S:-90})) && bound=${GPU_PROFILE_STEP_S:-90}
      # shellcheck disable=SC2086
      timeout -k 10 "$bound" "$dir/bin/ddp_train" --device cuda --backend nccl --model resnet18 --synthetic "$2" \
        --epochs 1 --batch-size 256 --lr 0.1 --quiet $1 >>"$3" 2>&1
    }
    # Note [next kernels]: the first set that fails and takes pieces (all
    # but --gpu-kernels reference) is run again without halves of its
    # pieces (short runs) until one piece is left whose absence alone lets
    # it pass; later sets then leave that piece out too (cut), and say so in
    # their headers.
    cut=""
    bisect() {
      local flags=$1 scratch pieces half n
      scratch=$(mktemp)
      timeout -k 5 30 "$dir/bin/ddp_train" --gpu-kernels "next,-?" >"$scratch" 2>&1 || true
      read -r -a pieces <<<"$(sed -n 's/.*a kernel of next (\([^)]*\)).*/\1/p' "$scratch" | tr -d ' ' | tr ',' ' ')"
      # proven's pieces are next's but step-graphs.
      if [[ $flags != *"--gpu-kernels next"* ]]; then
        local p kept=()
        for p in "${pieces[@]}"; do [[ $p == step-graphs ]] || kept+=("$p"); done
        pieces=("${kept[@]}")
      fi
      if ((${#pieces[@]} == 0)); then
        echo "bisect: the pieces of next are not known ($(tail -1 "$scratch"))" >>"$out/profile.txt"
        rm -f "$scratch"
        return 1
      fi
      # The short untraced run must fail with all of next, or halving it
      # would name a piece that fails nothing; and pass with reference (no
      # piece), or the fault is not a piece's.
      : >"$scratch"
      local rc=0
      resnet "$flags" 1024 "$scratch" || rc=$?
      if ((rc == 0 || rc == 125 || rc == 124 || rc == 137)); then
        echo "bisect: not narrowed: ${flags} $(case $rc in 0) echo "passes in a short untraced run" ;; 125) echo "was not run: the call's time is spent" ;; *) echo "timed out: a hang is not halved" ;; esac)" >>"$out/profile.txt"
        rm -f "$scratch"
        return 1
      fi
      : >"$scratch"
      rc=0
      local ref="$flags --gpu-kernels reference"
      # shellcheck disable=SC2001
      [[ $flags == *"--gpu-kernels "* ]] && ref=$(sed 's/--gpu-kernels [^ ]*/--gpu-kernels reference/' <<<"$flags")
      resnet "$ref" 1024 "$scratch" || rc=$?
      if ((rc != 0)); then
        echo "bisect: not narrowed: ${flags} fails with --gpu-kernels reference too (exit $rc; $(tail -1 "$scratch"))" >>"$out/profile.txt"
        rm -f "$scratch"
        return 1
      fi
      while ((${#pieces[@]} > 1)); do
        n=$((${#pieces[@]} / 2))
        half=$(printf ',-%s' "${pieces[@]:0:n}")
        : >"$scratch"
        rc=0
        resnet "$(without "$flags" "$half")" 1024 "$scratch" || rc=$?
        if ((rc == 125 || rc == 124 || rc == 137)); then
          echo "bisect: stopped, $( ((rc == 125)) && echo "the call's time is spent" || echo "a run timed out") (left: ${pieces[*]})" >>"$out/profile.txt"
          rm -f "$scratch"
          return 1
        elif ((rc == 0)); then
          echo "bisect: passes without ${pieces[*]:0:n}" >>"$out/profile.txt"
          pieces=("${pieces[@]:0:n}")
        else
          echo "bisect: fails without ${pieces[*]:0:n} ($(tail -1 "$scratch"))" >>"$out/profile.txt"
          pieces=("${pieces[@]:n}")
        fi
      done
      : >"$scratch"
      if resnet "$(without "$flags" ",-${pieces[0]}")" 1024 "$scratch"; then
        echo "bisect: ${flags} fails, and passes without ${pieces[0]}" >>"$out/profile.txt"
        cut=",-${pieces[0]}"
      else
        echo "bisect: no one piece of next makes ${flags} fail ($(tail -1 "$scratch"))" >>"$out/profile.txt"
      fi
      rm -f "$scratch"
    }
    # Set $1 with flags $2, traced, its kernel table after it; 1 where the
    # run failed, 2 where it timed out (a hang is not halved), and each
    # set's median step so far into profile-summary.txt.
    profile_set() {
      echo "=== ResNet-18, batch 256, $2" >>"$out/profile.txt"
      local rc=0
      resnet "$2 --trace $out/p$1.json --trace-steps 10:14" 5120 "$out/profile.txt" || rc=$?
      if ((rc == 0)); then
        python3 "$root/bench/gpu_kernels.py" "$out/p$1.rank0.json" --top 40 >>"$out/profile.txt" 2>&1 || true
      elif ((rc != 125)); then  # 125: not run (said), nothing to narrow down
        echo "profile $2 failed (exit $rc$( ((rc == 124 || rc == 137)) && echo ": timed out"))" >>"$out/profile.txt"
      fi
      python3 "$root/bench/profile_summary.py" "$out/profile.txt" >"$out/profile-summary.txt" 2>&1 || true
      keep profile-summary.txt profile-summary.txt
      case $rc in
      0 | 125) return 0 ;;
      124 | 137) return 2 ;;
      *) return 1 ;;
      esac
    }
    bisected=0 hung=""
    for i in "${!sets[@]}"; do
      flags=$(without "${sets[i]}" "$cut")
      # After a set of next hung, the others of next would too, at 90 s
      # each: the sets of proven kernels get the time.
      if [[ -n $hung && $flags == *"--gpu-kernels next"* ]]; then
        echo "=== ResNet-18, batch 256, $flags" >>"$out/profile.txt"
        echo "profile $flags not run: $hung hung" >>"$out/profile.txt"
        continue
      fi
      rc=0
      profile_set "$i" "$flags" || rc=$?
      if ((rc == 2)) && [[ $flags == *"--gpu-kernels next"* ]]; then hung=$flags; fi
      ((rc == 1)) || continue
      if [[ $flags != *"--gpu-kernels reference"* && $bisected == 0 && ${GPU_BISECT:-1} == 1 ]]; then
        bisected=1
        bisect "$flags" || true
        echo "$cut" >"$out/next-cut.txt"
        if [[ -n $cut ]]; then profile_set "$i" "$(without "${sets[i]}" "$cut")" || true; fi
      fi
    done
    # Each set's median step against plain fp32 (--deterministic's target).
    python3 "$root/bench/profile_summary.py" "$out/profile.txt" >"$out/profile-summary.txt" 2>&1 || true
    cat "$out/profile.txt" "$out/profile-summary.txt"
    exit 0
  fi
  [[ $mode == bench ]] && exit 0
  # Each test binary's output into one log (what comes back from a device
  # machine is a few files), its verdict into the summary.
  status=0
  : >"$out/tests.log"
  : >"$out/summary.txt"
  check() {
    local name=$1 rc=0 log verdict=passed bound
    shift
    if ! bound=$(limit); then
      echo "$name: not run, the call's time is spent" | tee -a "$out/summary.txt"
      status=1
      return
    fi
    log=$(mktemp)
    timeout -k 10 "$bound" "$@" --gtest_color=no >"$log" 2>&1 || rc=$?
    { echo "=== $name: $*"; cat "$log"; } >>"$out/tests.log"
    # 77: every test skipped on every rank (mpi_gtest_main.cpp's verdict).
    if ((rc == 77)); then
      verdict=skipped
    elif ((rc == 124 || rc == 137)); then
      verdict="TIMED OUT after ${bound} s"
      status=1
      reap
    elif ((rc != 0)); then
      verdict="FAILED (exit $rc)"
      status=1
    fi
    echo "$name: $verdict; $(grep -h -E '^\[ +(PASSED|SKIPPED|FAILED) +\] ([0-9]+ test|[A-Za-z])' "$log" | sort -u \
      | tr '\n' ' ')" | tee -a "$out/summary.txt"
    rm -f "$log"
    keep summary.txt "${GPU_ALL_STAGE:-stage}-summary.txt"
  }
  learning=GpuTraining.Bf16AndFp16LearnAsFp32:GpuTraining.GradCompressionHalvesTheBytesAndLearnsAsFp32
  if [[ $mode == learn ]]; then
    check GpuTraining-learning "$dir/bin/test_cli" --gtest_filter="$learning"
    exit $status
  fi
  if [[ $mode == nccl ]]; then
    # GPU_NCCL_FILTER: a part of them (a gtest filter).
    check NcclOnOneGpu "$dir/bin/test_cli" \
      --gtest_filter="${GPU_NCCL_FILTER:-On/Deterministic.*/nccl_on_one_gpu:On/Reliability.*/nccl_on_one_gpu:NcclOnOneGpu.*}"
    exit $status
  fi
  check test_cuda "$dir/bin/test_cuda"
  # The world sizes tests/CMakeLists.txt runs each GPU MPI suite at.
  for run in GpuNccl:1 GpuNccl:2 GpuStagedMpi:2 GpuStagedMpi:4 GpuDeterministic:1 GpuDeterministic:2 \
             GpuDeterministic:4 GpuLossScale:1 GpuLossScale:2; do
    check "mpi_${run%:*}_np${run#*:}" mpirun -np "${run#*:}" --oversubscribe --bind-to none "$dir/bin/mpi_test_cuda" \
      --gtest_filter="${run%:*}.*"
  done
  # NCCL at more ranks than GPUs: each rank its own host to NCCL.
  for run in GpuNccl:2 GpuNccl:4 GpuDeterministic:4; do
    check "mpi_${run%:*}_np${run#*:}_nccl_on_one_gpu" mpirun -np "${run#*:}" --oversubscribe --bind-to none \
      "$dir/launch/nccl-host-per-rank" "$dir/bin/mpi_test_cuda" --gtest_filter="${run%:*}.*"
  done
  check GpuTraining "$dir/bin/test_cli" --gtest_filter="GpuTraining.*:-$learning"
  # Whole runs of the kernels not yet proven over NCCL ranks sharing the GPU.
  check NcclOnOneGpu-next "$dir/bin/test_cli" \
    --gtest_filter='On/DeterministicNext.*:On/SyncBatchNorm.*/nccl_on_one_gpu:On/StepGraphs.*'
  exit $status
  ;;
all)
  out=$(realpath -m "${3:-${OUT:-$dir/out}}")
  work=$(mktemp -d)
  mkdir -p "$out"
  : >"$out/all.txt"
  deadline=$(($(date +%s) + ${GPU_ALL_S:-560}))
  failed=0
  for stage in ${GPU_ALL_STAGES:-run profile bench nccl}; do
    left=$((deadline - $(date +%s)))
    if ((left < 30)); then
      echo "$stage: not run, ${left} s left" | tee -a "$out/all.txt"
      failed=1
      continue
    fi
    began=$SECONDS rc=0
    # A stage may take its share (GPU_RUN_S, GPU_PROFILE_S: a hang in one
    # must leave the benchmark its time) or what is left, whichever is
    # less. Each step of the stage ends by the stage's deadline (limit);
    # the stage's own timeout is only the backstop.
    case $stage in
    run) cap=${GPU_RUN_S:-240} ;;
    profile) cap=${GPU_PROFILE_S:-150} ;;
    *) cap=$left ;;
    esac
    ((cap > left)) && cap=$left
    next_cut=$(cat "$work/profile/next-cut.txt" 2>/dev/null || true)
    GPU_CHECK_DEADLINE=$(($(date +%s) + cap)) GPU_BENCH_PROFILE=0 GPU_NEXT_CUT=$next_cut GPU_ALL_OUT=$out \
      GPU_ALL_STAGE=$stage timeout -k 5 $((cap + 10)) "$0" "$stage" "$dir" "$work/$stage" >"$work/$stage.txt" 2>&1 \
      || rc=$?
    ((rc == 0)) || failed=1
    reap
    echo "$stage: exit $rc after $((SECONDS - began)) s" | tee -a "$out/all.txt"
    [[ -f $work/$stage/summary.txt ]] && cp "$work/$stage/summary.txt" "$out/$stage-summary.txt"
    for f in profile-summary.txt bench.txt; do
      [[ -f $work/$stage/$f ]] && cp "$work/$stage/$f" "$out/$f"
    done
    # Written aside, then moved: a call stopped while it is written keeps
    # the last stage's archive.
    if tar czf "$out/logs.tgz.part" --exclude='*.json' -C "$work" .; then
      mv "$out/logs.tgz.part" "$out/logs.tgz"
    else
      echo "logs.tgz: tar exit $?" >>"$out/all.txt"
    fi
  done
  cat "$out"/*summary.txt "$out"/bench.txt 2>/dev/null || true
  exit "$failed"
  ;;
*)
  echo "gpu-check.sh: prepare, run, learn, bench, nccl, profile or all, not '$mode'" >&2
  exit 2
  ;;
esac
