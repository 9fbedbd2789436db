"""Run by every peer of a ring under `peertrain launch -- python3 lost_check.py`: the last
peer leaves (crashes) after three calls; its neighbours go on gossiping without it, as D-PSGD
does in the engine, and lost_peers() names it. The all-reduce, which needs everyone, says
so. Prints "ok RANK" (the lost peer prints nothing more)."""
import os
import sys

import numpy as np

import peertrain

peertrain.init(peer_timeout=10)
rank, n = peertrain.rank(), peertrain.size()
x = np.full(1000, float(rank), np.float32)
for _ in range(3):
    x = peertrain.neighbor_allreduce(x)
if rank == n - 1:
    os._exit(3)  # a crash: no goodbye
for _ in range(5):
    x = peertrain.neighbor_allreduce(x)
lost = [peer for peer, _ in peertrain.lost_peers()]
if rank in (0, n - 2):
    assert lost == [n - 1], f"peer {rank} lost {lost}"
    try:
        peertrain.allreduce(x)
        sys.exit("an all-reduce without a lost peer was accepted")
    except peertrain.PeerLostError as e:
        assert "was lost" in str(e), e
else:
    assert lost == [], f"peer {rank} lost {lost}"
print(f"ok {rank}")
