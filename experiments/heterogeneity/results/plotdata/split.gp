set terminal pngcairo enhanced font 'sans,10' size 1120,460
set output 'experiments/heterogeneity/results/gap_split.png'
set multiplot layout 1,2 title "The ring's gap to all-reduce, split\ndashed: the form's share (the complete graph's gap); solid: the spectral share"
set xtics ('∞' 0, '1' 1, '0.3' 2, '0.1' 3)
set xlabel 'Dirichlet α (right: more skewed)'
set ylabel 'points of accuracy'
set grid
set key top left font ',8'
set xrange [-0.3:3.3]
set title 'momentum 0'
plot 'experiments/heterogeneity/results/plotdata/split-cta-form_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#1f77b4' pt 7 ps 0.6 title 'cta (D-PSGD): form', 'experiments/heterogeneity/results/plotdata/split-cta-spectral_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#1f77b4' pt 7 ps 0.6 title 'cta (D-PSGD): spectral', 'experiments/heterogeneity/results/plotdata/split-atc-form_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#2ca02c' pt 7 ps 0.6 title 'atc: form', 'experiments/heterogeneity/results/plotdata/split-atc-spectral_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#2ca02c' pt 7 ps 0.6 title 'atc: spectral', 'experiments/heterogeneity/results/plotdata/split-d2-form_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#d62728' pt 7 ps 0.6 title 'D²: form', 'experiments/heterogeneity/results/plotdata/split-d2-spectral_share-m0.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#d62728' pt 7 ps 0.6 title 'D²: spectral', 0 lc rgb 'grey' notitle
set title 'momentum 0.9'
plot 'experiments/heterogeneity/results/plotdata/split-cta-form_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#1f77b4' pt 7 ps 0.6 title 'cta (D-PSGD): form', 'experiments/heterogeneity/results/plotdata/split-cta-spectral_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#1f77b4' pt 7 ps 0.6 title 'cta (D-PSGD): spectral', 'experiments/heterogeneity/results/plotdata/split-atc-form_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#2ca02c' pt 7 ps 0.6 title 'atc: form', 'experiments/heterogeneity/results/plotdata/split-atc-spectral_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#2ca02c' pt 7 ps 0.6 title 'atc: spectral', 'experiments/heterogeneity/results/plotdata/split-d2-form_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 2 lc rgb '#d62728' pt 7 ps 0.6 title 'D²: form', 'experiments/heterogeneity/results/plotdata/split-d2-spectral_share-m0.9.dat' using 1:2:3 with yerrorlines lw 2 dt 1 lc rgb '#d62728' pt 7 ps 0.6 title 'D²: spectral', 0 lc rgb 'grey' notitle
unset multiplot
