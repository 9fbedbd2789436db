#!/usr/bin/env bash
# Experiment: simulated clusters (launch --simulate, docs/simulate.md) against real runs,
# and at the scale of Lian et al. 2017.
#  1. fidelity: 8 peers, each of D-PSGD, ring all-reduce and the parameter server, run for
#     real and then simulated with the hosts calibrated from the real run's own compute time
#     per step (so that the comparison is of the network and the synchronisation): on the
#     engine's link emulation (10 Mbit/s and 10 ms on every link) and, where network
#     namespaces can be made, on the kernel's tbf shaping at 1000, 100 and 10 Mbit/s
#     (scripts/netlab.sh). The simulated time per step against the measured one.
#  2. lian2017: D-PSGD on a ring against a parameter server (C-PSGD) for n = 16 to 112 on
#     simulated 10 Gbit/s and 1 Gbit/s clusters: the speed-up of an epoch over one worker.
#  3. scale: 256 peers of the MLP on an exponential graph for 500 steps, and 1,024 peers of
#     a 64-unit MLP for 200 steps: the real time per simulated peer-step and the memory per
#     peer, against a real run's peer.
# Writes the runs, CSVs, plots and a README.md computed from them. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << USAGE
Usage: experiments/simulate/run.sh [--quick] [--out DIR]

  --quick     fidelity at 4 peers on the emulated link and 10 Mbit/s in namespaces, n = 16 and
              32 for lian2017, scale at 64 peers: about 5 minutes on 2 cores
  --out DIR   where results go (default: experiments/simulate/results)
  -h, --help  this help

Full mode: fidelity at 8 peers, MLP 784-32-10 (101,848 bytes a message), 30 steps each
(24 trainings, half of them real); lian2017 at n = 16, 32, 64, 112 on 10 and 1 Gbit/s,
MLP 784-512-512-10, 10 steps each (16 simulations); the two scale runs. About 40 minutes
on a quiet 2-core machine with 24 GiB. Environment: PEERTRAIN (default: <repo>/build/peertrain).
USAGE
}

pt_parse_args simulate "$@"
pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

case $mode in
  full) fid_n=8 fid_steps=30 rates=(1000 100 10) lian_n=(16 32 64 112) lian_steps=10 scale=full ;;
  quick) fid_n=4 fid_steps=15 rates=(10) lian_n=(16 32) lian_steps=5 scale=quick ;;
  tiny) fid_n=4 fid_steps=5 rates=(10) lian_n=(4 8) lian_steps=2 scale=none ;;
esac
fid_algorithms=(dpsgd ring ps)
shipped=yes  # also LV08 as SimGrid ships it, on the emulated links
[[ $mode != tiny ]] || fid_algorithms=(dpsgd ps) shipped=no
netlab=$PT_SCRIPT_DIR/../../scripts/netlab.sh
netns_ok=yes
if ! why=$("$netlab" check 2>&1); then
  echo "namespace part skipped: $why"
  netns_ok=no
fi
[[ $netns_ok == yes ]] || rates=()

