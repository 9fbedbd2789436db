set terminal pngcairo enhanced font 'sans,10' size 820,480
set output 'experiments/diloco/results/loss_vs_step.png'
set grid
set xlabel 'step (equal tokens for every method)'
set ylabel 'validation bits per byte of x̄'
set key top right
set yrange [*:*]
plot 'experiments/diloco/results/curve-allreduce.dat' using 1:2 with linespoints title 'all-reduce (data-parallel)', 'experiments/diloco/results/curve-diloco-small.dat' using 1:2 with linespoints title 'DiLoCo H = 50', 'experiments/diloco/results/curve-diloco-large.dat' using 1:2 with linespoints title 'DiLoCo H = 250', 'experiments/diloco/results/curve-diloco-gossip.dat' using 1:2 with linespoints title 'gossip DiLoCo H = 50 (exponential)', 'experiments/diloco/results/curve-streaming-int8.dat' using 1:2 with linespoints title 'Streaming DiLoCo int8, F = 4, τ = 1, H = 50'
