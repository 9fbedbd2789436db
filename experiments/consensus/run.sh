#!/usr/bin/env bash
# Experiment: the consensus distance Ξ = (1/n) Σ‖x_i − x̄‖² that D-PSGD holds in training,
# measured against the prediction from W's spectrum (Koloskova et al. 2020; Kong et al.
# 2021, "Consensus Control"): with gradient noise of variance σ̂² per peer, a mode of W with
# eigenvalue λ settles at η²σ̂²/(1 − λ²), so Ξ ∝ mean over the modes of 1/(1 − λ_k²)
# (report.py computes the exact steady state of the linear recursion, momentum and the
# time-varying graph included, and takes σ̂² from the complete graph, where W = J).
# Rings of 4, 8, 16 and 32 peers, a 4x4 torus, the exponential and one-peer exponential
# graphs and the complete graph of 16; momentum 0 and 0.9; 3 seeds; iid shards.
# Writes the runs, CSVs, a log-log plot and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/consensus/run.sh [--quick] [--out DIR]

  --quick     one seed: about 6 minutes on 2 cores
  --out DIR   where results go (default: experiments/consensus/results)
  -h, --help  this help

Full mode: 8 graphs x momentum 0 and 0.9 x 3 seeds = 48 trainings of the MLP 784-32-10,
batch 32 per peer, lr 0.05, 200 steps, evaluated every 10; Ξ is averaged over the second
half. About 20 minutes on a quiet 2-core machine (start-up, each peer reading
Fashion-MNIST, is most of it).
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args consensus "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools
/usr/bin/python3 -c 'import numpy' 2> /dev/null || pt_die "the report needs numpy (apt-get install python3-numpy)"

hidden=32 batch=32 lr=0.05 steps=200 eval_every=10
graphs=(ring:4 ring:8 ring:16 ring:32 torus:16 exponential:16 one-peer-exponential:16 complete:16)
momenta=(0 0.9)
case $mode in
  full) seeds=3 ;;
  quick) seeds=1 ;;
  tiny) seeds=1 graphs=(ring:4 one-peer-exponential:4 complete:4) momenta=(0) steps=20 eval_every=2 hidden=16 ;;
esac

graph_yaml() {  # KIND N -> the `graph:` mapping
  case $1 in
    torus) echo "{generator: torus, rows: 4, cols: $(($2 / 4))}" ;;
    *) echo "{generator: $1, n: $2}" ;;
  esac
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" "$out/plotdata" "$out"/*.png "$out"/*.csv "$out/README.md" "$out/manifest.tsv" "$out/meta.json" \
  "$out/report.html"
mkdir -p "$out/runs"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
total=$((${#graphs[@]} * ${#momenta[@]} * seeds))
echo "consensus ($mode): $total trainings, MLP 784-$hidden-10, batch $batch per peer, lr $lr, $steps steps; results -> $out"
printf 'label\tgraph\tpeers\tmomentum\tseed\trun_dir\tlr\tsteps\n' > "$out/manifest.tsv"
index=0
for ((s = 1; s <= seeds; s++)); do
  for momentum in "${momenta[@]}"; do
    for g in "${graphs[@]}"; do
      kind=${g%%:*} n=${g#*:}
      index=$((index + 1))
      dir=runs/$kind$n-m$momentum-s$s
      mkdir -p "$out/$dir"
      pt_write_topology "$out/$dir/topology.yaml" "$kind$n" "$n" "$(graph_yaml "$kind" "$n")"
      pt_launch "$index" "$total" "$kind$n/m$momentum/s$s" "$out/$dir" "$out/$dir/topology.yaml" --algorithm dpsgd \
        --hidden "$hidden" --batch "$batch" --lr "$lr" --momentum "$momentum" --seed "$s" --max-steps "$steps" \
        --eval-every "$eval_every" --epochs 100
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind$n/m$momentum/s$s" "$kind" "$n" "$momentum" "$s" "$dir" "$lr" \
        "$steps" >> "$out/manifest.tsv"
    done
  done
done
pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/consensus/report.py $out)"
pt_report "$out" "${graphs[0]/:/}/m0/s1"
echo "report: $out/README.md"
