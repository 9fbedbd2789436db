#!/usr/bin/python3
"""Report of the Lian et al. 2017 experiment: reads RESULTS/manifest.tsv and the run
directories it names, writes runs.csv, curves.csv, settings.csv, speedup_seeds.csv,
speedup.csv, the PNG plots and README.md.

Usage: report.py RESULTS_DIR

Time is peer 0's summed step time (wall_s of peer 0 in metrics.csv): the other peers'
wall_s also holds the time they wait while peer 0 evaluates the average model, which
is not training. Training loss is the peers' mean of their minibatch losses since the
previous evaluation. Every claim in the README is computed from these numbers.

Seeds: every setting (network, n, algorithm) runs with each seed; a seed fixes the model's
initialization, the shards and the batches, so the algorithms of one seed are paired. Means
are given with 95 % confidence intervals over the seeds (Student's t). A speed-up is a
ratio, computed per seed (same seed, network and n) and averaged on the log scale: the
geometric mean of the per-seed ratios, with the t-interval of their logarithms
exponentiated. An interval that contains 1× means the difference is not resolved at 95 %.
"""

import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402

# "allreduce" is the ring (its key since before the tree was added); "tree" the binomial tree.
ALGO_TITLES = {"dpsgd": "D-PSGD (ring)", "ps": "C-PSGD, parameter server", "allreduce": "C-PSGD, ring all-reduce",
               "tree": "C-PSGD, tree all-reduce"}
ALGO_SHORT = {"dpsgd": "D-PSGD", "ps": "PS", "allreduce": "ring all-reduce", "tree": "tree all-reduce"}
ALGO_FLAGS = {"dpsgd": "--algorithm dpsgd", "ps": "--algorithm ps",
              "allreduce": "--algorithm allreduce --allreduce-algo ring",
              "tree": "--algorithm allreduce --allreduce-algo tree"}
ALGO_COLORS = {"dpsgd": "#d62728", "ps": "#1f77b4", "allreduce": "#2ca02c", "tree": "#9467bd"}
# The centralized baselines have the same iterates (to the summation order), so their loss
# curves coincide: each is drawn narrower than the one before, so that all stay visible.
ALGO_WIDTH = {"ps": 6, "allreduce": 4, "tree": 2.5, "dpsgd": 2}
BASELINES = ["ps", "allreduce", "tree"]
BASELINE_SHORT = dict(ALGO_SHORT, best="the fastest of the baselines run")
PEER0_ROLE = {"ps": " (the server)", "tree": " (the root)"}
NET_TITLES = {"fast": "fast", "lowbw": "low bandwidth (10 Mbit/s)", "highlat": "high latency (5-20 ms)"}
NET_COLORS = {"fast": "#000000", "lowbw": "#1f77b4", "highlat": "#ff7f0e"}
NET_DASH = {"fast": 1, "highlat": 2, "lowbw": 3}
NET_ORDER = ["fast", "lowbw", "highlat"]
PAPER_MAX_SPEEDUP = 10  # "up to one order of magnitude faster" (Lian et al. 2017, abstract)
NAN = float("nan")

RUN_FIELDS = [
    "label", "network", "peers", "algorithm", "hidden", "parameters", "batch", "lr", "seed", "steps", "epochs",
    "eval_every", "final_train_loss", "test_accuracy", "wall_s", "wall_s_peer0", "s_per_step",
    "bytes_sent_per_peer", "bytes_sent_peer0_per_step", "target_loss", "time_to_target_s", "epoch_at_target",
    "target_accuracy", "time_to_accuracy_s", "epoch_at_accuracy", "run_dir",
]
CURVE_FIELDS = [
    "label", "network", "peers", "algorithm", "seed", "step", "epoch", "train_loss", "train_loss_smoothed",
    "avg_accuracy", "mean_local_accuracy", "bytes_sent_mean", "bytes_sent_peer0", "wall_s_peer0", "wall_s_max",
]
# Per setting (network, n, algorithm): the mean over the seeds and the CI's half-width.
STAT_KEYS = ["final_train_loss", "test_accuracy", "s_per_step", "wall_s_peer0", "bytes_sent_peer0_per_step",
             "time_to_target_s", "epoch_at_target", "time_to_accuracy_s", "epoch_at_accuracy"]
SETTING_FIELDS = ["network", "peers", "algorithm", "seeds", "steps", "epochs", "target_loss", "target_accuracy"] + \
    [f for k in STAT_KEYS for f in (k, k + "_ci95")]
# Two targets, two sets of paired speed-ups: the training loss (prefix "", the columns that
# came first and that experiments/ci_test.sh checks) and x̄'s test accuracy (prefix "xbar_"):
# x̄ is the model D-PSGD delivers, the local models' loss is what it optimizes.
METRICS = [("", "time_to_target_s"), ("xbar_", "time_to_accuracy_s")]
SPEEDUP_SEED_FIELDS = (["network", "peers", "seed", "target_loss"] + [f"time_{a}_s" for a in ALGO_TITLES] +
                       [f"speedup_vs_{k}" for k in BASELINES + ["best"]] + ["best_baseline"] +
                       [f"epoch_{a}" for a in ALGO_TITLES] + ["xbar_target_accuracy"] +
                       [f"xbar_time_{a}_s" for a in ALGO_TITLES] +
                       [f"xbar_speedup_vs_{k}" for k in BASELINES + ["best"]] + ["xbar_best_baseline"])


def speedup_fields(pre):
    """speedup.csv's columns of one target (prefix "" or "xbar_"); `_seeds` is the number of
    usable (finite, positive) per-seed ratios behind each geometric mean."""
    ks = BASELINES + ["best"]
    return ([f"{pre}time_{a}_s" for a in ALGO_TITLES] + [f"{pre}speedup_vs_{k}" for k in ks] +
            [f"{pre}time_{a}_s_ci95" for a in ALGO_TITLES] +
            [f"{pre}speedup_vs_{k}_{b}" for k in ks for b in ("lo", "hi", "seeds")] +
            [f"{pre}resolved_vs_{k}" for k in ks] + [f"{pre}best_baseline", f"{pre}best_baseline_seeds"])


# The loss columns first, in the order experiments/ci_test.sh checks them.
SPEEDUP_FIELDS = (["network", "peers", "target_loss"] + [f"time_{a}_s" for a in ALGO_TITLES] +
                  [f"speedup_vs_{k}" for k in BASELINES + ["best"]] + ["seeds", "best_baseline"] +
                  [f"time_{a}_s_ci95" for a in ALGO_TITLES] +
                  [f"speedup_vs_{k}_{b}" for k in BASELINES + ["best"] for b in ("lo", "hi")] +
                  [f"resolved_vs_{k}" for k in BASELINES + ["best"]] +
                  [f for a in ALGO_TITLES for f in (f"epoch_{a}", f"epoch_{a}_ci95")] +
                  [f"speedup_vs_{k}_seeds" for k in BASELINES + ["best"]] + ["best_baseline_seeds"] +
                  ["xbar_target_accuracy"] + speedup_fields("xbar_"))


