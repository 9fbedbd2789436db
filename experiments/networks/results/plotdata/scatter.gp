set terminal pngcairo enhanced font 'sans,10' size 640,560
set output 'experiments/networks/results/predicted_vs_measured.png'
set title 'Time per step: the α-β model against the measurement'
set logscale xy
set grid
set xrange [2.1822222222222223:17254.01188448602]
set yrange [2.1822222222222223:17254.01188448602]
set xlabel 'measured (ms)'
set ylabel 'predicted (ms)'
set key top left font ',9'
plot 'experiments/networks/results/plotdata/scatter-dpsgd.dat' using 1:2 with points pt 7 ps 1 lc rgb '#1f77b4' title 'D-PSGD', 'experiments/networks/results/plotdata/scatter-choco.dat' using 1:2 with points pt 7 ps 1 lc rgb '#9467bd' title 'CHOCO qsgd:4', 'experiments/networks/results/plotdata/scatter-ps.dat' using 1:2 with points pt 7 ps 1 lc rgb '#ff7f0e' title 'parameter server', 'experiments/networks/results/plotdata/scatter-ring.dat' using 1:2 with points pt 7 ps 1 lc rgb '#2ca02c' title 'ring all-reduce', 'experiments/networks/results/plotdata/scatter-tree.dat' using 1:2 with points pt 7 ps 1 lc rgb '#d62728' title 'tree all-reduce', x lc rgb 'black' title 'predicted = measured', 1.2*x dt 2 lc rgb 'grey' title '±20 %', x/1.2 dt 2 lc rgb 'grey' notitle
