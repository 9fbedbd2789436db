#!/usr/bin/env bash
# Experiment: directed and random graphs (docs/algo.md, "Directed graphs") on simulated
# clusters (launch --simulate, 1 Gbit/s links, 1 ms), the MLP on Fashion-MNIST:
#  1. Epidemic Learning against a static graph at equal bytes: EL-Local and EL-Oracle with
#     s = ⌈log₂ n⌉ against D-PSGD on a random s-regular graph (each peer sends s models a
#     round in all three), n = 16 and 32, non-iid shards (Dirichlet α = 0.1), 3 seeds: the
#     rounds until the peers' mean local accuracy reaches a target;
#  2. SGP on the one-peer directed exponential graph (one message a peer a step) against
#     D-PSGD on the exponential graph (2⌈log₂ n⌉ − 1 messages), same shards and seeds: the
#     final accuracy of x̄ and of the peers' own models;
#  3. the consensus distance each graph holds in training (iid shards, momentum 0, seed 1)
#     against the steady state its mixing matrices predict (experiments/lib/consensus_model.py),
#     D-PSGD, SGP and EL alike.
# Writes the runs, CSVs, plots and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/directed/run.sh [--quick] [--out DIR]

  --quick     n = 16 only, one seed, 300 steps: about 8 minutes on 2 cores
  --out DIR   where results go (default: experiments/directed/results)
  -h, --help  this help

Full mode: parts 1 and 2 at n = 16 and 32 over 3 seeds, batch 32 per peer, 400 steps at
n = 16 and 290 (5 epochs) at n = 32 (30 trainings), and part 3's 9 trainings of 200 steps: about 60 minutes on a quiet 2-core
machine. A run whose summary.json is complete is kept, so an interrupted run.sh goes on
where it stopped.
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args directed "$@"
pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

case $mode in
  full) sizes=(16 32) seeds=(1 2 3) steps=400 consensus_steps=200 ;;
  quick) sizes=(16) seeds=(1) steps=300 consensus_steps=200 ;;
  tiny) sizes=(4) seeds=(1) steps=20 consensus_steps=20 ;;
esac
eval_every=$((steps / 40 > 0 ? steps / 40 : 1))
[[ $mode != tiny ]] || eval_every=5
noniid=(--partition dirichlet --alpha 0.1)
[[ $mode != tiny ]] || noniid=(--partition dirichlet --alpha 0.1 --hidden 16)
links="  default: {bandwidth_mbps: 1000, latency_ms: 1}"

steps_for() {  # N -> the steps a run of N peers takes: $steps, or the 5 epochs launch defaults to if fewer
  local per_epoch=$((60000 / ($1 * 32)))
  ((per_epoch * 5 < steps)) && echo $((per_epoch * 5)) || echo "$steps"
}
fanout_of() {  # N -> ⌈log₂ N⌉
  local s=0
  while (((1 << s) < $1)); do s=$((s + 1)); done
  echo "$s"
}
# METHOD N -> "GRAPH_YAML|FLAGS"
setting() {
  local s
  s=$(fanout_of "$2")
  case $1 in
    el-local) echo "{generator: complete, n: $2}|--algorithm el --fanout $s" ;;
    el-oracle) echo "{generator: complete, n: $2}|--algorithm el --fanout $s --el-variant oracle" ;;
    dpsgd-regular) echo "{generator: random-regular, n: $2, degree: $s, seed: 1}|--algorithm dpsgd" ;;
    sgp-one-peer) echo "{generator: one-peer-directed-exponential, n: $2}|--algorithm sgp" ;;
    sgp-exponential) echo "{generator: directed-exponential, n: $2}|--algorithm sgp" ;;
    sgp-random-out) echo "{generator: random-out, n: $2, fanout: 2, seed: 1}|--algorithm sgp" ;;
    dpsgd-exponential) echo "{generator: exponential, n: $2}|--algorithm dpsgd" ;;
    dpsgd-one-peer) echo "{generator: one-peer-exponential, n: $2}|--algorithm dpsgd" ;;
    dpsgd-complete) echo "{generator: complete, n: $2}|--algorithm dpsgd" ;;
  esac
}

el_methods=(el-local el-oracle dpsgd-regular)
sgp_methods=(sgp-one-peer dpsgd-exponential)
consensus_methods=(dpsgd-complete dpsgd-exponential dpsgd-regular dpsgd-one-peer sgp-one-peer sgp-exponential
  sgp-random-out el-local el-oracle)
consensus_n=16
[[ $mode != tiny ]] || consensus_methods=(dpsgd-complete sgp-one-peer el-local) consensus_n=4

mkdir -p "$out/runs"
rm -f "$out"/*.csv "$out"/*.png "$out"/*.dat "$out"/*.gp "$out/README.md"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
total=$(((${#el_methods[@]} + ${#sgp_methods[@]}) * ${#sizes[@]} * ${#seeds[@]} + ${#consensus_methods[@]}))
echo "directed ($mode): $total simulated trainings; results -> $out"
printf 'label\tpart\tmethod\tpeers\tseed\trun_dir\n' > "$out/manifest.tsv"
index=0

# run PART METHOD N SEED N_STEPS [FLAGS...]: one simulated training, recorded in manifest.tsv.
run() {
  local part=$1 method=$2 n=$3 seed=$4 n_steps=$5
  shift 5
  local dir=runs/$part-$method-n$n-s$seed spec graph flags
  spec=$(setting "$method" "$n")
  graph=${spec%%|*} flags=${spec#*|}
  index=$((index + 1))
  mkdir -p "$out/$dir"
  pt_write_topology "$out/$dir/topology.yaml" "$method-n$n" "$n" "$graph" "$links"
  if [[ ! -s $out/$dir/summary.json ]] || ! grep -q "\"steps\": $n_steps," "$out/$dir/summary.json"; then
    # shellcheck disable=SC2086
    pt_launch "$index" "$total" "$part/$method/n$n/s$seed" "$out/$dir" "$out/$dir/topology.yaml" --simulate \
      --max-steps "$n_steps" --seed "$seed" $flags "$@"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$part/$method/n$n/s$seed" "$part" "$method" "$n" "$seed" "$dir" \
    >> "$out/manifest.tsv"
}

for n in "${sizes[@]}"; do
  n_steps=$(steps_for "$n")
  [[ $mode != tiny ]] || n_steps=$steps
  for seed in "${seeds[@]}"; do
    for m in "${el_methods[@]}"; do run el "$m" "$n" "$seed" "$n_steps" --eval-every "$eval_every" "${noniid[@]}"; done
    for m in "${sgp_methods[@]}"; do run sgp "$m" "$n" "$seed" "$n_steps" --eval-every "$eval_every" "${noniid[@]}"; done
  done
done
tiny_model=()
[[ $mode != tiny ]] || tiny_model=(--hidden 16)
for m in "${consensus_methods[@]}"; do
  run consensus "$m" "$consensus_n" 1 "$consensus_steps" --eval-every 10 --momentum 0 --lr 0.05 "${tiny_model[@]}"
done

pt_finish_meta "$out/meta.json"
/usr/bin/python3 "$PT_SCRIPT_DIR/report.py" "$out" "$PEERTRAIN"
pt_report "$out" "el/el-local/n${sizes[0]}/s1"
echo "report: $out/README.md"
