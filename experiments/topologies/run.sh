#!/usr/bin/env bash
# Experiment: how the gossip topology changes D-PSGD.
#
# The same model and data on n = 16 peers joined as a ring, a 4x4 torus, the exponential
# graph, the one-peer exponential graph and the complete graph, with ring all-reduce (the
# exact average) as the reference; on iid shards and on label-skewed shards (Dirichlet,
# alpha = 0.1); 3 seeds, so every difference carries a 95 % confidence interval. Then the
# byte-level GPT on a ring and an exponential graph against all-reduce, in bits per byte.
# Writes the runs, combined CSVs, PNG plots and a README.md report computed from the CSVs.
# See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << EOF
Usage: experiments/topologies/run.sh [--quick] [--out DIR]

Trains n peers on each topology (ring, torus, exponential, one-peer exponential,
complete, and ring all-reduce as the exact-average reference) on iid and on non-iid
(Dirichlet alpha 0.1) shards over 3 seeds, then the GPT (bytes of the fortunes text) on
a ring, an exponential graph and all-reduce over 3 seeds, and writes DIR/README.md with
tables (means with 95 % confidence intervals over the seeds) and plots.

  --quick     a smaller run (64,64 hidden units, 1 epoch; GPT 300 steps; one seed):
              under 10 minutes on 2 cores
  --out DIR   where results go (default: experiments/topologies/results)
  -h, --help  this help

Full mode: 16 peers; the 784-512-512-10 MLP, 3 epochs, batch 32 per peer, 36 trainings;
the GPT d64, 2 layers, context 64, batch 8 per peer, 1,200 steps, 9 trainings; about
50 minutes on a quiet 2-core machine (every peer is a process on this machine).
Environment: PEERTRAIN (default: <repo>/build/peertrain).
EOF
}

pt_parse_args topologies "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

# Settings per mode. eval_every gives each curve at least 10 points.
lr=0.05 batch=32 alpha=0.1
data_settings=(iid noniid)
# The GPT part: a small byte-level GPT (Adam, cosine schedule) whose x̄ is scored in bits
# per byte on held-out text; sized so 9 trainings of 16 peers take ~12 minutes here.
gpt_flags=(--model gpt --d-model 64 --layers 2 --heads 2 --seq 64 --batch 8 --lr 0.003 --weight-decay 0.1)
gpt_topologies=(ring exponential allreduce)
case $mode in
  full)
    n=16 hidden=512,512 train_flags=(--epochs 3) eval_every=18 seeds=(1 2 3)
    topologies=(ring torus exponential one-peer-exponential complete allreduce)
    gpt_steps=1200 gpt_eval_every=100 gpt_windows=128 gpt_seeds=(1 2 3)
    ;;
  quick)
    n=16 hidden=64,64 train_flags=(--epochs 1) eval_every=10 seeds=(1)
    topologies=(ring torus exponential one-peer-exponential complete allreduce)
    gpt_steps=300 gpt_eval_every=50 gpt_windows=64 gpt_seeds=(1)
    ;;
  tiny)
    # Two seeds, so the confidence intervals' code runs in CI.
    n=4 hidden=16 train_flags=(--max-steps 20) eval_every=2 seeds=(1 2)
    topologies=(ring allreduce)
    gpt_flags=(--model gpt --d-model 16 --layers 1 --heads 2 --seq 16 --batch 2 --lr 0.003 --weight-decay 0.1)
    gpt_topologies=(ring allreduce) gpt_steps=10 gpt_eval_every=5 gpt_windows=4 gpt_seeds=(1)
    ;;
esac

# Steps the run will take: the trainer's steps per epoch are floor(60000 / (n * batch)).
if [[ ${train_flags[0]} == --epochs ]]; then
  steps=$((train_flags[1] * (60000 / (n * batch))))
else
  steps=${train_flags[1]}
fi

# graph_of TOPOLOGY -> the `graph:` mapping of its topology file
graph_of() {
  case $1 in
    ring | allreduce) echo "{generator: ring, n: $n}" ;;
    torus)
      local rows=4
      ((n == 16)) || rows=2
      echo "{generator: torus, rows: $rows, cols: $((n / rows))}"
      ;;
    exponential) echo "{generator: exponential, n: $n}" ;;
    one-peer-exponential) echo "{generator: one-peer-exponential, n: $n}" ;;
    complete) echo "{generator: complete, n: $n}" ;;
  esac
}

degree_of() {  # messages of one model size each peer sends per step (for the estimate)
  case $1 in
    ring) echo 2 ;;
    torus) echo 4 ;;
    exponential) echo 7 ;;
    one-peer-exponential) echo 1 ;;
    complete) echo $((n - 1)) ;;
    allreduce) echo 2 ;;
  esac
}

