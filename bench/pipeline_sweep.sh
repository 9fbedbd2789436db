#!/usr/bin/env bash
# The pipeline sweep of docs/parallel.md: every schedule × vocabulary size with
# `peertrain bench pipeline` (gpt d128 L6, seq 128, batch 8, p = 4, m = 8), one JSON line
# each, then a markdown table and a plot (gnuplot).
# Usage: bench/pipeline_sweep.sh [PEERTRAIN] [OUT_DIR]   (defaults: build/peertrain, runs/pipeline_sweep)
set -euo pipefail
bin=${1:-build/peertrain}
out=${2:-runs/pipeline_sweep}
mkdir -p "$out"
: >"$out/sweep.jsonl"
schedules=(gpipe 1f1b interleaved zb-h1 zb-h2 zb-v v-half)
for v in 256 8000 32000 64000; do
  for s in "${schedules[@]}"; do
    echo "vocab $v, $s" >&2
    "$bin" bench pipeline --vocab-size "$v" --d-model 128 --layers 6 --heads 4 --seq 128 --batch 8 --pp 4 \
      --microbatches 8 --schedule "$s" --steps 2 --format json | tr -d '\n' >>"$out/sweep.jsonl"
    echo >>"$out/sweep.jsonl"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/sweep.jsonl") if l.strip()]
cell = lambda x: "-" if x is None else f"{x:.3f}"
lines = ["| vocab | schedule | units per virtual stage | bubble (replayed) | theory | params max/mean | compute max/mean | tokens/s, core per worker | peak micro-batches by stage |",
         "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    peaks = " ".join(f"{s['peak_microbatches']:g}" for s in r["stages"])
    lines.append(f"| {r['vocab']} | {r['schedule']} | {r['split']} | {r['replayed_bubble']:.3f} | {cell(r['theoretical_bubble'])} | "
                 f"{r['parameter_bytes_max_over_mean']:.2f} | {r['compute_max_over_mean']:.2f} | {r['replayed_tokens_per_s']:.0f} | {peaks} |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
with open(f"{out}/plot.dat", "w") as f:
    for s in ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "v-half"]:
        f.write(f'"{s}"\n')
        for r in rows:
            if r["schedule"] == s:
                f.write(f"{r['vocab']} {r['replayed_tokens_per_s']:.1f} {r['compute_max_over_mean']:.3f} {r['replayed_bubble']:.4f}\n")
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
plot for [i=0:6] "$out/plot.dat" index i using 1:4 with linespoints title columnheader(1)
set ylabel "compute max/mean over stages"
set yrange [1:4]
plot for [i=0:6] "$out/plot.dat" index i using 1:3 with linespoints title columnheader(1)
unset multiplot
GP
echo "wrote $out/sweep.jsonl, $out/table.md, $out/pipeline_vocab_none.png" >&2