def smooth(values):
    """Centred moving average over 3 evaluations (2 at the ends)."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - 1):i + 2]
        out.append(sum(window) / len(window))
    return out


def load(results):
    manifest = ek.read_tsv(os.path.join(results, "manifest.tsv"))
    if not manifest:
        raise SystemExit(f"error: {results}/manifest.tsv lists no runs")
    runs = []
    for m in manifest:
        d = os.path.join(results, m["run_dir"])
        summary = ek.read_json(os.path.join(d, "summary.json"))
        curve = ek.per_evaluation(ek.read_metrics(os.path.join(d, "metrics.csv")))
        for p, s in zip(curve, smooth([p["train_loss"] for p in curve])):
            p["train_loss_smoothed"] = s
        steps = int(summary["steps"])
        run = dict(m)
        run.update({
            "peers": int(m["peers"]),
            "seed": int(m["seed"]),
            "parameters": ek.mlp_parameters(m["hidden"]),
            "steps": steps,
            "epochs": float(summary["epochs"]),
            "final_train_loss": curve[-1]["train_loss"],
            "test_accuracy": float(summary["test_accuracy"]),
            "wall_s": float(summary["wall_s"]),
            "wall_s_peer0": curve[-1]["wall_s_peer0"],
            "s_per_step": curve[-1]["wall_s_peer0"] / steps,
            "bytes_sent_per_peer": float(summary["bytes_sent_per_peer"]),
            "bytes_sent_peer0_per_step": curve[-1]["bytes_sent_peer0"] / steps,
            "curve": curve,
        })
        runs.append(run)
    return runs


def find(runs, network, n, algorithm, seed):
    return next((r for r in runs if r["network"] == network and r["peers"] == n and r["algorithm"] == algorithm
                 and r["seed"] == seed), None)


def present(runs):
    """(networks in report order, n ascending, seeds ascending, algorithms in report order)."""
    return ([n for n in NET_ORDER if any(r["network"] == n for r in runs)], sorted({r["peers"] for r in runs}),
            sorted({r["seed"] for r in runs}), [a for a in ALGO_TITLES if any(r["algorithm"] == a for r in runs)])


# ---------------------------------------------------------------- statistics over seeds

def finite(values):
    return [v for v in values if v is not None and not math.isnan(v)]


def mean_ci(values):
    """(mean, CI half-width) over the finite values; (nan, None) for none, half None for one."""
    values = finite(values)
    return ek.mean_ci95(values) if values else (NAN, None)


def ratio_ci(ratios):
    """Geometric mean of per-seed ratios and its 95 % interval (t on the logs, exponentiated):
    (mean, lo, hi, k), k the number of usable (finite, positive) ratios, which can be fewer
    than the seeds run when a run missed its target; lo and hi are None for one ratio, the
    mean nan for none."""
    logs = [math.log(r) for r in finite(ratios) if r > 0]
    if not logs:
        return NAN, None, None, 0
    m, h = ek.mean_ci95(logs)
    g = math.exp(m)
    return (g, None, None, len(logs)) if h is None else (g, math.exp(m - h), math.exp(m + h), len(logs))


def resolved(lo, hi):
    """True when the interval excludes 1× (resolved at 95 %), False when it contains it, None without one."""
    return None if lo is None or hi is None else not lo <= 1 <= hi


def half(x):
    """A CI half-width as stored (nan for none) back to None."""
    return None if x is None or math.isnan(x) else x


def mean_curve(curves):
    """Point-by-point mean of the seeds' curves (the same evaluation steps: same steps and
    eval_every), cut to the shortest."""
    keys = ["step", "epoch", "train_loss", "train_loss_smoothed", "avg_accuracy", "mean_local_accuracy",
            "wall_s_peer0"]
    length = min(len(c) for c in curves)
    return [{k: sum(c[i][k] for c in curves) / len(curves) for k in keys} for i in range(length)]


def targets_and_times(runs):
    """target(n): the highest smoothed training loss that any run with n peers (any algorithm,
    network and seed) had half-way through its evaluations, rounded up to 0.01 — a level
    every run reaches while its loss still falls. A run whose loss is not finite there
    (diverged) is left out of the target and counted: {n: runs left out}. Then each run's
    (interpolated) time and epoch at the target."""
    targets, skipped = {}, {}
    for n in sorted({r["peers"] for r in runs}):
        mids = [r["curve"][(len(r["curve"]) - 1) // 2]["train_loss_smoothed"] for r in runs if r["peers"] == n]
        ok = [m for m in finite(mids) if not math.isinf(m)]
        skipped[n] = len(mids) - len(ok)
        targets[n] = math.ceil(max(ok) * 100) / 100 if ok else NAN
    for r in runs:
        r["target_loss"] = targets[r["peers"]]
        r["time_to_target_s"], r["epoch_at_target"] = time_and_epoch_at(
            ek.interpolate_crossing, r["curve"], "train_loss_smoothed", r["target_loss"])
    return targets, skipped


def time_and_epoch_at(crossing, curve, key, target):
    """(peer 0's seconds, epoch) when `key` first crosses `target` by `crossing`
    (ek.interpolate_crossing for a falling loss, ek.interpolate_rise for a rising accuracy);
    nan for either that never comes or a nan target."""
    if math.isnan(target):
        return NAN, NAN
    t, _ = crossing(curve, key, target, "wall_s_peer0")
    e, _ = crossing(curve, key, target, "epoch")
    return (NAN if t is None else t), (NAN if e is None else e)


def accuracy_targets_and_times(runs):
    """x̄'s target test accuracy per n: the highest accuracy that every run with n peers (every
    algorithm, network and seed) reaches, i.e. the least of their best accuracies, rounded
    down to 0.01. Then each run's time and epoch when x̄'s accuracy first reached it
    (interpolated between the two evaluations around the crossing; x̄ is evaluated, not
    smoothed, so this is the first crossing, not a sustained one)."""
    targets = {}
    for n in sorted({r["peers"] for r in runs}):
        bests = finite([max(finite([p["avg_accuracy"] for p in r["curve"]]) or [NAN])
                        for r in runs if r["peers"] == n])
        # + 1e-9: 0.8 * 100 is 79.99999999999999 in binary floating point.
        targets[n] = math.floor(min(bests) * 100 + 1e-9) / 100 if bests else NAN
    for r in runs:
        r["target_accuracy"] = targets[r["peers"]]
        r["time_to_accuracy_s"], r["epoch_at_accuracy"] = time_and_epoch_at(
            ek.interpolate_rise, r["curve"], "avg_accuracy", r["target_accuracy"])
    return targets


def aggregate(runs):
    """{(network, n, algorithm): the setting's mean and CI of every STAT_KEY over its seeds,
    its runs (by seed) and its mean curve}."""
    groups = {}
    for r in runs:
        groups.setdefault((r["network"], r["peers"], r["algorithm"]), []).append(r)
    settings = {}
    for (net, n, alg), rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        s = {"network": net, "peers": n, "algorithm": alg, "seeds": len(rs), "runs": rs, "steps": rs[0]["steps"],
             "epochs": rs[0]["epochs"], "eval_every": rs[0]["eval_every"], "target_loss": rs[0]["target_loss"],
             "target_accuracy": rs[0]["target_accuracy"],
             "curve": mean_curve([r["curve"] for r in rs])}
        for k in STAT_KEYS:
            m, h = mean_ci([r[k] for r in rs])
            s[k], s[k + "_ci95"] = m, NAN if h is None else h
        settings[(net, n, alg)] = s
    return settings


def seed_ratios(row, d, found, pre, time_key):
    """One seed's paired ratios for one target: each baseline's time over D-PSGD's (run d),
    and over the fastest baseline of that seed; `found` maps algorithm to its run (or None)."""
    for a in ALGO_TITLES:
        r = found[a]
        row[f"{pre}time_{a}_s"] = r[time_key] if r else NAN
    t = d[time_key]
    for k in BASELINES:
        row[f"{pre}speedup_vs_{k}"] = row[f"{pre}time_{k}_s"] / t if t > 0 else NAN
    timed = [(row[f"{pre}time_{k}_s"], k) for k in BASELINES if not math.isnan(row[f"{pre}time_{k}_s"])]
    best_t, best_k = min(timed) if timed else (NAN, "")
    row[f"{pre}speedup_vs_best"], row[f"{pre}best_baseline"] = (best_t / t if t > 0 else NAN), best_k


def aggregate_ratios(agg, mine, pre):
    """Over the seeds of one network and n: mean times with CIs, the geometric mean of each
    ratio with its CI and the number of usable ratios, and which baseline was fastest in how
    many seeds."""
    for a in ALGO_TITLES:
        m, h = mean_ci([r[f"{pre}time_{a}_s"] for r in mine])
        agg[f"{pre}time_{a}_s"], agg[f"{pre}time_{a}_s_ci95"] = m, NAN if h is None else h
    for k in BASELINES + ["best"]:
        g, lo, hi, used = ratio_ci([r[f"{pre}speedup_vs_{k}"] for r in mine])
        agg[f"{pre}speedup_vs_{k}"], agg[f"{pre}speedup_vs_{k}_seeds"] = g, used
        agg[f"{pre}speedup_vs_{k}_lo"], agg[f"{pre}speedup_vs_{k}_hi"] = (NAN, NAN) if lo is None else (lo, hi)
        res = resolved(lo, hi)
        agg[f"{pre}resolved_vs_{k}"] = "" if res is None else ("yes" if res else "no")
    fastest = [r[f"{pre}best_baseline"] for r in mine if r[f"{pre}best_baseline"]]
    order = [k for k in BASELINES if k in fastest]
    agg[f"{pre}best_baseline"] = "/".join(order)
    # "allreduce:2 ps:1": the fastest baseline differs between seeds; the README lists the counts.
    agg[f"{pre}best_baseline_seeds"] = " ".join(f"{k}:{fastest.count(k)}" for k in order)


def speedups(runs, targets, acc_targets):
    """Per seed: each baseline's time to the target over D-PSGD's, at the same seed, network
    and n (a paired ratio), and over the fastest baseline of that seed; for the training loss
    and for x̄'s test accuracy. Then per network and n: the mean times with their CIs and the
    geometric mean of each ratio with its CI."""
    networks, ns, seeds, _ = present(runs)
    per_seed, rows = [], []
    for net in networks:
        for n in ns:
            mine = []
            for seed in seeds:
                d = find(runs, net, n, "dpsgd", seed)
                if not d:
                    continue
                row = {"network": net, "peers": n, "seed": seed, "target_loss": targets[n],
                       "xbar_target_accuracy": acc_targets[n]}
                found = {a: find(runs, net, n, a, seed) for a in ALGO_TITLES}
                for a in ALGO_TITLES:
                    row[f"epoch_{a}"] = found[a]["epoch_at_target"] if found[a] else NAN
                for pre, time_key in METRICS:
                    seed_ratios(row, d, found, pre, time_key)
                mine.append(row)
            if not mine:
                continue
            per_seed += mine
            agg = {"network": net, "peers": n, "target_loss": targets[n], "xbar_target_accuracy": acc_targets[n],
                   "seeds": len(mine)}
            for a in ALGO_TITLES:
                m, h = mean_ci([r[f"epoch_{a}"] for r in mine])
                agg[f"epoch_{a}"], agg[f"epoch_{a}_ci95"] = m, NAN if h is None else h
            for pre, _ in METRICS:
                aggregate_ratios(agg, mine, pre)
            rows.append(agg)
    return per_seed, rows


def tree_hops(n):
    """Dependent transfers of one binomial-tree all-reduce step: ⌈log₂ n⌉ up, as many down."""
    return 2 * math.ceil(math.log2(n)) if n > 1 else 0


def ring_hops(n):
    return 2 * (n - 1)


# ---------------------------------------------------------------- plots

def plot_all(results, runs, settings, speedup_rows, targets):
    """Curves are the means over the seeds (same evaluation steps in every seed); the
    speed-ups are the geometric means with their 95 % intervals as error bars."""
    pd = os.path.join(results, "plotdata")
    os.makedirs(pd, exist_ok=True)
    for s in settings.values():
        s["dat"] = os.path.join(pd, f"{s['network']}-n{s['peers']}-{s['algorithm']}.dat")
        ek.write_dat(s["dat"], ["step", "epoch", "train_loss", "train_loss_smoothed", "wall_s_peer0", "avg_accuracy",
                                "mean_local_accuracy"],
                     [[p["step"], p["epoch"], p["train_loss"], p["train_loss_smoothed"], p["wall_s_peer0"],
                       100 * p["avg_accuracy"], 100 * p["mean_local_accuracy"]] for p in s["curve"]])
    term = ek.gnuplot_terminal()
    networks, ns, seeds, algorithms = present(runs)
    over = f"mean of {len(seeds)} seeds" if len(seeds) > 1 else "one seed"
    figures = []

    def render(name, title, lines):
        png = os.path.join(results, name)
        script = os.path.join(pd, name.replace(".png", ".gp"))
        with open(script, "w") as f:
            f.write("\n".join([f"set output {ek.gp_quote(png)}"] + lines + ["unset multiplot"]) + "\n")
        ek.run_gnuplot(script, png)
        figures.append((name, title))

    # Training loss vs epoch: one panel per n; colour = algorithm, dash = network.
    lines = [f"set terminal {term} size {max(560 * len(ns), 700)},500",
             f"set multiplot layout 1,{len(ns)} title 'Training loss vs epoch, {over} (colour: algorithm; dash: "
             f"network; the centralized three coincide)'",
             "set grid", "set key top right box opaque font ',9'"]
    for n in ns:
        lines += [f"set title '{n} peers'", "set xlabel 'epoch (passes over the 60,000 training images)'",
                  "set ylabel 'training loss (cross-entropy, mean of peers)'"]
        plots = []
        for alg in algorithms:
            for net in networks:
                s = settings.get((net, n, alg))
                if s:
                    plots.append(f"{ek.gp_quote(s['dat'])} using 2:3 with lines lw {ALGO_WIDTH[alg]} "
                                 f"dt {NET_DASH[net]} lc rgb '{ALGO_COLORS[alg]}' "
                                 f"title {ek.gp_quote(ALGO_SHORT[alg] + ', ' + net)}")
        lines.append("plot " + ", \\\n  ".join(plots))
    render("loss_vs_epoch.png", "Training loss vs epoch", lines)

    # x̄ beside the local models: test accuracy vs epoch, one panel per n. The algorithms are
    # synchronous, so their iterates are the same on every network: the fast network's runs.
    acc_net = "fast" if "fast" in networks else networks[0]
    lines = [f"set terminal {term} size {max(560 * len(ns), 700)},480",
             f"set multiplot layout 1,{len(ns)} title \"Test accuracy vs epoch, {over}: x̄ (solid) and the "
             f"mean of the local models (dashed)\"",
             "set grid", "set key bottom right box opaque font ',9'"]
    for n in ns:
        lines += [f"set title '{n} peers'", "set xlabel 'epoch'", "set ylabel 'test accuracy (%)'"]
        plots = []
        for alg in algorithms:
            s = settings.get((acc_net, n, alg))
            if s:
                plots.append(f"{ek.gp_quote(s['dat'])} using 2:6 with lines lw {ALGO_WIDTH[alg]} dt 1 "
                             f"lc rgb '{ALGO_COLORS[alg]}' title {ek.gp_quote(ALGO_SHORT[alg] + ': x̄')}")
                plots.append(f"{ek.gp_quote(s['dat'])} using 2:7 with lines lw {ALGO_WIDTH[alg]} dt 2 "
                             f"lc rgb '{ALGO_COLORS[alg]}' title {ek.gp_quote(ALGO_SHORT[alg] + ': local models')}")
        lines.append("plot " + ", \\\n  ".join(plots))
    render("accuracy_vs_epoch.png", "Test accuracy of x̄ and of the local models vs epoch", lines)

    # Training loss vs wall time: rows = networks, columns = n.
    lines = [f"set terminal {term} size {max(480 * len(ns), 640)},{380 * len(networks)}",
             f"set multiplot layout {len(networks)},{len(ns)} title 'Training loss vs wall time, {over} "
             f"(grey: target loss)'",
             "set grid", "set logscale x", "set key top right box opaque font ',8'"]
    for net in networks:
        for n in ns:
            lines += [f"set title {ek.gp_quote(f'{NET_TITLES[net]}, {n} peers')}",
                      "set xlabel 'wall time (s, log scale)'", "set ylabel 'training loss'"]
            plots = []
            for alg in algorithms:
                s = settings.get((net, n, alg))
                if s:
                    plots.append(f"{ek.gp_quote(s['dat'])} using 5:4 with lines lw 2 lc rgb '{ALGO_COLORS[alg]}' "
                                 f"title {ek.gp_quote(ALGO_SHORT[alg])}")
            if not math.isnan(targets[n]):
                plots.append(f"{targets[n]} with lines dt 2 lw 1 lc rgb '#808080' notitle")
            lines.append("plot " + ", \\\n  ".join(plots))
    render("loss_vs_time.png", "Training loss vs wall time", lines)

    # Speed-up vs n: one panel per baseline, colour = network, error bars = 95 % CI. The
    # networks' points are nudged apart along x so that their bars do not hide each other.
    sp = os.path.join(pd, "speedup.dat")
    keys = [k for k in BASELINES if k in algorithms] + ["best"]
    values = []
    with open(sp, "w") as f:
        f.write("# peers x speedup lo hi (one block per baseline and network; lo = hi = mean without a CI)\n")
        for k in keys:
            for i, net in enumerate(networks):
                nudge = 2 ** (0.05 * (i - (len(networks) - 1) / 2))
                for row in (s for s in speedup_rows if s["network"] == net):
                    g, lo, hi = (row[f"speedup_vs_{k}{b}"] for b in ("", "_lo", "_hi"))
                    lo, hi = (g, g) if math.isnan(lo) else (lo, hi)
                    values += [v for v in (g, lo, hi) if not math.isnan(v) and v > 0]
                    f.write(f"{row['peers']} {row['peers'] * nudge!r} " +
                            " ".join("NaN" if math.isnan(v) else repr(v) for v in (g, lo, hi)) + "\n")
                f.write("\n\n")
    lo = min(values + [1.0]) / 1.5
    hi = max(values + [1.0]) * 1.5
    xs = f"({', '.join(str(n) for n in ns)})"
    cols = 2 if len(keys) > 2 else len(keys)
    rows = math.ceil(len(keys) / cols)
    lines = [f"set terminal {term} size {720 * cols},{420 * rows + 60}",
             f"set multiplot layout {rows},{cols} title \"Speed-up of D-PSGD in reaching the target loss (time of "
             f"the baseline / time of D-PSGD): geometric mean over {len(seeds)} seed(s), bars: 95 % CI\"",
             "set grid", "set logscale y", f"set yrange [{lo!r}:{hi!r}]", f"set ytics {ek.log_tics(lo, hi)}",
             "set logscale x 2", f"set xtics {xs}", f"set xrange [{ns[0] / 1.4!r}:{ns[-1] * 1.4!r}]",
             "set xlabel 'peers n (log scale)'", "set ylabel 'speed-up (×, log scale)'",
             "set key outside right top box font ',8'"]
    for j, k in enumerate(keys):
        lines.append(f"set title {ek.gp_quote('over ' + BASELINE_SHORT[k])}")
        plots = [f"{ek.gp_quote(sp)} index {j * len(networks) + i} using 2:3:4:5 with yerrorlines lw 2 pt 7 "
                 f"lc rgb '{NET_COLORS[net]}' title {ek.gp_quote(NET_TITLES[net])}" for i, net in enumerate(networks)]
        plots.append("1 with lines lw 1 lc rgb '#808080' title 'no speed-up'")
        lines.append("plot " + ", \\\n  ".join(plots))
    render("speedup_vs_n.png", "Speed-up of D-PSGD vs n", lines)

    # Seconds per step vs n: explains the speed-ups. Means only (the intervals are in the
    # tables; with two seeds a t-interval can reach below zero, which a log axis cannot show).
    lines = [f"set terminal {term} size {max(480 * len(networks), 640)},460",
             f"set multiplot layout 1,{len(networks)} title 'Time per training step (peer 0) vs n, {over}'",
             "set grid", "set logscale y", "set logscale x 2", f"set xtics {xs}",
             f"set xrange [{ns[0] / 1.3!r}:{ns[-1] * 1.3!r}]", "set key top left box opaque font ',9'"]
    for net in networks:
        dat = os.path.join(pd, f"step-{net}.dat")
        with open(dat, "w") as f:
            for alg in algorithms:
                for n in ns:
                    s = settings.get((net, n, alg))
                    if s:
                        f.write(f"{n} {s['s_per_step']!r}\n")
                f.write("\n\n")
        per_step = [s["s_per_step"] for s in settings.values() if s["network"] == net and s["s_per_step"] > 0]
        lo, hi = min(per_step) / 1.5, max(per_step) * 1.5
        lines += [f"set title {ek.gp_quote(NET_TITLES[net])}", "set xlabel 'peers n (log scale)'",
                  "set ylabel 'seconds per step (log scale)'", f"set yrange [{lo!r}:{hi!r}]",
                  f"set ytics {ek.log_tics(lo, hi)}"]
        lines.append("plot " + ", \\\n  ".join(
            f"{ek.gp_quote(dat)} index {i} using 1:2 with linespoints lw 2 pt 7 lc rgb '{ALGO_COLORS[alg]}' "
            f"title {ek.gp_quote(ALGO_SHORT[alg])}" for i, alg in enumerate(algorithms)))
    render("step_time_vs_n.png", "Seconds per step vs n", lines)
    return figures


# ---------------------------------------------------------------- report

def fmt_s(x):
    return "—" if x is None or math.isnan(x) or math.isinf(x) else (f"{x:.3g}" if x < 100 else f"{x:.0f}")


def fmt_s_ci(mean, half_width):
    """'0.209 ± 0.012' (3 significant digits), the mean alone without an interval."""
    h = half(half_width)
    return fmt_s(mean) if h is None or math.isnan(mean) else f"{fmt_s(mean)} ± {fmt_s(h)}"


def sig3(x):
    """3 significant figures without an exponent: 0.857, 1.43, 12.3, 1234 (so that a bound
    of 0.0061 does not print as 0.01 or 0.00)."""
    if x == 0:
        return "0"
    r = float(f"{x:.3g}")  # rounded first, so that 0.99996 prints as 1.00, not 1.000
    if not 1e-3 <= abs(r) < 1e5:
        return f"{x:.3g}"  # 7.05e-08, not 0.0000000705: the bound of a very wide interval
    return f"{x:.{max(0, 2 - math.floor(math.log10(abs(r))))}f}"


def fmt_x(x):
    return "—" if x is None or math.isnan(x) or math.isinf(x) else f"{sig3(x)}×"


def usable_note(used, seeds):
    """'(2 of 3 seeds)' when a ratio rests on fewer seeds than were run (a run missed its target)."""
    return f" ({used} of {seeds} seeds)" if used < seeds else ""


def fmt_x_ci(row, key, mark=True, pre=""):
    """A speed-up with its interval, '1.43× [1.30, 1.58]', † where the interval holds 1×, and
    how many seeds it rests on when fewer than were run."""
    g, lo, hi = (row[f"{pre}speedup_vs_{key}{b}"] for b in ("", "_lo", "_hi"))
    if math.isnan(g):
        return "—"
    note = usable_note(row[f"{pre}speedup_vs_{key}_seeds"], row["seeds"])
    if math.isnan(lo):
        return fmt_x(g) + note
    return (f"{fmt_x(g)} [{sig3(lo)}, {sig3(hi)}]" + note +
            (" †" if mark and row[f"{pre}resolved_vs_{key}"] == "no" else ""))


def verdict(row, key, pre=""):
    """faster / slower / not resolved, from the 95 % interval; from the mean alone (±20 %)
    with one seed (or one usable seed)."""
    g = row[f"{pre}speedup_vs_{key}"]
    if math.isnan(g):
        return "not measured"
    res = row[f"{pre}resolved_vs_{key}"]
    if res == "":
        word = "faster" if g >= 1.2 else "slower" if g <= 1 / 1.2 else "on par"
        one = "one usable seed" if row["seeds"] > 1 else "one seed"
        return f"{word}, {one}: no interval"
    if res == "no":
        return "not resolved at 95 %: the interval contains 1×"
    return "faster, resolved at 95 %" if g > 1 else "slower, resolved at 95 %"


def fastest_text(row, pre=""):
    """Which baseline was the fastest: 'ring all-reduce', or 'ring all-reduce in 2 seeds, PS
    in 1' when the seeds disagree."""
    counts = [(k, int(c)) for k, c in (x.split(":") for x in row[f"{pre}best_baseline_seeds"].split())]
    if not counts:
        return "—"
    if len(counts) == 1:
        return ALGO_SHORT[counts[0][0]]
    counts.sort(key=lambda kc: -kc[1])
    return ", ".join(f"{ALGO_SHORT[k]} in {c} seed{'s' if c != 1 else ''}" if i == 0 else f"{ALGO_SHORT[k]} in {c}"
                     for i, (k, c) in enumerate(counts))


