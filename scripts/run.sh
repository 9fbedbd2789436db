#!/usr/bin/env bash
# The main job with its defaults: set up, build, then train 8 peers on a ring with D-PSGD
# (the MLP on Fashion-MNIST, 5 epochs) with a live progress line and a final summary.
# Extra arguments go to `peertrain launch`, e.g. scripts/run.sh --algorithm allreduce
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
cd "$root"
exec "$build/peertrain" launch --topology topology/ring8.yaml --out runs/ring8-dpsgd "$@"
