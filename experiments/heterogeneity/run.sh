#!/usr/bin/env bash
# Experiment: non-iid data, taken apart. How much of x̄'s accuracy gap to
# all-reduce comes from the update form, and how much from the graph's spectral gap?
#   Dirichlet α of ∞ (iid), 1, 0.3 and 0.1
#   × ring, exponential and complete graphs of 16 peers, and all-reduce
#   × the update form: cta (D-PSGD as Lian et al. write it), atc, and D² (Tang et al. 2018)
#   × momentum 0 and 0.9, × 3 seeds.
# The complete graph's W is J, the exact average, so whatever gap it leaves to all-reduce is
# the update form's; what a sparser graph adds on top of the complete graph, with the same
# form, is its spectral gap's. Writes the runs, CSVs, plots and a README.md computed from
# them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/heterogeneity/run.sh [--quick] [--out DIR]

  --quick     8 peers, α ∞ and 0.1 only, one epoch, one seed: about 3 minutes on 2 cores
  --out DIR   where results go (default: experiments/heterogeneity/results)
  -h, --help  this help

Full mode: 4 α × (3 graphs × 3 update forms + all-reduce) × momentum 0 and 0.9 × 3 seeds
= 240 trainings of 16 peers, MLP 784-32-10, batch 32 per peer, lr 0.05, 3 epochs each.
About 45 minutes on a quiet 2-core machine.
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args heterogeneity "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

hidden=32 batch=32 lr=0.05 extra=()
alphas=(inf 1 0.3 0.1)
graphs=(ring exponential complete)
forms=(cta atc d2)
momenta=(0 0.9)
case $mode in
  full) n=16 epochs=3 seeds=3 ;;
  quick) n=8 epochs=1 seeds=1 alphas=(inf 0.1) ;;
  tiny) n=4 epochs=1 seeds=1 alphas=(inf 0.1) graphs=(ring complete) forms=(cta atc) momenta=(0.9) hidden=16
    extra=(--max-steps 20) ;;
esac

algorithm_flags() {  # FORM -> the launch flags of that update form
  case $1 in
    cta) echo "--algorithm dpsgd --update cta" ;;
    atc) echo "--algorithm dpsgd --update atc" ;;
    d2) echo "--algorithm d2" ;;
    allreduce) echo "--algorithm allreduce" ;;
  esac
}
partition_flags() {  # ALPHA -> the launch flags of that partition
  if [[ $1 == inf ]]; then echo "--partition iid"; else echo "--partition dirichlet --alpha $1"; fi
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" "$out/plotdata" "$out"/*.png "$out"/*.csv "$out/README.md" "$out/manifest.tsv" "$out/meta.json" \
  "$out/report.html"
mkdir -p "$out/runs"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
total=$((${#alphas[@]} * (${#graphs[@]} * ${#forms[@]} + 1) * ${#momenta[@]} * seeds))
echo "heterogeneity ($mode): $total trainings, $n peers, MLP 784-$hidden-10, batch $batch per peer, $epochs epoch(s); results -> $out"
printf 'label\talpha\tgraph\tform\tmomentum\tseed\tpeers\trun_dir\n' > "$out/manifest.tsv"
index=0
# train ALPHA GRAPH FORM MOMENTUM SEED: one training and its line in the manifest.
train() {
  local alpha=$1 graph=$2 form=$3 momentum=$4 seed=$5
  index=$((index + 1))
  local label=a$alpha/$graph/$form/m$momentum/s$seed
  local dir=runs/a$alpha-$graph-$form-m$momentum-s$seed
  mkdir -p "$out/$dir"
  local generator=$graph
  [[ $graph == allreduce ]] && generator=ring
  pt_write_topology "$out/$dir/topology.yaml" "$graph$n" "$n" "{generator: $generator, n: $n}"
  # shellcheck disable=SC2046
  pt_launch "$index" "$total" "$label" "$out/$dir" "$out/$dir/topology.yaml" $(algorithm_flags "$form") \
    $(partition_flags "$alpha") --momentum "$momentum" --seed "$seed" --hidden "$hidden" --epochs "$epochs" \
    --batch "$batch" --lr "$lr" "${extra[@]}"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$alpha" "$graph" "$form" "$momentum" "$seed" "$n" "$dir" \
    >> "$out/manifest.tsv"
}
# Seeds outermost, so that a run cut short still holds whole seeds of every setting.
for ((s = 1; s <= seeds; s++)); do
  for momentum in "${momenta[@]}"; do
    for alpha in "${alphas[@]}"; do
      train "$alpha" allreduce allreduce "$momentum" "$s"
      for graph in "${graphs[@]}"; do
        for form in "${forms[@]}"; do
          train "$alpha" "$graph" "$form" "$momentum" "$s"
        done
      done
    done
  done
done
pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/heterogeneity/report.py $out)"
pt_report "$out" "a${alphas[-1]}/ring/cta/m${momenta[-1]}/s1"
echo "report: $out/README.md"
