"""A small PyTorch CNN on Fashion-MNIST, trained by D-PSGD over the peers of a topology file
with peertrain.torch.DistributedOptimizer: each peer trains on its own shard and gossips its
parameters with its neighbours every step. At the end x̄ (the average of the peers' models)
is evaluated on the test set.

    PYTHONPATH=build/python build/peertrain launch --topology topology/ring8.yaml -- \\
        /usr/bin/python3 examples/torch_dpsgd.py --epochs 5

Options: --epochs E (default 5), --batch B per peer (32), --lr (0.05), --momentum (0.9),
--algorithm dpsgd|allreduce, --limit N (train on N examples only, for a quick check),
--data DIR (Debian's dataset-fashion-mnist).
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

import peertrain
import peertrain.torch as pt

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--epochs", type=float, default=5)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--algorithm", default="dpsgd", choices=pt.DistributedOptimizer.ALGORITHMS)
parser.add_argument("--limit", type=int, default=0)
parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
args = parser.parse_args()


def idx(name):
    path = os.path.join(args.data, name)
    with gzip.open(path) as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5, padding=2)
        self.fc = torch.nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


peertrain.init()
rank, n = peertrain.rank(), peertrain.size()
torch.set_num_threads(1)
torch.manual_seed(rank)
images = torch.from_numpy(idx("train-images-idx3-ubyte.gz").astype(np.float32) / 255).unsqueeze(1)
labels = torch.from_numpy(idx("train-labels-idx1-ubyte.gz").astype(np.int64))
if args.limit:
    images, labels = images[:args.limit], labels[:args.limit]
order = torch.randperm(len(images), generator=torch.Generator().manual_seed(1))  # the same on every peer
shard = order[rank::n]  # an iid shard per peer
model = Net()
pt.broadcast_parameters(model.state_dict(), root=0)  # every replica starts from peer 0's
optimizer = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum), model,
                                    algorithm=args.algorithm)
steps_per_epoch = len(shard) // args.batch
steps = int(args.epochs * steps_per_epoch)
start, loss_sum = time.time(), 0.0
for step in range(steps):
    if step % steps_per_epoch == 0:
        perm = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(step + rank))]
    take = perm[(step % steps_per_epoch) * args.batch:(step % steps_per_epoch + 1) * args.batch]
    optimizer.zero_grad()
    loss = F.cross_entropy(model(images[take]), labels[take])
    loss.backward()
    optimizer.step()
    loss_sum += loss.item()
    if rank == 0 and (step + 1) % max(1, steps // 10) == 0:
        print(f"step {step + 1}/{steps} epoch {(step + 1) / steps_per_epoch:.2f} loss {loss_sum / (step + 1):.4f} "
              f"({time.time() - start:.0f} s)", flush=True)

with torch.no_grad():
    distance = sum(pt.consensus_distance(p) for p in model.parameters())
    for p in model.parameters():  # x̄: the average of the peers' models
        p.copy_(pt.allreduce(p))
    test_x = torch.from_numpy(idx("t10k-images-idx3-ubyte.gz").astype(np.float32) / 255).unsqueeze(1)
    test_y = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    accuracy = float((model(test_x).argmax(1) == test_y).float().mean())
if rank == 0:
    print(f"{args.algorithm} over {n} peers, {args.epochs:g} epochs: test accuracy of x̄ {accuracy:.4f}, "
          f"consensus distance before averaging {distance:.3e}, {time.time() - start:.0f} s")
peertrain.barrier()
