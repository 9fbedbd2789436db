set terminal pngcairo enhanced font 'sans,10' size 760,600
set output 'experiments/consensus/results/consensus_fit.png'
set logscale xy
set xrange [0.004467984839999978:3.170296573857052]
set yrange [0.004467984839999978:3.170296573857052]
set grid
set key top left
set xlabel 'predicted Ξ (spectrum, scale from the complete graph)'
set ylabel 'measured Ξ'
plot x title 'measured = predicted' lw 2 lc rgb '#333333', \
  2*x title 'within 2x' dt 2 lc rgb '#999999', \
  0.5*x notitle dt 2 lc rgb '#999999', \
  'experiments/consensus/results/plotdata/m0.0.dat' using 1:2:3 with yerrorbars title 'momentum 0.0' pt 7 ps 1.2, \
  'experiments/consensus/results/plotdata/m0.0.dat' using 1:2:4 with labels offset 0.8,0.6 font ',8' notitle, \
  'experiments/consensus/results/plotdata/m0.9.dat' using 1:2:3 with yerrorbars title 'momentum 0.9' pt 7 ps 1.2, \
  'experiments/consensus/results/plotdata/m0.9.dat' using 1:2:4 with labels offset 0.8,0.6 font ',8' notitle
