#!/usr/bin/env python3
"""PyTorch CPU training step for the byte-level GPT that `peertrain bench step --model gpt`
times, as the reference it is compared with (bench/compare_gpt_step.sh). The same model
(pre-norm blocks, GELU tanh, learned positions, untied LM head), the same optimizer
(AdamW), random bytes, warm-up first, median of the timed steps. Attention is PyTorch's
fused scaled_dot_product_attention (causal) where this torch has it (2.x), else
the explicit masked softmax of nanoGPT. Prints one JSON object."""
import argparse
import json
import statistics
import time

import torch_blas  # before torch: OpenBLAS reads its kernel choice at load
import torch
import torch.nn.functional as F


def median_step_ms(step, warmup, steps, sync=lambda: None):
    """The median wall time of `steps` calls of step() after `warmup` untimed ones, in ms;
    sync() before and after each timed call (a device's queue must be empty)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class Block(torch.nn.Module):
    def __init__(self, d, heads, causal=True):
        super().__init__()
        self.heads = heads
        self.causal = causal  # the GPT's blocks are causal, the ViT's (torch_vit_step.py) are not
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch 2
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:  # torch 1.x: the textbook path, as nanoGPT writes it
            att = (q @ k.transpose(-2, -1)) * (k.shape[-1] ** -0.5)
            if self.causal:
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                att = att.masked_fill(~mask, float("-inf"))
            att = att.softmax(dim=-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, seq, d, layers, heads):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--tf32", action="store_true", help="cuda: TF32 matmuls (peertrain's default GEMM)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (the warm-up compiles)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Gpt(256, args.seq, args.d_model, args.layers, args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    forward = torch.compile(model) if args.compile else model
    x = torch.randint(0, 256, (args.batch, args.seq), device=device)
    y = torch.randint(0, 256, (args.batch, args.seq), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(x).view(-1, 256), y.view(-1))
        loss.backward()
        optimizer.step()

    ms = median_step_ms(step, args.warmup, args.steps, sync)
    print(json.dumps({
        "framework": f"torch {torch.__version__}" + (" compile" if args.compile else " eager"),
        "blas": torch_blas.core(),
        "device": str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
        "peak_device_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
        "model": "gpt",
        "batch": args.batch,
        "seq": args.seq,
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": ms,
        "items_per_s": args.batch / (ms / 1e3),
        "tokens_per_s": args.batch * args.seq / (ms / 1e3),
    }))


if __name__ == "__main__":
    main()
