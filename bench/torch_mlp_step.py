#!/usr/bin/env python3
"""PyTorch CPU training step for the MLP that `peertrain bench step --model mlp` times, as
the reference it is compared with (bench/compare_mlp_step.sh). Same shapes, same optimizer
(SGD, momentum 0.9, weight decay 1e-4), random data, warm-up first, median of the timed
steps. Prints one JSON object."""
import argparse
import json

import torch_blas  # before torch: OpenBLAS reads its kernel choice at load
import torch

from torch_gpt_step import median_step_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", default="512,512")
    parser.add_argument("--inputs", type=int, default=784)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    widths = [args.inputs] + [int(h) for h in args.hidden.split(",") if h] + [args.classes]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.batch, args.inputs)
    y = torch.randint(0, args.classes, (args.batch,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    ms = median_step_ms(step, args.warmup, args.steps)
    print(json.dumps({
        "framework": f"torch {torch.__version__}",
        "blas": torch_blas.core(),
        "model": "mlp",
        "widths": widths,
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "ms_per_step": ms,
        "items_per_s": args.batch / (ms / 1e3),
    }))


if __name__ == "__main__":
    main()
