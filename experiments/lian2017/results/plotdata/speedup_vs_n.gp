set output '/work/main/experiments/lian2017/results/speedup_vs_n.png'
set terminal pngcairo enhanced font 'sans,10' size 1440,900
set multiplot layout 2,2 title "Speed-up of D-PSGD in reaching the target loss (time of the baseline / time of D-PSGD): geometric mean over 3 seed(s), bars: 95 % CI"
set grid
set logscale y
set yrange [0.14731606590684893:37.49387254769319]
set ytics ('0.2' 0.2, '0.5' 0.5, '1' 1.0, '2' 2.0, '5' 5.0, '10' 10.0, '20' 20.0)
set logscale x 2
set xtics (4, 8, 16)
set xrange [2.857142857142857:22.4]
set xlabel 'peers n (log scale)'
set ylabel 'speed-up (×, log scale)'
set key outside right top box font ',8'
set title 'over PS'
plot '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 0 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#000000' title 'fast', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 1 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s)', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 2 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#ff7f0e' title 'high latency (5-20 ms)', \
  1 with lines lw 1 lc rgb '#808080' title 'no speed-up'
set title 'over ring all-reduce'
plot '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 3 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#000000' title 'fast', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 4 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s)', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 5 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#ff7f0e' title 'high latency (5-20 ms)', \
  1 with lines lw 1 lc rgb '#808080' title 'no speed-up'
set title 'over tree all-reduce'
plot '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 6 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#000000' title 'fast', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 7 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s)', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 8 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#ff7f0e' title 'high latency (5-20 ms)', \
  1 with lines lw 1 lc rgb '#808080' title 'no speed-up'
set title 'over the fastest of the baselines run'
plot '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 9 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#000000' title 'fast', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 10 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#1f77b4' title 'low bandwidth (10 Mbit/s)', \
  '/work/main/experiments/lian2017/results/plotdata/speedup.dat' index 11 using 2:3:4:5 with yerrorlines lw 2 pt 7 lc rgb '#ff7f0e' title 'high latency (5-20 ms)', \
  1 with lines lw 1 lc rgb '#808080' title 'no speed-up'
unset multiplot
