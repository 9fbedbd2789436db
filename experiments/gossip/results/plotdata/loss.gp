set terminal pngcairo enhanced font 'sans,10' size 900,520
set output '/work/main/experiments/gossip/results/loss_vs_time.png'
set logscale x
set xlabel 'wall time (s, slowest peer)'
set ylabel 'mean training loss'
set key top right
set grid
set arrow from graph 0, first 0.55 to graph 1, first 0.55 nohead dashtype 2
plot '/work/main/experiments/gossip/results/plotdata/slow0.dat' using 1:2 with linespoints title 'allreduce', \
  '/work/main/experiments/gossip/results/plotdata/slow1.dat' using 1:2 with linespoints title 'allreduce --allreduce-algo rd', \
  '/work/main/experiments/gossip/results/plotdata/slow2.dat' using 1:2 with linespoints title 'dpsgd', \
  '/work/main/experiments/gossip/results/plotdata/slow3.dat' using 1:2 with linespoints title 'choco --compression top-k:0.01', \
  '/work/main/experiments/gossip/results/plotdata/slow4.dat' using 1:2 with linespoints title 'choco --compression top-k:0.01 --gossip-step 0.04', \
  '/work/main/experiments/gossip/results/plotdata/slow5.dat' using 1:2 with linespoints title 'choco --compression top-k:0.05', \
  '/work/main/experiments/gossip/results/plotdata/slow6.dat' using 1:2 with linespoints title 'choco --compression qsgd:4', \
  '/work/main/experiments/gossip/results/plotdata/slow7.dat' using 1:2 with linespoints title 'choco --compression sign'
