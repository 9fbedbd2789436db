set output '/work/main/experiments/lian2017/results/speedup_vs_n.png'
set terminal pngcairo enhanced font 'sans,10' size 1100,600
set title "Speed-up of D-PSGD in reaching the target loss\n(time of the baseline / time of D-PSGD)"
set grid
set logscale y
set yrange [0.32814879742732067:26.3877930568865]
set ytics ('0.5' 0.5, '1' 1.0, '2' 2.0, '5' 5.0, '10' 10.0, '20' 20.0)
set logscale x 2
set xtics (4, 8, 16)
set xrange [3.0769230769230766:20.8]
set xlabel 'peers n (log scale)'
set ylabel 'speed-up (×, log scale)'
set key outside right top box font ',9'
plot '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 0 using 1:2 with linespoints lw 2 pt 7 dt 1 lc rgb '#000000' title 'fast: over PS', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 0 using 1:3 with linespoints lw 2 pt 5 dt 2 lc rgb '#000000' title 'fast: over all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 1 using 1:2 with linespoints lw 2 pt 7 dt 1 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s): over PS', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 1 using 1:3 with linespoints lw 2 pt 5 dt 2 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s): over all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 2 using 1:2 with linespoints lw 2 pt 7 dt 1 lc rgb '#ff7f0e' title 'high latency (5-20 ms): over PS', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 2 using 1:3 with linespoints lw 2 pt 5 dt 2 lc rgb '#ff7f0e' title 'high latency (5-20 ms): over all-reduce', \
  1 with lines lw 1 lc rgb '#808080' title 'no speed-up'
unset multiplot
