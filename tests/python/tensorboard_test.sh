#!/usr/bin/env bash
# Our TensorBoard event files read back by the tensorboard package's own
# readers (tensorboard_dump.py): every scalar tensorboard_write says it wrote,
# at every step, with its float32 value. Then one flipped byte must show: the
# readers check CRCs, and the comparison is not vacuous.
# tensorboard is not in Debian: scripts/python-venv.sh installs it with pip
# into a venv outside the repository, and this test fails (never skips) when
# pip cannot. Usage: tensorboard_test.sh TENSORBOARD_WRITE
set -euo pipefail
write=$1
here=$(cd "$(dirname "$0")" && pwd)
py=$("$here/../../scripts/python-venv.sh")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

"$write" "$dir/logs" >"$dir/wrote.json"
"$py" "$here/tensorboard_dump.py" "$dir/logs" --expect "$dir/wrote.json"

first=$(ls "$dir"/logs/events.out.tfevents.* | sort | head -n 1)
"$py" -c 'import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[len(b) // 2] ^= 0xFF
open(sys.argv[1], "wb").write(b)' "$first"
if "$py" "$here/tensorboard_dump.py" "$dir/logs" --expect "$dir/wrote.json" 2>"$dir/err"; then
  echo "tensorboard_test: a corrupted events file was read as written" >&2
  exit 1
fi
echo "corrupted file, as it should: $(cat "$dir/err")"
