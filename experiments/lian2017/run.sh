#!/usr/bin/env bash
# Experiment: Lian et al. 2017 ("Can Decentralized Algorithms Outperform Centralized
# Algorithms?", NeurIPS) on one machine.
#
# D-PSGD on a ring against C-PSGD as a parameter server (--algorithm ps), as ring
# all-reduce (--algorithm allreduce) and as binomial-tree all-reduce (--allreduce-algo
# tree), for several n and 3 seeds, under three emulated networks: fast (no limits), low
# bandwidth (10 Mbit/s per link and per network card) and high latency (10 ms per link, a
# few links at 20 ms and 5 ms). Writes the runs, combined CSVs, PNG plots and a README.md
# report computed from the CSVs, with 95 % confidence intervals over the seeds. See --help.
set -euo pipefail

PT_SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../lib/common.sh
source "$PT_SCRIPT_DIR/../lib/common.sh"

usage() {
  cat << EOF
Usage: experiments/lian2017/run.sh [--quick] [--out DIR]

Trains D-PSGD (ring), a parameter server, ring all-reduce and binomial-tree all-reduce for
n = 4, 8, 16 peers under a fast, a low-bandwidth and a high-latency emulated network, with
seeds 1, 2 and 3, then writes DIR/README.md: training loss vs epoch and vs wall time (means
over the seeds), and the speed-up of D-PSGD in reaching a target loss over each baseline,
with 95 % confidence intervals over the seeds.

  --quick     n = 4 and 8 only, seeds 1 and 2, 60 steps per run: under 10 minutes on 2 cores
  --out DIR   where results go (default: experiments/lian2017/results)
  -h, --help  this help

Full mode: 108 trainings (4 algorithms x 3 n x 3 networks x 3 seeds), MLP 784-32-10,
1 epoch, batch 32 per peer; about 75 minutes on a quiet 2-core machine, half of it the
parameter server and the tree in the low-bandwidth network (every peer is a process on
this machine). One epoch, not two as with one seed: 3 seeds of 2 epochs would take about
2 h 20 min; one epoch buys the seeds, and every run still reaches the target loss (defined
half-way through the runs).
Environment: PEERTRAIN (default: <repo>/build/peertrain).
EOF
}

pt_parse_args lian2017 "$@"

pt_find_binary "$PT_SCRIPT_DIR"
pt_check_tools

lr=0.05 batch=32
# allreduce is the ring (the manifest's key since before the tree); tree its own key.
algorithms=(dpsgd ps allreduce tree)
# Hidden width: one layer of 32 (25,450 parameters, ~102 KB per message, ~81 ms at
# 10 Mbit/s). The paper-size 784-512-512-10 MLP is 2.7 MB per message, 2.2 s at
# 10 Mbit/s: a parameter server of 16 peers would need ~33 s per step.
# One epoch in full mode (two with one seed): 3 seeds × 4 algorithms of two epochs would
# take ~2 h 20 min on 2 cores; one epoch halves that, and buys the confidence intervals.
# Tiny runs two seeds, so that the report's confidence intervals are exercised.
case $mode in
  full)
    peer_counts=(4 8 16) networks=(fast highlat lowbw) hidden=32 epochs=1 max_steps=0 points=20 seeds=(1 2 3)
    ;;
  quick)
    peer_counts=(4 8) networks=(fast highlat lowbw) hidden=32 epochs=1 max_steps=60 points=12 seeds=(1 2)
    ;;
  tiny)
    peer_counts=(4) networks=(fast lowbw) hidden=16 epochs=1 max_steps=20 points=10 seeds=(1 2)
    ;;
esac

algorithm_flags() {  # manifest key -> launch flags
  case $1 in
    dpsgd) echo "--algorithm dpsgd" ;;
    ps) echo "--algorithm ps" ;;
    allreduce) echo "--algorithm allreduce --allreduce-algo ring" ;;
    tree) echo "--algorithm allreduce --allreduce-algo tree" ;;
  esac
}

steps_for() {  # N -> steps of one run (the trainer: floor(60000 / (n * batch)) per epoch)
  local s=$((epochs * (60000 / ($1 * batch))))
  ((max_steps > 0 && max_steps < s)) && s=$max_steps
  echo "$s"
}

network_links() {  # NAME N -> the `links:` block of the topology file
  local h=$(($2 / 2))
  case $1 in
    fast) ;;
    lowbw)
      echo "  default: {latency_ms: 0, bandwidth_mbps: 10}"
      echo "  node_bandwidth_mbps: 10"
      ;;
    highlat)
      echo "  default: {latency_ms: 10, bandwidth_mbps: 0}"
      echo "  overrides:"
      echo "    - {between: [0, 1], latency_ms: 20}"
      echo "    - {between: [$h, $((h + 1))], latency_ms: 20}"
      echo "    - {between: [0, $h], latency_ms: 5}"
      echo "    - {between: [$(($2 - 1)), 0], latency_ms: 5}"
      ;;
  esac
}

network_description() {
  case $1 in
    fast) echo "no emulation: loopback TCP between processes on this machine" ;;
    lowbw) echo "10 Mbit/s on every link, and node_bandwidth_mbps 10: a peer's links share one 10 Mbit/s card; no added latency" ;;
    highlat) echo "10 ms one-way latency on every link (default), overrides 20 ms on 0-1 and n/2-(n/2+1), 5 ms on 0-n/2 and (n-1)-0; no bandwidth limit" ;;
  esac
}

