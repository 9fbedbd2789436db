#!/usr/bin/env bash
# Experiment: time to accuracy on swept and uneven networks.
#  1. accuracy: each algorithm on the fast network (no emulation), 3 seeds, and one worker
#     alone (n = 1, batch n × 32): the steps until x̄ reaches the target test accuracy. The algorithms are
#     synchronous, so their iterates do not depend on the network: on any network the time
#     to the target is these steps times the step's time there;
#  2. sweep: bandwidth 1000, 100, 10, 1 Mbit/s × latency 0, 1, 5, 20, 50 ms (every link and
#     every card, both ways), each algorithm: the time per step, fitted by an α-β model
#     (lib/netmodel.py) that predicts every point and the crossovers;
#  3. uneven: one straggler link (10 Mbit/s in a 100 Mbit/s ring) and log-normal per-link
#     bandwidths (median 100 Mbit/s, σ = 1), predicted by the fitted model;
#  4. netns: the low-bandwidth points again with the kernel doing the shaping (a network
#     namespace per peer, veth cables into a bridge, tc tbf on every cable: scripts/netlab.sh),
#     against the engine's own link emulation. Needs root; skipped, and said so, without it.
# Algorithms: D-PSGD, CHOCO-SGD with qsgd:4, the parameter server, ring and tree all-reduce.
# Writes the runs, CSVs, plots and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/networks/run.sh [--quick] [--out DIR]

  --quick     4 peers, bandwidth 100 and 1 Mbit/s × latency 0 and 20 ms, one seed, the
              straggler only, one netns point: under 10 minutes on 2 cores
  --out DIR   where results go (default: experiments/networks/results)
  -h, --help  this help

Full mode: 8 peers, MLP 784-32-10 (101,800 bytes a message), batch 32 per peer, lr 0.05;
15 accuracy runs (2 epochs) and one worker alone; 100 sweep runs, each sized to take about
12 s of steps (4 to 60 steps, evaluated once at the end so that no evaluation hides a
transfer); 10 uneven runs; 10 netns runs. About 50 minutes on a quiet 2-core machine.
Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args networks "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools
/usr/bin/python3 -c 'import numpy' 2> /dev/null || pt_die "the report needs numpy (apt-get install python3-numpy)"

hidden=32 batch=32 lr=0.05 target=0.8 acc_limit=() netns_rates=()
algorithms=(dpsgd choco ps ring tree)
case $mode in
  full) n=8 bandwidths=(1000 100 10 1) latencies=(0 1 5 20 50) seeds=3 acc_epochs=2 uneven=(straggler lognormal)
    netns_rates=(10 1) budget=12 ;;
  quick) n=4 bandwidths=(100 1) latencies=(0 20) seeds=1 acc_epochs=1 uneven=(straggler) netns_rates=(1) budget=5 ;;
  tiny) n=4 bandwidths=(100 10) latencies=(0 5) seeds=1 acc_epochs=1 uneven=(straggler) netns_rates=(10) budget=0.3
    algorithms=(dpsgd ring) hidden=16 acc_limit=(--max-steps 20) target=0.3 ;;
esac

# Bytes of one message of the whole model: 4 per parameter.
size=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, '$PT_SCRIPT_DIR/../lib'); import expkit; print(4 * expkit.mlp_parameters('$hidden'))")
netmodel() {  # PYTHON: run with lib/netmodel.py imported as m
  /usr/bin/python3 -c "import math, sys; sys.path.insert(0, '$PT_SCRIPT_DIR/../lib'); import netmodel as m; $1"
}
flags_of() { netmodel "print(m.ALGORITHMS['$1'])"; }
steps_for() {  # ALGORITHM LATENCY_MS BANDWIDTH_MBPS -> steps of about $budget seconds
  netmodel "print(min(60, max(4, math.ceil($budget / m.rough_step_s('$1', $n, $size, $2, $3)))))"
}
uniform_links() {  # LATENCY_MS BANDWIDTH_MBPS: every link and every card, both ways
  printf '  default: {latency_ms: %s, bandwidth_mbps: %s}\n  node_bandwidth_mbps: %s\n  node_ingress_mbps: %s' "$1" "$2" "$2" "$2"
}
uneven_links() {  # NAME -> the links block: 1 ms everywhere, 100 Mbit/s cards or uncapped
  case $1 in
    straggler)
      uniform_links 1 100
      printf '\n  overrides:\n    - {between: [0, 1], bandwidth_mbps: 10}'
      ;;
    lognormal)
      printf '  default: {latency_ms: 1, bandwidth_mbps: 100}\n  overrides:\n'
      netmodel "[print(f'    - {{between: [{i}, {j}], bandwidth_mbps: {b}}}') for (i, j), b in sorted(m.lognormal_bandwidths($n, 100, 1.0, 7).items())]"
      ;;
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