def setting_of(settings, net, n, alg):
    return settings.get((net, n, alg))


def div(a, b):
    """a / b, nan where that is not a usable ratio (b zero or missing, a missing)."""
    return a / b if b is not None and b > 0 and a is not None and not math.isnan(a) else NAN


def paired_ratio(runs, net, n, seeds, num, den_keys, key):
    """Per seed: run `num`'s `key` over the mean of the `den_keys` runs' (same seed, network
    and n); returns ratio_ci of those ratios."""
    ratios = []
    for seed in seeds:
        a = find(runs, net, n, num, seed)
        dens = finite([r[key] for r in (find(runs, net, n, k, seed) for k in den_keys) if r])
        if a and dens:
            ratios.append(div(a[key], sum(dens) / len(dens)))
    return ratio_ci(ratios)


def fmt_ratio(t, seeds):
    """A ratio_ci result (mean, lo, hi, usable) as '1.43× [1.30, 1.58]', with '(k of N seeds)'
    when it rests on fewer than the N seeds run."""
    g, lo, hi, used = t
    if math.isnan(g):
        return "—"
    return (fmt_x(g) if lo is None else f"{fmt_x(g)} [{sig3(lo)}, {sig3(hi)}]") + usable_note(used, len(seeds))


def title(net):
    return NET_TITLES[net][0].upper() + NET_TITLES[net][1:]


