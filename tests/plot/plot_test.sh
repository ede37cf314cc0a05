#!/usr/bin/env bash
# ddp_plot end to end: two short runs of ddp_train on the real subset (np 1
# and np 2) with --metrics-out, their curves plotted, and a benchmark file
# built from the runs' rates plotted as bars. Each SVG is rendered by headless
# Chromium (Debian's chromium; as root it needs --no-sandbox), and the
# screenshot, the browser's DOM and ddp_plot's own PNG are checked by
# check_chart.py: not blank, every legend label present as text, each run's
# colour on its swatch and in the plotting areas. The checker must also reject
# a missing label and a blank image, and ddp_plot's errors must name the file
# and line at fault.
# Usage: plot_test.sh MPIEXEC DDP_TRAIN DDP_PLOT DATA_DIR
set -euo pipefail
mpiexec=$1 train=$2 plot=$3 data=$4
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's, with python3-numpy and python3-pil
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# Not a skip: without a browser this test has nothing to show, and CI installs
# it (scripts/install-deps.sh).
command -v chromium >/dev/null || fail "chromium is not installed (scripts/install-deps.sh installs it)"
$py -c 'import numpy, PIL' 2>/dev/null || fail "$py lacks numpy or PIL (python3-numpy, python3-pil)"

check() { $py "$here/check_chart.py" "$@"; }

# SVG -> PNG screenshot and DOM dump, at device scale 2 as ddp_plot's PNG.
chromium_render() {  # SVG OUT_PNG OUT_DOM
  local size
  size=$($py -c 'import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot()
print("%d,%d" % (round(float(r.get("width"))), round(float(r.get("height")))))' "$1")
  local flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$dir/chromium"
               --force-device-scale-factor=2)
  timeout 120 chromium "${flags[@]}" --window-size="$size" --screenshot="$2" "file://$1" >"$dir/chromium.log" 2>&1 \
    || { cat "$dir/chromium.log"; fail "chromium --screenshot of $1"; }
  [[ -s $2 ]] || { cat "$dir/chromium.log"; fail "chromium wrote no screenshot of $1"; }
  timeout 120 chromium "${flags[@]}" --dump-dom "file://$1" >"$3" 2>"$dir/chromium.log" \
    || { cat "$dir/chromium.log"; fail "chromium --dump-dom of $1"; }
}

# A few seconds each: 512 images, 8 steps an epoch, 3 epochs.
for np in 1 2; do
  "$mpiexec" -np $np --oversubscribe --bind-to none "$train" --data-dir "$data" --train-limit 512 \
    --batch-size 64 --lr 0.1 --epochs 3 --metrics-out "$dir/np$np.jsonl" --quiet >"$dir/np$np.out"
  [[ $(grep -c . "$dir/np$np.jsonl") == 3 ]] || fail "np $np: expected 3 records in $dir/np$np.jsonl"
done

# Curves: the label of np1 is the file's stem, np 2's is given.
"$plot" -o "$dir/curves" --title "np 1 and np 2, 3 epochs" "$dir/np1.jsonl" "2 ranks=$dir/np2.jsonl"
chromium_render "$dir/curves.svg" "$dir/curves.chromium.png" "$dir/curves.dom"
check "$dir/curves.svg" "$dir/curves.chromium.png" --dom "$dir/curves.dom" --label np1 --label "2 ranks"
check "$dir/curves.svg" "$dir/curves.png" --label np1 --label "2 ranks"

# Bars: ddp_train's measured rates beside made-up ones of another system.
$py - "$dir" >"$dir/bench.jsonl" <<'PY'
import json, sys
for np in (1, 2):
    s = json.loads(open(f"{sys.argv[1]}/np{np}.out").read().strip().splitlines()[-1])
    r = s["samples_per_sec"]
    print(json.dumps({"model": "lenet", "np": np, "samples_per_sec": {"ddp_train": r, "other (made up)": r / 3}}))
