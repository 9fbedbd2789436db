set output '/work/main/experiments/lian2017/results/loss_vs_epoch.png'
set terminal pngcairo enhanced font 'sans,10' size 1680,500
set multiplot layout 1,3 title 'Training loss vs epoch, mean of 3 seeds (colour: algorithm; dash: network; the centralized three coincide)'
set grid
set key top right box opaque font ',9'
set title '4 peers'
set xlabel 'epoch (passes over the 60,000 training images)'
set ylabel 'training loss (cross-entropy, mean of peers)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n4-dpsgd.dat' using 2:3 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-dpsgd.dat' using 2:3 with lines lw 2 dt 3 lc rgb '#d62728' title 'D-PSGD, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-dpsgd.dat' using 2:3 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-ps.dat' using 2:3 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-ps.dat' using 2:3 with lines lw 6 dt 3 lc rgb '#1f77b4' title 'PS, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-ps.dat' using 2:3 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-allreduce.dat' using 2:3 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-allreduce.dat' using 2:3 with lines lw 4 dt 3 lc rgb '#2ca02c' title 'ring all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-allreduce.dat' using 2:3 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n4-tree.dat' using 2:3 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n4-tree.dat' using 2:3 with lines lw 2.5 dt 3 lc rgb '#9467bd' title 'tree all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n4-tree.dat' using 2:3 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce, highlat'
set title '8 peers'
set xlabel 'epoch (passes over the 60,000 training images)'
set ylabel 'training loss (cross-entropy, mean of peers)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n8-dpsgd.dat' using 2:3 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-dpsgd.dat' using 2:3 with lines lw 2 dt 3 lc rgb '#d62728' title 'D-PSGD, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-dpsgd.dat' using 2:3 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-ps.dat' using 2:3 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-ps.dat' using 2:3 with lines lw 6 dt 3 lc rgb '#1f77b4' title 'PS, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-ps.dat' using 2:3 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-allreduce.dat' using 2:3 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-allreduce.dat' using 2:3 with lines lw 4 dt 3 lc rgb '#2ca02c' title 'ring all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-allreduce.dat' using 2:3 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n8-tree.dat' using 2:3 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n8-tree.dat' using 2:3 with lines lw 2.5 dt 3 lc rgb '#9467bd' title 'tree all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n8-tree.dat' using 2:3 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce, highlat'
set title '16 peers'
set xlabel 'epoch (passes over the 60,000 training images)'
set ylabel 'training loss (cross-entropy, mean of peers)'
plot '/work/main/experiments/lian2017/results/plotdata/fast-n16-dpsgd.dat' using 2:3 with lines lw 2 dt 1 lc rgb '#d62728' title 'D-PSGD, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-dpsgd.dat' using 2:3 with lines lw 2 dt 3 lc rgb '#d62728' title 'D-PSGD, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-dpsgd.dat' using 2:3 with lines lw 2 dt 2 lc rgb '#d62728' title 'D-PSGD, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-ps.dat' using 2:3 with lines lw 6 dt 1 lc rgb '#1f77b4' title 'PS, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-ps.dat' using 2:3 with lines lw 6 dt 3 lc rgb '#1f77b4' title 'PS, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-ps.dat' using 2:3 with lines lw 6 dt 2 lc rgb '#1f77b4' title 'PS, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-allreduce.dat' using 2:3 with lines lw 4 dt 1 lc rgb '#2ca02c' title 'ring all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-allreduce.dat' using 2:3 with lines lw 4 dt 3 lc rgb '#2ca02c' title 'ring all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-allreduce.dat' using 2:3 with lines lw 4 dt 2 lc rgb '#2ca02c' title 'ring all-reduce, highlat', \
  '/work/main/experiments/lian2017/results/plotdata/fast-n16-tree.dat' using 2:3 with lines lw 2.5 dt 1 lc rgb '#9467bd' title 'tree all-reduce, fast', \
  '/work/main/experiments/lian2017/results/plotdata/lowbw-n16-tree.dat' using 2:3 with lines lw 2.5 dt 3 lc rgb '#9467bd' title 'tree all-reduce, lowbw', \
  '/work/main/experiments/lian2017/results/plotdata/highlat-n16-tree.dat' using 2:3 with lines lw 2.5 dt 2 lc rgb '#9467bd' title 'tree all-reduce, highlat'
unset multiplot
