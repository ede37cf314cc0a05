#!/usr/bin/env bash
# Installs the Debian packages ddp builds, tests and benchmarks with.
# Idempotent: packages already present are not touched, and apt-get runs only
# when something is missing. Needs root (or sudo) on Debian 12.
set -euo pipefail

packages=(
  cmake g++ make pkg-config          # build
  openmpi-bin libopenmpi-dev         # launcher and MPI
  libopenblas-dev                    # CBLAS GEMM
  libcxxopts-dev nlohmann-json3-dev  # CLI, JSON
  zlib1g-dev                         # gzip IDX files
  libgtest-dev                       # tests
  jq                                 # launch/merge-traces: the ranks' --trace files as one
  protobuf-compiler libprotobuf-dev  # TensorBoard event files (src/observe/proto)
  python3 python3-numpy              # checks of written model files
  python3-torch                      # the same files in PyTorch's definitions (tests/python)
  python3-venv                       # scripts/python-venv.sh: tensorboard's event reader (tests/python)
  iproute2                           # tests/netns: two fake hosts (ip netns, veth)
  slurm-wlm munge                    # tests/slurm: a local Slurm cluster (slurmctld, slurmd, srun)
  clang libclang-rt-14-dev llvm     # scripts/fuzz.sh: libFuzzer (libclang_rt.fuzzer), llvm-symbolizer for reports
  librsvg2-dev fonts-dejavu-core     # ddp_plot: its SVG rasterised to PNG (librsvg, cairo) in the font it names
  chromium python3-pil               # tests/plot: the SVG rendered by a browser, its pixels checked
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
