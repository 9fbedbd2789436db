"""An α-β cost model of one training step of peertrain's algorithms on a network of links.

A step is a sequence of rounds, each a set of messages sent at once (the engine's own
exchanges: D-PSGD's one round to the neighbours; ring all-reduce's 2(n − 1) rounds of S/n;
the binomial tree's log2 n reduce rounds and log2 n broadcast rounds of S; the parameter
server's pushes to peer 0, then its broadcast). A message from i to j of b bytes finishes
after

    L_ij + α + b' · (1/B + β)

where L_ij is the link's latency, B the slowest of the link and the two cards it crosses
(sender's out, receiver's in), and b' the bytes that resource carries in that round (a
card carries every message through it). α is the software's cost per message and β its
cost per byte, beyond the wire; a round lasts as long as its slowest message, and a step
is c (its computation, per algorithm) plus its rounds. step_time_flow replays that message
by message, for networks whose links differ (a round waits only for what it needs).

On a uniform network (latency L, bandwidth B on every link and card) this is linear:
T = c + K · (L + α) + M · (1/B + β), with K the rounds and M the bytes on the critical path,
so c, α and β are fitted by least squares (fit()).

Standard library only (but fit(), which needs numpy), so that run.sh can size its runs.
"""
import math
import random

# name -> launch flags
ALGORITHMS = {
    "dpsgd": "--algorithm dpsgd",
    "choco": "--algorithm choco --compression qsgd:4",
    "ps": "--algorithm ps",
    "ring": "--algorithm allreduce --allreduce-algo ring",
    "tree": "--algorithm allreduce --allreduce-algo tree",
}
NAMES = {"dpsgd": "D-PSGD", "choco": "CHOCO qsgd:4", "ps": "parameter server", "ring": "ring all-reduce",
         "tree": "tree all-reduce", "single": "one worker"}


def rounds(algorithm, n, size):
    """The rounds of one step on a ring of n peers: a list of rounds, each a list of
    (sender, receiver, bytes). size: the bytes of one message of the whole model (for
    choco, of one compressed message)."""
    if n == 1:
        return []
    if algorithm in ("dpsgd", "choco"):
        return [[(i, j, size) for i in range(n) for j in sorted({(i + 1) % n, (i - 1) % n}) if j != i]]
    if algorithm == "ring":
        return [[(i, (i + 1) % n, size / n) for i in range(n)] for _ in range(2 * (n - 1))]
    if algorithm == "tree":
        reduce_rounds, mask = [], 1
        while mask < n:
            reduce_rounds.append([(i, i - mask, size) for i in range(n) if i & mask and not i & (mask - 1)])
            mask <<= 1
        broadcast = [[(j, i, b) for (i, j, b) in r] for r in reversed(reduce_rounds)]
        return reduce_rounds + broadcast
    if algorithm == "ps":
        return [[(i, 0, size) for i in range(1, n)], [(0, i, size) for i in range(1, n)]]
    raise ValueError(f"unknown algorithm {algorithm}")


class Network:
    """Per-pair latency (s) and bandwidth (bit/s, inf for none), and each node's card out
    and in (bit/s, inf for none)."""

    def __init__(self, n, latency_s=0.0, bandwidth=math.inf, card=math.inf, card_in=math.inf):
        self.n = n
        self.latency = [[latency_s] * n for _ in range(n)]
        self.bandwidth = [[bandwidth] * n for _ in range(n)]
        self.card_out = [card] * n
        self.card_in = [card_in] * n

    def set_link(self, i, j, latency_s=None, bandwidth=None):
        for a, b in ((i, j), (j, i)):
            if latency_s is not None:
                self.latency[a][b] = latency_s
            if bandwidth is not None:
                self.bandwidth[a][b] = bandwidth


