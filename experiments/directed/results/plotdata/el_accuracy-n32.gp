set terminal pngcairo enhanced font 'sans,10' size 760,480
set output 'experiments/directed/results/el_accuracy_n32.png'
set title 'n = 32, mean over seeds'
set xlabel 'step (round)'
set ylabel 'mean accuracy of the peers'' own models'
set grid
set key bottom right
plot 'experiments/directed/results/plotdata/el_accuracy-n32-el-local.dat' using 1:2 with linespoints title 'EL-Local' pt 7 ps 0.6, \
  'experiments/directed/results/plotdata/el_accuracy-n32-el-oracle.dat' using 1:2 with linespoints title 'EL-Oracle' pt 7 ps 0.6, \
  'experiments/directed/results/plotdata/el_accuracy-n32-dpsgd-regular.dat' using 1:2 with linespoints title 'D-PSGD, static s-regular' pt 7 ps 0.6