netlab=$PT_SCRIPT_DIR/../../scripts/netlab.sh
netns_ok=yes
if ((${#netns_rates[@]})) && ! why=$("$netlab" check 2>&1); then
  echo "netns part skipped: $why"
  printf '%s\n' "$why" > "$out/netns-skipped.txt"
  netns_ok=no
fi
sweep=$((${#bandwidths[@]} * ${#latencies[@]} * ${#algorithms[@]}))
total=$((${#algorithms[@]} * seeds + 1 + sweep + ${#uneven[@]} * ${#algorithms[@]}))
[[ $netns_ok == yes ]] && total=$((total + ${#netns_rates[@]} * ${#algorithms[@]}))
echo "networks ($mode): $total trainings of $n peers ({${algorithms[*]}}), MLP 784-$hidden-10, $size bytes a message; results -> $out"
printf 'label\tpart\talgorithm\tpeers\tbandwidth_mbps\tlatency_ms\tnetwork\tseed\tsteps\ttarget\trun_dir\n' > "$out/manifest.tsv"
index=0
# record LABEL PART ALGORITHM PEERS BANDWIDTH LATENCY NETWORK SEED STEPS DIR: the manifest line.
record() {
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" "$7" "$8" "$9" "$target" \
    "${10}" >> "$out/manifest.tsv"
}
# train PART ALGORITHM PEERS NETWORK LINKS SEED STEPS [FLAGS...]: one training of the engine.
train() {
  local part=$1 algorithm=$2 peers=$3 network=$4 links=$5 seed=$6 steps=$7
  shift 7
  index=$((index + 1))
  local dir=runs/$part-$network-$algorithm-s$seed
  mkdir -p "$out/$dir"
  pt_write_topology "$out/$dir/topology.yaml" "ring$peers-$network" "$peers" "{generator: ring, n: $peers}" "$links"
  local flags="--algorithm local"
  [[ $algorithm == single ]] || flags=$(flags_of "$algorithm")
  # shellcheck disable=SC2086
  pt_launch "$index" "$total" "$part/$network/$algorithm/s$seed" "$out/$dir" "$out/$dir/topology.yaml" $flags \
    --hidden "$hidden" --batch "$batch" --lr "$lr" --seed "$seed" --partition iid "$@"
  local bw=${network%%-*} lat=${network#*-}
  [[ $part == sweep ]] || bw="" lat=""
  record "$part/$network/$algorithm/s$seed" "$part" "$algorithm" "$peers" "${bw%mbit}" "${lat%ms}" "$network" "$seed" \
    "$steps" "$dir"
}

# 1. Steps to the target on the fast network, and one worker alone.
for ((s = 1; s <= seeds; s++)); do
  for a in "${algorithms[@]}"; do
    train accuracy "$a" "$n" fast "" "$s" 0 --epochs "$acc_epochs" --eval-every 10 "${acc_limit[@]}"
  done
done
# One worker doing all n peers' work a step (batch n × $batch): all-reduce's iterates, so the
# same steps to the target, at one process's speed: the speed-up is the systems' alone.
train accuracy single 1 fast "" 1 0 --epochs "$acc_epochs" --eval-every 10 "${acc_limit[@]}" --batch $((batch * n))
# 2. The sweep: time per step, one evaluation at the end.
for bw in "${bandwidths[@]}"; do
  for lat in "${latencies[@]}"; do
    for a in "${algorithms[@]}"; do
      steps=$(steps_for "$a" "$lat" "$bw")
      train sweep "$a" "$n" "${bw}mbit-${lat}ms" "$(uniform_links "$lat" "$bw")" 1 "$steps" --epochs 100 \
        --max-steps "$steps" --eval-every "$steps"
    done
  done
done
# 3. Uneven networks.
for net in "${uneven[@]}"; do
  for a in "${algorithms[@]}"; do
    steps=$(steps_for "$a" 1 10)
    train uneven "$a" "$n" "$net" "$(uneven_links "$net")" 1 "$steps" --epochs 100 --max-steps "$steps" \
      --eval-every "$steps"
  done
done
# 4. The kernel's shaping: peer r on host r of a lab, every cable tbf-shaped to the rate.
if [[ $netns_ok == yes ]] && ((${#netns_rates[@]})); then
  lab=nw$$
  trap '"$netlab" down "$lab" > /dev/null 2>&1 || true' EXIT
  "$netlab" up "$lab" "$n" --rate "${netns_rates[0]}mbit" || pt_die "netlab could not make a lab of $n hosts"
  for rate in "${netns_rates[@]}"; do
    for ((r = 0; r < n; r++)); do "$netlab" shape "$lab" "$r" "${rate}mbit"; done
    for a in "${algorithms[@]}"; do
      index=$((index + 1))
      steps=$(steps_for "$a" 0 "$rate")
      dir=runs/netns-${rate}mbit-$a
      mkdir -p "$out/$dir"
      "$netlab" topology "$lab" ring "$n" 7000 > "$out/$dir/topology.yaml"
      printf '[%*d/%d] %-34s ' ${#total} "$index" "$total" "netns/${rate}mbit/$a"
      start=$SECONDS pids=()
      for ((r = 0; r < n; r++)); do
        # shellcheck disable=SC2046
        timeout 600 "$netlab" exec "$lab" "$r" "$PEERTRAIN" peer --rank "$r" --topology "$out/$dir/topology.yaml" \
          $(flags_of "$a") --hidden "$hidden" --batch "$batch" --lr "$lr" --seed 1 --partition iid --epochs 100 \
          --max-steps "$steps" --eval-every "$steps" --out "$out/$dir/out-$r" > "$out/$dir/peer-$r.log" 2>&1 < /dev/null &
        pids+=($!)
      done
      failed=0
      for p in "${pids[@]}"; do wait "$p" || failed=1; done
      ((failed == 0)) || pt_die "netns run ${rate}mbit/$a failed; see $out/$dir/peer-*.log"
      mv "$out/$dir/out-0/metrics.csv" "$out/$dir/out-0/summary.json" "$out/$dir/"
      printf '%4ds  (elapsed %s)\n' $((SECONDS - start)) "$(pt_clock $((SECONDS - PT_T0)))"
      record "netns/${rate}mbit/$a/s1" netns "$a" "$n" "$rate" 0 "${rate}mbit-0ms" 1 "$steps" "$dir"
    done
  done
  "$netlab" down "$lab"
  trap - EXIT
fi
pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/networks/report.py $out)"
pt_report "$out" "uneven/straggler/dpsgd/s1"
echo "report: $out/README.md"