# Duration model, from runs on this 2-core machine (fitted to the 27 runs of 2 epochs and one
# seed: 30:49 measured, 32:30 modelled): start-up and the last evaluation ~1 s + 0.3 s per
# peer; a step of this small MLP ~1 ms per peer on loopback, evaluations included. At
# 10 Mbit/s a model-sized message takes 4P*8/1e7 s, and a step costs 2 of them (D-PSGD: two
# neighbours on one card), 2(n-1)/n (ring all-reduce), n-1 (the server's broadcast) or
# 2 log2(n) (the tree: every round sends the whole model, and the root's card carries one
# per round, up and down). At high latency 20 ms (D-PSGD), 40 ms (parameter server),
# 2(n-1) x 20 ms (the ring's sequential rounds, each as slow as its slowest link) or
# 2 log2(n) x 15 ms (the tree's sequential hops, over 5, 10 and 20 ms links). Times the
# number of seeds.
estimate_s() {
  local -a args=()
  local n
  for n in "${peer_counts[@]}"; do args+=("$n:$(steps_for "$n")"); done
  /usr/bin/python3 - "$hidden" "${networks[*]}" "${algorithms[*]}" "${#seeds[@]}" "${args[@]}" << 'EOF'
import math, sys
hidden, networks, algorithms, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), int(sys.argv[4])
widths = [784] + [int(h) for h in hidden.split(",")] + [10]
P = sum(a * b + b for a, b in zip(widths, widths[1:]))
msg = 4 * P * 8 / 1e7
total = 0.0
for arg in sys.argv[5:]:
    n, steps = (int(x) for x in arg.split(":"))
    for net in networks:
        for alg in algorithms:
            step = 0.001 * n
            if net == "lowbw":
                step += {"dpsgd": 2, "allreduce": 2 * (n - 1) / n, "ps": n - 1,
                         "tree": 2 * math.log2(n)}[alg] * msg
            elif net == "highlat":
                step += {"dpsgd": 0.02, "allreduce": 2 * (n - 1) * 0.02, "ps": 0.04,
                         "tree": 2 * math.log2(n) * 0.015}[alg]
            total += 1 + 0.3 * n + steps * step
print(int(seeds * total))
EOF
}

mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" "$out/plotdata" "$out"/*.png "$out"/*.csv "$out/README.md" "$out/manifest.tsv" "$out/networks.tsv" "$out/meta.json" \
  "$out/report.html"
mkdir -p "$out/runs"

PT_T0=$SECONDS
pt_init_ports
total=$((${#peer_counts[@]} * ${#networks[@]} * ${#algorithms[@]} * ${#seeds[@]}))
est=$(estimate_s)
echo "lian2017 ($mode): $total trainings: {${algorithms[*]}} x n in {${peer_counts[*]}} x networks {${networks[*]}} x seeds {${seeds[*]}}, MLP 784-$(tr , - <<< "$hidden")-10, $epochs epoch(s), batch $batch per peer"
echo "  every peer is a process on this machine ($(nproc) cores), so wall times grow with n"
echo "  estimated duration: ~$(pt_clock "$est") (m:ss) on a quiet machine; results -> $out"
pt_write_meta "$out/meta.json" "$mode" "$command_line"

printf 'network\tdescription\n' > "$out/networks.tsv"
for net in "${networks[@]}"; do printf '%s\t%s\n' "$net" "$(network_description "$net")" >> "$out/networks.tsv"; done
printf 'label\tnetwork\tpeers\talgorithm\trun_dir\thidden\tbatch\tlr\tseed\tsteps\teval_every\n' > "$out/manifest.tsv"
index=0
# Seeds outermost, so that a run cut short still holds whole seeds of every setting.
for seed in "${seeds[@]}"; do
  for net in "${networks[@]}"; do
    for n in "${peer_counts[@]}"; do
      steps=$(steps_for "$n")
      eval_every=$((steps / points))
      ((eval_every >= 1)) || eval_every=1
      for algorithm in "${algorithms[@]}"; do
        index=$((index + 1))
        label=$net/n$n/$algorithm/s$seed
        dir=runs/$net-n$n-$algorithm-s$seed
        mkdir -p "$out/$dir"
        pt_write_topology "$out/$dir/topology.yaml" "ring$n-$net" "$n" "{generator: ring, n: $n}" "$(network_links "$net" "$n")"
        # shellcheck disable=SC2046  # the flags split into words on purpose
        pt_launch "$index" "$total" "$label" "$out/$dir" "$out/$dir/topology.yaml" $(algorithm_flags "$algorithm") \
          --hidden "$hidden" --epochs "$epochs" --max-steps "$steps" --batch "$batch" \
          --lr "$lr" --seed "$seed" --eval-every "$eval_every" --partition iid
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$net" "$n" "$algorithm" "$dir" \
          "$hidden" "$batch" "$lr" "$seed" "$steps" "$eval_every" >> "$out/manifest.tsv"
      done
    done
  done
done

pt_finish_meta "$out/meta.json"
echo "trainings done in $(pt_clock $((SECONDS - PT_T0))) (estimated $(pt_clock "$est")); writing the report"
/usr/bin/python3 -B "$PT_SCRIPT_DIR/report.py" "$out" || pt_die "the report generator failed (experiments/lian2017/report.py $out)"
pt_report "$out" "lowbw/n${peer_counts[-1]}/dpsgd/s${seeds[0]}"
echo "report: $out/README.md"
