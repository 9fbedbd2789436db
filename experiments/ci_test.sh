#!/usr/bin/env bash
# CI test of the experiments: runs each one in its reduced --tiny form (4 peers, a few
# settings, 20 steps, a 16-unit MLP) into a temporary folder and checks what it wrote:
# every expected file, CSVs that parse with the expected columns and row counts, PNGs that
# are PNG files, and a README.md that embeds every PNG. Also checks --help and the errors
# for a bad flag and a missing binary. About 3 minutes on 2 cores; exits non-zero with a
# message naming what is wrong.
#
# Usage: experiments/ci_test.sh   (env PEERTRAIN: the binary, default build/peertrain)
# Exit status: 0 passed, 1 failed, 77 skipped (gnuplot or python3 missing).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PEERTRAIN=${PEERTRAIN:-$here/../build/peertrain}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/peertrain-experiments.XXXXXX")
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

cleanup() {
  if ((failures == 0)); then rm -rf "$tmp"; else echo "outputs kept in $tmp" >&2; fi
}
trap cleanup EXIT

# Without the report's tools the test cannot run: exit 77, which ctest reports as skipped.
for tool in gnuplot /usr/bin/python3; do
  command -v "$tool" > /dev/null || {
    echo "SKIP: $tool is not installed (Debian: apt-get install gnuplot-nox python3)" >&2
    exit 77
  }
done

[[ -x $PEERTRAIN ]] || {
  echo "FAIL: peertrain binary not found at $PEERTRAIN (set PEERTRAIN)" >&2
  exit 1
}