mkdir -p "$out/runs"
rm -f "$out"/*.csv "$out"/*.png "$out/README.md"
PT_T0=$SECONDS
pt_init_ports
pt_write_meta "$out/meta.json" "$mode" "$command_line"
total=$((2 * ${#fid_algorithms[@]} * (1 + ${#rates[@]}) + 4 * ${#lian_n[@]}))
[[ $shipped == no ]] || total=$((total + ${#fid_algorithms[@]}))
case $scale in full | quick) total=$((total + 3)) ;; esac
echo "simulate ($mode): $total runs; results -> $out"
printf 'label\tpart\talgorithm\tpeers\tnetwork\tkind\tsteps\thost_speed\trss_kb\treal_s\trun_dir\n' > "$out/manifest.tsv"
index=0
record() {  # LABEL PART ALGORITHM PEERS NETWORK KIND STEPS HOST_SPEED RSS_KB REAL_S DIR
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$out/manifest.tsv"
}
flags_of() {
  case $1 in
    dpsgd) echo "--algorithm dpsgd" ;;
    ring) echo "--algorithm allreduce --allreduce-algo ring" ;;
    ps) echo "--algorithm ps" ;;
  esac
}
summary_field() { /usr/bin/python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
# The gradient's FLOPs of the MLP 784-H...-10 at batch B (model/mlp.cpp: 2·in·out·B per GEMM;
# the forward and the weight gradient of every layer, the input gradient above the first).
mlp_flops() {
  /usr/bin/python3 -c "import sys
w = [784] + [int(h) for h in sys.argv[1].split(',')] + [10]
print(sum(2 * w[i] * w[i + 1] * int(sys.argv[2]) * (2 if i == 0 else 3) for i in range(len(w) - 1)))" "$1" "$2"
}
# 1. Fidelity.
fid_hidden=32 fid_batch=32
fid_flops=$(mlp_flops $fid_hidden $fid_batch)
fid_common=(--hidden $fid_hidden --batch $fid_batch --lr 0.05 --seed 1 --epochs 100 --max-steps $fid_steps
  --eval-every $fid_steps)
# simulate_twin PART ALGORITHM NETWORK REAL_DIR TOPOLOGY [KIND SIMGRID_SETTING]: the simulated
# twin of a real run, its hosts as fast as the real peers' gradient was.
simulate_twin() {
  local part=$1 a=$2 network=$3 real=$4 topology=$5 kind=${6:-simulated} setting=${7:-}
  local steps compute speed
  local -a extra=()
  [[ -z $setting ]] || extra=(--sim-cfg "$setting")
  steps=$(summary_field "$out/$real/summary.json" steps)
  compute=$(summary_field "$out/$real/summary.json" mean_compute_s)
  speed=$(/usr/bin/python3 -c "print(f'{$fid_flops / ($compute / $steps):.6g}')")
  index=$((index + 1))
  local dir=runs/$part-$network-$a-$kind
  # shellcheck disable=SC2046
  pt_launch "$index" "$total" "$part/$network/$a/$kind" "$out/$dir" "$topology" --simulate --host-speed "$speed" \
    "${extra[@]}" $(flags_of "$a") "${fid_common[@]}"
  record "$part/$network/$a/$kind" "$part" "$a" "$fid_n" "$network" "$kind" "$steps" "$speed" "" "" "$dir"
}

network=emulated-10mbit-10ms
for a in "${fid_algorithms[@]}"; do
  index=$((index + 1))
  dir=runs/fidelity-$network-$a-real
  mkdir -p "$out/$dir"
  pt_write_topology "$out/$dir/topology.yaml" "ring$fid_n-$network" "$fid_n" "{generator: ring, n: $fid_n}" \
    "  default: {latency_ms: 10, bandwidth_mbps: 10}"
  # shellcheck disable=SC2046
  pt_launch "$index" "$total" "fidelity/$network/$a/real" "$out/$dir" "$out/$dir/topology.yaml" $(flags_of "$a") \
    "${fid_common[@]}"
  record "fidelity/$network/$a/real" fidelity "$a" "$fid_n" "$network" real "$fid_steps" "" "" "" "$dir"
  simulate_twin fidelity "$a" "$network" "$dir" "$out/$dir/topology.yaml"
  # LV08 as SimGrid ships it: every route's latency times 13.01.
  [[ $shipped == no ]] ||
    simulate_twin fidelity "$a" "$network" "$dir" "$out/$dir/topology.yaml" lv08-shipped network/latency-factor:13.01
done

if ((${#rates[@]})); then
  lab=sim$$
  trap '"$netlab" down "$lab" > /dev/null 2>&1 || true' EXIT
  "$netlab" up "$lab" "$fid_n" --rate "${rates[0]}mbit" || pt_die "netlab could not make a lab of $fid_n hosts"
  for rate in "${rates[@]}"; do
    for ((r = 0; r < fid_n; r++)); do "$netlab" shape "$lab" "$r" "${rate}mbit"; done
    network=netns-${rate}mbit
    for a in "${fid_algorithms[@]}"; do
      index=$((index + 1))
      dir=runs/fidelity-$network-$a-real
      mkdir -p "$out/$dir"
      "$netlab" topology "$lab" ring "$fid_n" 7000 > "$out/$dir/topology.yaml"
      printf '[%*d/%d] %-34s ' ${#total} "$index" "$total" "fidelity/$network/$a/real"
      start=$SECONDS pids=()
      for ((r = 0; r < fid_n; r++)); do
        # shellcheck disable=SC2046
        timeout 600 "$netlab" exec "$lab" "$r" "$PEERTRAIN" peer --rank "$r" --topology "$out/$dir/topology.yaml" \
          $(flags_of "$a") "${fid_common[@]}" --out "$out/$dir/out-$r" > "$out/$dir/peer-$r.log" 2>&1 < /dev/null &
        pids+=($!)
      done
      failed=0
      for p in "${pids[@]}"; do wait "$p" || failed=1; done
      ((failed == 0)) || pt_die "namespace run ${rate}mbit/$a failed; see $out/$dir/peer-*.log"
      mv "$out/$dir/out-0/metrics.csv" "$out/$dir/out-0/summary.json" "$out/$dir/"
      printf '%4ds  (elapsed %s)\n' $((SECONDS - start)) "$(pt_clock $((SECONDS - PT_T0)))"
      record "fidelity/$network/$a/real" fidelity "$a" "$fid_n" "$network" real "$fid_steps" "" "" "" "$dir"
      # The twin: each host's card shaped as the lab's cable, both ways.
      pt_write_topology "$out/$dir/simulated.yaml" "ring$fid_n-$network" "$fid_n" "{generator: ring, n: $fid_n}" \
        "$(printf '  node_bandwidth_mbps: %s\n  node_ingress_mbps: %s' "$rate" "$rate")"
      simulate_twin fidelity "$a" "$network" "$dir" "$out/$dir/simulated.yaml"
    done
  done
  "$netlab" down "$lab"
  trap - EXIT
fi

# 2. Lian et al.'s scale: batch 128 a worker, a host of 20 GFLOP/s (the 411 MFLOP gradient in
# 20.5 ms), each card at the cluster's rate both ways, 0.1 ms of latency a hop.
lian_speed=2e10
for gbit in 10 1; do
  for n in "${lian_n[@]}"; do
    for a in dpsgd ps; do
      index=$((index + 1))
      network=cluster-${gbit}gbit
      dir=runs/lian2017-$network-n$n-$a
      mkdir -p "$out/$dir"
      pt_write_topology "$out/$dir/topology.yaml" "ring$n-$network" "$n" "{generator: ring, n: $n}" \
        "$(printf '  default: {latency_ms: 0.1}\n  node_bandwidth_mbps: %s\n  node_ingress_mbps: %s' $((gbit * 1000)) $((gbit * 1000)))"
      # shellcheck disable=SC2046
      pt_launch "$index" "$total" "lian2017/$network/n$n/$a" "$out/$dir" "$out/$dir/topology.yaml" --simulate \
        --host-speed $lian_speed $(flags_of "$a") --batch 128 --seed 1 --epochs 100 --max-steps $lian_steps \
        --eval-every $lian_steps
      record "lian2017/$network/n$n/$a" lian2017 "$a" "$n" "$network" simulated "$lian_steps" $lian_speed "" "" "$dir"
    done
  done
done

# 3. Scale, with the peak memory and the real time of each run.
scale_run() {  # LABEL PEERS STEPS HIDDEN [--real]
  local label=$1 n=$2 steps=$3 hidden=$4 kind=${5:-simulated}
  index=$((index + 1))
  local dir=runs/scale-$label
  mkdir -p "$out/$dir"
  if [[ $kind == real ]]; then
    pt_write_topology "$out/$dir/topology.yaml" "exponential$n" "$n" "{generator: exponential, n: $n}"
  else
    printf 'name: exponential%s\ngraph: {generator: exponential, n: %s}\nweights: metropolis\n' "$n" "$n" \
      > "$out/$dir/topology.yaml"
  fi
  local -a sim=() cmd
  [[ $kind == real ]] || sim=(--simulate)
  cmd=("$PEERTRAIN" launch --topology "$out/$dir/topology.yaml" --out "$out/$dir" "${sim[@]}" --hidden "$hidden"
    --batch 32 --seed 1 --epochs 1000 --max-steps "$steps" --eval-every "$steps")
  printf '%q ' "${cmd[@]}" > "$out/$dir/command.txt"
  printf '[%*d/%d] %-34s ' ${#total} "$index" "$total" "scale/$label"
  local start=$SECONDS
  # The peak memory (KB; of launch's largest process, a peer for a real run) and the real seconds.
  /usr/bin/time -f '%M %e' -o "$out/$dir/time.txt" "${cmd[@]}" > "$out/$dir/launch.log" 2>&1 < /dev/null ||
    pt_die "run 'scale/$label' failed; see $out/$dir/launch.log"
  printf '%4ds  (elapsed %s)\n' $((SECONDS - start)) "$(pt_clock $((SECONDS - PT_T0)))"
  read -r rss real < "$out/$dir/time.txt"
  record "scale/$label" scale dpsgd "$n" exponential "$kind" "$steps" 1e10 "$rss" "$real" "$dir"
}
case $scale in
  full)
    scale_run real8 8 100 512,512 real
    scale_run n256 256 500 512,512
    scale_run n1024-h64 1024 200 64
    ;;
  quick)
    scale_run real4 4 50 512,512 real
    scale_run n64 64 50 512,512
    scale_run n256-h64 256 20 64
    ;;
esac

pt_finish_meta "$out/meta.json"
echo "runs done in $(pt_clock $((SECONDS - PT_T0))); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/simulate/report.py $out)"
