#!/usr/bin/env bash
# Simulated clusters from the command line (launch --simulate, docs/simulate.md):
#  1. a simulated run is the twin of a real one: for D-PSGD, ring all-reduce and the parameter
#     server with a fixed seed, metrics.csv's losses, accuracies and consensus distances are
#     equal, bit for bit, to those of the same run as processes over TCP (its bytes sent
#     within 0.1 %); and for the GPT split over a pipeline inside each peer;
#  2. its time is SimGrid's: on 10 Mbit/s links with 4 ms of latency under SimGrid's CM02
#     model, a D-PSGD step of 2.68 MB messages takes what the model says, and summary.json
#     says the time is simulated;
#  3. a host that fails at a simulated time is lost through the same membership code as a
#     real lost peer, and the survivors finish; so is one end of a link that is cut;
#  4. a SimGrid platform file is used as given, and a bad one, a flag of the simulation
#     without --simulate, or a bad --fail gets one error line naming it.
# Usage: PEERTRAIN=build/peertrain simulate_cli_test.sh SOURCE_DIR
set -u
source "$(dirname "$0")/common.sh"
write_topology "$work/ring4.yaml" ring4 ring 4 $((25000 + RANDOM % 2000))
small=(--batch 16 --max-steps 30 --eval-every 15 --seed 7)
metrics_core() { cut -d, -f1-7 "$1/metrics.csv"; }  # step, epoch, peer, the losses, accuracies and consensus
# Bytes sent agree to a few control messages (a real run's, such as the membership's, depend on its timing).
bytes_close() {
  paste -d, <(cut -d, -f8 "$1/metrics.csv" | tail -n +2) <(cut -d, -f8 "$2/metrics.csv" | tail -n +2) |
    awk -F, '{ d = $1 - $2; if (d < 0) d = -d; if (d > 0.001 * $1) bad++ } END { exit bad > 0 }'
}

# 1. Twins.
for algorithm in dpsgd allreduce ps; do
  real="$work/real-$algorithm" simulated="$work/sim-$algorithm"
  timeout 300 "$bin" launch --topology "$work/ring4.yaml" --algorithm $algorithm "${small[@]}" --out "$real" \
    >"$real.log" 2>&1 || { fail "real $algorithm run"; tail -5 "$real.log"; continue; }
  timeout 300 "$bin" launch --simulate --topology "$work/ring4.yaml" --algorithm $algorithm "${small[@]}" \
    --out "$simulated" >"$simulated.log" 2>&1 || { fail "simulated $algorithm run"; tail -5 "$simulated.log"; continue; }
  rows=$(metrics_core "$real" | wc -l)
  [[ $rows -ge 9 ]] && ok || fail "$algorithm: the real run wrote $rows rows of metrics"
  if diff <(metrics_core "$real") <(metrics_core "$simulated") >"$work/diff-$algorithm"; then ok; else
    fail "$algorithm: the simulated run's metrics differ from the real run's"; head -6 "$work/diff-$algorithm"
  fi
  bytes_close "$real" "$simulated" && ok || fail "$algorithm: the simulated run's bytes sent differ by over 0.1 %"
done

# The GPT too, its pipeline's workers being threads of the simulated peer.
real="$work/real-gpt" simulated="$work/sim-gpt"
gpt=(--model gpt --pp 2 --microbatches 2 --max-steps 3 --eval-every 3 --eval-windows 16 --seed 7)
if timeout 300 "$bin" launch --topology "$work/ring4.yaml" "${gpt[@]}" --out "$real" >"$real.log" 2>&1 &&
    timeout 300 "$bin" launch --simulate --topology "$work/ring4.yaml" "${gpt[@]}" --out "$simulated" \
      >"$simulated.log" 2>&1; then
  diff <(metrics_core "$real") <(metrics_core "$simulated") >/dev/null &&
    diff <(cut -d, -f13- "$real/metrics.csv") <(cut -d, -f13- "$simulated/metrics.csv") >/dev/null && ok ||
    fail "gpt: the simulated run's metrics (bits per byte included) differ from the real run's"
else
  fail "gpt runs"; tail -3 "$real.log" "$simulated.log"
fi

# 2. SimGrid's time. Each peer sends its 669,706 parameters (2,678,872 bytes, and a 48-byte
# header) to its two neighbours on links capped at 10 Mbit/s with 4 ms: CM02 says
# 4 ms + 2,678,872 B / 1.25 MB/s = 2.1471 s; the gradient's 0.26 s overlaps it.
cat >"$work/ring4-10mbit.yaml" <<YAML
name: ring4-10mbit
graph: {generator: ring, n: 4}
links:
  default: {latency_ms: 4, bandwidth_mbps: 10}
YAML
out="$work/sim-timed"
if timeout 300 "$bin" launch --simulate --topology "$work/ring4-10mbit.yaml" --max-steps 5 --batch 32 \
    --host-speed 1G --sim-cfg network/model:CM02 --out "$out" >"$out.log" 2>&1; then
  ok
  wall=$(grep -o '"wall_s": [0-9.e+-]*' "$out/summary.json" | cut -d' ' -f2)
  awk -v w="$wall" 'BEGIN { step = 0.004 + 2678920 / 1.25e6; exit !(w / 5 > 0.99 * step && w / 5 < 1.01 * step) }' &&
    ok || fail "a step took $wall/5 simulated seconds, not CM02's 2.147 s"
  grep -q '"time": "simulated"' "$out/summary.json" && ok || fail "summary.json does not say the time is simulated"
  grep -q '"network_model":"CM02"' "$out/summary.json" && ok || fail "summary.json does not name the network model"
  grep -q "simulated" "$out.log" && ok || fail "the summary table does not say the time is simulated"
