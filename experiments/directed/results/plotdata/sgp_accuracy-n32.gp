set terminal pngcairo enhanced font 'sans,10' size 760,480
set output 'experiments/directed/results/sgp_accuracy_n32.png'
set title 'n = 32, mean over seeds'
set xlabel 'step (round)'
set ylabel 'test accuracy of x̄'
set grid
set key bottom right
plot 'experiments/directed/results/plotdata/sgp_accuracy-n32-sgp-one-peer.dat' using 1:2 with linespoints title 'SGP, one-peer directed exponential' pt 7 ps 0.6, \
  'experiments/directed/results/plotdata/sgp_accuracy-n32-dpsgd-exponential.dat' using 1:2 with linespoints title 'D-PSGD, exponential' pt 7 ps 0.6
