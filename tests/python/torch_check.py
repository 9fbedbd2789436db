"""Run by every peer under `peertrain launch -- python3 torch_check.py`: peertrain.torch.

DistributedOptimizer gives the iterates of the explicit loop (backward, neighbor_allreduce
of each parameter, optimizer.step()) to 1e-6, with SGD and momentum, on fresh random
batches that differ between peers; algorithm="allreduce" those of averaging the gradients;
DiLoCo with H = 1 those of the all-reduce run, and with H = 3 those of its loop by hand;
broadcast_parameters makes the replicas equal; tensors are read without copying; bad
models and options are refused with a message. Exits 77 (skipped) without torch.
"""
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("SKIP: torch is not installed (Debian: apt-get install python3-torch)")
    sys.exit(77)
import numpy as np

import peertrain
import peertrain.torch as pt

peertrain.init()
rank = peertrain.rank()
torch.set_num_threads(1)


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def batch(step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 10, generator=g), torch.randint(0, 3, (8,), generator=g)


def train(net, optimizer, explicit, steps=5):
    for k in range(steps):
        x, y = batch(k)
        optimizer.zero_grad()
        F.cross_entropy(net(x), y).backward()
        explicit(net)
        optimizer.step()


def gossip_parameters(net):
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(pt.neighbor_allreduce(p))


def average_gradients(net):
    with torch.no_grad():
        for p in net.parameters():
            p.grad.copy_(pt.allreduce(p.grad))


def worst(a, b):
    return max(float((p - q).norm() / q.norm()) for p, q in zip(a.parameters(), b.parameters()))


for algorithm, explicit in (("dpsgd", gossip_parameters), ("allreduce", average_gradients)):
    a, b = model(), model()
    wrapped = pt.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9), a, algorithm=algorithm)
    train(a, wrapped, lambda net: None)
    train(b, torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9), explicit)
    assert worst(a, b) <= 1e-6, f"peer {rank}: {algorithm}: {worst(a, b):.3g} from the explicit loop"
    assert worst(a, model()) > 1e-3, "the optimizer did not move the model"

# DiLoCo with H = 1, an outer rate of 1, no outer momentum and plain SGD inside is the
# all-reduce run; with H = 3 and Nesterov it is the loop written out by hand.
a, b = model(), model()
train(a, pt.DiLoCo(a, torch.optim.SGD(a.parameters(), lr=0.1), inner_steps=1, outer_lr=1.0, outer_momentum=0.0),
      lambda net: None)
train(b, torch.optim.SGD(b.parameters(), lr=0.1), average_gradients)
assert worst(a, b) <= 1e-5, f"peer {rank}: DiLoCo with H = 1: {worst(a, b):.3g} from the all-reduce run"
for exchange, average in (("allreduce", pt.allreduce), ("gossip", pt.neighbor_allreduce)):
    a, b = model(), model()
    train(a, pt.DiLoCo(a, torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9), inner_steps=3, exchange=exchange),
          lambda net: None, steps=7)
    inner = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    outer = [p.detach().clone() for p in b.parameters()]
    buffers = [torch.zeros_like(p) for p in outer]
    for k in range(7):
        x, y = batch(k)
        inner.zero_grad()
        F.cross_entropy(b(x), y).backward()
        inner.step()
        if (k + 1) % 3 == 0:
            with torch.no_grad():
                for p, o, m in zip(b.parameters(), outer, buffers):
                    delta = average(o - p)
                    m.mul_(0.9).add_(delta)
                    o.sub_(0.7 * (delta + 0.9 * m))
                    p.copy_(o)
    assert worst(a, b) <= 1e-5, f"peer {rank}: DiLoCo over {exchange}: {worst(a, b):.3g} from the loop by hand"
    assert worst(a, model()) > 1e-3, "DiLoCo did not move the model"

# The replicas differ (seeded by rank) until broadcast_parameters.
c = model(seed=rank)
pt.broadcast_parameters(c.state_dict(), root=0)
for p in c.parameters():
    assert torch.equal(p, pt.allreduce(p)), "the replicas differ after broadcast_parameters"
assert worst(c, model(seed=0)) == 0

t = torch.randn(100)
assert np.shares_memory(pt._view(t, "check"), t.numpy()), "a contiguous CPU tensor was copied"
assert pt.consensus_distance(torch.zeros(5) + rank) > 0

for bad, kind, words in ((lambda: pt.neighbor_allreduce(torch.zeros(3, dtype=torch.float64)), TypeError, "float32"),
                         (lambda: pt.neighbor_allreduce(np.zeros(3, np.float32)), TypeError, "torch.Tensor"),
                         (lambda: pt.DistributedOptimizer(torch.optim.SGD(model().double().parameters(), lr=0.1),
                                                          model().double()), TypeError, "float32"),
                         (lambda: pt.DistributedOptimizer(torch.optim.SGD(model().parameters(), lr=0.1), model(),
                                                          algorithm="gossip"), ValueError, "not one of"),
                         (lambda: pt.DiLoCo(model(), torch.optim.SGD(model().parameters(), lr=0.1), inner_steps=0),
                          ValueError, "inner_steps"),
                         (lambda: pt.DiLoCo(model(), torch.optim.SGD(model().parameters(), lr=0.1), exchange="ps"),
                          ValueError, "not one of")):
    try:
        bad()
        sys.exit("accepted")
    except kind as e:
        assert words in str(e), e
peertrain.barrier()
print(f"ok {rank}")
