set terminal pngcairo enhanced font 'sans,10' size 720,480
set output 'experiments/simulate/results/speedup_vs_n.png'
set xlabel 'workers n'
set ylabel 'speed-up of an epoch over one worker'
set key top left
set grid
set xrange [0:117.60000000000001]
set yrange [0:117.60000000000001]
plot x title 'linear (the paper: D-PSGD is close to it)' dt 2 lc rgb 'gray', 'experiments/simulate/results/speedup-cluster-10gbit-dpsgd.dat' using 1:2 with linespoints title 'D-PSGD, cluster-10gbit', 'experiments/simulate/results/speedup-cluster-10gbit-ps.dat' using 1:2 with linespoints title 'parameter server, cluster-10gbit', 'experiments/simulate/results/speedup-cluster-1gbit-dpsgd.dat' using 1:2 with linespoints title 'D-PSGD, cluster-1gbit', 'experiments/simulate/results/speedup-cluster-1gbit-ps.dat' using 1:2 with linespoints title 'parameter server, cluster-1gbit'
