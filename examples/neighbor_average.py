"""Gossip alone: every peer starts from its own random vector and repeatedly averages with
its neighbours through W. The consensus distance (1/n) Σ‖x_i − x̄‖² falls by about
(1 − gap)² per step, where gap is W's spectral gap; this prints both.

    build/peertrain launch --topology topology/ring8.yaml -- /usr/bin/python3 examples/neighbor_average.py

(with PYTHONPATH=build/python, see docs/python.md). Options: --steps N (default 30), --size D.
"""
import argparse

import numpy as np

import peertrain

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--size", type=int, default=10000)
args = parser.parse_args()

peertrain.init()
rank, gap = peertrain.rank(), peertrain.spectral_gap()
x = np.random.default_rng(rank).standard_normal(args.size).astype(np.float32)
mean = peertrain.allreduce(x)
start = peertrain.consensus_distance(x)
if rank == 0:
    print(f"{peertrain.size()} peers, spectral gap {gap:.4f}: predicted contraction per step (1 - gap)^2 = "
          f"{(1 - gap) ** 2:.4f}")
    print(f"{'step':>5} {'consensus distance':>19} {'predicted bound':>16}")
distance = start
for step in range(1, args.steps + 1):
    x = peertrain.neighbor_allreduce(x)
    previous, distance = distance, peertrain.consensus_distance(x)
    if rank == 0 and (step <= 5 or step % 5 == 0):
        print(f"{step:>5} {distance:>19.4e} {start * (1 - gap) ** (2 * step):>16.4e}")
drift = float(np.abs(peertrain.allreduce(x) - mean).max())
if rank == 0:
    rate = (distance / start) ** (1 / args.steps)
    print(f"measured contraction per step {rate:.4f} (predicted at most {(1 - gap) ** 2:.4f}); "
          f"the mean moved by {drift:.1e} (gossip keeps it)")
