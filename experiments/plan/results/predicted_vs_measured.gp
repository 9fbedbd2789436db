set terminal pngcairo enhanced font 'sans,10' size 640,560
set output '/tmp/plan41/predicted_vs_measured.png'
set title 'Step time: simulator against the engine (38 strategies, 2 cores)'
set xlabel 'measured step time (ms)'
set ylabel 'predicted step time (ms)'
set xrange [0:105.77505620000001]
set yrange [0:105.77505620000001]
set key top left
set grid
plot x title 'predicted = measured' lc rgb '#888888', \
     1.1*x title '±10 %' dt 2 lc rgb '#bbbbbb', 0.9*x notitle dt 2 lc rgb '#bbbbbb', \
     '/tmp/plan41/predicted_vs_measured.dat' using 1:($3==1?$2:1/0) title '1 worker' pt 7 ps 1.2 lc rgb '#000000', \
     '' using 1:($3==2?$2:1/0) title '2 workers' pt 7 ps 1.2 lc rgb '#1f77b4', \
     '' using 1:($3==3?$2:1/0) title '3 workers' pt 7 ps 1.2 lc rgb '#2ca02c', \
     '' using 1:($3==4?$2:1/0) title '4 workers' pt 7 ps 1.2 lc rgb '#d62728'