# A rough duration model, fitted to the full runs on this 2-core machine (ring
# 40 s, complete 140 s of 16 peers): start-up (each peer reads Fashion-MNIST) ~0.8 s per
# peer; compute ~6·P·batch flops per peer-step at ~80 GFLOP/s per core; loopback traffic
# ~2 GB/s; an evaluation runs n+1 models on 10,000 images at ~160 GFLOP/s per core.
estimate_s() {
  local params
  params=$(/usr/bin/python3 -c "
h=[784]+[int(x) for x in '$hidden'.split(',')]+[10]
print(sum(a*b+b for a,b in zip(h,h[1:])))")
  local total=0 topo
  for topo in "${topologies[@]}"; do
    total=$(/usr/bin/python3 -c "
P,n,B,steps,deg,ev=$params,$n,$batch,$steps,$(degree_of "$topo"),$eval_every
cores=$(nproc)
step=n*6*P*B/80e9/cores + n*deg*4*P/2e9
evals=steps//ev+1
print($total + 2+0.8*n + steps*step + evals*((n+1)*2*P*1e4/160e9/cores + n*4*P/2e9))")
  done
  # The GPT: ~55 ms per peer-step for all 16 peers on 2 cores at full size (measured), and
  # the evaluation of x̄ on the held-out windows.
  /usr/bin/python3 -c "print(int($total * ${#data_settings[@]} * ${#seeds[@]} + \
    ${#gpt_topologies[@]} * ${#gpt_seeds[@]} * (2 + 0.8 * $n + $gpt_steps * 0.0035 * $n)))"
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" "$out/plotdata" "$out"/*.png "$out"/*.csv "$out/README.md" "$out/manifest.tsv" "$out/meta.json"
mkdir -p "$out/runs"

PT_T0=$SECONDS
pt_init_ports
total=$((${#data_settings[@]} * ${#topologies[@]} * ${#seeds[@]} + ${#gpt_topologies[@]} * ${#gpt_seeds[@]}))
est=$(estimate_s)
echo "topologies ($mode): $total trainings of $n peers: MLP 784-$(tr , - <<< "$hidden")-10, $steps steps each, batch $batch per peer, seeds ${seeds[*]}; then the GPT, $gpt_steps steps, seeds ${gpt_seeds[*]}"
echo "  every peer is a process on this machine ($(nproc) cores), so wall times grow with n"
echo "  estimated duration: ~$(pt_clock "$est") (m:ss) on a quiet machine; results -> $out"
pt_write_meta "$out/meta.json" "$mode" "$command_line"

printf 'label\tmodel\tdata\ttopology\talgorithm\tpeers\trun_dir\thidden\tbatch\tlr\tseed\teval_every\n' > "$out/manifest.tsv"
index=0
flag_value() {  # NAME FLAGS... -> the value after NAME
  local name=$1
  shift
  while (($# > 1)); do
    [[ $1 == "$name" ]] && { echo "$2"; return; }
    shift
  done
}
# launch_one MODEL DATA TOPOLOGY SEED [flags...]: one training, and its manifest row.
launch_one() {
  local model=$1 data=$2 topo=$3 seed=$4
  shift 4
  index=$((index + 1))
  local algorithm=dpsgd
  [[ $topo == allreduce ]] && algorithm=allreduce
  local label=$data/$topo/s$seed name=$data-$topo-s$seed
  local run_dir=$out/runs/$name
  mkdir -p "$run_dir"
  pt_write_topology "$run_dir/topology.yaml" "$topo$n" "$n" "$(graph_of "$topo")"
  "$PEERTRAIN" topology inspect "$run_dir/topology.yaml" --format json > "$run_dir/inspect.json" 2> "$run_dir/inspect.err" ||
    pt_die "topology inspect failed for '$label'; see $run_dir/inspect.err"
  pt_launch "$index" "$total" "$label" "$run_dir" "$run_dir/topology.yaml" --algorithm "$algorithm" --seed "$seed" "$@"
  local b=$batch l=$lr h=$hidden e=$eval_every
  if [[ $model == gpt ]]; then  # the GPT's batch and lr, as its flags give them
    b=$(flag_value --batch "${gpt_flags[@]}") l=$(flag_value --lr "${gpt_flags[@]}") h=- e=$gpt_eval_every
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$model" "$data" "$topo" "$algorithm" "$n" \
    "runs/$name" "$h" "$b" "$l" "$seed" "$e" >> "$out/manifest.tsv"
}
for seed in "${seeds[@]}"; do
  for data in "${data_settings[@]}"; do
    data_flags=(--partition iid)
    [[ $data == noniid ]] && data_flags=(--partition dirichlet --alpha "$alpha")
    for topo in "${topologies[@]}"; do
      launch_one mlp "$data" "$topo" "$seed" --hidden "$hidden" "${train_flags[@]}" --batch "$batch" --lr "$lr" \
        --eval-every "$eval_every" "${data_flags[@]}"
    done
  done
done
for seed in "${gpt_seeds[@]}"; do
  for topo in "${gpt_topologies[@]}"; do
    launch_one gpt gpt "$topo" "$seed" "${gpt_flags[@]}" --max-steps "$gpt_steps" --eval-every "$gpt_eval_every" \
      --eval-windows "$gpt_windows"
  done
done

pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))) (estimated $(pt_clock "$est")); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/topologies/report.py $out)"
pt_report "$out" "iid/ring/s1"
echo "report: $out/README.md"
