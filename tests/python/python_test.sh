#!/usr/bin/env bash
# The Python module end to end, as a user runs it: `peertrain launch --topology FILE --
# /usr/bin/python3 SCRIPT` on the ring, the exponential graph and the star.
#   collectives: collectives_check.py on each (W·X oracle, allreduce, broadcast, bad input),
#                and lost_check.py (a crashed peer is gone around and named);
#   torch:       torch_check.py (DistributedOptimizer against the explicit loop); exits 77,
#                skipped, where Debian's python3-torch is not installed;
#   examples:    examples/neighbor_average.py (with a secret file: the measured contraction
#                within the spectral gap's bound) and examples/torch_dpsgd.py, shortened.
# Usage: PEERTRAIN=build/peertrain PYTHONPATH=build/python python_test.sh collectives|torch|examples
set -u
source "$(dirname "$0")/../cli/common.sh"
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
"$py" -c "import peertrain" 2>"$work/import.log" || { echo "FAIL: import peertrain:"; cat "$work/import.log"; exit 1; }
port=$((30000 + RANDOM % 3000))
topology() {  # FILE GRAPH N
  {
    echo "graph: $2"
    echo "peers:"
    for ((i = 0; i < $3; i++)); do echo "  - {id: $i, host: 127.0.0.1, port: $((port + i))}"; done
  } >"$1"
  port=$((port + $3))
}
expect_ok() {  # LOG N: every peer printed "ok RANK"
  local oks
  oks=$(grep -c "\] ok [0-9]" "$1")
  [[ $oks -eq $2 ]] && ok || { fail "$1: $oks of $2 peers ok"; tail -20 "$1"; }
}
case ${1:-collectives} in
  collectives)
    topology "$work/ring8.yaml" "{generator: ring, n: 8}" 8
    topology "$work/exp8.yaml" "{generator: exponential, n: 8}" 8
    topology "$work/star5.yaml" "{generator: star, n: 5}" 5
    for t in ring8:8 exp8:8 star5:5; do
      name=${t%%:*} n=${t##*:}
      if timeout 300 "$bin" launch --topology "$work/$name.yaml" -- "$py" "$here/collectives_check.py" \
          >"$work/$name.log" 2>&1; then ok; else fail "collectives_check.py on $name"; fi
      expect_ok "$work/$name.log" "$n"
    done
    topology "$work/ring4.yaml" "{generator: ring, n: 4}" 4
    timeout 120 "$bin" launch --topology "$work/ring4.yaml" -- "$py" "$here/lost_check.py" >"$work/lost.log" 2>&1
    [[ $? -eq 1 ]] && ok || fail "launch did not report the crashed peer's failure"
    grep -q "peer 3 (.*) exited with status 3" "$work/lost.log" && ok || fail "launch did not name peer 3"
    expect_ok "$work/lost.log" 3
    # launch -- without a program, and a program that is not there.
    "$bin" launch --topology "$work/ring4.yaml" -- >"$work/err.log" 2>&1
    [[ $? -eq 2 ]] && grep -q "error: nothing to run after '--'" "$work/err.log" && ok || fail "launch -- with nothing"
    "$bin" launch --topology "$work/ring4.yaml" -- /nonexistent/python >"$work/err.log" 2>&1
    grep -q "cannot run '/nonexistent/python'" "$work/err.log" && ok || fail "launch -- a missing program"
    ;;
  examples)
    # The README's examples as a user runs them, the gossip one with a shared key.
    topology "$work/ring8.yaml" "{generator: ring, n: 8}" 8
    "$bin" keygen "$work/run.key" >/dev/null 2>&1 || fail "keygen"
    if timeout 300 "$bin" launch --topology "$work/ring8.yaml" --secret-file "$work/run.key" -- "$py" \
        "$root/examples/neighbor_average.py" --steps 20 >"$work/average.log" 2>&1; then ok; else fail "neighbor_average.py"; fi
    line=$(grep -o "measured contraction per step [0-9.]* (predicted at most [0-9.]*)" "$work/average.log")
    read -r measured bound <<<"$(sed 's/[^0-9. ]//g' <<<"$line" | xargs)"
    echo "neighbor_average.py: contraction ${measured:-?} per step, bound ${bound:-?}"
    awk -v m="${measured:-9}" -v b="${bound:-0}" 'BEGIN { exit !(m > 0 && m <= b + 0.01) }' && ok ||
      { fail "neighbor_average.py: ${line:-no result}"; tail -5 "$work/average.log"; }
    if "$py" -c "import torch" 2>/dev/null; then
      topology "$work/ring4.yaml" "{generator: ring, n: 4}" 4
      timeout 300 "$bin" launch --topology "$work/ring4.yaml" -- "$py" "$root/examples/torch_dpsgd.py" --epochs 1 \
        --limit 8000 >"$work/cnn.log" 2>&1 && ok || fail "torch_dpsgd.py"
      acc=$(grep -o "test accuracy of x̄ [0-9.]*" "$work/cnn.log" | grep -o "[0-9.]*$")
      echo "torch_dpsgd.py, 8,000 examples, 1 epoch: x̄ accuracy ${acc:-?}"
      awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.6) }' && ok || { fail "torch_dpsgd.py: accuracy ${acc:-?}"; tail -5 "$work/cnn.log"; }
    else
      echo "SKIP: examples/torch_dpsgd.py needs torch (Debian: apt-get install python3-torch)"
    fi
    ;;
  torch)
    "$py" -c "import torch" 2>/dev/null || { echo "SKIP: torch is not installed (Debian: apt-get install python3-torch)"; exit 77; }
    topology "$work/ring4.yaml" "{generator: ring, n: 4}" 4
    if timeout 300 "$bin" launch --topology "$work/ring4.yaml" -- "$py" "$here/torch_check.py" >"$work/torch.log" 2>&1
    then ok; else fail "torch_check.py"; fi
    expect_ok "$work/torch.log" 4
    ;;
esac
echo "python: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
