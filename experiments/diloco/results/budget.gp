set terminal pngcairo enhanced font 'sans,10' size 820,480
set output 'experiments/diloco/results/budget.png'
set grid
set xlabel 'step'
set ylabel 'validation bits per byte of x̄'
set key top right
plot 'experiments/diloco/results/budget-allreduce.dat' using 1:2 with linespoints title 'all-reduce (data-parallel)', 'experiments/diloco/results/budget-diloco-small.dat' using 1:2 with linespoints title 'DiLoCo H = 50'
