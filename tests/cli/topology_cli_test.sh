#!/usr/bin/env bash
# The topology commands as a user runs them: --help everywhere, exit codes, "error:" lines
# that name the input, and the figures the README promises.
set -u
root=$1
bin=${PEERTRAIN:?set PEERTRAIN to the peertrain binary}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
pass=0

check() {  # check NAME EXPECTED_EXIT PATTERN -- command...
  local name=$1 want=$2 pattern=$3
  shift 4
  local out code
  out=$(timeout 60 "$@" 2>&1)
  code=$?
  if [[ $code -ne $want ]]; then
    echo "FAIL $name: exit $code, expected $want"; echo "$out" | head -5; failures=$((failures + 1)); return
  fi
  if ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output lacks /$pattern/"; echo "$out" | head -5; failures=$((failures + 1)); return
  fi
  pass=$((pass + 1))
}

check "help" 0 "topology inspect" -- "$bin" --help
check "topology help" 0 "generate KIND" -- "$bin" topology --help
check "generate help" 0 "random-regular" -- "$bin" topology generate --help
check "inspect help" 0 "--format" -- "$bin" topology inspect --help
check "no command" 2 "usage" -- "$bin"
check "unknown command" 2 "^error: unknown command 'trian'" -- "$bin" trian
check "unknown flag" 2 "^error: .*colour" -- "$bin" topology inspect "$root/topology/ring8.yaml" --colour
check "bad format" 2 "^error: --format 'xml'" -- "$bin" topology inspect "$root/topology/ring8.yaml" --format xml
check "bad solver" 1 "^error: --solver 'magic'" -- "$bin" topology inspect "$root/topology/ring8.yaml" --solver magic
check "bad number" 2 "^error: --peers 'many' is not an integer" -- "$bin" topology generate ring --peers many
check "missing file arg" 2 "^error: missing FILE" -- "$bin" topology inspect
check "missing file" 1 "^error: .*nope.yaml: cannot read" -- "$bin" topology inspect "$work/nope.yaml"

check "ring16 gap" 0 "spectral gap +0\.0507" -- "$bin" topology inspect "$root/topology/ring16.yaml"
"$bin" topology inspect "$root/topology/ring16.yaml" --format json --dot "$work/r.dot" --mtx "$work/r.mtx" >"$work/r.json"
for key in peers edges lambda2 lambda_min spectral_gap doubly_stochastic connected; do
  check "json has $key" 0 "\"$key\": " -- cat "$work/r.json"
done
check "dot written" 0 "0 -- 1" -- cat "$work/r.dot"
check "mtx written" 0 "^%%MatrixMarket matrix coordinate real symmetric" -- cat "$work/r.mtx"
check "one-peer exact averaging" 0 "exact averaging" -- "$bin" topology inspect "$root/topology/one-peer-exponential16.yaml"

check "generate" 0 "wrote" -- "$bin" topology generate torus --rows 3 --cols 5 --weights max-degree -o "$work/t.yaml"
check "generated file inspects" 0 "peers +15" -- "$bin" topology inspect "$work/t.yaml"
check "generate edges" 0 "edges:" -- "$bin" topology generate small-world --peers 12 --k 4 --p 0.2 --seed 3 --edges
check "one-letter flags" 0 "p: 0.5" -- "$bin" topology generate erdos-renyi --peers 10 --p=0.5 --seed 2
check "generate needs peers" 2 "^error: --peers N is required" -- "$bin" topology generate ring
check "generate bad kind" 1 "^error: unknown generator 'rign'" -- "$bin" topology generate rign --peers 4
check "generate explicit" 1 "^error: --weights explicit" -- "$bin" topology generate ring --peers 4 --weights explicit

cat >"$work/bipartite.yaml" <<'YAML'
graph: {n: 4, edges: [[0, 1], [1, 2], [2, 3], [3, 0]]}
weights: explicit
matrix: [[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0]]
YAML
check "no consensus" 0 "no consensus" -- "$bin" topology inspect "$work/bipartite.yaml"
printf 'graph: {n: 4, edges: [[0, 1], [2, 3]]}\n' >"$work/split.yaml"
check "disconnected" 1 "^error: .*split.yaml: .*disconnected" -- "$bin" topology inspect "$work/split.yaml"
printf 'graph:\n  generator: ring\n  n: [4\n' >"$work/broken.yaml"
check "malformed yaml" 1 "^error: .*broken.yaml:[0-9]+:[0-9]+: malformed YAML" -- "$bin" topology inspect "$work/broken.yaml"
: >"$work/empty.yaml"
check "empty file" 1 "^error: .*empty.yaml: the topology file is empty" -- "$bin" topology inspect "$work/empty.yaml"
head -c 64 "$bin" >"$work/binary.yaml"
check "binary file" 1 "^error: .*binary.yaml: .*binary" -- "$bin" topology inspect "$work/binary.yaml"
printf 'graph: {generator: ring, n: 4}\nweights: heavy\n' >"$work/w.yaml"
check "unknown weights" 1 "^error: .*w.yaml:2: unknown weight scheme 'heavy'" -- "$bin" topology inspect "$work/w.yaml"
check "a directory" 1 "^error: .*it is a directory" -- "$bin" topology inspect "$work"

echo "cli: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
