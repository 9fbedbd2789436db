#!/usr/bin/env bash
# The chaos hour: 8 peers train the MLP with D-PSGD while one of them is killed or stalled
# every 15 s or so (about 240 events), killed and dropped peers coming back with --rejoin;
# then a fault-free run trains as many samples. Prints, and writes OUT/chaos.json and
# OUT/README.md (the figures beside the targets): goodput, x̄'s accuracy at equal samples, the longest stall, and whether every survivor's
# membership view agreed after each change (tests/chaos/chaos.py explains each figure).
# Usage: bench/chaos.sh [build-dir] [minutes] [out]   (default: build, 60, build/chaos-hour)
# About twice [minutes] of wall time on 2 cores (the fault-free run follows).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
minutes=${2:-60}
out=${3:-$build/chaos-hour}
[[ -x $build/peertrain ]] || { echo "error: bench/chaos.sh: no peertrain in $build (build it first)" >&2; exit 1; }
export CHAOS_COMMAND="bench/chaos.sh ${1:-build} $minutes ${3:-build/chaos-hour}"
exec /usr/bin/python3 "$root/tests/chaos/chaos.py" --bin "$build/peertrain" --out "$out" --minutes "$minutes" \
  --event-every 15 --peer-timeout 4
