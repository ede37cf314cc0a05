#!/usr/bin/env bash
# Fuzzes the readers of untrusted files with libFuzzer (tests/fuzz):
#   scripts/fuzz.sh [seconds per target, default 60] [target...]
# Targets: idx idx_gzip safetensors checkpoint (default: all, one after
# another). Builds build-fuzz (clang, ASan+UBSan, $DDP_FUZZ_BUILD_DIR) when
# needed, makes the seed corpora from real files (the Fashion-MNIST subset,
# and a model file and checkpoints of a short ddp_train run), then runs each
# target. A crash, a sanitizer report, an input that takes more than 10 s, or
# an allocation of more than 64 MiB (inputs are at most 16 KiB: such an
# allocation trusts a size the file only claims) is a finding: the input is
# kept under build-fuzz/fuzz/findings/<target>/ and the script exits 1 after
# the last target. What to do with one: tests/fuzz/README.md.
# DDP_FUZZ_RUNS=N runs each target for N executions instead of a time.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DDP_FUZZ_BUILD_DIR:-$root/build-fuzz}
data=${DDP_DATA_DIR:-$root/../shared/data/fashion-mnist-subset}
work=$build/fuzz
seconds=${1:-60}
if (($# > 0)); then shift; fi
all=(idx idx_gzip safetensors checkpoint)
targets=("$@")
((${#targets[@]})) || targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (known: ${all[*]})" >&2; exit 2; }
done
jobs=$(($(nproc) < 2 ? $(nproc) : 2))

# --- build ---------------------------------------------------------------------
if [[ ! -f $build/CMakeCache.txt ]]; then
  mkdir -p "$build"
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDP_CUDA=OFF \
    -DDDP_FUZZ=ON >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j "$jobs" --target fuzz_shrink_tensors "${all[@]/#/fuzz_}" >"$build/build.log" 2>&1 \
  || { tail -50 "$build/build.log"; exit 1; }

# --- seeds ---------------------------------------------------------------------
# From the subset's files: two images and two labels with their header
# rewritten to say 2 (the harness's partner files hold 2 items), raw and
# gzipped; and the real files cut short, raw and gzipped.
seeds=$work/seeds
rm -rf "$seeds"
mkdir -p "$seeds"/{idx,idx_gzip,safetensors,checkpoint} "$work/tmp"
gunzip -c "$data/train-images-idx3-ubyte.gz" >"$work/tmp/images" 2>/dev/null || true
gunzip -c "$data/train-labels-idx1-ubyte.gz" >"$work/tmp/labels" 2>/dev/null || true
[[ -s $work/tmp/images && -s $work/tmp/labels ]] || { echo "fuzz: no IDX files in $data (DDP_DATA_DIR)" >&2; exit 1; }
s=$seeds/idx
{ printf '\x00\x00\x08\x03\x00\x00\x00\x02\x00\x00\x00\x1c\x00\x00\x00\x1c'; head -c $((16 + 1568)) "$work/tmp/images" | tail -c 1568; } >"$s/images-2"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x02'; head -c $((8 + 2)) "$work/tmp/labels" | tail -c 2; } >"$s/labels-2"
gzip -9 -n -c "$s/images-2" >"$s/images-2.gz"
gzip -9 -n -c "$s/labels-2" >"$s/labels-2.gz"
head -c 600 "$work/tmp/images" >"$s/images-cut"
head -c 100 "$work/tmp/labels" >"$s/labels-cut"
head -c 2000 "$data/train-images-idx3-ubyte.gz" >"$s/images-cut.gz"
cp "$data/t10k-labels-idx1-ubyte.gz" "$s/labels-test.gz"
chmod u+w "$s/labels-test.gz"
# idx_gzip: a layout byte (idx_gzip_fuzz.cpp), then the content.
for mode in 00 01 02 07 20; do
  for f in images-2 labels-2; do
    { printf "\\x$mode"; cat "$s/$f"; } >"$seeds/idx_gzip/$f-$mode"
  done
done
# From a short training run: its model file and checkpoints (one mid-epoch,
# with SGD's momentum buffers), cut short, and with tensors shrunk.
run=$work/run
if [[ ! -s $run/model.safetensors ]]; then
  train=${DDP_TRAIN:-${DDP_BUILD_DIR:-$root/build}/bin/ddp_train}
  if [[ ! -x $train ]]; then
    cmake --build "$build" -j "$jobs" --target ddp_train_exe >>"$build/build.log" 2>&1 \
      || { tail -50 "$build/build.log"; exit 1; }
    train=$build/bin/ddp_train
  fi
  rm -rf "$run"
  mkdir -p "$run"
  ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$train" --data-dir "$data" --epochs 1 --train-limit 256 --batch-size 128 --momentum 0.9 \
    --checkpoint-dir "$run/ckpt" --checkpoint-every 1 --output-model "$run/model.safetensors" --quiet \
    >"$run/train.log" 2>&1 || { cat "$run/train.log"; exit 1; }
fi
shrink=$build/tests/fuzz/fuzz_shrink_tensors
"$shrink" "$run/model.safetensors" "$seeds/safetensors/model-shrunk"
"$shrink" "$run/model.safetensors" "$seeds/safetensors/model-shrunk-0" 0
head -c 4096 "$run/model.safetensors" >"$seeds/safetensors/model-cut"
i=0
for c in "$run"/ckpt/ckpt-*.safetensors; do
  i=$((i + 1))
  "$shrink" "$c" "$seeds/checkpoint/ckpt-$i-shrunk"
  head -c 4096 "$c" >"$seeds/checkpoint/ckpt-$i-cut"
done
cp "$seeds/safetensors/model-shrunk" "$seeds/checkpoint/"

# --- run -----------------------------------------------------------------------
declare -A max_len=([idx]=8192 [idx_gzip]=8192 [safetensors]=16384 [checkpoint]=16384)
declare -A dict=([safetensors]=safetensors.dict [checkpoint]=safetensors.dict)
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus=$work/corpus/$t findings=$work/findings/$t log=$work/logs/$t.log
  mkdir -p "$corpus" "$findings" "$work/logs"
  dirs=("$corpus" "$seeds/$t" "$root/tests/fuzz/regressions/$t")
  limit=(-max_total_time="$seconds")
  what="$seconds s"
  if [[ -n ${DDP_FUZZ_RUNS:-} ]]; then
    limit=(-runs="$DDP_FUZZ_RUNS")
    what="$DDP_FUZZ_RUNS executions"
  fi
  extra=()
  [[ -n ${dict[$t]:-} ]] && extra+=(-dict="$root/tests/fuzz/${dict[$t]}")
  echo "fuzz: $t: $what (log: $log)"
  rc=0
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/tests/fuzz/fuzz_$t" "${limit[@]}" -max_len="${max_len[$t]}" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=64 -print_final_stats=1 -artifact_prefix="$findings/" "${extra[@]}" "${dirs[@]}" \
    >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  if ((rc != 0)); then
    failed+=("$t")
    grep -E '^(==[0-9]+==ERROR|fuzz: finding|SUMMARY|.*runtime error|artifact_prefix|Test unit written)' "$log" \
      | head -20 || tail -30 "$log"
    summary+=("$t: FINDING after ${execs:-?} executions (input kept in $findings/; log $log)")
  else
    summary+=("$t: ${execs:-?} executions, no finding")
  fi
done
printf 'fuzz: %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
