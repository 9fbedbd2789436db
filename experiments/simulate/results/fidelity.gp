set terminal pngcairo enhanced font 'sans,10' size 640,480
set output 'experiments/simulate/results/fidelity.png'
set logscale xy
set xrange [0.0011304038454910453:1.7641935860440618]
set yrange [0.0011304038454910453:1.7641935860440618]
set xlabel 'measured seconds per step'
set ylabel 'simulated seconds per step'
set key top left
set grid
plot x title 'equal' lw 1 lc rgb 'black', 1.15*x title '+15 %' dt 2 lc rgb 'gray', 0.85*x title '-15 %' dt 2 lc rgb 'gray', 'experiments/simulate/results/fidelity.dat' using 1:2 title 'a run (network × algorithm)' with points pt 7 ps 1.2
