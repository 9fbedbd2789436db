#!/usr/bin/env bash
# The gossip algorithms of the second wave from the command line, as a user runs them:
# choco (compressed), d2, gt (gradient tracking), dpsgd --update atc (also with quasi-global momentum) and the
# tree and recursive-doubling all-reduces train end to end with launch; top-k:0.01 sends at most 3 % of D-PSGD's
# bytes; choco and gt survive a killed peer as D-PSGD does; bad flags get an error naming them.
# Usage: PEERTRAIN=build/peertrain gossip_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"
write_topology "$work/ring4.yaml" ring4 ring 4 $((21000 + RANDOM % 2000))
write_topology "$work/ring6.yaml" ring6 ring 6 $((23000 + RANDOM % 2000))
small=(--batch 16 --connect-timeout 20 --peer-timeout 20 --max-steps 30 --eval-every 15)


# 1. Each trains end to end, and its summary says how it was configured.
for flags in "dpsgd" "choco --compression top-k:0.01" "choco --compression qsgd:8 --update atc" \
             "choco --compression sign --gossip-step 0.4" "d2 --momentum 0" "dpsgd --update atc" \
             "allreduce --allreduce-algo tree" "allreduce --allreduce-algo rd" \
             "dpsgd --update atc --momentum-form quasi-global" "gt --momentum 0" "gt --momentum-form quasi-global"; do
  out="$work/run-${flags//[ :.]/_}"
  # shellcheck disable=SC2086
  if timeout 300 "$bin" launch --topology "$work/ring4.yaml" --algorithm $flags "${small[@]}" --out "$out" \
      >"$out.log" 2>&1 && [[ -s $out/summary.json ]]; then
    ok
  else
    fail "launch --algorithm $flags"; tail -5 "$out.log"; continue
  fi
  acc=$(summary "$out" test_accuracy)
  awk -v a="${acc:-0}" 'BEGIN { exit !(a > 0.3) }' && ok || fail "$flags: x̄ accuracy ${acc:-?} after 30 steps"
done
grep -q '"compression": "top-k:0.01"' "$work/run-choco_--compression_top-k_0_01/summary.json" && ok ||
  fail "summary.json does not name the compression"
grep -q '"allreduce_algo": "rd"' "$work/run-allreduce_--allreduce-algo_rd/summary.json" && ok ||
  fail "summary.json does not name the all-reduce"
grep -q '"momentum_form": "quasi-global"' "$work/run-dpsgd_--update_atc_--momentum-form_quasi-global/summary.json" && ok ||
  fail "summary.json does not name the momentum form"

# 2. Bytes: top-k:0.01 sends at most 3 % of D-PSGD's per peer (the frames and the
# evaluation reports included).
dense=$(summary "$work/run-dpsgd" bytes_sent_per_peer)
sparse=$(summary "$work/run-choco_--compression_top-k_0_01" bytes_sent_per_peer)
echo "bytes per peer: dpsgd $dense, choco top-k:0.01 $sparse"
awk -v d="${dense:-0}" -v s="${sparse:-1e99}" 'BEGIN { exit !(d > 0 && s <= 0.03 * d) }' && ok ||
  fail "top-k:0.01 sent ${sparse:-?} bytes against D-PSGD's ${dense:-?}"

# 3. A peer killed mid-run: choco and gt drop it and the others finish, as D-PSGD does.
for flags in "choco --compression qsgd:8" "gt --momentum-form quasi-global"; do
  name=${flags%% *}
  out="$work/$name-kill"
  # shellcheck disable=SC2086
  launch_and_kill "$out" "$work/ring6.yaml" 6 4 --algorithm $flags --batch 16 --max-steps 600 --eval-every 300 \
    --peer-timeout 10 --connect-timeout 20
  code=$?
  [[ $code -eq 0 ]] && ok || { fail "$name: launch exited $code after losing peer 4"; tail -5 "$out.log"; }
  grep -q '"failed_peers": \[4\]' "$out/summary.json" 2>/dev/null && ok || fail "$name: peer 4 not in failed_peers"
done

# 4. Bad flags: an error naming the flag, exit 2, nothing started.
expect_error() { expect_launch_error "$work/ring4.yaml" "$@"; }
expect_error "--compression 'top-k:0'.*outside (0, 1\]" --algorithm choco --compression top-k:0
expect_error "--compression 'random-k:2'.*outside (0, 1\]" --algorithm choco --compression random-k:2
expect_error "--compression 'qsgd:0': 0 bits" --algorithm choco --compression qsgd:0
expect_error "--compression 'zip'" --algorithm choco --compression zip
expect_error "--gossip-step 1.5 is outside (0, 1\]" --algorithm choco --gossip-step 1.5
expect_error "--compression applies to --algorithm choco" --algorithm allreduce --compression sign
expect_error "--allreduce-algo applies to --algorithm allreduce" --allreduce-algo tree
expect_error "--allreduce-algo 'star'" --algorithm allreduce --allreduce-algo star
expect_error "--update applies to --algorithm dpsgd, choco, sgp or el" --algorithm d2 --update atc
expect_error "--algorithm 'choc'" --algorithm choc
expect_error "--resume: --algorithm choco" --algorithm choco --resume
expect_error "--momentum-form applies to --algorithm dpsgd or gt" --algorithm d2 --momentum-form quasi-global
expect_error "--update applies to --algorithm dpsgd, choco, sgp or el" --algorithm gt --update atc
expect_error "--resume: --algorithm gt" --algorithm gt --resume
expect_error "--momentum-form 'global' is not one of local, quasi-global" --momentum-form global
expect_error "--momentum-form quasi-global is SGD's heavy ball" --momentum-form quasi-global --optimizer adam
expect_error "--momentum-form quasi-global: its buffer" --momentum-form quasi-global --checkpoint-every 5

echo "gossip CLI: $pass passed, $failures failed"
[[ $failures -eq 0 ]]
