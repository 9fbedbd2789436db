set output '/work/main/experiments/lian2017/results/step_time_vs_n.png'
set terminal pngcairo enhanced font 'sans,10' size 1440,460
set multiplot layout 1,3 title 'Time per training step (peer 0) vs n, mean of 3 seeds'
set grid
set logscale y
set logscale x 2
set xtics (4, 8, 16)
set xrange [3.0769230769230766:20.8]
set key top left box opaque font ',9'
set title 'fast'
set xlabel 'peers n (log scale)'
set ylabel 'seconds per step (log scale)'
set yrange [0.00041039886039886036:0.020272222222222223]
set ytics ('0.0005' 0.0005, '0.001' 0.001, '0.002' 0.002, '0.005' 0.005, '0.01' 0.01, '0.02' 0.02)
plot '/work/main/experiments/lian2017/results/plotdata/step-fast.dat' index 0 using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/step-fast.dat' index 1 using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/step-fast.dat' index 2 using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/step-fast.dat' index 3 using 1:2 with linespoints lw 2 pt 7 lc rgb '#9467bd' title 'tree all-reduce'
set title 'low bandwidth (10 Mbit/s)'
set xlabel 'peers n (log scale)'
set ylabel 'seconds per step (log scale)'
set yrange [0.08192426400759735:1.9573799145299144]
set ytics ('0.1' 0.1, '0.2' 0.2, '0.5' 0.5, '1' 1.0)
plot '/work/main/experiments/lian2017/results/plotdata/step-lowbw.dat' index 0 using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/step-lowbw.dat' index 1 using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/step-lowbw.dat' index 2 using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/step-lowbw.dat' index 3 using 1:2 with linespoints lw 2 pt 7 lc rgb '#9467bd' title 'tree all-reduce'
set title 'high latency (5-20 ms)'
set xlabel 'peers n (log scale)'
set ylabel 'seconds per step (log scale)'
set yrange [0.013827825261158595:0.9098495726495727]
set ytics ('0.02' 0.02, '0.05' 0.05, '0.1' 0.1, '0.2' 0.2, '0.5' 0.5)
plot '/work/main/experiments/lian2017/results/plotdata/step-highlat.dat' index 0 using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'D-PSGD', \
  '/work/main/experiments/lian2017/results/plotdata/step-highlat.dat' index 1 using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'PS', \
  '/work/main/experiments/lian2017/results/plotdata/step-highlat.dat' index 2 using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'ring all-reduce', \
  '/work/main/experiments/lian2017/results/plotdata/step-highlat.dat' index 3 using 1:2 with linespoints lw 2 pt 7 lc rgb '#9467bd' title 'tree all-reduce'
unset multiplot