print(json.dumps({"model": "resnet18", "np": 1, "samples_per_sec": {"ddp_train": 73.2, "other (made up)": 52.8}}))
PY
"$plot" --bench "$dir/bench.jsonl" -o "$dir/bars"
chromium_render "$dir/bars.svg" "$dir/bars.chromium.png" "$dir/bars.dom"
check "$dir/bars.svg" "$dir/bars.chromium.png" --dom "$dir/bars.dom" --label ddp_train --label "other (made up)"
check "$dir/bars.svg" "$dir/bars.png" --label ddp_train --label "other (made up)"

# The checks can fail: a label that is not there, a blank image, a run whose
# colour is absent.
if check "$dir/curves.svg" "$dir/curves.png" --label np1 --label np3 >"$dir/neg.log"; then
  fail "the checker accepted a missing label"
fi
grep -q "expected \['np1', 'np3'\]" "$dir/neg.log" || { cat "$dir/neg.log"; fail "missing label: wrong complaint"; }
$py -c 'import sys; from PIL import Image; Image.new("RGB", Image.open(sys.argv[1]).size, "white").save(sys.argv[2])' \
  "$dir/curves.png" "$dir/blank.png"
if check "$dir/curves.svg" "$dir/blank.png" --label np1 --label "2 ranks" >"$dir/neg.log"; then
  fail "the checker accepted a blank image"
fi
grep -q "nearly blank" "$dir/neg.log" || { cat "$dir/neg.log"; fail "blank image: wrong complaint"; }
$py - "$dir/curves.png" "$dir/recoloured.png" <<'PY'
import sys
import numpy as np
from PIL import Image
img = np.asarray(Image.open(sys.argv[1]).convert("RGB")).copy()
orange = (np.abs(img.astype(int) - [0xff, 0x7f, 0x0e]).sum(axis=2) < 120)
img[orange] = [0x80, 0x80, 0x80]
Image.fromarray(img).save(sys.argv[2])
PY
if check "$dir/curves.svg" "$dir/recoloured.png" --label np1 --label "2 ranks" >"$dir/neg.log"; then
  fail "the checker accepted a chart without the second run's colour"
fi
grep -q "'2 ranks'" "$dir/neg.log" || { cat "$dir/neg.log"; fail "absent colour: wrong complaint"; }

# Errors name the file, and the line where one is at fault; exit status 1.
expect_error() {  # PATTERN ddp_plot-args...
  local pattern=$1 rc=0
  shift
  "$plot" "$@" >"$dir/err.out" 2>"$dir/err.log" || rc=$?
  ((rc == 1)) || fail "ddp_plot $*: exit $rc, expected 1"
  grep -qF -- "$pattern" "$dir/err.log" || { cat "$dir/err.log"; fail "ddp_plot $*: no '$pattern'"; }
}
expect_error "ddp_plot: error: $dir/absent.jsonl: cannot open" -o "$dir/x" "$dir/absent.jsonl"
{ head -n 2 "$dir/np1.jsonl"; echo '{"epoch": 3, "train_loss": 1.0}'; } >"$dir/lacking.jsonl"
expect_error "$dir/lacking.jsonl:3: no \"test_acc\" in this record" -o "$dir/x" "$dir/lacking.jsonl"
{ head -n 1 "$dir/np1.jsonl"; echo 'epoch 2 loss 0.9'; } >"$dir/text.jsonl"
expect_error "$dir/text.jsonl:2: not a JSON line" -o "$dir/x" "$dir/text.jsonl"
: >"$dir/empty.jsonl"
expect_error "$dir/empty.jsonl: no records" -o "$dir/x" "$dir/empty.jsonl"
expect_error "$dir/no/such/dir/x.svg: cannot open for writing" -o "$dir/no/such/dir/x" "$dir/np1.jsonl"
[[ ! -e $dir/x.svg && ! -e $dir/x.png ]] || fail "a failed ddp_plot left output behind"
echo "ok: curves and bars rendered by chromium and by ddp_plot, legends and colours present"
