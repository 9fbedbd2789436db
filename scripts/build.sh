#!/usr/bin/env bash
# Configures and builds peertrain in Release (-O3 -march=native) into build/ (or $BUILD_DIR).
# Extra arguments go to CMake, e.g. scripts/build.sh -DPEERTRAIN_CUDA=OFF
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release "$@" | grep -E "^-- peertrain|Error|error" || true
cmake --build "$build" -j"$(nproc)"
