"""Writes experiments/gossip's README.md, CSVs and plot from the runs in a results folder.

Usage: report.py RESULTS_DIR. Everything is computed from the runs' metrics.csv and
summary.json, listed in manifest.tsv.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402

TARGET_LOSS = 0.55  # the slow network's target: every full-mode run reaches it


def main(out):
    runs = ek.read_tsv(os.path.join(out, "manifest.tsv"))
    meta = ek.read_json(os.path.join(out, "meta.json"))
    for r in runs:
        r["summary"] = ek.read_json(os.path.join(out, r["run_dir"], "summary.json"))
        r["points"] = ek.per_evaluation(ek.read_metrics(os.path.join(out, r["run_dir"], "metrics.csv")))
    slow = [r for r in runs if r["part"] == "slow"]
    noniid = [r for r in runs if r["part"] == "noniid"]
    noniid_m0 = [r for r in runs if r["part"] == "noniid-m0"]
    latency = [r for r in runs if r["part"] == "latency"]
    write_tables(out, runs)
    lines = ["# Compressed gossip, update forms and fair baselines", ""]
    lines.append(f"Command: `{meta.get('command', 'experiments/gossip/run.sh')}` ({meta.get('mode', '?')} mode).")
    lines.append("")
    lines += slow_section(out, slow)
    lines += noniid_section(noniid, "2", "momentum 0.9 (the default)")
    lines += noniid_section(noniid_m0, "2b", "momentum 0 (plain SGD, as D² is analysed)")
    lines += latency_section(latency)
    lines += observations(slow, [(noniid, ""), (noniid_m0, " with momentum 0")], latency)
    lines += ["## Machine and run", "", ek.machine_section(meta), ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def write_tables(out, runs):
    """runs.csv, one row per training; curves.csv, one row per training per evaluation."""
    rows, curves = [], []
    for r in runs:
        s = r["summary"]
        t = time_to(r["points"], TARGET_LOSS)
        rows.append({"label": r["label"], "part": r["part"], "algorithm": r["algorithm"], "epochs": r["epochs"],
                     "steps": s["steps"], "test_accuracy": s["test_accuracy"],
                     "final_train_loss": s["final_train_loss"], "wall_s": s["wall_s"],
                     "bytes_per_step_per_peer": s["bytes_sent_per_peer"] / max(1, s["steps"]),
                     "time_to_target_s": t if t is not None else ""})
        for p in r["points"]:
            curves.append({"label": r["label"], **{k: p[k] for k in CURVE_KEYS[1:]}})
    ek.write_csv(os.path.join(out, "runs.csv"), list(rows[0].keys()), rows)
    ek.write_csv(os.path.join(out, "curves.csv"), CURVE_KEYS, curves)


CURVE_KEYS = ["label", "step", "epoch", "train_loss", "avg_accuracy", "wall_s_max", "bytes_sent_peer0"]


def latency_section(latency):
    if not latency:
        return []
    ring = next((r for r in latency if r["algorithm"] == "allreduce"), None)
    ring_step = ring["summary"]["wall_s"] / max(1, ring["summary"]["steps"]) if ring else None
    rows = []
    for r in latency:
        s = r["summary"]
        step = s["wall_s"] / max(1, s["steps"])
        t = time_to(r["points"], TARGET_LOSS)
        rows.append([f"`{r['algorithm']}`", f"{1000 * step:.1f}", f"{ring_step / step:.2f}×" if ring_step else "–",
                     f"{t:.2f}" if t is not None else "not reached", f"{s['test_accuracy']:.4f}"])
    peers = latency[0]["peers"]
    return [f"## 3. High latency: {peers} peers, 10 ms one way on every link", "",
            "No bandwidth cap. The ring all-reduce needs 2(n − 1) serial hops a step, the tree 2⌈log₂ n⌉ and recursive "
            "doubling ⌈log₂ n⌉; D-PSGD one exchange with its two neighbours. This is the comparison the earlier "
            "lian2017 report made against the ring alone.", "",
            ek.md_table(["algorithm", "ms/step", "step speed-up vs ring all-reduce", f"s to loss {TARGET_LOSS}",
                         "x̄ accuracy (end)"], rows), ""]


def observations(slow, noniid_sets, latency):
    """Sentences computed from the tables above, for the reader in a hurry."""
    lines = ["## Observations", ""]
    by = {r["algorithm"]: r for r in slow}
    ring = by.get("allreduce")
    ring_t = time_to(ring["points"], TARGET_LOSS) if ring else None
    best = None
    for r in slow:
        t = time_to(r["points"], TARGET_LOSS)
        if r["algorithm"].startswith("choco") and t and ring_t and (best is None or ring_t / t > best[1]):
            best = (r, ring_t / t)
    if best:
        r, speedup = best
        dpsgd = by.get("dpsgd")
        gap = ""
        if dpsgd:
            gap = (f"; its x̄ accuracy at the end is {r['summary']['test_accuracy']:.4f} against D-PSGD's "
                   f"{dpsgd['summary']['test_accuracy']:.4f} over the same epochs")
        lines.append(f"- On the slow network the fastest compressed gossip, `{r['algorithm']}`, reaches the target "
                     f"loss {speedup:.1f}× sooner than ring all-reduce{gap}.")
    elif ring is not None:
        lines.append(f"- On the slow network no compressed run reached the target loss {TARGET_LOSS} in this mode.")
    if "dpsgd" in by and "choco --compression top-k:0.01" in by:
        d = by["dpsgd"]["summary"]
        c = by["choco --compression top-k:0.01"]["summary"]
        ratio = (c["bytes_sent_per_peer"] / max(1, c["steps"])) / (d["bytes_sent_per_peer"] / max(1, d["steps"]))
        lines.append(f"- top-k:0.01 sends {100 * ratio:.1f} % of D-PSGD's bytes per step (target ≤ 3 %).")
    for noniid, label in noniid_sets:
        stats = noniid_stats(noniid)
        if {"dpsgd", "allreduce"} <= stats.keys():
            gap = ek.mean_ci95(stats["allreduce"][0])[0] - ek.mean_ci95(stats["dpsgd"][0])[0]
            for name, (_, closed) in stats.items():
                if closed:
                    mean, half = ek.mean_ci95(closed)
                    ci = f" (95 % CI {100 * (mean - half):.0f} to {100 * (mean + half):.0f} %)" if half is not None else ""
                    lines.append(f"- Non-iid{label}: `{name}` closes {100 * mean:.0f} %{ci} of the {100 * gap:.1f}-point "
                                 f"gap between D-PSGD and all-reduce per seed, {100 * gap_of_means(stats, name):.0f} % "
                                 f"of the means (target ≥ 50 %).")
    steps = {r["algorithm"]: r["summary"]["wall_s"] / max(1, r["summary"]["steps"]) for r in latency}
    fair = [k for k in ("allreduce --allreduce-algo rd", "allreduce --allreduce-algo tree") if k in steps]
    if "dpsgd" in steps and "allreduce" in steps and fair:
        best = min(fair, key=lambda k: steps[k])
        lines.append(f"- At 10 ms latency D-PSGD's step is {steps['allreduce'] / steps['dpsgd']:.1f}× faster than ring "
                     f"all-reduce's but only {steps[best] / steps['dpsgd']:.1f}× faster than the fair baseline, "
                     f"`{best}`.")
    lines.append("")
    return lines


def time_to(points, target):
    t, _ = ek.interpolate_crossing(points, "train_loss", target, "wall_s_max")
    return t


def slow_section(out, slow):
    if not slow:
        return []
    by = {r["algorithm"]: r for r in slow}
    ring = by.get("allreduce")
    dpsgd = by.get("dpsgd")
    ring_t = time_to(ring["points"], TARGET_LOSS) if ring else None
    dense_bytes = None
    if dpsgd:
        dense_bytes = dpsgd["summary"]["bytes_sent_per_peer"] / max(1, dpsgd["summary"]["steps"])
    rows = []
    for r in slow:
        s = r["summary"]
        t = time_to(r["points"], TARGET_LOSS)
        per_step = s["bytes_sent_per_peer"] / max(1, s["steps"])
        speedup = ring_t / t if (ring_t and t) else None
        step_s = s["wall_s"] / max(1, s["steps"])
        rows.append([
            f"`{r['algorithm']}`", r["epochs"], f"{1000 * step_s:.1f}",
            f"{t:.2f}" if t is not None else "not reached",
            f"{speedup:.1f}×" if speedup else "–",
            ek.human_bytes(per_step),
            f"{100 * per_step / dense_bytes:.1f} %" if dense_bytes else "–",
            f"{s['test_accuracy']:.4f}",
        ])
    plot(out, slow)
    peers = slow[0]["peers"]
    lines = [f"## 1. {peers} peers on a ring at 10 Mbit/s", "",
             "Every link is 10 Mbit/s and each peer's links share one 10 Mbit/s card "
             "(`node_bandwidth_mbps: 10`); the MLP and batch are in each run's `command.txt` (784-32-10, 102 KB a "
             "dense message, outside --tiny). "
             f"Target: the peers' mean training loss at {TARGET_LOSS} (interpolated between evaluations, on the "
             "slowest peer's clock). Speed-up: ring all-reduce's time to the target over the run's.", "",
             ek.md_table(["algorithm", "epochs", "ms/step", "s to target", "speed-up vs ring all-reduce",
                          "bytes/step/peer", "of D-PSGD's", "x̄ accuracy (end)"], rows), "",
             "![training loss against wall time](loss_vs_time.png)", ""]
    if ring and "allreduce --allreduce-algo rd" in by:
        rd = by["allreduce --allreduce-algo rd"]["summary"]
        lines.append(f"Recursive doubling moves the whole vector in each of its log₂ n rounds, so at 10 Mbit/s it is "
                     f"{rd['wall_s'] / max(1, rd['steps']) / (ring['summary']['wall_s'] / max(1, ring['summary']['steps'])):.2f}× "
                     "the ring's step time; it is the fair baseline only where latency, not bandwidth, dominates.")
        lines.append("")
    return lines


def plot(out, slow):
    dat = os.path.join(out, "plotdata")
    os.makedirs(dat, exist_ok=True)
    plots = []
    for i, r in enumerate(slow):
        path = os.path.join(dat, f"slow{i}.dat")
        ek.write_dat(path, ["wall_s", "train_loss"], [[p["wall_s_max"], p["train_loss"]] for p in r["points"]])
        plots.append(f"'{path}' using 1:2 with linespoints title {ek.gp_quote(r['algorithm'])}")
    png = os.path.join(out, "loss_vs_time.png")
    script = os.path.join(dat, "loss.gp")
    with open(script, "w") as f:
        f.write(f"set terminal {ek.gnuplot_terminal()} size 900,520\nset output '{png}'\n")
        f.write("set logscale x\nset xlabel 'wall time (s, slowest peer)'\nset ylabel 'mean training loss'\n")
        f.write(f"set key top right\nset grid\nset arrow from graph 0, first {TARGET_LOSS} to graph 1, first "
                f"{TARGET_LOSS} nohead dashtype 2\nplot " + ", \\\n  ".join(plots) + "\n")
    ek.run_gnuplot(script, png)


def noniid_stats(noniid):
    """Per algorithm, in run order: (accuracies over seeds, gap closed per seed). The gap is
    taken within each seed (the same shards, model and batches): (run − D-PSGD cta) /
    (all-reduce − D-PSGD cta)."""
    acc = {}
    for r in noniid:
        acc.setdefault(r["algorithm"], {})[r.get("seed", "1")] = r["summary"]["test_accuracy"]
    stats = {}
    for algorithm, by_seed in acc.items():
        closed = []
        for seed, a in by_seed.items():
            base, ceiling = acc.get("dpsgd", {}).get(seed), acc.get("allreduce", {}).get(seed)
            if base is not None and ceiling is not None and ceiling != base and algorithm not in ("dpsgd", "allreduce"):
                closed.append((a - base) / (ceiling - base))
        stats[algorithm] = (list(by_seed.values()), closed)
    return stats


def noniid_section(noniid, number, which):
    if not noniid:
        return []
    rows = []
    seeds = 1
    stats = noniid_stats(noniid)
    for algorithm, (accs, closed) in stats.items():
        seeds = max(seeds, len(accs))
        of_means = gap_of_means(stats, algorithm)
        rows.append([f"`{algorithm}`", ek.fmt_ci(*ek.mean_ci95(accs), scale=100),
                     ek.fmt_ci(*ek.mean_ci95(closed), scale=100, digits=0) + " %" if closed else "–",
                     f"{100 * of_means:.0f} %" if of_means is not None else "–"])
    peers = noniid[0]["peers"]
    noise = (f"Means over {seeds} seeds with 95 % confidence intervals (Student's t); the gap is closed within each seed."
             if seeds > 1 else "One seed: differences below about 0.5 points are within evaluation noise.")
    return [f"## {number}. Non-iid shards: {peers} peers on a ring, Dirichlet α = 0.1, {which}", "",
            f"{noniid[0]['epochs']} epochs, no emulation. Gap closed: (run − D-PSGD cta) / (all-reduce − D-PSGD cta) "
            f"on x̄'s final test accuracy. {noise} The per-seed ratio is unstable where a seed's gap is near zero, so "
            f"the last column gives the same ratio on the means over the seeds.", "",
            ek.md_table(["algorithm", "x̄ accuracy (%)", "gap closed (per seed)", "gap closed (of the means)"], rows), ""]


def gap_of_means(stats, algorithm):
    """(mean run − mean D-PSGD) / (mean all-reduce − mean D-PSGD), over the seeds."""
    if algorithm in ("dpsgd", "allreduce") or not {"dpsgd", "allreduce"} <= stats.keys():
        return None
    mean = lambda name: sum(stats[name][0]) / len(stats[name][0])
    gap = mean("allreduce") - mean("dpsgd")
    return (mean(algorithm) - mean("dpsgd")) / gap if gap != 0 else None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_DIR")
    main(sys.argv[1])
