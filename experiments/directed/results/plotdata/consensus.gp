set terminal pngcairo enhanced font 'sans,10' size 760,600
set output 'experiments/directed/results/consensus_fit.png'
set logscale xy
set xrange [0.0008432756:0.32458846233846494]
set yrange [0.0008432756:0.32458846233846494]
set grid
set key top left
set xlabel 'predicted Ξ (mixing matrices, scale from the complete graph)'
set ylabel 'measured Ξ'
plot x title 'measured = predicted' lw 2 lc rgb '#333333', 2*x title 'within 2x' dt 2 lc rgb '#999999', 0.5*x notitle dt 2 lc rgb '#999999', 'experiments/directed/results/plotdata/consensus.dat' using 1:2 with points pt 7 ps 1.2 title 'runs', 'experiments/directed/results/plotdata/consensus.dat' using 1:2:3 with labels offset 0.8,0.6 font ',8' notitle
