#!/usr/bin/env bash
# Every benchmark of the project beside its peer or its limit, measured in the same run,
# as one table in docs/performance.md (bench/all.py does the work; --help lists it).
#   bench/all.sh [--quick] [--runs N] [--build build] [--out docs/performance.md]
# Builds what is missing first (scripts/build.sh). Run it alone: a loaded machine is noise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do [[ ${args[i]} == --build ]] && build=${args[i + 1]}; done
if [[ " ${args[*]} " != *" -h "* && " ${args[*]} " != *" --help "* ]]; then
  [[ -x $build/peertrain && -x $build/bench/auth_bench && -x $build/bench/attention_bench ]] ||
    "$root/scripts/build.sh"
fi
exec /usr/bin/python3 "$root/bench/all.py" "$@"