def row_at(speedup_rows, net, n):
    return next((s for s in speedup_rows if s["network"] == net and s["peers"] == n), None)


def acc_pct(a):
    return "—" if math.isnan(a) else f"{100 * a:.0f} %"


def headline(runs, settings, speedup_rows, per_seed):
    """The few numbers a reader needs first, each computed here, at the largest n (fixed in
    advance, not picked for its result): the speed-up over the fastest baseline of each
    seed in each slow network, on the training loss and on x̄'s test accuracy; and at high
    latency over the tree beside over the ring (the ring needs the most dependent transfers
    of the three baselines, so the ring alone would flatter D-PSGD)."""
    out = []
    networks, ns, seeds, algorithms = present(runs)
    baselines = [k for k in BASELINES if k in algorithms]
    n = ns[-1]
    for net in (x for x in ("lowbw", "highlat") if x in networks):
        row = row_at(speedup_rows, net, n)
        if not row or (math.isnan(row["speedup_vs_best"]) and math.isnan(row["xbar_speedup_vs_best"])):
            continue
        parts = [f"in reaching {what}: {fmt_x_ci(row, 'best', mark=False, pre=pre)} ({verdict(row, 'best', pre)}; "
                 f"fastest baseline: {fastest_text(row, pre)})"
                 for pre, what in (("", f"the target training loss ({row['target_loss']:.2f})"),
                                   ("xbar_", f"x̄'s target test accuracy ({acc_pct(row['xbar_target_accuracy'])}; "
                                             f"x̄ is the model D-PSGD delivers)"))]
        out.append(f"{title(net)}, n = {n} (the largest n run): D-PSGD's speed-up over the fastest of the "
                   f"{len(baselines)} baselines in each seed (an oracle choice per seed; if anything this understates "
                   f"D-PSGD's speed-up) " + "; ".join(parts) +
                   ". (speedup_vs_n.png; speedup.csv, columns speedup_vs_best and xbar_speedup_vs_best)")
    if "highlat" in networks and "tree" in algorithms and "allreduce" in algorithms:
        row = row_at(speedup_rows, "highlat", n)
        step = {a: settings.get(("highlat", n, a)) for a in ("dpsgd", "allreduce", "tree")}
        if row and all(step.values()) and not math.isnan(row["speedup_vs_tree"]):
            sps = {a: fmt_s_ci(s["s_per_step"], s["s_per_step_ci95"]) for a, s in step.items()}
            # speed-up over the ring / speed-up over the tree = the ring's time / the tree's, per seed.
            ring_tree = ratio_ci([div(r["time_allreduce_s"], r["time_tree_s"]) for r in per_seed
                                  if r["network"] == "highlat" and r["peers"] == n])
            out.append(
                f"High latency, n = {n}: over ring all-reduce ({ring_hops(n)} dependent transfers a step) D-PSGD is "
                f"{fmt_x_ci(row, 'allreduce', mark=False)}; over tree all-reduce ({tree_hops(n)} dependent transfers) "
                f"{fmt_x_ci(row, 'tree', mark=False)} ({verdict(row, 'tree')}); on x̄'s accuracy target "
                f"{fmt_x_ci(row, 'allreduce', mark=False, pre='xbar_')} and "
                f"{fmt_x_ci(row, 'tree', mark=False, pre='xbar_')}. Measured against the ring, D-PSGD's speed-up "
                f"in reaching the target loss is {fmt_ratio(ring_tree, seeds)} what it is against the tree "
                f"(the ring's time over the tree's, per seed). Seconds per step: tree {sps['tree']}, ring "
                f"{sps['allreduce']}, D-PSGD {sps['dpsgd']}. (speedup_vs_n.png; step_time_vs_n.png; speedup.csv; "
                f"speedup_seeds.csv)")
    if len(seeds) > 1:
        out.append(f"Speed-ups: geometric means over {len(seeds)} seeds of the per-seed paired ratios, in brackets "
                   f"the 95 % interval (t on the log ratios, {len(seeds) - 1} degree(s) of freedom), per comparison, "
                   f"uncorrected for multiple comparisons. (speedup_seeds.csv; speedup.csv)")
    else:
        out.append("One seed: no confidence intervals. (speedup_seeds.csv; speedup.csv)")
    return out


