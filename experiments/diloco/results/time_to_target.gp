set terminal pngcairo enhanced font 'sans,10' size 820,480
set output 'experiments/diloco/results/time_to_target.png'
set grid
set logscale xy
set xlabel 'link bandwidth (Mbit/s)'
set ylabel 'simulated seconds to 3.863 bits per byte'
set key top right
plot 'experiments/diloco/results/time-dpsgd.dat' using 1:2 with linespoints title 'D-PSGD (exponential)', 'experiments/diloco/results/time-choco.dat' using 1:2 with linespoints title 'CHOCO qsgd:8 (exponential)', 'experiments/diloco/results/time-allreduce.dat' using 1:2 with linespoints title 'all-reduce (data-parallel)', 'experiments/diloco/results/time-diloco-small.dat' using 1:2 with linespoints title 'DiLoCo H = 50', 'experiments/diloco/results/time-streaming-int8.dat' using 1:2 with linespoints title 'Streaming DiLoCo int8, F = 4, τ = 1, H = 50'
