set terminal pngcairo enhanced font 'sans,10' size 800,520
set output '/work/main/experiments/topologies/results/gpt_bits_per_byte.png'
set title 'GPT, 16 peers: held-out bits per byte of x̄ (mean of 3 seed(s))'
set grid
set key top right box opaque
set xlabel 'step (one batch of sequences per peer)'
set ylabel 'validation bits per byte of x̄ (lower is better)'
plot '/work/main/experiments/topologies/results/plotdata/gpt-ring.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'ring', \
  '/work/main/experiments/topologies/results/plotdata/gpt-exponential.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'exponential', \
  '/work/main/experiments/topologies/results/plotdata/gpt-allreduce.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#000000' title 'all-reduce (exact average)'
