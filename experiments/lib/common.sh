# shellcheck shell=bash
# Shared by experiments/<name>/run.sh (sourced, not run). Bash only.
#
# What every experiment needs: find the peertrain binary, pick ports no other run uses,
# write topology files with explicit peers, launch one training with a one-line progress
# report, and fail with one `error:` line that names the run and its log.

pt_die() {
  echo "error: $*" >&2
  exit 1
}

# pt_parse_args NAME ARGS...: the options every run.sh takes. Sets command_line (as typed,
# for the report), mode (full, quick, or the CI test's hidden tiny) and out (default
# <script dir>/results); --help calls the script's usage and exits.
pt_parse_args() {
  local name=$1
  shift
  command_line="experiments/$name/run.sh${*:+ $*}"
  mode=full
  out=$PT_SCRIPT_DIR/results
  while (($#)); do
    case $1 in
      --quick) mode=quick ;;
      --tiny) mode=tiny ;;  # hidden: the CI test's reduced form
      --out)
        (($# >= 2)) || pt_die "--out needs a directory"
        out=$2
        shift
        ;;
      --out=*) out=${1#--out=} ;;
      -h | --help)
        usage
        exit 0
        ;;
      *) pt_die "unknown argument '$1' (see --help)" ;;
    esac
    shift
  done
}

# pt_find_binary SCRIPT_DIR: sets PEERTRAIN (env, else ../../build/peertrain from the script).
pt_find_binary() {
  local script_dir=$1
  PEERTRAIN=${PEERTRAIN:-$script_dir/../../build/peertrain}
  [[ -e $PEERTRAIN ]] || pt_die "peertrain binary not found at $PEERTRAIN (build it, or set PEERTRAIN=/path/to/peertrain)"
  [[ -x $PEERTRAIN ]] || pt_die "$PEERTRAIN is not executable"
  PEERTRAIN=$(cd "$(dirname "$PEERTRAIN")" && pwd)/$(basename "$PEERTRAIN")
  "$PEERTRAIN" --version > /dev/null 2>&1 || pt_die "$PEERTRAIN --version failed: is it a peertrain binary?"
  export PEERTRAIN
}

# Ports: a per-invocation base in [21000, 28400) from our PID, so two runs started at
# the same time (CI and a person, say) almost never share one; each training gets its own
# block of 32 (peers 0..31) within a window of 640 above the base, and a block somebody
# else is listening on is skipped.
pt_init_ports() {
  PT_PORT_BASE=$((21000 + ($$ * 32) % 7400))
  PT_PORT_SLOT=0
}

pt_ports_in_use() {  # LO HI -> exit 0 when some TCP socket listens in [LO, HI]
  [[ -n $(ss -Hltn "sport >= :$1 and sport <= :$2" 2> /dev/null) ]]
}

# pt_next_port_block N: sets PT_PORT to the first port of a free block of N (N <= 32).
pt_next_port_block() {
  local n=$1 tries=0
  while :; do
    PT_PORT=$((PT_PORT_BASE + (PT_PORT_SLOT % 20) * 32))
    PT_PORT_SLOT=$((PT_PORT_SLOT + 1))
    pt_ports_in_use "$PT_PORT" $((PT_PORT + n - 1)) || return 0
    tries=$((tries + 1))
    ((tries < 20)) || pt_die "no free block of $n ports near $PT_PORT_BASE"
  done
}

# pt_write_topology FILE NAME N GRAPH_YAML [LINKS_YAML]
# GRAPH_YAML is the flow mapping after `graph:` (e.g. "{generator: ring, n: 16}");
# LINKS_YAML, when given, is the block after `links:` (indented lines). Peers are listed
# explicitly on 127.0.0.1 from a fresh port block.
pt_write_topology() {
  local file=$1 name=$2 n=$3 graph=$4 links=${5:-}
  pt_next_port_block "$n"
  {
    echo "# written by experiments/ for one run: $n peers on 127.0.0.1, ports $PT_PORT-$((PT_PORT + n - 1))"
    echo "name: $name"
    echo "graph: $graph"
    case $graph in  # a directed graph mixes with push-sum's column-stochastic P
      *directed* | *random-out* | *random-regular-out*) echo "weights: column-stochastic" ;;
      *) echo "weights: metropolis" ;;
    esac
    echo "peers:"
    local i
    for ((i = 0; i < n; i++)); do
      echo "  - {id: $i, host: 127.0.0.1, port: $((PT_PORT + i))}"
    done
    if [[ -n $links ]]; then
      echo "links:"
      printf '%s\n' "$links"
    fi
  } > "$file"
}

