#!/usr/bin/env python3
"""Writes tests/data/mlp_reference.txt, the PyTorch values that tests/model/mlp_test.cpp
compares peertrain's MLP with: a 20-16-12-5 MLP (ReLU, softmax cross-entropy, mean over a
batch of 7), its inputs, labels and parameters, and the loss and every gradient as PyTorch
computes them. Run with a Python that has torch (here /usr/bin/python3); the test itself
needs only the text file.

The parameters and inputs are float32 values (written with 9 significant digits, which
round-trip exactly); the loss and gradients are computed in float64 from those same values,
so the reference carries no float32 rounding of its own.

Format: whitespace-separated tokens. "widths 20 16 12 5", "batch 7", then sections
"<name> <count>" followed by count numbers: inputs (batch × features, example-major),
labels, params (peertrain's flat layout: per layer the weight out × in column-major, then
the bias), loss (1), grads (the params layout)."""
import os

import torch

WIDTHS = [20, 16, 12, 5]
BATCH = 7


def main():
    torch.manual_seed(20240521)
    layers = [torch.nn.Linear(WIDTHS[i], WIDTHS[i + 1]) for i in range(len(WIDTHS) - 1)]
    x = torch.randn(BATCH, WIDTHS[0])
    y = torch.randint(0, WIDTHS[-1], (BATCH,))
    y[:WIDTHS[-1]] = torch.arange(WIDTHS[-1])  # every class appears

    params64 = []
    for layer in layers:
        # Column-major out × in is the transpose's rows: flatten weight.T.
        params64.append(layer.weight.detach().double().t().contiguous().view(-1).requires_grad_())
        params64.append(layer.bias.detach().double().clone().requires_grad_())
    h = x.double()
    for i, layer in enumerate(layers):
        w = params64[2 * i].view(layer.in_features, layer.out_features).t()
        h = h @ w.t() + params64[2 * i + 1]
        if i + 1 < len(layers):
            h = torch.relu(h)
    loss = torch.nn.functional.cross_entropy(h, y)
    loss.backward()

    flat_params = torch.cat([p.detach() for p in params64])
    flat_grads = torch.cat([p.grad for p in params64])
    out = [
        "widths " + " ".join(map(str, WIDTHS)),
        f"batch {BATCH}",
        section("inputs", x.reshape(-1).tolist(), "%.9g"),
        section("labels", y.tolist(), "%d"),
        section("params", flat_params.tolist(), "%.9g"),
        section("loss", [loss.item()], "%.17g"),
        section("grads", flat_grads.tolist(), "%.17g"),
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "mlp_reference.txt")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {path}: loss {loss.item():.6f}, {flat_params.numel()} parameters")


def section(name, values, fmt):
    lines = [f"{name} {len(values)}"]
    for i in range(0, len(values), 8):
        lines.append(" ".join(fmt % v for v in values[i:i + 8]))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
