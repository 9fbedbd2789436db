set terminal pngcairo enhanced font 'sans,10' size 1800,540
set output '/work/main/experiments/topologies/results/consensus_vs_step.png'
set multiplot layout 1,2 title '16 peers, mean of 3 seed(s): consensus distance (solid) and the steady state predicted from W, scaled by the complete graph (dashed)'
set grid
set key box opaque samplen 3 spacing 1.1
unset logscale; unset format; set autoscale
set title 'iid shards'
set xlabel 'step (one minibatch per peer)'
set ylabel 'consensus distance (1/n) Σ‖x_i − x̄‖² (squared parameter norm)'
set logscale y
set format y '10^{%T}'
set yrange [0.0007325188888888889:0.9368479999999999]
set xrange [0:351]
set key outside right top font ',9' samplen 2
plot '/work/main/experiments/topologies/results/plotdata/iid-ring.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'ring (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-iid-ring.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#1f77b4' title 'ring: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/iid-torus.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title 'torus (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-iid-torus.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#ff7f0e' title 'torus: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/iid-exponential.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'exponential (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-iid-exponential.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#2ca02c' title 'exponential: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/iid-one-peer-exponential.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title 'one-peer exponential (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-iid-one-peer-exponential.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#d62728' title 'one-peer exponential: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/iid-complete.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#9467bd' title 'complete (measured)'
unset logscale; unset format; set autoscale
set title 'non-iid shards (Dirichlet α = 0.1)'
set xlabel 'step (one minibatch per peer)'
set ylabel 'consensus distance (1/n) Σ‖x_i − x̄‖² (squared parameter norm)'
set logscale y
set format y '10^{%T}'
set yrange [0.00137265:2.049776]
set xrange [0:351]
set key outside right top font ',9' samplen 2
plot '/work/main/experiments/topologies/results/plotdata/noniid-ring.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'ring (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-noniid-ring.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#1f77b4' title 'ring: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/noniid-torus.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title 'torus (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-noniid-torus.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#ff7f0e' title 'torus: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/noniid-exponential.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'exponential (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-noniid-exponential.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#2ca02c' title 'exponential: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/noniid-one-peer-exponential.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#d62728' title 'one-peer exponential (measured)', \
  '/work/main/experiments/topologies/results/plotdata/pred-noniid-one-peer-exponential.dat' using 1:2 with lines dt 2 lw 2 lc rgb '#d62728' title 'one-peer exponential: predicted steady state', \
  '/work/main/experiments/topologies/results/plotdata/noniid-complete.dat' using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 lc rgb '#9467bd' title 'complete (measured)'
unset multiplot
