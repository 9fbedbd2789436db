set output '/work/main/experiments/lian2017/results/loss_vs_time.png'
set terminal pngcairo enhanced font 'sans,10' size 1440,1140
set multiplot layout 3,3 title 'Training loss vs wall time, mean of 3 seeds (grey: target loss)'
set grid
set logscale x
set key top right box opaque font ',8'
set title 'fast, 4 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n4-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.49 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'fast, 8 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n8-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.51 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'fast, 16 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n16-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.57 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'low bandwidth (10 Mbit/s), 4 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.49 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'low bandwidth (10 Mbit/s), 8 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.51 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'low bandwidth (10 Mbit/s), 16 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.57 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'high latency (5-20 ms), 4 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/highlat-n4-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.49 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'high latency (5-20 ms), 8 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/highlat-n8-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.51 with lines dt 2 lw 1 lc rgb '#808080' notitle
set title 'high latency (5-20 ms), 16 peers'
set xlabel 'wall time (s, log scale)'
set ylabel 'training loss'
plot '/work/main/experiments/lian2017/results/plotdata/highlat-n16-dpsgd.dat' using 5:4 with lines lw 2 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-ps.dat' using 5:4 with lines lw 2 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-allreduce.dat' using 5:4 with lines lw 2 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-tree.dat' using 5:4 with lines lw 2 lc rgb '#9467bd' title 'tree all-reduce', \
  0.57 with lines dt 2 lw 1 lc rgb '#808080' notitle
unset multiplot
