#!/usr/bin/env bash
# Experiment: the step-time simulator against the engine. For a grid of
# strategies the engine runs here — sequence, tensor and pipeline parallelism, micro-batch
# counts, the schedules, a stage-mesh pair — measures the step time with `peertrain bench
# pipeline` and predicts it with `peertrain plan --strategy` (the same stage boundaries),
# then lets `peertrain plan` search 2 and 4 workers, by the simulator alone and with
# --measure 3, and measures its picks against the grid's best. Writes DIR/grid.tsv, search.tsv, a plot and README.md (report.py).
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << EOF
Usage: experiments/plan/run.sh [--quick] [--out DIR]

Measures each strategy of the grid (gpt d128 L4 H4 T128, batch 8) with bench pipeline
(the median of its steps; the median of 5 rounds over the grid) and predicts it with plan
--strategy from profiles taken afresh before each round (the median of the rounds'
predictions), then checks plan's pick, then predicts lian2017's runs across peers.

  --quick     3 measured steps a strategy instead of 9, one round of the grid instead of 5
              (profiled once, as plan does), 3 side-by-side rounds of the search's check
              instead of 5, and each fast lian2017 run retrained once instead of 3 times
              (about 4 minutes)
  --peers-only  redo only the across-peers part (after a new lian2017 run or a change to
              plan --topology), keeping DIR's grid and search results; about 4 minutes
  --out DIR   where results go (default: experiments/plan/results)
  -h, --help  this help

Full mode: about 15-20 minutes on 2 cores (about half of it profiling). The last round's profiles
are kept in DIR/profile.tsv. Environment: PEERTRAIN (default: <repo>/build/peertrain).
EOF
}

command_line="experiments/plan/run.sh${*:+ $*}"
steps=9
rounds=5
grid_rounds=5
profile_rounds=3
retrain_rounds=3
mode=full
peers_only=0
out=$PT_SCRIPT_DIR/results
while (($#)); do
  case $1 in
    --quick) steps=3 rounds=3 grid_rounds=1 profile_rounds=7 retrain_rounds=1 mode=quick ;;
    --peers-only) peers_only=1 ;;
    --out) out=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PT_T0=$SECONDS
pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools
mkdir -p "$out"
if ((peers_only)); then
  [[ -s $out/grid.tsv && -s $out/search.tsv && -s $out/meta.json ]] ||
    { echo "error: --peers-only needs a full run's grid.tsv, search.tsv and meta.json in $out" >&2; exit 1; }
  cp "$out/meta.json" "$out/meta.grid.json"
else
  pt_write_meta "$out/meta.json" "$mode" "$command_line"
fi
model=(--d-model 128 --layers 4 --heads 4 --seq 128 --batch 8)
cache="$out/profile.tsv"
((peers_only)) || rm -f "$cache"  # a validation profiles this machine afresh
# median A,B,...: the median of comma-separated numbers.
median() { /usr/bin/python3 -c 'import statistics, sys; print(statistics.median(map(float, sys.argv[1].split(","))))' "$1"; }
json() { /usr/bin/python3 -c "import json,sys; d=json.load(sys.stdin); d=d[0] if isinstance(d, list) else d; print($1)"; }
# flags ← a strategy's flags, with --pp and --microbatches always said (bench pipeline and
# plan default differently).
strategy_flags() {
  read -r -a flags <<< "$1"
  [[ " ${flags[*]} " == *" --pp "* ]] || flags+=(--pp 1)
  [[ " ${flags[*]} " == *" --microbatches "* ]] || flags+=(--microbatches 1)
}

