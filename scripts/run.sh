#!/usr/bin/env bash
# The main job with its defaults: set up, build, then run it. Until peers can train, the
# main job inspects the default topology (8 peers on a ring) and draws its graph.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
"$build/peertrain" topology inspect "$root/topology/ring8.yaml" --dot "$build/ring8.dot"
echo "graph written to $build/ring8.dot (draw it with: dot -Tpng $build/ring8.dot -o ring8.png)"
