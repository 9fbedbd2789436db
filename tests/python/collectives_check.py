"""Run by every peer under `peertrain launch --topology FILE -- python3 collectives_check.py`.

The collectives against their serial twins computed in NumPy from the same topology: each
peer regenerates every peer's random tensor from the seeds, so it knows X and checks its
own row of W·X (neighbor_allreduce, within 1e-6 normalized), the mean (allreduce), root's
tensor (broadcast), the consensus distance, custom weights and the non-blocking forms; then
the bad input: a float64 tensor, a list, a tensor of another shape than the neighbours',
init() twice and src_weights naming a non-neighbour. Prints "ok RANK" at the end.
"""
import sys

import numpy as np

import peertrain

try:
    peertrain.rank()
    sys.exit("rank() before init() did not raise")
except RuntimeError as e:
    assert "before peertrain.init()" in str(e), e

peertrain.init()
rank, n = peertrain.rank(), peertrain.size()
W = peertrain.mixing_matrix()
assert W.shape == (n, n) and np.allclose(W.sum(axis=1), 1) and np.allclose(W, W.T)
self_weight, weights = peertrain.mixing_weights()
assert abs(self_weight - W[rank, rank]) < 1e-12 and sorted(weights) == peertrain.neighbors()
assert 0 < peertrain.spectral_gap() <= 1


def tensors(size, call):
    """Every peer's tensor for this call: fresh normal entries, seeded by (peer, size, call)."""
    return np.stack([np.random.default_rng([p, size, call]).standard_normal(size).astype(np.float32)
                     for p in range(n)]) if size else np.zeros((n, 0), np.float32)


def close(got, want, what, tol=1e-6):
    err = np.linalg.norm(got.astype(np.float64) - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= tol or want.size == 0, f"peer {rank}: {what}: normalized error {err:.3g} > {tol}"


for size in (0, 1, 1001, 10**6):
    X = tensors(size, 1)
    got = peertrain.neighbor_allreduce(X[rank])
    assert got.shape == X[rank].shape and got.dtype == np.float32
    close(got, (W @ X.astype(np.float64))[rank], f"neighbor_allreduce of {size}")
    close(peertrain.allreduce(X[rank]), X.astype(np.float64).mean(axis=0), f"allreduce of {size}")
    close(peertrain.allreduce(X[rank], average=False), X.astype(np.float64).sum(axis=0), f"sum of {size}")
    close(peertrain.broadcast(X[rank], root=n - 1), X[n - 1].astype(np.float64), f"broadcast of {size}")

# Shapes travel as they are; custom weights; the non-blocking forms; the consensus distance.
X = tensors(6, 2).reshape(n, 2, 3)
close(peertrain.neighbor_allreduce(X[rank]), np.einsum("j,jab->ab", W[rank], X.astype(np.float64)), "2x3 tensor")
neighbour = peertrain.neighbors()[0]
custom = peertrain.neighbor_allreduce(X[rank], self_weight=0.25, src_weights={neighbour: 0.75})
close(custom, 0.25 * X[rank].astype(np.float64) + 0.75 * X[neighbour], "custom weights")
handles = [peertrain.neighbor_allreduce_nonblocking(X[rank]), peertrain.allreduce_nonblocking(X[rank])]
close(handles[0].wait(timeout=30), np.einsum("j,jab->ab", W[rank], X.astype(np.float64)), "non-blocking gossip")
close(handles[1].wait(), X.astype(np.float64).mean(axis=0), "non-blocking allreduce")
# The non-blocking gossip reads its input while it runs: the handle holds the buffer, so
# the input cannot be resized (and freed) under it until wait() returns.
from array import array
held = array("f", X[rank].ravel())
pending = peertrain.neighbor_allreduce_nonblocking(held)
try:
    held.extend([0.0] * 100000)
    sys.exit("an array('f') was resized while a non-blocking call read it")
except BufferError:
    pass
close(pending.wait(), np.einsum("j,jab->ab", W[rank], X.astype(np.float64)).ravel(), "non-blocking gossip of an array")
held.extend([0.0])  # released once done
Y = tensors(1000, 3)
mean = Y.astype(np.float64).mean(axis=0)
want = float(((Y - mean) ** 2).sum(axis=1).mean())
got = peertrain.consensus_distance(Y[rank])
assert abs(got - want) <= 1e-5 * want, (got, want)
peertrain.barrier()

# Bad input: refused before anything is sent, so the peers stay in step.
for bad, kind, words in ((np.zeros(3), TypeError, "float32"), ([1.0, 2.0], TypeError, "buffer of float32"),
                         (np.zeros((4, 4), np.float32)[:, ::2], ValueError, "not contiguous")):
    try:
        peertrain.neighbor_allreduce(bad)
        sys.exit(f"{bad!r} was accepted")
    except kind as e:
        assert words in str(e), e
try:
    peertrain.init()
    sys.exit("init() twice was accepted")
except RuntimeError as e:
    assert "already called" in str(e), e
stranger = next((p for p in range(n) if p != rank and p not in peertrain.neighbors()), None)
if stranger is not None:
    try:
        peertrain.neighbor_allreduce(X[rank], src_weights={stranger: 0.5})
        sys.exit("a non-neighbour in src_weights was accepted")
    except ValueError as e:
        assert "not a neighbour" in str(e), e
    # Refused before the call took its number: the peers without a stranger are still in step.
peertrain.barrier()
# A shape that differs between neighbours: both sides say so (the last call: they are out of step after it).
try:
    peertrain.neighbor_allreduce(np.zeros(10 + rank, np.float32))
    sys.exit("tensors of different shapes were accepted")
except ValueError as e:
    assert "must have the same shape" in str(e), e
print(f"ok {rank}")