# workers|the strategy's flags[|the model, when not the default one]
grid=(
  "1|--pp 1"
  "2|--sp 2"
  "2|--tp 2"
  "2|--pp 2 --microbatches 2 --schedule 1f1b"
  "2|--pp 2 --microbatches 4 --schedule 1f1b"
  "2|--pp 2 --microbatches 8 --schedule 1f1b"
  "2|--pp 2 --microbatches 4 --schedule gpipe"
  "2|--pp 2 --microbatches 4 --schedule zb-h1"
  "2|--pp 2 --microbatches 4 --schedule zb-v"
  "2|--pp 2 --microbatches 4 --schedule eager-1f1b"
  "2|--pp 2 --microbatches 4 --schedule interleaved"
  "3|--pp 3 --microbatches 4 --schedule 1f1b"
  "3|--pp 3 --microbatches 8 --schedule zb-h1"
  "4|--sp 4"
  "4|--tp 4"
  "4|--sp 2 --tp 2"
  "4|--sp 2 --pp 2 --microbatches 4"
  "4|--tp 2 --pp 2 --microbatches 4"
  "4|--pp 4 --microbatches 4 --schedule 1f1b"
  "4|--pp 4 --microbatches 8 --schedule 1f1b"
  "4|--pp 4 --microbatches 8 --schedule gpipe"
  "4|--pp 4 --microbatches 8 --schedule zb-h1"
  "4|--pp 4 --microbatches 8 --schedule zb-h2"
  "4|--pp 4 --microbatches 8 --schedule eager-1f1b"
  "4|--pp 2 --microbatches 4 --stage-mesh sp=2;tp=2"
  "4|--sp 2 --pp 2 --microbatches 8 --schedule zb-h1"
  "2|--pp 2 --microbatches 4|--d-model 128 --layers 4 --heads 4 --seq 256 --batch 8"
  "4|--sp 4|--d-model 128 --layers 4 --heads 4 --seq 256 --batch 8"
  "4|--pp 4 --microbatches 8 --schedule 1f1b|--d-model 128 --layers 4 --heads 4 --seq 128 --batch 16"
  "2|--sp 2|--d-model 128 --layers 4 --heads 4 --seq 128 --batch 4"
  "4|--tp 4|--d-model 256 --layers 4 --heads 8 --seq 128 --batch 8"
  "2|--pp 2 --microbatches 2|--d-model 64 --layers 4 --heads 4 --seq 64 --batch 4"
  "2|--pp 2 --microbatches 4 --vocab-parallel vocab-1"
  "2|--pp 2 --microbatches 4 --vocab-parallel vocab-2"
  "4|--pp 4 --microbatches 8 --vocab-parallel vocab-2"
  "2|--pp 2 --microbatches 4|--d-model 128 --layers 4 --heads 4 --seq 128 --batch 8 --vocab-size 8192"
  "2|--pp 2 --microbatches 4 --vocab-parallel vocab-1|--d-model 128 --layers 4 --heads 4 --seq 128 --batch 8 --vocab-size 8192"
  "2|--pp 2 --microbatches 4 --vocab-parallel vocab-2|--d-model 128 --layers 4 --heads 4 --seq 128 --batch 8 --vocab-size 8192"
)
if ((!peers_only)); then
echo "grid: ${#grid[@]} strategies, $grid_rounds rounds of $steps measured steps each, each round predicted from profiles taken just before it; the last round's kept in $cache"
base_model="${model[*]}"
# Round 1 measures and predicts every strategy; the later rounds measure them again with
# the same stage boundaries, the rounds interleaved over the grid, so a slow minute of this
# machine moves one measurement of many strategies rather than all of one. Its measured
# step is the median over the rounds.
declare -a r_workers r_strategy r_model r_replayed r_predicted r_simulate r_stages r_steps
# profile ROUND: the profiles a round's predictions read, in their own cache. For each
# model and worker count of the grid, the search over them measures every unit shape it
# needs together, in rounds (docs/plan.md), as a user's `plan --workers W` does; the grid's
# predictions then read them from the cache. Not the base model's vocabulary-parallel rows:
# with its 256-byte vocabulary the search leaves vocabulary parallelism out, so those rows
# profile their own shapes. In full mode every round of the grid profiles the machine
# afresh, just before it measures (3 rounds a unit instead of plan's 7: 15 in all; with 2,
# a unit's figure would be the mean of two, which one slow burst moves): a shared
# host's speed drifts over minutes, and profiles taken once, in one spell, would move
# every prediction of a run with that spell (docs/plan.md, Validation). A row's
# prediction is then the median of its rounds', as its measurement is.
profile() {
  local round=$1 workers row_model
  round_cache="$out/profile.round$round.tsv"
  rm -f "$round_cache"
  [[ $mode == quick ]] && return  # --quick: each row profiles what it lacks, plan's 7 rounds
  declare -A profiled=()
  for row in "${grid[@]}"; do
    IFS='|' read -r workers _ row_model <<< "$row"
    row_model=${row_model:-$base_model}
    [[ -n ${profiled["$workers|$row_model"]:-} ]] && continue
    profiled["$workers|$row_model"]=1
    read -r -a model <<< "$row_model"
    "$PEERTRAIN" plan "${model[@]}" --workers "$workers" --profile-cache "$round_cache" \
      --profile-rounds "$profile_rounds" --format json > /dev/null
  done
  echo "  round $round: profiled by ${#profiled[@]} searches (model, workers), $profile_rounds rounds a unit"
}
# predict I: row I's prediction from this round's profiles, with its measured stages.
predict() {
  local i=$1
  predicted=$("$PEERTRAIN" plan --strategy "${model[@]}" "${flags[@]}" --stages "${r_stages[i]}" \
    --profile-cache "$round_cache" --profile-rounds "$profile_rounds" --format json)
  r_predicted[i]+="${r_predicted[i]:+,}$(json 'd["step_s"]' <<< "$predicted")"
  r_simulate[i]+="${r_simulate[i]:+,}$(json 'd.get("simulate_s", 0)' <<< "$predicted")"
}
for ((round = 1; round <= grid_rounds; round++)); do
  profile "$round"
  i=0
  for row in "${grid[@]}"; do
    IFS='|' read -r workers strategy row_model <<< "$row"
    row_model=${row_model:-$base_model}
    strategy_flags "$strategy"
    read -r -a model <<< "$row_model"
    if ((round == 1)); then  # the engine chooses the stage boundaries; later rounds keep them
      measured=$("$PEERTRAIN" bench pipeline "${model[@]}" "${flags[@]}" --steps "$steps" --format json)
      r_stages[i]=$(json 'd["split"]' <<< "$measured")
      r_workers[i]=$workers r_strategy[i]=$strategy r_model[i]=$row_model
      r_replayed[i]=$(json 'd["replayed_step_s"]' <<< "$measured")
      r_steps[i]=$(json 'd["step_s"]' <<< "$measured")
      predict "$i"
      printf '  %-50s %-40s measured %6.2f ms, predicted %6.2f ms\n' "$strategy" "${row_model/$base_model/}" \
        "$(json 'd*1e3' <<< "${r_steps[i]}")" "$(json 'd*1e3' <<< "${r_predicted[i]}")"
    else
      predict "$i"
      measured=$("$PEERTRAIN" bench pipeline "${model[@]}" "${flags[@]}" --stages "${r_stages[i]}" --steps "$steps" \
        --format json)
      r_steps[i]+=",$(json 'd["step_s"]' <<< "$measured")"
    fi
    i=$((i + 1))
  done
  ((round == 1)) || echo "  round $round of $grid_rounds measured and predicted"
