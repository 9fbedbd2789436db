set terminal pngcairo enhanced font 'sans,10' size 820,480
set output 'experiments/diloco/results/loss_vs_time.png'
set grid
set logscale x
set xlabel 'simulated seconds at 100 Mbit/s'
set ylabel 'validation bits per byte of x̄'
set key top right
plot 'experiments/diloco/results/slow-dpsgd.dat' using 1:2 with linespoints title 'D-PSGD (exponential)', 'experiments/diloco/results/slow-choco.dat' using 1:2 with linespoints title 'CHOCO qsgd:8 (exponential)', 'experiments/diloco/results/slow-allreduce.dat' using 1:2 with linespoints title 'all-reduce (data-parallel)', 'experiments/diloco/results/slow-diloco-small.dat' using 1:2 with linespoints title 'DiLoCo H = 50', 'experiments/diloco/results/slow-streaming-int8.dat' using 1:2 with linespoints title 'Streaming DiLoCo int8, F = 4, τ = 1, H = 50'
