#!/usr/bin/env bash
# Python packages the tests need that Debian does not ship (tensorboard, whose
# own event reader checks our --tensorboard files), in a virtual environment
# outside the repository: ${DDP_PY_VENV:-<repo>/../.ddp-py-venv}. Built on
# Debian's python3 and python3-venv (scripts/install-deps.sh).
#
# Idempotent: when the environment already has the pinned versions it returns
# at once, without pip. Prints the environment's python on stdout, so a test
# runs `py=$(scripts/python-venv.sh)`. Fails (non-zero, with the reason on
# stderr) when pip cannot install: a test that needs these packages must fail
# then, never pass or skip unnoticed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${DDP_PY_VENV:-$(dirname "$root")/.ddp-py-venv}

# One pin per package, so every machine reads event files with the same reader.
requirements=(tensorboard==2.20.0)

have_all() {
  [[ -x $venv/bin/python ]] || return 1
  "$venv/bin/python" - "${requirements[@]}" <<'EOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
for req in sys.argv[1:]:
    name, want = req.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
}

if have_all; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# Tests running side by side may all arrive here: one builds, the others wait.
exec 9>"$venv.lock"
flock 9
if ! have_all; then
  if ! "$venv/bin/python" -c '' 2>/dev/null; then
    # Missing, or broken (its python gone with an upgrade): made anew, but
    # only where nothing else lives, since --clear empties the folder.
    if [[ -e $venv && ! -f $venv/pyvenv.cfg ]]; then
      echo "python-venv: error: $venv exists and is not a virtual environment (set DDP_PY_VENV elsewhere)" >&2
      exit 1
    fi
    echo "python-venv: creating $venv" >&2
    /usr/bin/python3 -m venv --clear "$venv" >&2 || {
      echo "python-venv: error: cannot create the virtual environment $venv (is python3-venv installed? scripts/install-deps.sh)" >&2
      exit 1
    }
  fi
  echo "python-venv: installing ${requirements[*]} into $venv" >&2
  "$venv/bin/python" -m pip install --quiet "${requirements[@]}" >&2 || {
    echo "python-venv: error: pip could not install ${requirements[*]} into $venv" \
         "(no package index reachable? set PIP_INDEX_URL, or PIP_FIND_LINKS to a folder of wheels)" >&2
    exit 1
  }
  have_all || {
    echo "python-venv: error: $venv still lacks ${requirements[*]} after pip install" >&2
    exit 1
  }
fi
echo "$venv/bin/python"
