#!/usr/bin/env bash
# The pipeline sweep of docs/parallel.md: every schedule × vocabulary size × vocabulary
# parallelism (none, vocab-1, vocab-2; V = 256 and pipedream without) with `peertrain bench pipeline`
# (gpt d128 L6, seq 128, batch 8, p = 4, m = 8), one JSON line each, then a markdown table
# and two plots (gnuplot).
# Usage: bench/pipeline_sweep.sh [PEERTRAIN] [OUT_DIR]   (defaults: build/peertrain, runs/pipeline_sweep)
set -euo pipefail
bin=${1:-build/peertrain}
out=${2:-runs/pipeline_sweep}
mkdir -p "$out"
: >"$out/sweep.jsonl"
schedules=(gpipe 1f1b interleaved zb-h1 zb-h2 zb-v v-half pipedream)
for v in 256 8000 32000 64000; do
  for vp in none vocab-1 vocab-2; do
    [[ $v == 256 && $vp != none ]] && continue
    for s in "${schedules[@]}"; do
      [[ $s == pipedream && $vp != none ]] && continue  # refused: it carries passes across steps
      echo "vocab $v, $vp, $s" >&2
      "$bin" bench pipeline --vocab-size "$v" --d-model 128 --layers 6 --heads 4 --seq 128 --batch 8 --pp 4 \
        --microbatches 8 --schedule "$s" --vocab-parallel "$vp" --steps 2 --format json | tr -d '\n' >>"$out/sweep.jsonl"
      echo >>"$out/sweep.jsonl"
    done
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/sweep.jsonl") if l.strip()]
cell = lambda x: "-" if x is None else f"{x:.3f}"
lines = ["| vocab | vocab-parallel | schedule | units per virtual stage | bubble (replayed) | theory | params max/mean | compute max/mean | tokens/s here | tokens/s, core per worker | gain over none (core per worker) | peak micro-batches by stage (+ output states) |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
none = {(r["vocab"], r["schedule"]): r["replayed_tokens_per_s"] for r in rows if r["vocab_parallel"] == "none"}
for r in rows:
    peaks = " ".join(f"{s['peak_microbatches']:g}" for s in r["stages"])
    outs = max(s.get("peak_output_states", 0) for s in r["stages"])
    if outs: peaks += f" (+{outs})"
    gain = r["replayed_tokens_per_s"] / none[(r["vocab"], r["schedule"])] - 1
    lines.append(f"| {r['vocab']} | {r['vocab_parallel']} | {r['schedule']} | {r['split']} | {r['replayed_bubble']:.3f} | {cell(r['theoretical_bubble'])} | "
                 f"{r['parameter_bytes_max_over_mean']:.2f} | {r['compute_max_over_mean']:.2f} | {r['tokens_per_s']:.0f} | {r['replayed_tokens_per_s']:.0f} | "
                 f"{'-' if r['vocab_parallel'] == 'none' else f'{100 * gain:+.0f} %'} | {peaks} |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
with open(f"{out}/plot.dat", "w") as f:
    for s in ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half", "pipedream"]:
        f.write(f'"{s}"\n')
        for r in rows:
            if r["schedule"] == s and r["vocab_parallel"] == "none":
                f.write(f"{r['vocab']} {r['replayed_tokens_per_s']:.1f} {r['compute_max_over_mean']:.3f} {r['replayed_bubble']:.4f}\n")
        f.write("\n\n")
# The vocabulary-parallel plot: 1F1B and V-Half, none against vocab-1 and vocab-2.
with open(f"{out}/plot_vp.dat", "w") as f:
    for s in ["1f1b", "v-half"]:
        for vp in ["none", "vocab-1", "vocab-2"]:
            f.write(f'"{s} {vp}"\n')
            for r in rows:
                if r["schedule"] == s and r["vocab_parallel"] == vp and r["vocab"] > 256:
                    f.write(f"{r['vocab']} {r['replayed_tokens_per_s']:.1f} {r['compute_max_over_mean']:.3f} {r['parameter_bytes_max_over_mean']:.3f}\n")
            f.write("\n\n")
PY
gnuplot <<GP
set terminal pngcairo size 900,380 font ",10"
set output "$out/pipeline_vocab_none.png"
set multiplot layout 1,2 title "peertrain bench pipeline: gpt d128 L6, p = 4, m = 8, no vocabulary parallelism (replayed with a core per worker)"
set logscale x 2
set xtics ("256" 256, "8k" 8000, "32k" 32000, "64k" 64000)
set xlabel "vocabulary size"
set key top left
set ylabel "replayed bubble"
set yrange [0:0.8]
plot for [i=0:7] "$out/plot.dat" index i using 1:4 with linespoints title columnheader(1)
set ylabel "compute max/mean over stages"
set yrange [1:4]
plot for [i=0:7] "$out/plot.dat" index i using 1:3 with linespoints title columnheader(1)
unset multiplot
set output "$out/pipeline_vocab_parallel.png"
set multiplot layout 1,2 title "vocabulary parallelism: gpt d128 L6, p = 4, m = 8 (replayed with a core per worker)"
set xtics ("8k" 8000, "32k" 32000, "64k" 64000)
set ylabel "tokens/s"
set yrange [0:*]
plot for [i=0:5] "$out/plot_vp.dat" index i using 1:2 with linespoints title columnheader(1)
set ylabel "compute max/mean over stages"
set yrange [1:4]
plot for [i=0:5] "$out/plot_vp.dat" index i using 1:3 with linespoints title columnheader(1)
unset multiplot
GP
echo "wrote $out/sweep.jsonl, $out/table.md, $out/pipeline_vocab_none.png, $out/pipeline_vocab_parallel.png" >&2