pt_clock() {  # seconds -> m:ss or h:mm:ss
  local s=${1%.*}
  if ((s >= 3600)); then printf '%d:%02d:%02d' $((s / 3600)) $((s % 3600 / 60)) $((s % 60)); else printf '%d:%02d' $((s / 60)) $((s % 60)); fi
}

# pt_launch INDEX TOTAL LABEL RUN_DIR TOPOLOGY_FILE [launch flags...]
# Trains into RUN_DIR (metrics.csv, summary.json, peer logs, launch.log, command.txt) and
# prints one line: index/total, label, seconds it took, time since the experiment began.
pt_launch() {
  local index=$1 total=$2 label=$3 run_dir=$4 topology=$5
  shift 5
  mkdir -p "$run_dir"
  rm -f "$run_dir/metrics.csv" "$run_dir/summary.json"
  local log=$run_dir/launch.log
  local -a cmd=("$PEERTRAIN" launch --topology "$topology" --out "$run_dir" "$@")
  printf '%q ' "${cmd[@]}" > "$run_dir/command.txt"
  echo >> "$run_dir/command.txt"
  printf '[%*d/%d] %-34s ' ${#total} "$index" "$total" "$label"
  local start=$SECONDS rc=0
  "${cmd[@]}" > "$log" 2>&1 < /dev/null || rc=$?
  local took=$((SECONDS - start))
  if ((rc != 0)); then
    echo "FAILED"
    pt_die "run '$label' failed (exit $rc); see $log$(grep -m1 '^error:' "$log" 2> /dev/null | sed 's/^/: /')"
  fi
  [[ -s $run_dir/metrics.csv && -s $run_dir/summary.json ]] ||
    pt_die "run '$label' exited 0 but wrote no metrics.csv/summary.json in $run_dir; see $log"
  printf '%4ds  (elapsed %s)\n' "$took" "$(pt_clock $((SECONDS - PT_T0)))"
}

# pt_write_meta FILE MODE COMMAND: what the report needs about this run and machine (meta.json).
pt_write_meta() {
  local file=$1 mode=$2
  shift 2
  local cpu
  cpu=$(lscpu 2> /dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
  /usr/bin/python3 - "$file" "$mode" "$(nproc)" "${cpu:-unknown}" "$("$PEERTRAIN" --version 2>&1 | head -1)" \
    "$PEERTRAIN" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git -C "$PT_SCRIPT_DIR" describe --always --dirty 2> /dev/null || echo unknown)" \
    "$(free -g 2> /dev/null | awk '/^Mem:/{print $2}')" "$*" << 'EOF'
import json, sys
keys = ["mode", "nproc", "cpu", "peertrain_version", "peertrain", "started_utc", "git_commit", "mem_gib", "command"]
json.dump(dict(zip(keys, sys.argv[2:])), open(sys.argv[1], "w"), indent=1)
EOF
}

# pt_report OUT LABEL: the dashboard's view (peertrain report) of the run of manifest.tsv
# labelled LABEL as OUT/report.html, and a line in OUT/README.md that links it.
pt_report() {
  local out=$1 label=$2 dir
  dir=$(/usr/bin/python3 -c 'import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t") if r["label"] == sys.argv[2]]
print(rows[0]["run_dir"] if rows else "")' "$out/manifest.tsv" "$label")
  [[ -n $dir ]] || pt_die "pt_report: no run labelled '$label' in $out/manifest.tsv"
  "$PEERTRAIN" report "$out/$dir" -o "$out/report.html" > /dev/null || pt_die "peertrain report $out/$dir failed"
  printf '
The dashboard'"'"'s view of the run `%s` (graph, curves, time per peer; `peertrain report %s`): [report.html](report.html), one file that opens offline.\n' \
    "$label" "$dir" >> "$out/README.md"
}

pt_finish_meta() {  # FILE: add the end time and the total seconds
  /usr/bin/python3 - "$1" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$((SECONDS - PT_T0))" << 'EOF'
import json, sys
meta = json.load(open(sys.argv[1]))
meta["finished_utc"], meta["total_s"] = sys.argv[2], int(sys.argv[3])
json.dump(meta, open(sys.argv[1], "w"), indent=1)
EOF
}

pt_check_tools() {
  [[ -x /usr/bin/python3 ]] || pt_die "/usr/bin/python3 is required for the report"
  command -v gnuplot > /dev/null || pt_die "gnuplot is required for the plots (apt-get install gnuplot-nox)"
}