def eval_spacing(runs, net, n):
    """Epochs between two evaluations at n, from its first run (the same in every run of n)."""
    r = next((r for r in runs if r["network"] == net and r["peers"] == n and r["steps"] > 0), None)
    return NAN if not r else int(r["eval_every"]) / r["steps"] * r["epochs"]


def xbar_epochs(runs, ns, seeds, net):
    """Per n: the epoch at which x̄'s test accuracy first reached the accuracy every run of
    that n reached (the least of their best, over algorithms and seeds), per algorithm the
    mean over the seeds, and D-PSGD's epochs over the centralized baselines', paired by seed."""
    parts, ratios, spacing = [], [], []
    for n in ns:
        rs = [r for r in runs if r["network"] == net and r["peers"] == n and r["curve"]]
        bests = finite([max(p["avg_accuracy"] for p in r["curve"]) for r in rs])
        if not bests:
            continue
        target = math.floor(min(bests) * 100 + 1e-9) / 100
        for r in rs:
            r["_xbar_hit"] = next((p["epoch"] for p in r["curve"] if p["avg_accuracy"] >= target), NAN)
        for a in ALGO_TITLES:
            m, h = mean_ci([r["_xbar_hit"] for r in rs if r["algorithm"] == a])
            if not math.isnan(m):
                parts.append(f"{ALGO_SHORT[a]} n={n} {ek.fmt_ci(m, h, digits=3)}")
        t = paired_ratio(runs, net, n, seeds, "dpsgd", BASELINES, "_xbar_hit")
        if not math.isnan(t[0]):
            ratios.append(f"n = {n}: {fmt_ratio(t, seeds)}")
            spacing.append(f"{eval_spacing(runs, net, n):.2g} epochs at n = {n}")
    if not parts:
        return []
    s = (f"On x̄'s test accuracy, the model D-PSGD delivers ({NET_TITLES[net]} network), the epoch at which each "
         f"run first reached the accuracy all runs of its n reached (mean over seeds): " + ", ".join(parts))
    if ratios:
        s += (". D-PSGD's epochs over the centralized baselines' on x̄, paired by seed: " + "; ".join(ratios) +
              f" (x̄ is evaluated every {', '.join(spacing)}, which bounds this resolution)")
    return [s + ". (accuracy_vs_epoch.png; curves.csv)"]


def epoch_convergence(runs, settings, ns, seeds, networks, algorithms, baselines):
    """Observations on per-epoch convergence: final losses, how close the centralized baselines
    are, and D-PSGD's epochs to the target over theirs (comparable only when the interval
    lies within [1/1.25, 1.25])."""
    obs = []
    ref_net = networks[0]
    parts = []
    for n in ns:
        ss = [s for s in (setting_of(settings, ref_net, n, a) for a in algorithms) if s]
        if not ss:
            continue
        parts.append(f"n = {n} after {ss[0]['epochs']:.3g} epoch(s): " +
                     ", ".join(f"{ALGO_SHORT[s['algorithm']]} "
                               f"{ek.fmt_ci(s['final_train_loss'], half(s['final_train_loss_ci95']), digits=4)}"
                               for s in ss))
    if parts:
        obs.append(f"Per epoch (final training loss, mean over seeds, {NET_TITLES[ref_net]} network): " +
                   "; ".join(parts) + ". (loss_vs_epoch.png; settings.csv)")
    # How far apart the centralized baselines are: epochs to the target, and their loss curves.
    spread = gap = 0.0
    for n in ns:
        for seed in seeds:
            rs = [r for r in (find(runs, ref_net, n, k, seed) for k in baselines) if r]
            epochs = finite([r["epoch_at_target"] for r in rs])
            if len(epochs) > 1:
                spread = max(spread, max(epochs) - min(epochs))
            for points in zip(*[r["curve"] for r in rs]):
                losses = finite([p["train_loss"] for p in points])
                if len(losses) > 1:
                    gap = max(gap, max(losses) - min(losses))
    same = ("their training-loss curves are identical at every evaluation" if gap == 0 else
            f"their training losses differ by at most {gap:.2g} at any evaluation")
    lo_ok, hi_ok = 1 / 1.25, 1.25
    parts, close, more, fewer, open_ = [], [], [], [], []
    for n in ns:
        t = paired_ratio(runs, ref_net, n, seeds, "dpsgd", baselines, "epoch_at_target")
        g, lo, hi, _ = t
        if math.isnan(g):
            continue
        parts.append(f"n = {n}: {fmt_ratio(t, seeds)}")
        lo, hi = (g, g) if lo is None else (lo, hi)
        (close if lo >= lo_ok and hi <= hi_ok else more if lo > hi_ok else fewer if hi < lo_ok else open_).append(str(n))
    s = (f"Epochs to the target training loss ({NET_TITLES[ref_net]} network; the mean loss of the peers' local "
         f"models, not of x̄): the centralized baselines reached it within {spread:.3g} epochs of each other in "
         f"every seed and {same}; D-PSGD's epochs over theirs, paired by seed")
    if parts:
        s += ": " + "; ".join(parts)
        basis = "the ratio, one seed: no interval," if len(seeds) == 1 else "the 95 % interval"
        if not more and not fewer and not open_:
            s += (f" — comparable per-epoch convergence ({basis} within [0.8×, 1.25×] at every n), as in the paper, "
                  "so the differences in time below come mostly from the time per step")
        else:
            found = []
            if close:
                found.append(f"comparable ({basis} within [0.8×, 1.25×]) at n = {', '.join(close)}")
            if more:
                found.append(f"D-PSGD needed more epochs ({basis} above 1.25×) at n = {', '.join(more)}, unlike the "
                             "paper's comparable per-epoch convergence")
            if fewer:
                found.append(f"D-PSGD needed fewer epochs ({basis} below 0.8×) at n = {', '.join(fewer)}")
            if open_:
                found.append(f"at n = {', '.join(open_)} {basis} reaches outside [0.8×, 1.25×]: comparable per-epoch "
                             "convergence is neither established nor ruled out")
            s += " — " + "; ".join(found)
    obs.append(s + ". (loss_vs_epoch.png; speedup.csv, columns epoch_*)")
    return obs


def network_invariance(runs, ns, seeds, networks, algorithms):
    """Whether the networks change the iterates: the largest difference of the training loss
    at one evaluation across networks (same algorithm, n and seed). Only a difference of 0 is
    reported as 'timing only'."""
    if len(networks) < 2:
        return []
    worst = 0.0
    for n in ns:
        for a in algorithms:
            for seed in seeds:
                curves = [c["curve"] for c in (find(runs, net, n, a, seed) for net in networks) if c]
                for points in zip(*curves):
                    losses = finite([p["train_loss"] for p in points])
                    if len(losses) > 1:
                        worst = max(worst, max(losses) - min(losses))
    if worst == 0:
        return [f"The networks change only the timing: for the same algorithm, n and seed, the training loss at every "
                f"evaluation is identical (difference 0) across the {len(networks)} networks. (curves.csv)"]
    return [f"For the same algorithm, n and seed, the training loss at one evaluation differs by up to {worst:.2g} "
            f"across the {len(networks)} networks, so the networks change the iterates as well as the timing "
            f"(by that much). (curves.csv)"]


def resolution_summary(speedup_rows, baselines, seeds):
    """Which speed-ups are not resolved; rows without an interval (under two usable seeds)
    are counted apart, not called resolved."""
    if len(seeds) < 2:
        return []
    cells = [(s, k, pre) for s in speedup_rows for k in baselines + ["best"] for pre, _ in METRICS
             if not math.isnan(s[f"{pre}speedup_vs_{k}"])]
    unresolved = [(s, k, pre) for s, k, pre in cells if s[f"{pre}resolved_vs_{k}"] == "no"]
    done = sum(1 for s, k, pre in cells if s[f"{pre}resolved_vs_{k}"] == "yes")
    bare = len(cells) - len(unresolved) - done
    what = {"": "loss", "xbar_": "x̄ accuracy"}
    out = []
    if unresolved:
        out.append("Not resolved at 95 % (the interval contains 1×, so these differences could be noise across "
                   "seeds): " + "; ".join(f"D-PSGD vs {BASELINE_SHORT[k]}, {what[pre]}, {NET_TITLES[s['network']]}, "
                                          f"n = {s['peers']} ({fmt_x_ci(s, k, mark=False, pre=pre)})"
                                          for s, k, pre in unresolved))
    if done:
        out.append(f"{done} of the {len(cells)} speed-ups' 95 % intervals exclude 1× (resolved)")
    if bare:
        out.append(f"{bare} have no interval (fewer than two usable seeds)")
    return ["; ".join(out) + ". Intervals are per comparison, uncorrected for multiple comparisons. (speedup.csv)"]


