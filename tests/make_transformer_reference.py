#!/usr/bin/env python3
"""Writes tests/data/transformer_{gpt,gpt_tied,vit}.bin, the PyTorch values that
tests/model/transformer_test.cpp compares peertrain's transformer with (the llm.c recipe:
logits, loss, every gradient, then ten SGD steps). Run with a Python that has torch (here
/usr/bin/python3); the test itself needs only the files.

The model is built here from torch operations on one flat parameter tensor laid out as in
src/model/transformer.cpp, so the flat gradient is directly peertrain's layout. The
parameters are drawn here (wider than GPT-2's init, biases and LayerNorm affine non-zero,
so every path carries signal), rounded to float32, and everything is computed in float64
from those float32 values: the reference carries no float32 rounding of its own.

Format: a sequence of sections, little-endian: u32 name length, the name (ASCII), u8 type
(0 float32, 1 int32, 2 float64), u64 count, count values. Sections: config (int32: kind
0 gpt / 1 vit, d_model, layers, heads, seq, vocab, tied, image, patch, classes, batch,
tokens, mlp_ratio), inputs (gpt: bytes int32 [batch × tokens]; vit: pixels float32
[batch × image²]), targets (int32), params (float32), logits (float32, classes × columns
column-major), loss (float64, mean over targets), grads (float32), lr (float64),
sgd_losses (float64: the loss before each of 10 SGD steps on the same batch)."""
import math
import os
import struct

import torch

torch.set_default_dtype(torch.float64)


def layout(cfg):
    """(name, rows, cols, init) in buffer order, as in src/model/transformer.cpp."""
    d, f = cfg["d_model"], cfg["mlp_ratio"] * cfg["d_model"]
    t = []
    if cfg["kind"] == "gpt":
        t.append(("wte", d, cfg["vocab"], "w"))
    else:
        t.append(("patch.weight", d, cfg["patch"] ** 2, "w"))
        t.append(("patch.bias", d, 1, "b"))
    t.append(("wpe", d, cfg["seq"], "w"))
    for l in range(cfg["layers"]):
        p = f"h{l}."
        t += [(p + "ln1.weight", d, 1, "g"), (p + "ln1.bias", d, 1, "b"),
              (p + "attn.qkv.weight", 3 * d, d, "w"), (p + "attn.qkv.bias", 3 * d, 1, "b"),
              (p + "attn.proj.weight", d, d, "w"), (p + "attn.proj.bias", d, 1, "b"),
              (p + "ln2.weight", d, 1, "g"), (p + "ln2.bias", d, 1, "b"),
              (p + "mlp.fc.weight", f, d, "w"), (p + "mlp.fc.bias", f, 1, "b"),
              (p + "mlp.proj.weight", d, f, "w"), (p + "mlp.proj.bias", d, 1, "b")]
    t += [("ln_f.weight", d, 1, "g"), ("ln_f.bias", d, 1, "b")]
    if cfg["kind"] == "vit":
        t += [("head.weight", cfg["classes"], d, "w"), ("head.bias", cfg["classes"], 1, "b")]
    elif not cfg["tied"]:
        t.append(("lm_head.weight", cfg["vocab"], d, "w"))
    return t


def draw_params(cfg, gen):
    parts = []
    for name, rows, cols, init in layout(cfg):
        if init == "w":  # scaled so that activations stay O(1) through the blocks
            v = torch.randn(rows * cols, generator=gen) * (0.5 / math.sqrt(cols if rows > 1 and cols > 1 else rows))
            if name in ("wte", "wpe"):
                v = torch.randn(rows * cols, generator=gen) * 0.25
        elif init == "g":
            v = 1 + 0.1 * torch.randn(rows * cols, generator=gen)
        else:
            v = 0.1 * torch.randn(rows * cols, generator=gen)
        parts.append(v)
    return torch.cat(parts).float().double()


def views(cfg, p):
    """Named torch views of the flat tensor: a column-major rows × cols slice is the
    transpose of a row-major cols × rows view."""
    out, at = {}, 0
    for name, rows, cols, _ in layout(cfg):
        n = rows * cols
        out[name] = p[at:at + n].view(cols, rows).t() if cols > 1 else p[at:at + n]
        at += n
    assert at == p.numel()
    return out


def layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def block(cfg, v, l, x):
    p = f"h{l}."
    bsz, t, d = x.shape
    heads, hd = cfg["heads"], d // cfg["heads"]
    h = layer_norm(x, v[p + "ln1.weight"], v[p + "ln1.bias"])
    qkv = h @ v[p + "attn.qkv.weight"].t() + v[p + "attn.qkv.bias"]
    q, k, val = (z.reshape(bsz, t, heads, hd).transpose(1, 2) for z in qkv.split(d, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if cfg["kind"] == "gpt":
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
    att = (torch.softmax(scores, dim=-1) @ val).transpose(1, 2).reshape(bsz, t, d)
    x = x + att @ v[p + "attn.proj.weight"].t() + v[p + "attn.proj.bias"]
    h = layer_norm(x, v[p + "ln2.weight"], v[p + "ln2.bias"])
    h = gelu_tanh(h @ v[p + "mlp.fc.weight"].t() + v[p + "mlp.fc.bias"])
    return x + h @ v[p + "mlp.proj.weight"].t() + v[p + "mlp.proj.bias"]


def logits_of(cfg, p, inputs):
    v = views(cfg, p)
    if cfg["kind"] == "gpt":
        x = v["wte"].t()[inputs] + v["wpe"].t()[: cfg["tokens"]]
    else:
        bsz, ps, per_row = inputs.shape[0], cfg["patch"], cfg["image"] // cfg["patch"]
        # (b, row, y, col, x) → (b, row, col, y, x): patches row by row, pixels row by row.
        patches = inputs.view(bsz, per_row, ps, per_row, ps).permute(0, 1, 3, 2, 4).reshape(bsz, per_row ** 2, ps * ps)
        x = patches @ v["patch.weight"].t() + v["patch.bias"] + v["wpe"].t()[: cfg["tokens"]]
    for l in range(cfg["layers"]):
        x = block(cfg, v, l, x)
    y = layer_norm(x, v["ln_f.weight"], v["ln_f.bias"])
    if cfg["kind"] == "vit":
        return y.mean(dim=1) @ v["head.weight"].t() + v["head.bias"]
    return y @ (v["wte"] if cfg["tied"] else v["lm_head.weight"].t())


def loss_of(cfg, p, inputs, targets):
    logits = logits_of(cfg, p, inputs)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)), logits


def section(name, kind, values):
    fmt = {0: "<f", 1: "<i", 2: "<d"}[kind]
    body = b"".join(struct.pack(fmt, x) for x in values)
    return struct.pack("<I", len(name)) + name.encode() + struct.pack("<BQ", kind, len(values)) + body


def make(cfg, seed, path, lr=0.1):
    gen = torch.Generator().manual_seed(seed)
    bsz = cfg["batch"]
    if cfg["kind"] == "gpt":
        cfg["tokens"] = cfg["seq"]
        inputs = torch.randint(0, cfg["vocab"], (bsz, cfg["seq"]), generator=gen)
        targets = torch.randint(0, cfg["vocab"], (bsz, cfg["seq"]), generator=gen)
        flat_inputs = section("inputs", 1, inputs.reshape(-1).tolist())
    else:
        cfg["tokens"] = (cfg["image"] // cfg["patch"]) ** 2
        cfg["seq"] = cfg["tokens"]
        inputs = torch.randn(bsz, cfg["image"], cfg["image"], generator=gen).float().double()
        targets = torch.randint(0, cfg["classes"], (bsz,), generator=gen)
        flat_inputs = section("inputs", 0, inputs.reshape(-1).tolist())
    params = draw_params(cfg, gen).requires_grad_()
    loss, logits = loss_of(cfg, params, inputs, targets)
    loss.backward()

    sgd_losses = []
    p = params.detach().clone()
    for _ in range(10):
        p.requires_grad_()
        step_loss, _ = loss_of(cfg, p, inputs, targets)
        step_loss.backward()
        sgd_losses.append(step_loss.item())
        # float32 parameters, as peertrain keeps them.
        p = (p.detach() - lr * p.grad).float().double()

    config = [0 if cfg["kind"] == "gpt" else 1, cfg["d_model"], cfg["layers"], cfg["heads"], cfg["seq"],
              cfg.get("vocab", 0), int(cfg.get("tied", False)), cfg.get("image", 28), cfg.get("patch", 7),
              cfg.get("classes", 10), bsz, cfg["tokens"], cfg["mlp_ratio"]]
    data = b"".join([
        section("config", 1, config),
        flat_inputs,
        section("targets", 1, targets.reshape(-1).tolist()),
        section("params", 0, params.detach().tolist()),
        section("logits", 0, logits.detach().reshape(-1).tolist()),
        section("loss", 2, [loss.item()]),
        section("grads", 0, params.grad.tolist()),
        section("lr", 2, [lr]),
        section("sgd_losses", 2, sgd_losses),
    ])
    with open(path, "wb") as f:
        f.write(data)
    print(f"wrote {path}: {params.numel()} parameters, loss {loss.item():.6f}, "
          f"after 10 SGD steps {sgd_losses[-1]:.6f}, {len(data)} bytes")


def main():
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    gpt = dict(kind="gpt", d_model=32, layers=2, heads=2, seq=16, vocab=256, batch=3, mlp_ratio=4)
    make(dict(gpt, tied=False), 101, os.path.join(data, "transformer_gpt.bin"))
    # Tied: the embedding gets two gradients and moves fast; a smaller step keeps the ten
    # steps well-conditioned, so float32 rounding stays far below the 1e-5 tolerance.
    make(dict(gpt, tied=True), 102, os.path.join(data, "transformer_gpt_tied.bin"), lr=0.03)
    vit = dict(kind="vit", d_model=32, layers=2, heads=2, image=28, patch=7, classes=10, batch=3, mlp_ratio=4)
    make(vit, 103, os.path.join(data, "transformer_vit.bin"))


if __name__ == "__main__":
    main()
