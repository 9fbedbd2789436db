set terminal pngcairo enhanced font 'sans,10' size 1280,520
set output '/work/main/experiments/topologies/results/accuracy_vs_epoch.png'
set multiplot layout 1,2 title '16 peers, mean of 3 seed(s): test accuracy of x̄ vs epoch'
set grid
set key box opaque samplen 3 spacing 1.1
unset logscale; unset format; set autoscale
set title 'iid shards'
set xlabel 'epoch (passes over the 60,000 training images, all peers together)'
set ylabel 'test accuracy of x̄ (fraction of 10,000 images)'
set key bottom right
set yrange [*:*]
plot '/work/main/experiments/topologies/results/plotdata/iid-ring.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'ring', \
  '/work/main/experiments/topologies/results/plotdata/iid-torus.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title 'torus', \
  '/work/main/experiments/topologies/results/plotdata/iid-exponential.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'exponential', \
  '/work/main/experiments/topologies/results/plotdata/iid-one-peer-exponential.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title 'one-peer exponential', \
  '/work/main/experiments/topologies/results/plotdata/iid-complete.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#9467bd' title 'complete', \
  '/work/main/experiments/topologies/results/plotdata/iid-allreduce.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#000000' title 'all-reduce (exact average)'
unset logscale; unset format; set autoscale
set title 'non-iid shards (Dirichlet α = 0.1)'
set xlabel 'epoch (passes over the 60,000 training images, all peers together)'
set ylabel 'test accuracy of x̄ (fraction of 10,000 images)'
set key bottom right
set yrange [*:*]
plot '/work/main/experiments/topologies/results/plotdata/noniid-ring.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'ring', \
  '/work/main/experiments/topologies/results/plotdata/noniid-torus.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title 'torus', \
  '/work/main/experiments/topologies/results/plotdata/noniid-exponential.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'exponential', \
  '/work/main/experiments/topologies/results/plotdata/noniid-one-peer-exponential.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title 'one-peer exponential', \
  '/work/main/experiments/topologies/results/plotdata/noniid-complete.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#9467bd' title 'complete', \
  '/work/main/experiments/topologies/results/plotdata/noniid-allreduce.dat' using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#000000' title 'all-reduce (exact average)'
unset multiplot
