#!/usr/bin/env python3
"""PyTorch CPU training step for the ViT that `peertrain bench step --model vit` times, as
the reference it is compared with (bench/all.sh). The same model: non-overlapping
patch × patch patches through one Linear, learned positions, pre-norm blocks (GELU tanh,
MLP 4d, torch_gpt_step.py's Block without the causal mask), a final LayerNorm, mean
pooling over the tokens and a Linear head with bias; AdamW; random images and labels,
warm-up first, median of the timed steps. Prints one JSON object."""
import argparse
import json

import torch_blas  # before torch: OpenBLAS reads its kernel choice at load
import torch
import torch.nn.functional as F

from torch_gpt_step import Block, median_step_ms


class Vit(torch.nn.Module):
    def __init__(self, image, patch, d, layers, heads, classes):
        super().__init__()
        self.patch = patch
        tokens = (image // patch) ** 2
        self.embed = torch.nn.Linear(patch * patch, d)
        self.wpe = torch.nn.Parameter(torch.randn(tokens, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads, causal=False) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, images):  # [batch, image, image]
        b, p = images.shape[0], self.patch
        patches = images.unfold(1, p, p).unfold(2, p, p).reshape(b, -1, p * p)
        x = self.embed(patches) + self.wpe
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x).mean(dim=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=28)
    parser.add_argument("--patch", type=int, default=7)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Vit(args.image, args.patch, args.d_model, args.layers, args.heads, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    x = torch.randn(args.batch, args.image, args.image)
    y = torch.randint(0, args.classes, (args.batch,))

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    ms = median_step_ms(step, args.warmup, args.steps)
    print(json.dumps({
        "framework": f"torch {torch.__version__}",
        "blas": torch_blas.core(),
        "model": "vit",
        "batch": args.batch,
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": ms,
        "items_per_s": args.batch / (ms / 1e3),
    }))


if __name__ == "__main__":
    main()