def observations(runs, settings, speedup_rows, per_seed):
    obs = []
    networks, ns, seeds, algorithms = present(runs)
    baselines = [k for k in BASELINES if k in algorithms]

    # 1. Per-epoch convergence, and whether the networks change the iterates.
    obs += epoch_convergence(runs, settings, ns, seeds, networks, algorithms, baselines)
    obs += xbar_epochs(runs, ns, seeds, networks[0])
    obs += network_invariance(runs, ns, seeds, networks, algorithms)

    # 2. Speed-ups per network and baseline, with their intervals.
    for net in networks:
        rows = [s for s in speedup_rows if s["network"] == net]
        for key in baselines:
            valid = [s for s in rows if not math.isnan(s[f"speedup_vs_{key}"])]
            if not valid:
                continue
            best = valid[-1]  # the largest n, fixed in advance (the largest speed-up would be picked for its result)
            trend = ", ".join(f"n={s['peers']} {fmt_x_ci(s, key, mark=False)}" for s in valid)
            obs.append(f"{title(net)}, D-PSGD vs {ALGO_SHORT[key]} (target loss): {trend}. "
                       f"At n = {best['peers']}, the largest n measured, D-PSGD reached loss "
                       f"{best['target_loss']:.2f} in {fmt_s_ci(best['time_dpsgd_s'], best['time_dpsgd_s_ci95'])} s vs "
                       f"{fmt_s_ci(best[f'time_{key}_s'], best[f'time_{key}_s_ci95'])} s for {ALGO_SHORT[key]} "
                       f"({verdict(best, key)}). (speedup_vs_n.png; loss_vs_time.png; speedup.csv)")
        parts = [f"n={s['peers']} ({acc_pct(s['xbar_target_accuracy'])}): " +
                 ", ".join(f"{fmt_x_ci(s, k, mark=False, pre='xbar_')} over {ALGO_SHORT[k]}" for k in baselines)
                 for s in rows if any(not math.isnan(s[f"xbar_speedup_vs_{k}"]) for k in baselines)]
        if parts:
            obs.append(f"{title(net)}, D-PSGD's speed-up in reaching x̄'s target test accuracy: " + "; ".join(parts) +
                       ". (speedup.csv, columns xbar_*; accuracy_vs_epoch.png)")
    obs += resolution_summary(speedup_rows, baselines, seeds)

    # 3. Why: per-step time and traffic at the largest n.
    n = ns[-1]
    for net in networks:
        ss = {a: setting_of(settings, net, n, a) for a in algorithms}
        if not all(ss.values()):
            continue
        obs.append(f"Why, {NET_TITLES[net]} at n = {n}: seconds per step " +
                   ", ".join(f"{ALGO_SHORT[a]} {fmt_s_ci(s['s_per_step'], s['s_per_step_ci95'])}"
                             for a, s in ss.items()) +
                   "; peer 0 sent " + ", ".join(ek.human_bytes(s["bytes_sent_peer0_per_step"]) + PEER0_ROLE.get(a, "")
                                                for a, s in ss.items()) +
                   " per step (same order). (step_time_vs_n.png; settings.csv)")
    for net in networks:
        growth = []
        for a in algorithms:
            lo, hi = setting_of(settings, net, ns[0], a), setting_of(settings, net, ns[-1], a)
            if lo and hi and len(ns) > 1:
                growth.append(f"{ALGO_SHORT[a]} {fmt_x(div(hi['s_per_step'], lo['s_per_step']))}")
        if growth:
            obs.append(f"Time per step from n = {ns[0]} to n = {ns[-1]} ({NET_TITLES[net]}; ratios of means, no "
                       f"interval): " + ", ".join(growth) + ". (step_time_vs_n.png; settings.csv)")

    # 4. Against the paper: its claim is over well-optimized centralized SGD, so the measure
    # is the speed-up over the fastest baseline of each seed, not over the ring alone; at the
    # largest n, fixed in advance like the headline's (the largest of several would be
    # selected for its result).
    for net in (x for x in ("lowbw", "highlat") if x in networks):
        row = row_at(speedup_rows, net, n)
        if not row or math.isnan(row["speedup_vs_best"]):
            continue
        g, res = row["speedup_vs_best"], row["resolved_vs_best"]
        if res != "yes":
            one = "one usable seed" if row["seeds"] > 1 else "one seed"
            why = f"{one}: no interval" if res == "" else "the interval contains 1×"
            word = (f"is not resolved at 95 % ({why}), so it neither confirms nor refutes the paper's \"up to one "
                    f"order of magnitude\"")
        elif g < 1:
            word = "disagrees with the paper: D-PSGD was slower than the fastest baseline (resolved at 95 %)"
        elif g >= PAPER_MAX_SPEEDUP / 2:
            word = "agrees with the paper's \"up to one order of magnitude\" in order of magnitude (resolved at 95 %)"
        else:
            word = ("agrees in direction with the paper (D-PSGD faster, resolved at 95 %) but is smaller than its up "
                    f"to ~{PAPER_MAX_SPEEDUP}× (under {PAPER_MAX_SPEEDUP // 2}×)")
        obs.append(f"Against the paper, {NET_TITLES[net]}, n = {n} (the largest n, as in the headline): D-PSGD's "
                   f"speed-up in reaching the target loss over the fastest of the baselines in each seed is "
                   f"{fmt_x_ci(row, 'best', mark=False)} (fastest: {fastest_text(row)}); this {word}. On x̄'s "
                   f"accuracy target: {fmt_x_ci(row, 'best', mark=False, pre='xbar_')} "
                   f"({verdict(row, 'best', 'xbar_')}). (speedup_vs_n.png; speedup.csv)")
    # Of the baselines the ring needs the most dependent transfers, so the latency win is
    # measured against the tree too, at the same fixed n.
    hl = row_at(speedup_rows, "highlat", n) if "highlat" in networks else None
    step = {a: setting_of(settings, "highlat", n, a) for a in ("allreduce", "tree")}
    if hl and all(step.values()) and not math.isnan(hl["speedup_vs_tree"]):
        ring_tree = paired_ratio(runs, "highlat", n, seeds, "allreduce", ["tree"], "s_per_step")
        ps = f", over the parameter server (two transfers) {fmt_x_ci(hl, 'ps', mark=False)}" if "ps" in baselines else ""
        obs.append(f"High latency, n = {n}: of the baselines, ring all-reduce needs the most dependent transfers a step "
                   f"({ring_hops(n)}, against the binomial tree's {tree_hops(n)}); measured seconds per step: ring "
                   f"{fmt_s_ci(step['allreduce']['s_per_step'], step['allreduce']['s_per_step_ci95'])}, tree "
                   f"{fmt_s_ci(step['tree']['s_per_step'], step['tree']['s_per_step_ci95'])} (ring over tree, per "
                   f"seed: {fmt_ratio(ring_tree, seeds)}). D-PSGD's speed-up over the ring is "
                   f"{fmt_x_ci(hl, 'allreduce', mark=False)}, over the tree {fmt_x_ci(hl, 'tree', mark=False)} "
                   f"({verdict(hl, 'tree')}){ps}. Other all-reduce schedules (recursive doubling, see "
                   f"experiments/gossip) are not run here. (step_time_vs_n.png; speedup_vs_n.png; speedup.csv)")
    fast = [s for s in speedup_rows if s["network"] == "fast"]
    if fast:
        parts = ", ".join(f"n={s['peers']}: " + ", ".join(f"{fmt_x_ci(s, k, mark=False)} over {ALGO_SHORT[k]}"
                                                          for k in baselines) for s in fast)
        obs.append(f"Fast network: {parts}. It has no emulated limits, so its step times are the computation and "
                   f"the loopback copies of peers sharing this machine's cores. (speedup_vs_n.png; speedup.csv)")
    return obs