is_png() {  # FILE: non-empty and starts with the PNG signature
  [[ -s $1 ]] && [[ $(head -c 8 "$1" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]]
}

# check_csv FILE ROWS COLUMN... : header has these columns (in order, maybe more after),
# ROWS data rows (or any number when ROWS is -), every row as wide as the header.
check_csv() {
  local file=$1 rows=$2
  shift 2
  /usr/bin/python3 - "$file" "$rows" "$@" << 'EOF'
import csv, sys
path, rows, want = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(path, newline="") as f:
    table = list(csv.reader(f))
if not table:
    sys.exit(f"{path}: empty")
header, body = table[0], table[1:]
missing = [c for c in want if c not in header]
if missing:
    sys.exit(f"{path}: missing columns {missing}; header is {header}")
ragged = [i + 2 for i, r in enumerate(body) if len(r) != len(header)]
if ragged:
    sys.exit(f"{path}: lines {ragged[:5]} do not have {len(header)} fields")
if rows != "-" and len(body) != int(rows):
    sys.exit(f"{path}: {len(body)} data rows, expected {rows}")
EOF
}

# check_experiment NAME RUNS PNG... : run NAME --tiny and check its results.
check_experiment() {
  local name=$1 runs=$2
  shift 2
  local out=$tmp/$name log=$tmp/$name.log start=$SECONDS
  echo "== $name --tiny"
  if ! timeout 170 "$here/$name/run.sh" --tiny --out "$out" > "$log" 2>&1; then
    fail "$name/run.sh --tiny failed; last lines of $log:"
    tail -n 15 "$log" >&2
    return
  fi
  echo "   ran in $((SECONDS - start)) s"
  local f
  for f in README.md runs.csv curves.csv manifest.tsv meta.json "$@"; do
    [[ -s $out/$f ]] || fail "$name: $f missing or empty"
  done
  local dirs
  dirs=$(/usr/bin/python3 -c 'import csv, sys; print("\n".join(r["run_dir"] for r in csv.DictReader(open(sys.argv[1]), delimiter="\t")))' \
    "$out/manifest.tsv") || fail "$name: manifest.tsv has no run_dir column"
  local listed dir evaluations=0 evaluations_accuracy=0
  listed=$(grep -c . <<< "$dirs")
  ((listed == runs)) || fail "$name: manifest.tsv lists $listed runs, expected $runs"
  for dir in $dirs; do
    for f in metrics.csv summary.json; do
      [[ -s $out/$dir/$f ]] || fail "$name: $dir/$f missing"
    done
    check_csv "$out/$dir/metrics.csv" - step epoch peer train_loss test_accuracy avg_accuracy consensus_distance \
      bytes_sent bytes_received wall_s compute_s comm_wait_s || fail "$name: $dir/metrics.csv"
    /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); [s[k] for k in ('test_accuracy','wall_s','steps','bytes_sent_per_peer')]" \
      "$out/$dir/summary.json" || fail "$name: $dir/summary.json lacks a key"
    # One evaluation = one row per peer; curves.csv has one row per run per evaluation.
    evaluations=$((evaluations + $(tail -n +2 "$out/$dir/metrics.csv" | cut -d, -f1 | sort -u | wc -l)))
    [[ $dir != runs/accuracy-* ]] ||
      evaluations_accuracy=$((evaluations_accuracy + $(tail -n +2 "$out/$dir/metrics.csv" | cut -d, -f1 | sort -u | wc -l)))
  done
  case $name in
    topologies)
      check_csv "$out/runs.csv" "$runs" label model data topology algorithm seed spectral_gap test_accuracy \
        mean_local_accuracy consensus_distance bytes_per_peer_per_step wall_s val_bits_per_byte || fail "$name: runs.csv"
      grep -qE '[0-9] ± [0-9]' "$out/README.md" || fail "$name: README.md gives no confidence interval"
      check_csv "$out/curves.csv" "$evaluations" label step epoch avg_accuracy consensus_distance bytes_sent_peer0 ||
        fail "$name: curves.csv"
      ;;
    lian2017)
      check_csv "$out/runs.csv" "$runs" label network peers algorithm final_train_loss wall_s_peer0 time_to_target_s ||
        fail "$name: runs.csv"
      check_csv "$out/curves.csv" "$evaluations" label network peers algorithm step epoch train_loss wall_s_peer0 ||
        fail "$name: curves.csv"
      # 2 networks × n = 4, aggregated over 2 seeds; per seed, 4 rows; per setting (× 4 algorithms), 8.
      check_csv "$out/speedup.csv" 2 network peers target_loss time_dpsgd_s time_ps_s time_allreduce_s time_tree_s \
        speedup_vs_ps speedup_vs_allreduce speedup_vs_tree speedup_vs_best seeds speedup_vs_tree_lo speedup_vs_tree_hi \
        resolved_vs_tree || fail "$name: speedup.csv"
      check_csv "$out/speedup_seeds.csv" 4 network peers seed time_dpsgd_s time_tree_s speedup_vs_tree ||
        fail "$name: speedup_seeds.csv"
      check_csv "$out/settings.csv" 8 network peers algorithm seeds s_per_step s_per_step_ci95 time_to_target_s \
        time_to_target_s_ci95 || fail "$name: settings.csv"
      grep -q '^| low bandwidth (10 Mbit/s) | 4 | [0-9.]*× \[[0-9.e+-]*, [0-9.e+-]*\]' "$out/README.md" ||
        fail "$name: README.md's speed-up table has no 95 % interval"
      ;;
    consensus)
      check_csv "$out/runs.csv" "$runs" label graph peers momentum seed xi || fail "$name: runs.csv"
      check_csv "$out/curves.csv" "$evaluations" label step consensus_distance train_loss || fail "$name: curves.csv"
      check_csv "$out/consensus.csv" - graph peers momentum seeds xi_measured xi_predicted ratio || fail "$name: consensus.csv"
      ;;
    gossip)
      check_csv "$out/runs.csv" "$runs" label part algorithm epochs steps test_accuracy wall_s bytes_per_step_per_peer \
        time_to_target_s || fail "$name: runs.csv"
      check_csv "$out/curves.csv" "$evaluations" label step epoch train_loss avg_accuracy wall_s_max ||
        fail "$name: curves.csv"
      ;;
    heterogeneity)
      check_csv "$out/runs.csv" "$runs" label alpha graph form momentum seed accuracy || fail "$name: runs.csv"
      check_csv "$out/curves.csv" "$evaluations" label step avg_accuracy || fail "$name: curves.csv"
      check_csv "$out/accuracy.csv" 5 momentum graph form acc_ainf acc_a0.1 || fail "$name: accuracy.csv"
      # 2 α × 2 graphs × 2 forms; atc on the complete graph is all-reduce (to the summation
      # order: within 0.1 points of accuracy).
      check_csv "$out/gap_split.csv" 8 alpha momentum graph form gap form_share spectral_share || fail "$name: gap_split.csv"
      grep -qE 'differs from all-reduce.s by at most 0\.(0[0-9]|10) points' "$out/README.md" ||
        fail "$name: atc on the complete graph is not all-reduce: $(grep -m1 'atc on the complete' "$out/README.md")"
      ;;
    directed)
      check_csv "$out/el.csv" 3 peers method seeds messages_per_step local_accuracy rounds_0.65 || fail "$name: el.csv"
      check_csv "$out/sgp.csv" 2 peers method seeds accuracy accuracy_ci95 local_accuracy messages_per_step ||
        fail "$name: sgp.csv"
      check_csv "$out/consensus.csv" 3 method peers xi_measured xi_predicted ratio || fail "$name: consensus.csv"
      ;;
    simulate)
      check_csv "$out/runs.csv" "$runs" label part algorithm peers network kind steps step_s simulated ||
        fail "$name: runs.csv"
      # 2 algorithms on the emulated link (and at 10 Mbit/s in namespaces), each real and simulated
      check_csv "$out/fidelity.csv" $(((runs - 8) / 2)) network algorithm measured_step_s simulated_step_s error ||
        fail "$name: fidelity.csv"
      # 2 networks × n = 4, 8 × D-PSGD and the parameter server
      check_csv "$out/lian2017.csv" 8 network algorithm peers step_s speedup || fail "$name: lian2017.csv"
      grep -q 'pairs are within 15 %' "$out/README.md" || fail "$name: README.md has no fidelity summary"
      ;;
    networks)
      check_csv "$out/runs.csv" "$runs" label part algorithm peers step_s test_accuracy || fail "$name: runs.csv"
      check_csv "$out/curves.csv" "$evaluations_accuracy" label step avg_accuracy || fail "$name: curves.csv"
      # 2 bandwidths × 2 latencies × 2 algorithms, each measured and predicted
      check_csv "$out/sweep.csv" 8 bandwidth_mbps latency_ms algorithm step_s_measured step_s_predicted error ||
        fail "$name: sweep.csv"
      grep -q '^## 5. The emulation against the kernel' "$out/README.md" || fail "$name: no netns section"
      ;;
  esac
  local png
  for png in "$out"/*.png; do
    is_png "$png" || fail "$name: $(basename "$png") is not a PNG file"
    grep -qE "!\\[[^]]*\\]\\($(basename "$png")\\)" "$out/README.md" || fail "$name: README.md does not embed $(basename "$png")"
  done
  local ref
  while read -r ref; do
    [[ -s $out/$ref ]] || fail "$name: README.md embeds $ref, which does not exist"
  done < <(grep -o '!\[[^]]*\]([^)]*\.png)' "$out/README.md" | sed 's/.*(\(.*\))/\1/')
  [[ -n $(ls "$out"/*.png 2> /dev/null) ]] || fail "$name: no PNG written"
  grep -q '^## Observations' "$out/README.md" || fail "$name: README.md has no Observations section"
  ! grep -qwiE 'nan|inf' "$out/README.md" || fail "$name: README.md prints a nan or inf: $(grep -m1 -wiE 'nan|inf' "$out/README.md")"
}

start=$SECONDS
# topologies --tiny: 2 seeds × iid, non-iid × ring, all-reduce; the GPT on a ring and all-reduce
check_experiment topologies 10 accuracy_vs_epoch.png consensus_vs_step.png accuracy_vs_bytes.png gpt_bits_per_byte.png report.html
check_experiment lian2017 16 loss_vs_epoch.png accuracy_vs_epoch.png loss_vs_time.png speedup_vs_n.png step_time_vs_n.png \
  settings.csv speedup_seeds.csv report.html
check_experiment gossip 28 loss_vs_time.png report.html
check_experiment consensus 3 consensus_fit.png report.html
check_experiment heterogeneity 10 accuracy_vs_alpha.png gap_split.png accuracy.csv gap_split.csv report.html
# networks --tiny: 3 accuracy runs, 8 sweep runs, 2 uneven, and 2 in network namespaces where labs can be made
networks_runs=13
"$here/../scripts/netlab.sh" check > /dev/null 2>&1 && networks_runs=15
check_experiment networks $networks_runs time_to_target.png predicted_vs_measured.png sweep.csv report.html
# simulate --tiny: D-PSGD and the parameter server, real and simulated, on the emulated link
# (and in namespaces where labs can be made), and 8 simulations at Lian et al.'s scale
simulate_runs=12
"$here/../scripts/netlab.sh" check > /dev/null 2>&1 && simulate_runs=16
check_experiment simulate $simulate_runs fidelity.png speedup_vs_n.png fidelity.csv lian2017.csv

# diloco --tiny: the all-reduce, DiLoCo and int8 Streaming DiLoCo, and D-PSGD, on a simulated 1 Gbit/s cluster
check_experiment diloco 4 loss_vs_step.png time_to_target.png loss_vs_time.png loss.csv time.csv report.html

# directed --tiny: EL-Local, EL-Oracle and D-PSGD on a static graph; SGP and D-PSGD on the
# exponential graphs (4 peers, non-iid); 3 consensus runs
check_experiment directed 8 el_accuracy_n4.png sgp_accuracy_n4.png consensus_fit.png el.csv sgp.csv consensus.csv \
  report.html
echo "== command line"
for name in topologies lian2017 gossip consensus heterogeneity networks simulate directed; do
  "$here/$name/run.sh" --help | grep -q -- '--quick' || fail "$name/run.sh --help does not describe --quick"
  msg=$("$here/$name/run.sh" --no-such-flag 2>&1) && fail "$name/run.sh accepted --no-such-flag"
  [[ $msg == error:* ]] || fail "$name/run.sh --no-such-flag: expected an 'error:' line, got: $msg"
  msg=$(PEERTRAIN=$tmp/missing "$here/$name/run.sh" --tiny --out "$tmp/x" 2>&1) && fail "$name/run.sh ran without a binary"
  [[ $msg == *"error: peertrain binary not found"* ]] || fail "$name/run.sh without a binary: got: $msg"
done

if ((failures > 0)); then
  echo "experiments CI test: $failures failure(s) in $((SECONDS - start)) s" >&2
  exit 1
fi
echo "experiments CI test: all checks passed in $((SECONDS - start)) s"