def step_time_flow(algorithm, network, size, compute_s, alpha, beta):
    """The step replayed message by message, for networks whose links differ: a peer sends its
    round-r messages once it has every message addressed to it in the rounds before; a
    message holds its link, and the sender's outgoing and the receiver's incoming card where
    they are capped, each for bytes · (1/B + β) at that one's rate, and arrives L + α after
    its last byte left. So a
    slow link delays only what waits for it, and the rounds behind it pipeline, as the
    engine's exchanges do. On a uniform network it gives the rounds model's time."""
    rs = rounds(algorithm, network.n, size)
    n = network.n
    expected = [[0] * len(rs) for _ in range(n)]
    for r, messages in enumerate(rs):
        for _, d, _ in messages:
            expected[d][r] += 1
    arrivals = [[[] for _ in rs] for _ in range(n)]
    link_free, out_free, in_free = {}, [0.0] * n, [0.0] * n
    remaining = [(r, s, d, b) for r, messages in enumerate(rs) for (s, d, b) in messages]
    finished = 0.0
    per_byte = lambda bits_per_s: (8.0 / bits_per_s if math.isfinite(bits_per_s) else 0.0) + beta
    while remaining:
        best = None
        for m in remaining:
            r, s, d, b = m
            if any(len(arrivals[s][q]) < expected[s][q] for q in range(r)):
                continue
            ready = max((t for q in range(r) for t in arrivals[s][q]), default=0.0)
            start = max(ready, link_free.get((s, d), 0.0),
                        out_free[s] if math.isfinite(network.card_out[s]) else 0.0,
                        in_free[d] if math.isfinite(network.card_in[d]) else 0.0)
            if best is None or start < best[0]:
                best = (start, m)
        start, m = best
        r, s, d, b = m
        # Each resource is held for the bytes at its own rate: a message on a slow link uses
        # only part of a fast card, which the next message through that card can have.
        held = [b * per_byte(network.bandwidth[s][d]), b * per_byte(network.card_out[s]), b * per_byte(network.card_in[d])]
        finish = start + max(held)
        link_free[(s, d)] = start + held[0]
        if math.isfinite(network.card_out[s]):
            out_free[s] = start + held[1]
        if math.isfinite(network.card_in[d]):
            in_free[d] = start + held[2]
        arrival = finish + network.latency[s][d] + alpha
        arrivals[d][r].append(arrival)
        finished = max(finished, arrival)
        remaining.remove(m)
    return compute_s + finished


def critical_path(algorithm, n, size):
    """(K, M): the rounds and the bytes through the busiest resource of each round, summed,
    on a uniform network: T = c + K (L + α) + M (1/B + β)."""
    k = m = 0.0
    for r in rounds(algorithm, n, size):
        out_load, in_load = {}, {}
        for s, d, b in r:
            out_load[s] = out_load.get(s, 0.0) + b
            in_load[d] = in_load.get(d, 0.0) + b
        k += 1
        m += max(list(out_load.values()) + list(in_load.values()))
    return k, m


def fit(points, algorithms):
    """Weighted least squares (relative error) of T = c_a + K (L + α) + M (1/B + β) over
    points: dicts with algorithm, K, M, latency_s, bandwidth (bit/s), measured_s.
    Returns ({algorithm: c}, α, β). Needs numpy."""
    import numpy as np

    names = sorted(algorithms)
    rows, rhs, weights = [], [], []
    for p in points:
        known = p["K"] * p["latency_s"] + p["M"] * 8.0 / p["bandwidth"]
        rows.append([1.0 if p["algorithm"] == a else 0.0 for a in names] + [p["K"], p["M"]])
        rhs.append(p["measured_s"] - known)
        weights.append(1.0 / p["measured_s"])
    a, y, w = np.array(rows), np.array(rhs), np.array(weights)
    solution, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    c = {name: float(v) for name, v in zip(names, solution[:len(names)])}
    return c, float(solution[-2]), float(solution[-1])


def predict_uniform(c, alpha, beta, algorithm, k, m, latency_s, bandwidth):
    return c[algorithm] + k * (latency_s + alpha) + m * (8.0 / bandwidth + beta)


def lognormal_bandwidths(n, median_mbps, sigma, seed):
    """{(i, j): Mbit/s} for every pair i < j, log-normal around the median."""
    rng = random.Random(seed)
    return {(i, j): round(median_mbps * math.exp(rng.gauss(0.0, sigma)), 2) for i in range(n) for j in range(i + 1, n)}


def rough_step_s(algorithm, n, size, latency_ms, bandwidth_mbps):
    """A step's time before any fit (α 0.3 ms, β 0, 3 ms of computation): run.sh sizes its runs with it."""
    k, m = critical_path(algorithm, n, size)
    return 0.003 + k * (latency_ms / 1e3 + 3e-4) + m * 8.0 / (bandwidth_mbps * 1e6)
