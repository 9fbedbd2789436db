"""One peer's side of bench/python_overhead.sh: times neighbor_allreduce of a float32
tensor of --mb megabytes, --repeats times after a warm-up, and rank 0 prints the median
and the spread in ms (a line "python_ms MEDIAN MIN MAX")."""
import argparse
import time

import numpy as np

import peertrain

parser = argparse.ArgumentParser()
parser.add_argument("--mb", type=float, default=10)
parser.add_argument("--repeats", type=int, default=30)
args = parser.parse_args()
peertrain.init()
x = np.random.default_rng(peertrain.rank()).standard_normal(int(args.mb * 1e6 / 4)).astype(np.float32)
for _ in range(3):
    peertrain.neighbor_allreduce(x)
times = []
for _ in range(args.repeats):
    peertrain.barrier()
    start = time.perf_counter()
    peertrain.neighbor_allreduce(x)
    times.append(1e3 * (time.perf_counter() - start))
if peertrain.rank() == 0:
    times.sort()
    print(f"python_ms {times[len(times) // 2]:.3f} {times[0]:.3f} {times[-1]:.3f}")
