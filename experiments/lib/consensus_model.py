"""The steady-state consensus distance of D-PSGD predicted from W (numpy): shared by
experiments/consensus and experiments/topologies.

  e_{k+1} = W_k e_k − η m_{k+1},  m_{k+1} = β m_k + δ_k   (the engine's cta step, local heavy ball)

with δ_k the peers' gradient noise, white in time and across peers (iid shards). Its
covariance C obeys C ← A C Aᵀ + B Q Bᵀ; Ξ = tr(C_e)/n. Without momentum and with a fixed W
this is η²σ̂² (n−1)/n · mean_{k≥2} 1/(1 − λ_k²) (Koloskova et al. 2020; Kong et al. 2021).
The one scale η²σ̂² is not predicted: the experiments take it from the complete graph.
"""
import math
import os
import subprocess
import tempfile

import numpy as np


def read_mtx(path):
    """Matrix Market coordinate file (peertrain topology inspect --mtx) as a dense array."""
    with open(path) as f:
        lines = [l for l in f if not l.startswith("%")]
    rows, cols, _ = (int(v) for v in lines[0].split())
    w = np.zeros((rows, cols))
    symmetric = "symmetric" in open(path).readline()
    for line in lines[1:]:
        i, j, v = line.split()
        w[int(i) - 1, int(j) - 1] = float(v)
        if symmetric:
            w[int(j) - 1, int(i) - 1] = float(v)
    return w


def mixing_matrices(peertrain, run_dir, graph, n):
    """W for each step of one period: the engine's W (topology inspect --mtx) for a fixed
    graph; for the one-peer exponential graph the matchings i ↔ i xor 2^(k mod τ), weight 1/2
    (Metropolis on degree 1), checked against the engine's W(0)."""
    with tempfile.TemporaryDirectory() as tmp:
        mtx = os.path.join(tmp, "W.mtx")
        subprocess.run([peertrain, "topology", "inspect", os.path.join(run_dir, "topology.yaml"), "--mtx", mtx],
                       check=True, capture_output=True)
        w0 = read_mtx(mtx)
    if graph != "one-peer-exponential":
        return [w0]
    period = max(1, math.ceil(math.log2(n)))
    ws = []
    for k in range(period):
        w = np.eye(n)
        bit = 1 << k
        for i in range(n):
            j = i ^ bit
            if j < n and j != i:
                w[i, i], w[i, j] = 0.5, 0.5
        ws.append(w)
    if not np.allclose(ws[0], w0, atol=1e-6):
        raise ValueError(f"{run_dir}: the one-peer exponential W(0) differs from the engine's")
    return ws


def steady_xi(ws, beta, n, tol=1e-12, max_steps=200000):
    """tr(C_e)/n at the steady state of the recursion above with η = 1 and unit noise per
    peer (Q = I − J), averaged over one period of W."""
    eye, j = np.eye(n), np.full((n, n), 1.0 / n)
    q = eye - j
    b = np.vstack([-eye, eye])
    noise = b @ q @ b.T
    a_list = [np.block([[w, -beta * eye], [np.zeros((n, n)), beta * eye]]) for w in ws]
    c = np.zeros((2 * n, 2 * n))
    previous = None
    for step in range(max_steps):
        a = a_list[step % len(a_list)]
        c = a @ c @ a.T + noise
        if step % len(a_list) == len(a_list) - 1:
            value = np.trace(c[:n, :n]) / n
            if previous is not None and abs(value - previous) <= tol * max(1.0, value):
                break
            previous = value
    values = []
    for k in range(len(a_list)):
        c = a_list[k] @ c @ a_list[k].T + noise
        values.append(np.trace(c[:n, :n]) / n)
    return float(np.mean(values))


def directed_steady_xi(step_matrix, n, beta=0.0, atc=False, steps=3000, burn=1500):
    """The consensus distance of the de-biased z = x/w that a gossip with the step matrices
    M_k = step_matrix(k) holds against white gradient noise, for D-PSGD (M = W), push-sum
    (M column-stochastic) and a row average (Epidemic Learning) alike:

      x_{k+1} = M_k x_k − η m_{k+1} (cta) or M_k (x_k − η m_{k+1}) (atc),  w_{k+1} = M_k w_k,

    m the local heavy ball over the noise. Its disagreement e = x − w (1ᵀx)/n evolves as
    e_{k+1} = Q_{k+1} M_k e_k − η B_k m_{k+1} with Q = I − w 1ᵀ/n and B = Q (cta) or Q M
    (atc), exactly (1ᵀM = 1ᵀ for push-sum, w = 1 for a row average), and z − z̄ = Π D⁻¹ e
    with D = diag(w), Π = I − 11ᵀ/n. Returns tr(Π D⁻¹ C_e D⁻¹ Π)/n averaged over the steps
    after `burn`, with η = 1 and unit noise per peer: the same scale as steady_xi."""
    eye = np.eye(n)
    ones = np.ones(n)
    pi = eye - np.full((n, n), 1.0 / n)
    w = ones.copy()
    c = np.zeros((2 * n, 2 * n))
    values = []
    for k in range(steps):
        m = step_matrix(k)
        w_next = m @ w
        q = eye - np.outer(w_next, ones) / n
        a = q @ m
        b = a if atc else q
        f = np.block([[a, -beta * b], [np.zeros((n, n)), beta * eye]])
        g = np.vstack([-b, eye])
        c = f @ c @ f.T + g @ g.T
        w = w_next
        if k >= burn:
            d = pi @ np.diag(1 / w)
            values.append(np.trace(d @ c[:n, :n] @ d.T) / n)
    return float(np.mean(values))


def push_sum_matrix(n, arcs):
    """Column-stochastic P with uniform out-weights for arcs (i, j), i sending to j."""
    p = np.zeros((n, n))
    outs = [[] for _ in range(n)]
    for i, j in arcs:
        outs[i].append(j)
    for i in range(n):
        share = 1.0 / (1 + len(outs[i]))
        p[i, i] = share
        for j in outs[i]:
            p[j, i] = share
    return p


def row_average_matrix(n, arcs):
    """Epidemic Learning's round: each peer averages its own with what it received."""
    m = np.zeros((n, n))
    ins = [[] for _ in range(n)]
    for i, j in arcs:
        ins[j].append(i)
    for j in range(n):
        weight = 1.0 / (1 + len(ins[j]))
        m[j, j] = weight
        for i in ins[j]:
            m[j, i] = weight
    return m


def random_out_arcs(rng, n, s):
    """Each peer sends to s distinct others, uniformly (EL-Local's graph, random-out)."""
    return [(i, int(j)) for i in range(n) for j in rng.choice([q for q in range(n) if q != i], s, replace=False)]


def random_regular_out_arcs(rng, n, s):
    """An s-regular digraph: a random relabelling of a circulant with s distinct offsets
    (EL-Oracle's graph, random-regular-out)."""
    offsets = rng.choice(np.arange(1, n), s, replace=False)
    label = rng.permutation(n)
    return [(int(label[k]), int(label[(k + o) % n])) for k in range(n) for o in offsets]


def one_peer_directed_arcs(n, step):
    """i → i + 2^(step mod ⌈log₂ n⌉) (mod n)."""
    hop = 1 << (step % max(1, math.ceil(math.log2(n))))
    return [(i, (i + hop) % n) for i in range(n)]