done
cp "$round_cache" "$cache"  # the last round's profiles: the search below reads them
printf 'workers\tflags\tmodel\tmeasured_s\treplayed_s\tpredicted_s\tsimulate_s\tstages\tmeasured_rounds_s\tpredicted_rounds_s\n' \
  > "$out/grid.tsv"
for ((i = 0; i < ${#grid[@]}; i++)); do
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${r_workers[i]}" "${r_strategy[i]}" "${r_model[i]}" \
    "$(median "${r_steps[i]}")" "${r_replayed[i]}" "$(median "${r_predicted[i]}")" "$(median "${r_simulate[i]}")" \
    "${r_stages[i]}" "${r_steps[i]}" "${r_predicted[i]}" >> "$out/grid.tsv"
done
rm -f "$out"/profile.round*.tsv
read -r -a model <<< "$base_model"
# The search's pick for 2 and 4 workers, measured like the grid: the simulator's alone
# (`plan`), and with its best 3 run on the engine (`plan --measure 3`).
printf 'workers\tmode\tpick\tflags\tpredicted_s\tmeasured_s\tstages\n' > "$out/search.tsv"
for workers in 2 4; do
  for search_mode in simulator measured; do
    extra=()
    [[ $search_mode == measured ]] && extra=(--measure 3)
    pick=$("$PEERTRAIN" plan "${model[@]}" --workers "$workers" --profile-cache "$cache" "${extra[@]}" --format json)
    name=$(json 'd["strategy"]' <<< "$pick")
    pflags=$(json 'd["flags"]' <<< "$pick")
    pstep=$(json 'd["step_s"]' <<< "$pick")
    stages=$(json 'd["stages"]' <<< "$pick")
    read -r -a flags <<< "$pflags"
    measured=$("$PEERTRAIN" bench pipeline "${model[@]}" "${flags[@]}" --stages "$stages" --steps "$steps" --format json)
    step=$(json 'd["step_s"]' <<< "$measured")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$workers" "$search_mode" "$name" "$pflags" "$pstep" "$step" "$stages" \
      >> "$out/search.tsv"
    echo "  plan --workers $workers${extra[*]:+ ${extra[*]}} picks $name: predicted $(json 'd*1e3' <<< "$pstep") ms," \
      "measured $(json 'd*1e3' <<< "$step") ms"
  done
done
# The grid's best is the least of a dozen measurements, each ±3-10 % here, so it is
# biased low (the winner's curse) against the pick's one measurement. Measure the picks and
# the grid's three best of its worker count again, side by side, in rounds whose order
# rotates (the first run of a round is not always the same one); report.py compares their
# medians. A strategy named twice (a pick that is one of the grid's three, say) is
# measured once, under all its names: measuring one configuration twice would only compare
# the machine's noise with itself.
printf 'workers\tround\tcandidate\tflags\tstages\tmeasured_s\n' > "$out/sidebyside.tsv"
for workers in 2 4; do
  candidate_lines=$(
    /usr/bin/python3 - "$out/grid.tsv" "$out/search.tsv" "$workers" "$base_model" <<'PY'
import csv, sys
grid, search, workers, base = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
DEFAULTS = {"--sp": "1", "--tp": "1", "--pp": "1", "--microbatches": "1", "--schedule": "1f1b", "--chunks": "2",
            "--vocab-parallel": "none", "--reshard": "send-recv"}
def key(flags, stages):
    words = flags.split()
    named = dict(DEFAULTS, **dict(zip(words[0::2], words[1::2])))
    if named["--schedule"] != "interleaved":
        named.pop("--chunks")
    if "--stage-mesh" in named:  # "sp=2;tp=2" and "sp=2,tp=1;sp=1,tp=2" name the same meshes
        meshes = []
        for stage in named["--stage-mesh"].split(";"):
            mesh = dict({"sp": "1", "tp": "1"}, **dict(kv.split("=") for kv in stage.split(",") if kv))
            meshes.append((mesh["sp"], mesh["tp"]))
        named["--stage-mesh"] = tuple(meshes)
        named.pop("--sp", None)
        named.pop("--tp", None)
    return tuple(sorted(named.items())), stages
candidates = {}  # key -> [names, flags, stages], in first-seen order
def add(name, flags, stages):
    entry = candidates.setdefault(key(flags, stages), [[], flags, stages])
    if name not in entry[0]:
        entry[0].append(name)
for r in csv.DictReader(open(search), delimiter="\t"):
    if r["workers"] == workers:
        add("pick" if r.get("mode", "simulator") == "simulator" else "measured-pick", r["flags"], r["stages"])
rows = [r for r in csv.DictReader(open(grid), delimiter="\t") if r["workers"] == workers and r["model"] == base]
for r in sorted(rows, key=lambda r: float(r["measured_s"]))[:3]:
    add("grid", r["flags"], r["stages"])
for names, flags, stages in candidates.values():
    print(f"{'+'.join(names)}\t{flags}\t{stages}")
PY
  )
  [[ -n $candidate_lines ]] || { echo "error: no pick or grid strategy of $workers workers to measure" >&2; exit 1; }
  mapfile -t candidates <<< "$candidate_lines"
  n=${#candidates[@]}
  for ((round = 1; round <= rounds; round++)); do
    for ((j = 0; j < n; j++)); do
      IFS=$'\t' read -r kind cflags cstages <<< "${candidates[(j + round - 1) % n]}"
      strategy_flags "$cflags"
      measured=$("$PEERTRAIN" bench pipeline "${model[@]}" "${flags[@]}" --stages "$cstages" --steps "$steps" \
        --format json)
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$workers" "$round" "$kind" "$cflags" "$cstages" \
        "$(json 'd["step_s"]' <<< "$measured")" >> "$out/sidebyside.tsv"
    done
  done
  echo "  $workers workers: the picks and the grid's 3 best ($n strategies) measured again side by side, $rounds rounds"
done
fi
# Across peers: every run of the lian2017 experiment with seed 1, predicted from its
# topology file, with its --eval-every, on this machine's 2 cores as those runs had them.
# The network-bound runs (high latency, low bandwidth) are taken from lian2017's stored
# measurements (the seconds per step of peer 0; the other seeds step at the same pace).
# The fast network's runs are bound by the CPU, so by the binary, and are trained again
# here with this one: 12 runs of about 5 s, in $retrain_rounds rounds over the 12 (each run's
# figure the median of its rounds), since one fast run's pace moves by up to 20 % from one
# minute to the next on a shared 2-core host.
lian=$PT_SCRIPT_DIR/../lian2017/results
remeasured=$(mktemp -d)
trap 'rm -rf "$remeasured"' EXIT
printf 'label\tmeasured_s\tpredicted_s\twhere\tsource\twhole_run_s\tmeasured_rounds_s\tpredicted_rounds_s\n' > "$out/peers.tsv"
# Peer 0's seconds per step from a run's metrics.csv, as "STEADY WHOLE": STEADY from its
# first evaluation to its last (what plan predicts: a step of a running training), WHOLE
# over every step, as lian2017's report takes it. The difference is the first steps'
# one-time costs: a synchronous algorithm's first step waits for the last peer to start
# (about 90 ms in a 0.7 s fast run of 4 peers), and buffers are touched for the first time.
# (STEADY ends at the last evaluation that falls on the period: the last row is the final
# step, whose short stretch would carry a whole round of the other peers' tests.)
seconds_per_step() {  # METRICS_CSV STEPS EVAL_EVERY
  awk -F, -v steps="$2" -v every="$3" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    $col["peer"] == 0 {
      if (!seen++) { s0 = $col["step"]; w0 = $col["wall_s"] }
      w = $col["wall_s"]
      if (every > 0 && $col["step"] % every == 0) { s = $col["step"]; ws = w }
    }
    END {
      if (!(w > 0)) exit 1
      steady = (s > s0) ? (ws - w0) / (s - s0) : w / steps
      printf "%.9g %.9g\n", steady, w / steps
    }' "$1"
}
mapfile -t lian_runs < <(/usr/bin/python3 -c '
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r.get("seed", "1") == "1":
        print("\t".join(r[k] for k in ("label", "algorithm", "hidden", "batch", "s_per_step", "run_dir", "eval_every", "steps")))' "$lian/runs.csv")
((${#lian_runs[@]} > 0)) || { echo "error: no seed-1 run in $lian/runs.csv" >&2; exit 1; }
# predict LABEL ALGORITHM HIDDEN BATCH RUN_DIR EVAL_EVERY: plan's JSON for one run.
predict_run() {
  local flags=(--algorithm "$2")
  [[ $2 == tree ]] && flags=(--algorithm allreduce --allreduce-algo tree)
  "$PEERTRAIN" plan --topology "$lian/$5/topology.yaml" "${flags[@]}" --model mlp \
    --hidden "$3" --batch "$4" --eval-every "$6" --cores "$(nproc)" --format json
}
declare -A steady_rounds whole_rounds predicted_rounds where
for ((round = 1; round <= retrain_rounds; round++)); do
  for run in "${lian_runs[@]}"; do
    IFS=$'\t' read -r label algorithm hidden batch _ run_dir eval_every steps <<< "$run"
    [[ $label == fast/* ]] || continue
    # lian2017's own command, with this binary, its topology here and a scratch folder.
    read -r -a command < "$lian/$run_dir/command.txt"
    for ((i = 1; i < ${#command[@]}; i++)); do
      [[ ${command[i - 1]} == --topology ]] && command[i]="$lian/$run_dir/topology.yaml"
      [[ ${command[i - 1]} == --out ]] && command[i]="$remeasured/round$round/$run_dir"
    done
    "$PEERTRAIN" "${command[@]:1}" < /dev/null > "$remeasured/launch.log" 2>&1 ||
      { echo "error: retraining $label failed; see its log:" >&2; tail -5 "$remeasured/launch.log" >&2; exit 1; }
    metrics=$remeasured/round$round/$run_dir/metrics.csv
    read -r steady whole < <(seconds_per_step "$metrics" "$steps" "$eval_every") ||
      { echo "error: no wall_s of peer 0 in $metrics ($label)" >&2; exit 1; }
    steady_rounds[$label]+="${steady_rounds[$label]:+,}$steady"
    whole_rounds[$label]+="${whole_rounds[$label]:+,}$whole"
    # Predicted right after it was measured, with the host at the same pace (a plan's
    # probe and profile, like a run, move with it).
    prediction=$(predict_run "$label" "$algorithm" "$hidden" "$batch" "$run_dir" "$eval_every")
    predicted_rounds[$label]+="${predicted_rounds[$label]:+,}$(json 'd["step_s"]' <<< "$prediction")"
    where[$label]=$(json 'd["where"]' <<< "$prediction")
  done
  echo "  across peers: the fast network's runs retrained, round $round of $retrain_rounds"
done
for run in "${lian_runs[@]}"; do
  IFS=$'\t' read -r label algorithm hidden batch _ run_dir eval_every steps <<< "$run"
  if [[ $label == fast/* ]]; then
    source="retrained" rounds_s=${steady_rounds[$label]}
    s_per_step=$(median "$rounds_s") whole_s=$(median "${whole_rounds[$label]}")
    predicted_s=$(median "${predicted_rounds[$label]}") where_s=${where[$label]} predicted_rounds_s=${predicted_rounds[$label]}
  else
    metrics=$lian/$run_dir/metrics.csv
    source="lian2017"
    read -r s_per_step whole_s < <(seconds_per_step "$metrics" "$steps" "$eval_every") ||
      { echo "error: no wall_s of peer 0 in $metrics ($label)" >&2; exit 1; }
    rounds_s=$s_per_step
    prediction=$(predict_run "$label" "$algorithm" "$hidden" "$batch" "$run_dir" "$eval_every")
    predicted_s=$(json 'd["step_s"]' <<< "$prediction") where_s=$(json 'd["where"]' <<< "$prediction")
    predicted_rounds_s=$predicted_s
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$s_per_step" "$predicted_s" \
    "$where_s" "$source" "$whole_s" "$rounds_s" "$predicted_rounds_s" >> "$out/peers.tsv"
done
echo "  across peers: $(($(wc -l < "$out/peers.tsv") - 1)) lian2017 runs predicted"
if ((peers_only)); then  # the grid's dates and duration stay those of the full run
  mv "$out/meta.grid.json" "$out/meta.json"
else
  pt_finish_meta "$out/meta.json"
fi
/usr/bin/python3 "$PT_SCRIPT_DIR/report.py" "$out"
echo "report: $out/README.md"
