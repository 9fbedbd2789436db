#!/usr/bin/env bash
# Experiment: DiLoCo and its descendants (docs/algo.md) on the byte-level GPT (d 128,
# 4 layers), 8 peers on simulated clusters (launch --simulate), equal tokens for every
# method:
#  1. loss: data-parallel all-reduce, DiLoCo at H = 50 and 250, gossip DiLoCo on the
#     exponential graph (H = 50), and int8 Streaming DiLoCo with F = 4 fragments (H = 50,
#     τ = 1), at 1 Gbit/s, over 3 seeds: the final validation bits per byte, the bytes per
#     peer and the peak bytes of one exchange;
#  2. time to a target loss at 10 Gbit/s, 1 Gbit/s and 100 Mbit/s (hosts of 10 GFLOP/s) for
#     D-PSGD and CHOCO (qsgd:8) on the exponential graph, the all-reduce, DiLoCo (H = 50)
#     and Streaming DiLoCo: a table and a plot;
#  3. a longer budget (full mode): the all-reduce and DiLoCo H = 50 over 4 times the steps;
#  4. the outer optimizer (full mode, seed 1): DiLoCo H = 50 with the outer step a plain
#     average (FedAvg: outer lr 1, no momentum), and H = 10 with the paper's outer step.
# Writes the runs, CSVs, plots and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/diloco/run.sh [--quick] [--out DIR]

  --quick     200 steps, H = 25 and 100, one seed, 10 Gbit/s and 100 Mbit/s: about 12 minutes
              on 2 cores
  --out DIR   where results go (default: experiments/diloco/results)
  -h, --help  this help

Full mode: 750 steps of 4 sequences of 64 bytes per peer (1.5 M tokens in all), H = 50 and
250, 3 seeds; 27 simulated trainings, 2 of 3,000 steps and 2 more of 750: about 90
minutes on a quiet 2-core machine. A run whose summary.json is complete is kept, so an interrupted run.sh
goes on where it stopped.
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args diloco "$@"
pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

case $mode in
  full) steps=750 small=50 large=250 seeds=(1 2 3) rates=(10000 1000 100) eval_every=50 budget_steps=3000 ;;
  quick) steps=200 small=25 large=100 seeds=(1) rates=(10000 100) eval_every=25 ;;
  tiny) steps=24 small=8 large=12 seeds=(1) rates=(1000) eval_every=12 ;;
esac
loss_rate=${rates[${#rates[@]} / 2]}  # the loss runs' network: 1 Gbit/s in full mode
gpt=(--model gpt --d-model 128 --layers 4 --heads 4 --seq 64 --batch 4 --eval-windows 128)
[[ $mode != tiny ]] || gpt=(--model gpt --d-model 32 --layers 2 --heads 2 --seq 32 --batch 4 --eval-windows 16)
common=(--simulate "${gpt[@]}")
budget_steps=${budget_steps:-0}

flags_of() {  # METHOD -> its launch flags
  case $1 in
    allreduce) echo "--algorithm allreduce" ;;
    dpsgd) echo "--algorithm dpsgd" ;;
    choco) echo "--algorithm choco --compression qsgd:8" ;;
    diloco-small) echo "--algorithm diloco --inner-steps $small" ;;
    diloco-large) echo "--algorithm diloco --inner-steps $large" ;;
    diloco-gossip) echo "--algorithm diloco --inner-steps $small --outer-exchange gossip" ;;
    streaming-int8) echo "--algorithm diloco --inner-steps $small --fragments 4 --overlap 1 --outer-compression int8" ;;
    diloco-fedavg) echo "--algorithm diloco --inner-steps $small --outer-lr 1 --outer-momentum 0" ;;
    diloco-h10) echo "--algorithm diloco --inner-steps 10" ;;
  esac
}
graph_of() {  # METHOD -> the graph its peers sit on (the all-reduce and the server ignore it)
  case $1 in
    dpsgd | choco | diloco-gossip) echo "{generator: exponential, n: 8}" ;;
    *) echo "{generator: ring, n: 8}" ;;
  esac
}

loss_methods=(allreduce diloco-small diloco-large diloco-gossip streaming-int8)
time_methods=(dpsgd choco allreduce diloco-small streaming-int8)
[[ $mode != tiny ]] || loss_methods=(allreduce diloco-small streaming-int8) time_methods=(dpsgd diloco-small)

mkdir -p "$out/runs"
rm -f "$out"/*.csv "$out"/*.png "$out"/*.dat "$out"/*.gp "$out/README.md"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
# The time runs at the loss runs' rate with seed 1 are those loss runs.
extra=0
for m in "${time_methods[@]}"; do [[ " ${loss_methods[*]} " == *" $m "* ]] || extra=$((extra + 1)); done
total=$((${#loss_methods[@]} * ${#seeds[@]} + ${#time_methods[@]} * (${#rates[@]} - 1) + extra))
((budget_steps == 0)) || total=$((total + 4))
echo "diloco ($mode): $total simulated trainings; results -> $out"
printf 'label\tpart\tmethod\tseed\trate_mbps\trun_dir\n' > "$out/manifest.tsv"
index=0

# run PART METHOD SEED RATE [STEPS EVAL_EVERY]: one simulated training, recorded in manifest.tsv.
run() {
  local part=$1 method=$2 seed=$3 rate=$4 n_steps=${5:-$steps} every=${6:-$eval_every}
  local dir=runs/$method-s$seed-${rate}mbps
  [[ $part == loss || $part == time ]] || dir=runs/$part-$method-s$seed-${rate}mbps
  index=$((index + 1))
  mkdir -p "$out/$dir"
  pt_write_topology "$out/$dir/topology.yaml" "$method-${rate}mbps" 8 "$(graph_of "$method")" \
    "  default: {bandwidth_mbps: $rate, latency_ms: 1}"
  if [[ ! -s $out/$dir/summary.json ]] || ! grep -q "\"steps\": $n_steps," "$out/$dir/summary.json"; then
    # shellcheck disable=SC2046
    pt_launch "$index" "$total" "$part/$method/s$seed/${rate}mbps" "$out/$dir" "$out/$dir/topology.yaml" \
      "${common[@]}" --max-steps "$n_steps" --eval-every "$every" --seed "$seed" $(flags_of "$method")
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$part/$method/s$seed/${rate}mbps" "$part" "$method" "$seed" "$rate" "$dir" \
    >> "$out/manifest.tsv"
}

for seed in "${seeds[@]}"; do
  for m in "${loss_methods[@]}"; do run loss "$m" "$seed" "$loss_rate"; done
done
for rate in "${rates[@]}"; do
  for m in "${time_methods[@]}"; do
    if [[ $rate == "$loss_rate" && " ${loss_methods[*]} " == *" $m "* ]]; then continue; fi
    run time "$m" 1 "$rate"
  done
done

if ((budget_steps > 0)); then
  for m in allreduce diloco-small; do run budget "$m" 1 "$loss_rate" "$budget_steps" 250; done
  for m in diloco-fedavg diloco-h10; do run outer "$m" 1 "$loss_rate"; done
fi

pt_finish_meta "$out/meta.json"
/usr/bin/python3 "$PT_SCRIPT_DIR/report.py" "$out" "$steps" "$small" "$large" "$loss_rate" \
  "$(IFS=,; echo "${time_methods[*]}")"
pt_report "$out" "loss/diloco-small/s1/${loss_rate}mbps"
echo "report: $out/README.md"