def explanations(runs, settings):
    """Plain statements of where and why the setup changes the outcome, each with a number
    (means over the seeds; ratios paired by seed with their intervals, or labelled as ratios
    of means)."""
    out = []
    _, ns, seeds, algorithms = present(runs)
    n = ns[-1]

    def at(net):
        ss = {a: setting_of(settings, net, n, a) for a in algorithms}
        return ss if all(ss.values()) and {"dpsgd", "ps", "allreduce"} <= set(ss) else None

    def per_step(net, num, den):
        return fmt_ratio(paired_ratio(runs, net, n, seeds, num, [den], "s_per_step"), seeds)

    sps = lambda s: f"{s['s_per_step']:.3g} s"  # noqa: E731
    sent = lambda s: ek.human_bytes(s["bytes_sent_peer0_per_step"])  # noqa: E731
    lb = at("lowbw")
    if lb:
        step = paired_ratio(runs, "lowbw", n, seeds, "allreduce", ["dpsgd"], "s_per_step")
        sent_ratio = div(lb["allreduce"]["bytes_sent_peer0_per_step"], lb["dpsgd"]["bytes_sent_peer0_per_step"])
        if not math.isnan(step[0]) and step[0] < 1:
            then = f"and here the ring's step is the shorter: it takes {fmt_ratio(step, seeds)} D-PSGD's (paired by seed)"
        elif not math.isnan(step[0]) and step[0] <= 1.5:
            then = (f"and D-PSGD's per-step advantage over the ring is small: the ring's step takes "
                    f"{fmt_ratio(step, seeds)} D-PSGD's (paired by seed)")
        else:
            then = (f"yet the ring's step takes {fmt_ratio(step, seeds)} D-PSGD's (paired by seed), more than its "
                    f"bytes per step ({fmt_x(sent_ratio)} D-PSGD's, ratio of means) alone would explain")
        out.append(
            f"**Low bandwidth, ring all-reduce.** Ring all-reduce sends 2(n−1)/n model sizes per peer per step and "
            f"D-PSGD on a ring sends 2 (measured at n = {n}: {sent(lb['allreduce'])} vs {sent(lb['dpsgd'])} per step), "
            f"so when every card is capped at the same rate neither has a busiest node, {then}: measured "
            f"{sps(lb['dpsgd'])} vs {sps(lb['allreduce'])} per step. The paper's advantage is over centralized "
            f"schemes whose busiest node carries O(n) traffic, like the parameter server here ({sent(lb['ps'])} per "
            f"step at the server, {sps(lb['ps'])} per step). (step_time_vs_n.png; settings.csv)")
        if "tree" in lb:
            out.append(
                f"**Low bandwidth, tree all-reduce.** Each of the tree's {tree_hops(n)} rounds sends the whole model "
                f"and waits for the round before it, so a step is a chain of {tree_hops(n)} model-sized transfers, "
                f"{tree_hops(n) // 2} of them from the root's card in the broadcast ({sent(lb['tree'])} per step from "
                f"peer 0, the root): {sps(lb['tree'])} per step, {per_step('lowbw', 'tree', 'dpsgd')} D-PSGD's "
                f"(paired by seed). The tree saves latency, not bandwidth. (step_time_vs_n.png; settings.csv)")
        out.append(
            "**Sender-side emulation.** This experiment caps what a peer sends (`node_bandwidth_mbps`), not what it "
            "receives (no `node_ingress_mbps`), so the n−1 gradients the workers push to the server arrive in "
            f"parallel; only the server's broadcast of n−1 models is serialized on its card (measured at n = {n}: "
            f"{sps(lb['ps'])} per step, "
            f"{fmt_x(div(lb['ps']['s_per_step'], lb['dpsgd']['s_per_step'] / 2))} D-PSGD's time per model sent, "
            f"a ratio of means, no interval; n − 1 = {n - 1}). On a real 10 Mbit/s network the server's incoming link "
            "would serialize the n−1 pushes as well (not measured here), so the speed-up over the parameter server "
            "here understates that network's. (settings.csv)")
    hl = at("highlat")
    if hl:
        tree = (f", the tree all-reduce {tree_hops(n)} ({sps(hl['tree'])})" if "tree" in hl else "")
        out.append(
            f"**High latency.** Ring all-reduce runs {ring_hops(n)} dependent transfers per step at n = {n}, each "
            f"waiting for a link's latency (measured {sps(hl['allreduce'])} per step){tree}, the parameter server two "
            f"({sps(hl['ps'])}), D-PSGD one exchange with its neighbours ({sps(hl['dpsgd'])}). "
            f"(step_time_vs_n.png; settings.csv)")
    fast = at("fast")
    if fast:
        growth = ""
        if len(ns) > 1:
            series = {a: [setting_of(settings, "fast", m, a) for m in ns] for a in algorithms}
            rising = all(all(s for s in ss) and all(x["s_per_step"] < y["s_per_step"] for x, y in zip(ss, ss[1:]))
                         for ss in series.values())
            ratios = ", ".join(f"{ALGO_SHORT[a]} {fmt_x(div(ss[-1]['s_per_step'], ss[0]['s_per_step']))}"
                               for a, ss in series.items() if ss[0] and ss[-1])
            growth = ((" The step time grows with n for every algorithm here" if rising else
                       " The step time does not fall with n") +
                      f" (n = {ns[0]} to {ns[-1]}, ratios of means, no interval: {ratios}).")
        out.append(
            f"**Fast network on one machine.** All {n} peers share this machine's cores, so there is no parallel "
            f"speed-up with n, and bytes are copied by the same cores that compute gradients (D-PSGD: "
            f"{sps(fast['dpsgd'])} per step at n = {n}).{growth} In the paper each worker had its own GPU, so adding "
            f"workers did not take compute from the others. (step_time_vs_n.png; settings.csv)")
    return out


def epochs_note(meta, epochs, runs):
    """Why the full run trains one epoch: the time budget of the seeds (from this run's own
    duration)."""
    total = float(meta.get("total_s", 0) or 0)
    if meta.get("mode") != "full" or epochs >= 2 or total <= 0:
        return ""
    reached = sum(1 for r in runs if not math.isnan(r["time_to_target_s"]))
    every = "every run" if reached == len(runs) else f"{reached} of the {len(runs)} runs"
    return (f" One epoch, not two as in the single-seed version of this experiment: two epochs would have taken "
            f"about {ek.clock(2 * total)} here (twice this run's {ek.clock(total)}); one epoch buys the confidence "
            f"intervals, and {every} reached the target loss.")


def target_sentences(runs, targets, acc_targets, skipped):
    """The Setup's bullets on the two targets, with how many runs reached each (counted, not
    assumed) and the diverged runs left out of the loss target."""
    loss_reached = sum(1 for r in runs if not math.isnan(r["time_to_target_s"]))
    acc_reached = sum(1 for r in runs if not math.isnan(r["time_to_accuracy_s"]))
    left_out = sum(skipped.values())

    def reached(k):
        return "every run reached it" if k == len(runs) else f"{k} of the {len(runs)} runs reached it"
    return [
        "- Target loss per n: the highest training loss (smoothed over 3 evaluations) that any run with that n "
        "(every algorithm, network and seed) had half-way through, rounded up to 0.01, so that runs reach it "
        f"while their loss still falls ({reached(loss_reached)}" +
        (f"; {left_out} run(s) whose loss was not finite half-way were left out of the target" if left_out else "") +
        "); the time to it is interpolated between the two evaluations around the crossing. Targets: " +
        ", ".join(f"n = {n}: {t:.2f}" for n, t in sorted(targets.items()) if not math.isnan(t)) + ".",
        "- Target test accuracy of x̄ (the average model, the one D-PSGD delivers) per n: the highest accuracy "
        "that every run with that n (every algorithm, network and seed) reaches, i.e. the least of their best "
        f"accuracies, rounded down to 0.01 ({reached(acc_reached)}); the time to it is x̄'s first evaluation at "
        "or above it, interpolated with the evaluation before. Targets: " +
        ", ".join(f"n = {n}: {acc_pct(t)}" for n, t in sorted(acc_targets.items()) if not math.isnan(t)) + ".",
    ]


def time_table(speedup_rows, algorithms, pre):
    target = (lambda s: "—" if math.isnan(s["target_loss"]) else f"{s['target_loss']:.2f}") if pre == "" else (lambda s: acc_pct(s["xbar_target_accuracy"]))
    header = ["network", "n", "target loss" if pre == "" else "x̄ target accuracy"] + \
        [f"{ALGO_SHORT[a]} s" for a in algorithms]
    rows = [[NET_TITLES[s["network"]], s["peers"], target(s)] +
            [fmt_s_ci(s[f"{pre}time_{a}_s"], s[f"{pre}time_{a}_s_ci95"]) for a in algorithms] for s in speedup_rows]
    return ek.md_table(header, rows)


def speedup_table(speedup_rows, baselines, pre):
    header = ["network", "n"] + [f"over {ALGO_SHORT[k]}" for k in baselines] + \
        ["over the fastest baseline of each seed", "fastest baseline"]
    rows = [[NET_TITLES[s["network"]], s["peers"]] + [fmt_x_ci(s, k, pre=pre) for k in baselines] +
            [fmt_x_ci(s, "best", pre=pre), fastest_text(s, pre)] for s in speedup_rows]
    return ek.md_table(header, rows)


