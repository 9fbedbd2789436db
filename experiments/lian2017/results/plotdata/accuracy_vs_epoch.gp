set output '/work/main/experiments/lian2017/results/accuracy_vs_epoch.png'
set terminal pngcairo enhanced font 'sans,10' size 1680,480
set multiplot layout 1,3 title "Test accuracy vs epoch, mean of 3 seeds: x̄ (solid) and the mean of the local models (dashed)"
set grid
set key bottom right box opaque font ',9'
set title '4 peers'
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n4-dpsgd.dat' using 2:6 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-dpsgd.dat' using 2:7 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-ps.dat' using 2:6 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-ps.dat' using 2:7 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-allreduce.dat' using 2:6 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-allreduce.dat' using 2:7 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-tree.dat' using 2:6 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-tree.dat' using 2:7 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce: local models'
set title '8 peers'
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n8-dpsgd.dat' using 2:6 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-dpsgd.dat' using 2:7 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-ps.dat' using 2:6 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-ps.dat' using 2:7 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-allreduce.dat' using 2:6 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-allreduce.dat' using 2:7 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-tree.dat' using 2:6 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-tree.dat' using 2:7 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce: local models'
set title '16 peers'
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n16-dpsgd.dat' using 2:6 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-dpsgd.dat' using 2:7 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-ps.dat' using 2:6 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-ps.dat' using 2:7 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-allreduce.dat' using 2:6 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-allreduce.dat' using 2:7 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce: local models', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-tree.dat' using 2:6 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce: x̄', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-tree.dat' using 2:7 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce: local models'
unset multiplot
