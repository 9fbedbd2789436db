#!/usr/bin/env bash
# Installs what peertrain needs from Debian's packages, skipping what is already there.
# Run as root (or with sudo available). Usage: scripts/setup.sh [--test]
set -euo pipefail

packages=(
  build-essential cmake git pkg-config
  libeigen3-dev libspectra-dev libboost-dev libcxxopts-dev libyaml-cpp-dev zlib1g-dev libomp-dev libssl-dev
  libsentencepiece-dev
  nlohmann-json3-dev  # the run's files and every --format json
  libsimgrid-dev  # simulated clusters (launch --simulate): SimGrid 3.32, s4u
  googletest libgtest-dev libbenchmark-dev
  dataset-fashion-mnist fortunes
  gnuplot-nox python3 iperf3  # experiment plots and reports, the loopback baseline
  pybind11-dev python3-dev python3-numpy  # the Python module (docs/python.md)
  libjs-chart.js  # the dashboard's and the reports' curves, compiled into peertrain (docs/dashboard.md)
)
if [[ ${1:-} == --test ]]; then
  packages+=(clang libclang-rt-dev clang-format)  # libFuzzer and the sanitizers for the fuzz test; the format check
  packages+=(python3-torch libopenblas0-pthread)  # peertrain.torch's tests (without the second, torch's BLAS is slow)
  packages+=(chromium)  # the dashboard's browser test (headless)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "error: setup needs root to install: ${missing[*]}" >&2; exit 1; }
  as_root=(sudo)
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
