#!/usr/bin/env bash
# Experiment: compressed and heterogeneity-aware gossip against its baselines, on one machine.
#  1. slow network: n peers on a ring at 10 Mbit/s per link and per network card; ring and
#     recursive-doubling all-reduce, D-PSGD, and CHOCO-SGD with several compressors: time
#     until the training loss reaches a target, x̄'s accuracy, bytes per step;
#  2. non-iid shards (Dirichlet α = 0.1), n peers on a ring, no emulation: D-PSGD (cta),
#     D-PSGD --update atc, D², gradient tracking and the quasi-global momentum against all-reduce: x̄'s final
#     accuracy over 3 seeds, with 95 % confidence intervals;
#  3. high latency (10 ms one way on every link): ring, tree and recursive-doubling
#     all-reduce against D-PSGD, time per step and to the target loss (the fair baseline).
# Writes the runs, CSVs, a PNG and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/gossip/run.sh [--quick] [--out DIR]

  --quick     8 peers instead of 16, one epoch each: about 5 minutes on 2 cores
  --out DIR   where results go (default: experiments/gossip/results)
  -h, --help  this help

Full mode: 16 peers, MLP 784-32-10, batch 32 per peer; on the slow network 4 epochs for
CHOCO and D-PSGD and 1 for the all-reduces (they reach the target loss within it); non-iid
3 epochs, 3 seeds; at 10 ms latency one epoch each. About 15 minutes on a quiet 2-core machine.
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args gossip "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

hidden=32 batch=32 lr=0.05 seed=1 extra=()
case $mode in
  full) n=16 slow_epochs=4 base_epochs=1 noniid_epochs=3 seeds=3 ;;
  quick) n=8 slow_epochs=1 base_epochs=1 noniid_epochs=1 seeds=1 ;;
  tiny) n=4 slow_epochs=1 base_epochs=1 noniid_epochs=1 seeds=1 hidden=16 extra=(--max-steps 20) ;;
esac
slow=("allreduce" "allreduce --allreduce-algo rd" "dpsgd" "choco --compression top-k:0.01"
  "choco --compression top-k:0.01 --gossip-step 0.04" "choco --compression top-k:0.05" "choco --compression qsgd:4"
  "choco --compression sign")
noniid=("allreduce" "dpsgd" "dpsgd --update atc" "d2" "dpsgd --update atc --momentum-form quasi-global"
  "dpsgd --momentum-form quasi-global" "gt" "gt --momentum-form quasi-global")
latency=("allreduce" "allreduce --allreduce-algo tree" "allreduce --allreduce-algo rd" "dpsgd")

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" "$out/plotdata" "$out"/*.png "$out"/*.csv "$out/README.md" "$out/manifest.tsv" "$out/meta.json"
mkdir -p "$out/runs"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
total=$((${#slow[@]} + 2 * seeds * ${#noniid[@]} + ${#latency[@]}))
echo "gossip ($mode): $total trainings, $n peers on a ring, MLP 784-$hidden-10, batch $batch per peer; results -> $out"
printf 'label\tpart\talgorithm\trun_dir\tepochs\tpeers\tseed\n' > "$out/manifest.tsv"
index=0
slug() { tr ' :.' '___' <<< "$1"; }
# train PART FLAGS EPOCHS TOPOLOGY_NAME LINKS [MORE_FLAGS...]: one training on a ring of n
# with seed $run_seed, its run folder runs/PART-FLAGS[-sSEED], and its line in the manifest.
run_seed=$seed
train() {
  local part=$1 flags=$2 epochs=$3 name=$4 links=$5
  shift 5
  index=$((index + 1))
  local dir=runs/$part-$(slug "$flags")
  [[ $run_seed == "$seed" ]] || dir=$dir-s$run_seed
  mkdir -p "$out/$dir"
  pt_write_topology "$out/$dir/topology.yaml" "$name" "$n" "{generator: ring, n: $n}" "$links"
  # shellcheck disable=SC2086
  pt_launch "$index" "$total" "$part/$flags" "$out/$dir" "$out/$dir/topology.yaml" --algorithm $flags \
    --hidden "$hidden" --epochs "$epochs" --batch "$batch" --lr "$lr" --seed "$run_seed" "$@" "${extra[@]}"
  printf '%s/%s/s%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$part" "$flags" "$run_seed" "$part" "$flags" "$dir" "$epochs" "$n" \
    "$run_seed" >> "$out/manifest.tsv"
}
slow_mbps=10
# The CI test's tiny form checks the pipeline, not the network: a faster "slow" link keeps it short.
[[ $mode == tiny ]] && slow_mbps=100
slow_links=$(printf '  default: {latency_ms: 0, bandwidth_mbps: %s}\n  node_bandwidth_mbps: %s' "$slow_mbps" "$slow_mbps")
for flags in "${slow[@]}"; do
  epochs=$slow_epochs
  [[ $flags == allreduce* ]] && epochs=$base_epochs
  train slow "$flags" "$epochs" "ring$n-10mbit" "$slow_links" --eval-every 20
done
# With the default momentum 0.9 and without momentum (D² is analysed for plain SGD), over
# $seeds seeds (the seed draws the shards, the model and the batches).
for ((s = 0; s < seeds; s++)); do
  run_seed=$((seed + s))
  for flags in "${noniid[@]}"; do
    train noniid "$flags" "$noniid_epochs" "ring$n" "" --partition dirichlet --alpha 0.1 --momentum 0.9
  done
  for flags in "${noniid[@]}"; do
    train noniid-m0 "$flags" "$noniid_epochs" "ring$n" "" --partition dirichlet --alpha 0.1 --momentum 0
  done
done
run_seed=$seed
for flags in "${latency[@]}"; do
  train latency "$flags" "$base_epochs" "ring$n-10ms" "  default: {latency_ms: 10, bandwidth_mbps: 0}" --eval-every 20
done
pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/gossip/report.py $out)"
pt_report "$out" "slow/dpsgd/s1"
echo "report: $out/README.md"