else
  fail "simulated run on 10 Mbit/s links"; tail -5 "$out.log"
fi

# 3. A host fails at 0.1 simulated seconds; the survivors drop it and finish.
out="$work/sim-fail"
if timeout 300 "$bin" launch --simulate --topology "$work/ring4.yaml" "${small[@]}" --fail 2@0.1 --peer-timeout 2 \
    --out "$out" >"$out.log" 2>&1; then
  ok
  grep -q '"failed_peers": \[2\]' "$out/summary.json" && ok || fail "summary.json does not name peer 2 as failed"
  grep -q '"survivors": 3' "$out/summary.json" && ok || fail "three peers should survive"
  grep -q "peer 2 was lost: host peer-2 failed" "$out.log" && ok || fail "launch does not say which host failed"
else
  fail "simulated run with a failing host"; tail -5 "$out.log"
fi

# A cable between peers 0 and 1 is cut at 0.1 s: the two fall silent to each other, and the
# membership counts one of them lost, as in a real partition; the others finish.
out="$work/sim-cut"
if timeout 300 "$bin" launch --simulate --topology "$work/ring4.yaml" "${small[@]}" --fail 0-1@0.1 --peer-timeout 2 \
    --out "$out" >"$out.log" 2>&1; then
  ok
  grep -qE '"failures": \[\{"peer":[01],' "$out/summary.json" && ok ||
    fail "summary.json does not count peer 0 or 1 lost after their link was cut"
else
  fail "simulated run with a cut link"; tail -5 "$out.log"
fi

# 4. Platform files.
platform() {  # platform FILE HOSTS ROUTES…: a full zone of those hosts, one link per route "a-b"
  local file=$1 hosts=$2; shift 2
  {
    echo "<?xml version='1.0'?>"
    echo '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">'
    echo '<platform version="4.1"><zone id="lab" routing="Full">'
    for ((i = 0; i < hosts; i++)); do echo "  <host id=\"peer-$i\" speed=\"2Gf\"/>"; done
    for route in "$@"; do echo "  <link id=\"l$route\" bandwidth=\"100MBps\" latency=\"1ms\"/>"; done
    for route in "$@"; do
      echo "  <route src=\"peer-${route%-*}\" dst=\"peer-${route#*-}\"><link_ctn id=\"l$route\"/></route>"
    done
    echo '</zone></platform>'
  } >"$file"
}
platform "$work/lab.xml" 4 0-1 0-2 0-3 1-2 1-3 2-3
out="$work/sim-platform"
if timeout 300 "$bin" launch --simulate --platform "$work/lab.xml" --topology "$work/ring4.yaml" "${small[@]}" \
    --out "$out" >"$out.log" 2>&1; then
  ok
  grep -q "read from $work/lab.xml" "$out/summary.json" && ok || fail "summary.json does not name the platform file"
else
  fail "simulated run on a platform file"; tail -5 "$out.log"
fi

expect_error() {  # expect_error WHAT PATTERN ARGS…: exits non-zero with one "error:" line matching PATTERN
  local what=$1 pattern=$2; shift 2
  timeout 120 "$bin" launch "$@" >"$work/err.out" 2>"$work/err.log"
  local code=$?
  if [[ $code -ne 0 && $code -ne 124 ]] && [[ $(grep -c '^error:' "$work/err.log") -eq 1 ]] &&
      grep -q -- "$pattern" "$work/err.log"; then
    ok
  else
    fail "$what (exit $code)"; tail -3 "$work/err.log"
  fi
}
sed 's#<host id="peer-1" speed="2Gf"/>#<host id="peer-1" speed="2Gf"#' "$work/lab.xml" >"$work/broken.xml"
expect_error "a platform that does not parse" "broken.xml.*not a SimGrid platform" \
  --simulate --platform "$work/broken.xml" --topology "$work/ring4.yaml" --out "$work/e1"
platform "$work/three.xml" 3 0-1 1-2 0-2
expect_error "a platform without a host for a peer" "three.xml: no host named peer-3 for peer 3" \
  --simulate --platform "$work/three.xml" --topology "$work/ring4.yaml" --out "$work/e2"
platform "$work/no-route.xml" 4 0-1 0-2 0-3 2-3
expect_error "a platform without a route between neighbours" "no-route.xml: no route from peer-1 to peer-2" \
  --simulate --platform "$work/no-route.xml" --topology "$work/ring4.yaml" --out "$work/e3"
expect_error "a missing platform file" "--platform $work/absent.xml: no such file" \
  --simulate --platform "$work/absent.xml" --topology "$work/ring4.yaml" --out "$work/e4"
expect_error "--platform without --simulate" "--platform is for --simulate" \
  --platform "$work/lab.xml" --topology "$work/ring4.yaml" --out "$work/e5"
expect_error "--fail naming no peer" "--fail '9@1': no peer 9" \
  --simulate --fail 9@1 --topology "$work/ring4.yaml" --out "$work/e6"
expect_error "--fail without a time" "--fail '2': expected PEER@SECONDS (a host) or A-B@SECONDS (a link)" \
  --simulate --fail 2 --topology "$work/ring4.yaml" --out "$work/e7"
expect_error "--sim-compute of no model" "--sim-compute 'cycles' is not one of flops, measured" \
  --simulate --sim-compute cycles --topology "$work/ring4.yaml" --out "$work/e8"
expect_error "--host-speed that is no speed" "--host-speed 'fast' is not a positive FLOP/s" \
  --simulate --host-speed fast --topology "$work/ring4.yaml" --out "$work/e9"

echo "$pass passed, $failures failed"
[[ $failures -eq 0 ]]