def write_readme(results, runs, settings, speedup_rows, per_seed, targets, acc_targets, skipped, figures, meta,
                 networks_desc):
    networks, ns, seeds, algorithms = present(runs)
    r0 = runs[0]
    params = r0["parameters"]
    msg = 4 * params
    full_params = ek.mlp_parameters("512,512")
    full_msg = 4 * full_params
    first = lambda n: setting_of(settings, networks[0], n, "dpsgd")  # noqa: E731
    lines = [
        "# Lian et al. 2017 on one machine: D-PSGD vs centralized SGD under slow networks",
        "",
        "Generated by `experiments/lian2017/report.py` from the CSVs in this folder; every number below is read "
        "from the runs' `metrics.csv` and `summary.json`.",
        "",
        "## Headline",
        "",
    ]
    lines += [f"- {h}" for h in headline(runs, settings, speedup_rows, per_seed)]
    lines += [
        "",
        "## Setup",
        "",
        ek.machine_section(meta),
        f"- Algorithms: {', '.join(ALGO_TITLES[a] + f' (`{ALGO_FLAGS[a]}`)' for a in algorithms)}; peers n = "
        f"{', '.join(str(n) for n in ns)}; every peer is a process on this machine, so wall time grows with n.",
        f"- Model: MLP 784-{r0['hidden'].replace(',', '-')}-10, {params:,} parameters, {ek.human_bytes(msg)} per "
        f"message ({msg * 8 / 1e7:.3g} s at 10 Mbit/s). Why so small: the full 784-512-512-10 MLP has "
        f"{full_params:,} parameters, {ek.human_bytes(full_msg)} per message, {full_msg * 8 / 1e7:.3g} s at 10 Mbit/s, "
        f"so a 16-peer parameter server would spend ~{15 * full_msg * 8 / 1e7:.0f} s per step on its broadcast "
        f"(arithmetic, not run) — too slow to train to a loss target here. With the small model the runs are "
        f"communication-bound, the regime the paper studies.",
        "- Training loss: each peer's minibatch loss on its own model (for D-PSGD the local models, not x̄), "
        "averaged over the peers and the steps since the previous evaluation.",
        f"- Data: Fashion-MNIST, iid shards; batch {r0['batch']} per peer; lr {r0['lr']}; momentum 0.9; " +
        "; ".join(f"n = {n}: {first(n)['steps']} steps ({first(n)['epochs']:.3g} epochs), evaluation every "
                  f"{first(n)['eval_every']} steps" for n in ns if first(n)) + "." + epochs_note(meta, r0["epochs"], runs),
        f"- Seeds: {', '.join(str(s) for s in seeds)}. A seed fixes the model's initialization, the shards and the "
        "batches, so every algorithm of one seed starts from the same model and sees the same data: the runs are "
        "paired by seed. " +
        ("Tables give means with 95 % confidence intervals over the seeds (Student's t, "
         f"{len(seeds) - 1} degree(s) of freedom: t = {ek.T975[min(len(seeds) - 1, len(ek.T975)) - 1]}). A speed-up "
         "is a ratio of times, computed per seed (same seed, network and n) and averaged on the log scale: the "
         "geometric mean of the per-seed ratios, with the t-interval of the log ratios exponentiated (so it is not "
         "symmetric, and can differ slightly from the ratio of the mean times). † marks an interval that contains "
         "1×: that difference is not resolved at 95 %. Intervals are per comparison, uncorrected for multiple "
         "comparisons; \"(k of N seeds)\" marks a ratio with fewer usable seeds than were run (a run that missed "
         "its target)." if len(seeds) > 1 else
         "One seed: no confidence intervals."),
        "- Networks (emulated by each sender, docs/net.md, \"Link emulation\": a frame leaves `latency_ms` after it "
        "is queued; the bandwidth is a wire clock: a frame goes out in pieces, each handed to the socket once its "
        "last byte would have crossed the wire — the link's and the card's, the slower of the two — after the bytes "
        "before it; nothing is saved up while a link is idle, so every message pays its full serialization time):",
    ]
    lines += [f"  - **{NET_TITLES.get(n['network'], n['network'])}** (`{n['network']}`): {n['description']}"
              for n in networks_desc]
    lines += [
        "- Time: peer 0's summed step time (`wall_s` of peer 0). The other peers' `wall_s` also counts the time "
        "they wait while peer 0 evaluates x̄ (see the notes), which is not training.",
    ]
    lines += target_sentences(runs, targets, acc_targets, skipped)
    lines += [
        "- Files: `runs/<network>-n<N>-<algorithm>-s<seed>/` (metrics.csv, summary.json, topology.yaml, logs, "
        "command.txt; `allreduce` is the ring, `tree` the binomial tree); `runs.csv` (one row per run), "
        "`curves.csv` (every evaluation of every run), `settings.csv` (per network, n and algorithm: means and CI "
        "half-widths over the seeds), `speedup_seeds.csv` (the paired ratios, one row per seed), `speedup.csv` "
        "(their geometric means and intervals; columns `xbar_*` for x̄'s accuracy target, `*_seeds` the usable "
        "seeds behind each ratio).",
        "",
        "## Figures",
        "",
        ek.md_table(["figure", "file"], [(t, f"[{n}]({n})") for n, t in figures]),
        "",
        "## Time to the target loss (s, mean ± 95 % CI over seeds)",
        "",
        time_table(speedup_rows, algorithms, ""),
        "",
        "## Time to x̄'s target test accuracy (s, mean ± 95 % CI over seeds)",
        "",
        time_table(speedup_rows, algorithms, "xbar_"),
        "",
    ]
    baselines = [k for k in BASELINES if k in algorithms]
    how = ("Time of the baseline over the time of D-PSGD" +
           (", per seed; geometric mean [95 % CI, per comparison]. † the interval contains 1×: not resolved at 95 %. "
            "The fastest baseline is picked in each seed (an oracle choice; if anything this understates D-PSGD's "
            "speed-up)." if len(seeds) > 1 else " (one seed)."))
    lines += ["## Speed-up of D-PSGD in reaching the target loss", "", how, "",
              speedup_table(speedup_rows, baselines, ""), "",
              "## Speed-up of D-PSGD in reaching x̄'s target test accuracy", "",
              how + " x̄ is the average model, the one D-PSGD delivers; the loss above is the local models'.", "",
              speedup_table(speedup_rows, baselines, "xbar_"), ""]
    lines += [f"## Runs (per setting: mean ± 95 % CI over {len(seeds)} seed(s); every run in runs.csv)", ""]
    rows = []
    for net in networks:
        for n in ns:
            for a in algorithms:
                s = setting_of(settings, net, n, a)
                if s:
                    rows.append((NET_TITLES[net], n, ALGO_SHORT[a], s["seeds"], s["steps"], f"{s['epochs']:.3g}",
                                 ek.fmt_ci(s["final_train_loss"], half(s["final_train_loss_ci95"]), digits=4),
                                 ek.fmt_ci(s["test_accuracy"], half(s["test_accuracy_ci95"]), digits=4),
                                 fmt_s_ci(s["s_per_step"], s["s_per_step_ci95"]),
                                 ek.human_bytes(s["bytes_sent_peer0_per_step"]),
                                 fmt_s_ci(s["wall_s_peer0"], s["wall_s_peer0_ci95"])))
    lines += [ek.md_table(["network", "n", "algorithm", "seeds", "steps", "epochs", "final training loss",
                           "x̄ test accuracy", "s/step", "peer 0 sent/step", "wall s (peer 0)"], rows), ""]
    lines += ["## Plots", ""]
    for name, title in figures:
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    lines += ["## Observations (computed from runs.csv, curves.csv, settings.csv and speedup.csv)", ""]
    lines += [f"- {o}" for o in observations(runs, settings, speedup_rows, per_seed)]
    lines += [
        "",
        "## How this differs from the paper, and what that changes",
        "",
        "- **The paper:** ResNet-20 on CIFAR-10, CNTK and Torch, up to 112 GPUs on separate machines, networks "
        "throttled with `tc`; it reports D-PSGD up to one order of magnitude faster than well-optimized centralized "
        "counterparts on low-bandwidth or high-latency networks, with comparable convergence per epoch.",
        f"- **Here:** a {params:,}-parameter MLP on Fashion-MNIST, n ≤ {ns[-1]}, all peers as processes on one "
        f"{meta.get('nproc', '?')}-core machine over loopback TCP, bandwidth and latency emulated by the sender.",
    ]
    lines += [f"- {e}" for e in explanations(runs, settings)]
    lines += [
        "",
        "## Notes",
        "",
        "- peertrain's per-peer `wall_s` includes, for peers other than 0, the wait for peer 0's evaluation of x̄ "
        "(it happens inside their next step's exchange); `summary.json`'s `wall_s` is the maximum over peers and so "
        "grows with the number of evaluations. This report uses peer 0's `wall_s` for that reason; `runs.csv` keeps "
        "both (`wall_s`, `wall_s_peer0`).",
        "- peertrain's `bytes_sent` counts the evaluation reports peers 1..n−1 send to peer 0; bytes per step here "
        "are peer 0's, which sends none (for PS, peer 0 is the server; for the tree, the root).",
        "",
    ]
    with open(os.path.join(results, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: report.py RESULTS_DIR")
    results = os.path.abspath(sys.argv[1])
    runs = load(results)
    meta = ek.read_json(os.path.join(results, "meta.json"))
    networks_desc = ek.read_tsv(os.path.join(results, "networks.tsv"))
    targets, skipped = targets_and_times(runs)
    acc_targets = accuracy_targets_and_times(runs)
    settings = aggregate(runs)
    per_seed, speedup_rows = speedups(runs, targets, acc_targets)
    ek.write_csv(os.path.join(results, "runs.csv"), RUN_FIELDS, runs)
    ek.write_csv(os.path.join(results, "curves.csv"), CURVE_FIELDS,
                 [dict(p, label=r["label"], network=r["network"], peers=r["peers"], algorithm=r["algorithm"],
                       seed=r["seed"]) for r in runs for p in r["curve"]])
    ek.write_csv(os.path.join(results, "settings.csv"), SETTING_FIELDS,
                 [settings[k] for k in sorted(settings, key=lambda k: (NET_ORDER.index(k[0]), k[1],
                                                                       list(ALGO_TITLES).index(k[2])))])
    ek.write_csv(os.path.join(results, "speedup_seeds.csv"), SPEEDUP_SEED_FIELDS, per_seed)
    ek.write_csv(os.path.join(results, "speedup.csv"), SPEEDUP_FIELDS, speedup_rows)
    figures = plot_all(results, runs, settings, speedup_rows, targets)
    write_readme(results, runs, settings, speedup_rows, per_seed, targets, acc_targets, skipped, figures, meta,
                 networks_desc)


if __name__ == "__main__":
    main()
