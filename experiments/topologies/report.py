#!/usr/bin/python3
"""Report of the topologies experiment: reads RESULTS/manifest.tsv and the run
directories it names, writes runs.csv, curves.csv, the PNG plots and README.md.

Usage: report.py RESULTS_DIR

Every number in the README comes from the runs' metrics.csv / summary.json /
inspect.json; the observations are computed, not written by hand. Each setting (data,
topology) ran over several seeds: its tables give the seed mean with a 95 % confidence
interval, its differences are paired by seed, and its curves are seed means.
"""

import math
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402

DATA_TITLES = {"iid": "iid shards", "noniid": "non-iid shards (Dirichlet {alpha})"}
TOPO_TITLES = {
    "ring": "ring",
    "torus": "torus",
    "exponential": "exponential",
    "one-peer-exponential": "one-peer exponential",
    "complete": "complete",
    "allreduce": "all-reduce (exact average)",
}
COLORS = {
    "ring": "#1f77b4",
    "torus": "#ff7f0e",
    "exponential": "#2ca02c",
    "one-peer-exponential": "#d62728",
    "complete": "#9467bd",
    "allreduce": "#000000",
}

RUN_FIELDS = [
    "label", "model", "data", "topology", "algorithm", "peers", "hidden", "batch", "lr", "seed", "steps", "epochs",
    "spectral_gap", "contraction_per_step", "time_varying", "period",
    "test_accuracy", "mean_local_accuracy", "consensus_distance", "final_train_loss",
    "bytes_sent_per_peer", "bytes_per_peer_per_step", "train_bytes_per_peer_per_step_peer0",
    "wall_s", "wall_s_peer0", "items_per_s", "mean_compute_s", "mean_comm_wait_s", "val_bits_per_byte", "run_dir",
]
CURVE_FIELDS = [
    "label", "model", "data", "topology", "algorithm", "seed", "step", "epoch", "train_loss", "avg_accuracy",
    "mean_local_accuracy", "consensus_distance", "bytes_sent_mean", "bytes_sent_peer0",
    "wall_s_peer0", "wall_s_max", "avg_bits_per_byte",
]


def contraction(gap):
    """(1 - gap)^2, with the rounding error of a gap of 1 (the complete graph) read as 0."""
    c = (1.0 - gap) ** 2
    return 0.0 if c < 1e-12 else c


def load(results):
    manifest = ek.read_tsv(os.path.join(results, "manifest.tsv"))
    if not manifest:
        raise SystemExit(f"error: {results}/manifest.tsv lists no runs")
    runs = []
    for m in manifest:
        d = os.path.join(results, m["run_dir"])
        summary = ek.read_json(os.path.join(d, "summary.json"))
        inspect = ek.read_json(os.path.join(d, "inspect.json"))
        rows = ek.read_metrics(os.path.join(d, "metrics.csv"))
        curve = ek.per_evaluation(rows)
        # The GPT's x̄ in bits per byte on held-out text: peer 0's row of each evaluation.
        bpb = {r["step"]: r["avg_bits_per_byte"] for r in rows if r["peer"] == 0 and "avg_bits_per_byte" in r}
        for p in curve:
            p["avg_bits_per_byte"] = bpb.get(p["step"], "")
        exact = m["algorithm"] == "allreduce"
        steps = int(summary["steps"])
        period = inspect.get("period", {}).get("period", 1) if inspect.get("time_varying") else 1
        run = dict(m)
        run.update({
            "model": m.get("model", "mlp"),
            "seed": int(m["seed"]),
            "val_bits_per_byte": float(summary["val_bits_per_byte"]) if "val_bits_per_byte" in summary else "",
            "peers": int(m["peers"]),
            "steps": steps,
            "epochs": float(summary["epochs"]),
            # All-reduce averages exactly every step: W = 11^T/n, gap 1, whatever graph the file has.
            "spectral_gap": 1.0 if exact else float(inspect["spectral_gap"]),
            "contraction_per_step": 0.0 if exact else contraction(float(inspect["spectral_gap"])),
            "time_varying": bool(inspect.get("time_varying", False)),
            "period": period,
            "test_accuracy": float(summary["test_accuracy"]),
            "mean_local_accuracy": float(summary["mean_local_accuracy"]),
            "consensus_distance": float(summary["consensus_distance"]),
            "final_train_loss": float(summary["final_train_loss"]),
            "bytes_sent_per_peer": float(summary["bytes_sent_per_peer"]),
            "bytes_per_peer_per_step": float(summary["bytes_sent_per_peer"]) / steps,
            "train_bytes_per_peer_per_step_peer0": curve[-1]["bytes_sent_peer0"] / steps,
            "wall_s": float(summary["wall_s"]),
            "wall_s_peer0": curve[-1]["wall_s_peer0"],
            "items_per_s": float(summary["items_per_s"]),
            "mean_compute_s": float(summary["mean_compute_s"]),
            "mean_comm_wait_s": float(summary["mean_comm_wait_s"]),
            "curve": curve,
            "inspect": inspect,
        })
        runs.append(run)
    return runs


# Averaged over the seeds of a setting; the other fields (graph, spectrum, steps) do not
# depend on the seed and are the first seed's.
MEAN_FIELDS = ["test_accuracy", "mean_local_accuracy", "consensus_distance", "final_train_loss", "wall_s",
               "wall_s_peer0", "bytes_sent_per_peer", "bytes_per_peer_per_step", "train_bytes_per_peer_per_step_peer0",
               "items_per_s", "mean_compute_s", "mean_comm_wait_s"]


def aggregate(runs):
    """One entry per (model, data, topology): every MEAN_FIELDS field (and the GPT's bits per
    byte) as the seed mean with its 95 % half-width in FIELD_ci (None for one seed), the
    curve as the seed mean evaluation by evaluation, the seed runs themselves in `runs`."""
    groups = {}
    for r in runs:
        groups.setdefault((r["model"], r["data"], r["topology"]), []).append(r)
    out = []
    for (model, _, _), rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        a = dict(rs[0])
        a["runs"] = rs
        a["seeds"] = [r["seed"] for r in rs]
        for f in MEAN_FIELDS + (["val_bits_per_byte"] if model == "gpt" else []):
            a[f], a[f + "_ci"] = ek.mean_ci95([r[f] for r in rs])
        # The seeds evaluate at the same steps (same flags); average over the steps all share.
        shared = set.intersection(*({p["step"] for p in r["curve"]} for r in rs))
        for r in rs:
            r["curve"] = [p for p in r["curve"] if p["step"] in shared]
        length = len(rs[0]["curve"])
        curve = []
        for i in range(length):
            points = [r["curve"][i] for r in rs]
            p = {}
            for k, v in points[0].items():
                values = [q[k] for q in points]
                p[k] = "" if "" in values else sum(values) / len(values)
            p["step"] = points[0]["step"]
            curve.append(p)
        a["curve"] = curve
        out.append(a)
    return out


def paired(a, b, field):
    """(mean, 95 % half-width, seeds) of a's field minus b's over the seeds both ran."""
    bs = {r["seed"]: r[field] for r in b["runs"]}
    diffs = [r[field] - bs[r["seed"]] for r in a["runs"] if r["seed"] in bs]
    if not diffs:
        return None, None, 0
    mean, half = ek.mean_ci95(diffs)
    return mean, half, len(diffs)


def resolved(mean, half):
    """Whether a paired difference's 95 % interval excludes zero."""
    return mean is not None and half is not None and abs(mean) > half


def points_ci(mean, half):
    """A difference of accuracies in percentage points, with its interval; a third digit
    where two would show an interval that excludes zero as equal to its mean."""
    if mean is None:
        return "— (no seed in common)"
    digits = 3 if half is not None and round(100 * abs(mean), 2) == round(100 * half, 2) else 2
    return ek.fmt_ci(mean, half, scale=100.0, digits=digits) + (" (one seed, no interval)" if half is None else "")


def predict_steady_states(results, runs, meta):
    """Sets each gossip run's measured second-half consensus distance (xi_half) and the
    steady state predicted from its W (predicted_xi), scaled by the complete graph's run on
    the same data (lib/consensus_model.py). Without numpy, nothing is predicted."""
    try:
        from consensus_model import mixing_matrices, steady_xi
    except ImportError:
        return
    peertrain = os.environ.get("PEERTRAIN") or meta.get("peertrain") or "peertrain"
    for r in runs:
        last = r["curve"][-1]["step"]
        half = [p["consensus_distance"] for p in r["curve"] if p["step"] > last / 2]
        r["xi_half"] = sum(half) / len(half) if half else 0.0
        words = open(os.path.join(results, r["run_dir"], "command.txt")).read().split()
        r["momentum"] = float(words[words.index("--momentum") + 1]) if "--momentum" in words else 0.9
    for data in {r["data"] for r in runs}:
        complete = next((r for r in runs if r["data"] == data and r["topology"] == "complete"), None)
        if not complete or complete["xi_half"] <= 0:
            continue
        def shape(r):
            ws = mixing_matrices(peertrain, os.path.join(results, r["run_dir"]), r["topology"], r["peers"])
            return steady_xi(ws, r["momentum"], r["peers"])
        scale = complete["xi_half"] / shape(complete)
        for r in runs:
            if r["data"] == data and r["algorithm"] != "allreduce":
                r["predicted_xi"] = scale * shape(r)


def data_title(data, alpha):
    return DATA_TITLES.get(data, data).format(alpha=f"α = {alpha}")


# ---------------------------------------------------------------- plots

def plot_all(results, runs, settings, alpha):
    pd = os.path.join(results, "plotdata")
    os.makedirs(pd, exist_ok=True)
    for r in runs:
        rows = []
        for p in r["curve"]:
            rows.append([p["step"], p["epoch"], p["avg_accuracy"], p["mean_local_accuracy"],
                         p["consensus_distance"], p["bytes_sent_peer0"] / 1e6])
        r["dat"] = os.path.join(pd, f"{r['data']}-{r['topology']}.dat")
        ek.write_dat(r["dat"], ["step", "epoch", "avg_accuracy", "mean_local_accuracy", "consensus", "MB_sent_peer0"], rows)
    term = ek.gnuplot_terminal()
    figures = []

    def multiplot(name, title, panel, height=520, panel_width=640):
        png = os.path.join(results, name)
        gp = [f"set terminal {term} size {panel_width * len(settings)},{height}", f"set output {ek.gp_quote(png)}",
              f"set multiplot layout 1,{len(settings)} title {ek.gp_quote(title)}",
              "set grid", "set key box opaque samplen 3 spacing 1.1"]
        for data in settings:
            gp.append("unset logscale; unset format; set autoscale")
            gp.extend(panel(data))
        gp.append("unset multiplot")
        script = os.path.join(pd, name.replace(".png", ".gp"))
        with open(script, "w") as f:
            f.write("\n".join(gp) + "\n")
        ek.run_gnuplot(script, png)
        return png

    def panel_accuracy(data):
        rs = [r for r in runs if r["data"] == data]
        lines = [f"set title {ek.gp_quote(data_title(data, alpha))}", "set xlabel 'epoch (passes over the 60,000 training images, all peers together)'",
                 "set ylabel 'test accuracy of x̄ (fraction of 10,000 images)'", "set key bottom right", "set yrange [*:*]"]
        plots = [f"{ek.gp_quote(r['dat'])} using 2:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '{COLORS[r['topology']]}' "
                 f"title {ek.gp_quote(TOPO_TITLES[r['topology']])}" for r in rs]
        return lines + ["plot " + ", \\\n  ".join(plots)]

    def panel_consensus(data):
        rs = [r for r in runs if r["data"] == data and r["algorithm"] != "allreduce"]
        positives = [p["consensus_distance"] for r in rs for p in r["curve"] if p["consensus_distance"] > 0]
        if not positives:
            return ["set title 'no positive consensus distance to plot'", "plot 0 notitle"]
        ymin = min(positives) / 30
        ymax = max(positives) * 3
        xmax = max(p["step"] for r in rs for p in r["curve"])
        lines = [f"set title {ek.gp_quote(data_title(data, alpha))}", "set xlabel 'step (one minibatch per peer)'",
                 "set ylabel 'consensus distance (1/n) Σ‖x_i − x̄‖² (squared parameter norm)'", "set logscale y", "set format y '10^{%T}'",
                 f"set yrange [{ymin!r}:{ymax!r}]", f"set xrange [0:{xmax}]", "set key outside right top font ',9' samplen 2"]
        plots = []
        for r in rs:
            pts = [p for p in r["curve"] if p["consensus_distance"] > 0]
            if not pts:
                continue
            color = COLORS[r["topology"]]
            plots.append(f"{ek.gp_quote(r['dat'])} using 1:($5 > 0 ? $5 : 1/0) with linespoints lw 2 pt 7 ps 0.6 "
                         f"lc rgb '{color}' title {ek.gp_quote(TOPO_TITLES[r['topology']] + ' (measured)')}")
            level = r.get("predicted_xi")
            if not level or r["topology"] == "complete":
                continue
            # The steady state the spectrum predicts (lib/consensus_model.py), scaled by the
            # complete graph's measured level, over the second half where it is measured.
            seg = os.path.join(pd, f"pred-{r['data']}-{r['topology']}.dat")
            ek.write_dat(seg, ["step", "predicted"], [[xmax / 2, max(level, ymin)], [xmax, max(level, ymin)]])
            name = TOPO_TITLES[r["topology"]]
            plots.append(f"{ek.gp_quote(seg)} using 1:2 with lines dt 2 lw 2 lc rgb '{color}' "
                         f"title {ek.gp_quote(f'{name}: predicted steady state')}")
        return lines + ["plot " + ", \\\n  ".join(plots)]

    def panel_bytes(data):
        rs = [r for r in runs if r["data"] == data]
        lines = [f"set title {ek.gp_quote(data_title(data, alpha))}", "set xlabel 'data sent per peer (MB, training traffic, log scale)'",
                 "set ylabel 'test accuracy of x̄ (fraction of 10,000 images)'", "set logscale x", "set key bottom right", "set yrange [*:*]"]
        plots = [f"{ek.gp_quote(r['dat'])} using 6:3 with linespoints lw 2 pt 7 ps 0.6 lc rgb '{COLORS[r['topology']]}' "
                 f"title {ek.gp_quote(TOPO_TITLES[r['topology']])}" for r in rs]
        return lines + ["plot " + ", \\\n  ".join(plots)]

    n = runs[0]["peers"]
    n = f"{n} peers, mean of {len(runs[0]['seeds'])} seed(s)" if len(runs[0]["seeds"]) > 1 else f"{n} peers"
    figures.append(("accuracy_vs_epoch.png", "Test accuracy of the average model vs epoch",
                    multiplot("accuracy_vs_epoch.png", f"{n}: test accuracy of x̄ vs epoch", panel_accuracy)))
    figures.append(("consensus_vs_step.png", "Consensus distance vs step, with the spectrum's steady-state prediction",
                    multiplot("consensus_vs_step.png", f"{n}: consensus distance (solid) and the steady state predicted from W, scaled by the complete graph (dashed)",
                              panel_consensus, height=540, panel_width=900)))
    figures.append(("accuracy_vs_bytes.png", "Test accuracy of the average model vs data sent per peer",
                    multiplot("accuracy_vs_bytes.png", f"{n}: test accuracy of x̄ vs data sent per peer", panel_bytes)))
    return figures


# ---------------------------------------------------------------- the GPT part

def plot_gpt(results, gpt):
    """x̄'s held-out bits per byte against the step, seed means, one line per topology."""
    pd = os.path.join(results, "plotdata")
    os.makedirs(pd, exist_ok=True)
    plots = []
    for r in gpt:
        dat = os.path.join(pd, f"gpt-{r['topology']}.dat")
        ek.write_dat(dat, ["step", "avg_bits_per_byte"],
                     [[p["step"], p["avg_bits_per_byte"]] for p in r["curve"] if p["avg_bits_per_byte"] != ""])
        plots.append(f"{ek.gp_quote(dat)} using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '{COLORS[r['topology']]}' "
                     f"title {ek.gp_quote(TOPO_TITLES[r['topology']])}")
    name = "gpt_bits_per_byte.png"
    seeds, peers = len(gpt[0]["seeds"]), gpt[0]["peers"]
    title = f"GPT, {peers} peers: held-out bits per byte of x̄ (mean of {seeds} seed(s))"
    ek.render(os.path.join(pd, "gpt_bits_per_byte.gp"), [
        f"set terminal {ek.gnuplot_terminal()} size 800,520", f"set output {ek.gp_quote(os.path.join(results, name))}",
        f"set title {ek.gp_quote(title)}",
        "set grid", "set key top right box opaque", "set xlabel 'step (one batch of sequences per peer)'",
        "set ylabel 'validation bits per byte of x̄ (lower is better)'", "plot " + ", \\\n  ".join(plots)],
        os.path.join(results, name))
    return name, "GPT: held-out bits per byte of x̄ vs step"


def gpt_lines(gpt, figure):
    """The GPT section of the README: a table with paired differences, the plot, and what
    the numbers say."""
    ref = next((r for r in gpt if r["algorithm"] == "allreduce"), None)
    r0 = gpt[0]
    words = open(os.path.join(r0["results"], r0["run_dir"], "command.txt")).read().split()
    def flag(name):
        return words[words.index(name) + 1] if name in words else "?"
    rows = []
    for r in gpt:
        if ref and r is not ref:
            d, half, _ = paired(r, ref, "val_bits_per_byte")
            vs = ek.fmt_ci(d, half, digits=4) + (" *" if resolved(d, half) else "")
        else:
            vs = "—"
        rows.append((TOPO_TITLES[r["topology"]], gap_cell(r), ek.fmt_ci(r["val_bits_per_byte"], r["val_bits_per_byte_ci"], digits=4),
                     vs, ek.sci(r["consensus_distance"]), ek.human_bytes(r["bytes_per_peer_per_step"]), f"{r['wall_s']:.3g}"))
    name, title = figure
    lines = [
        "## The GPT: bits per byte on a ring, an exponential graph and all-reduce",
        "",
        f"- Model: the byte-level GPT (`--model gpt`), d_model {flag('--d-model')}, {flag('--layers')} layers, "
        f"{flag('--heads')} heads, context {flag('--seq')} bytes; batch {flag('--batch')} sequences per peer; Adam, lr "
        f"{flag('--lr')} with linear warm-up and cosine decay, weight decay {flag('--weight-decay')}; {r0['steps']} steps; "
        f"{r0['peers']} peers; seeds {', '.join(str(x) for x in r0['seeds'])}. Data: the fortunes text "
        f"(`/usr/share/games/fortunes`), each peer its own shard; x̄ scored on {flag('--eval-windows')} held-out "
        "windows, in bits per byte (the cross-entropy of the next byte, in bits).",
        "",
        ek.md_table(["topology", "spectral gap", "x̄ bits per byte", "x̄ − all-reduce", "consensus distance",
                     "bytes/peer/step", "wall s"], rows),
        "",
        "Mean over the seeds ± the 95 % half-width; *x̄ − all-reduce* is paired by seed, * where its interval "
        "excludes zero.",
        "",
        f"### {title}",
        "",
        f"![{title}]({name})",
        "",
    ]
    return lines


def gpt_observations(gpt):
    ref = next((r for r in gpt if r["algorithm"] == "allreduce"), None)
    if not ref:
        return []
    parts = []
    for r in gpt:
        if r is ref:
            continue
        d, half, k = paired(r, ref, "val_bits_per_byte")
        verdict = ("resolved: " + ("worse" if d > 0 else "better") + " than all-reduce") if resolved(d, half) else \
            "not resolved at 95 %"
        parts.append(f"{TOPO_TITLES[r['topology']]} {ek.fmt_ci(d, half, digits=4)} bits per byte ({verdict})")
    gossip = [r for r in gpt if r is not ref]
    between = []
    for i, a in enumerate(gossip):
        for b in gossip[i + 1:]:
            d, half, _ = paired(a, b, "val_bits_per_byte")
            between.append(f"{TOPO_TITLES[a['topology']]} minus {TOPO_TITLES[b['topology']]} {ek.fmt_ci(d, half, digits=4)} "
                           f"({'resolved' if resolved(d, half) else 'not resolved'} at 95 %)")
    tail = ("; between the gossip graphs, paired by seed: " + "; ".join(between)) if between else ""
    all_worse = all(resolved(*paired(r, ref, "val_bits_per_byte")[:2]) and paired(r, ref, "val_bits_per_byte")[0] > 0
                    for r in gossip)
    if between and all_worse and not any("(resolved" in b for b in between):
        gaps = sorted(r["spectral_gap"] for r in gossip)
        tail += (f". Graphs whose spectral gaps differ {gaps[-1] / gaps[0]:.0f}× are not resolved apart, while "
                 "both are resolved from all-reduce: consistent with a gap that is the update form's rather than the "
                 "topology's (each peer takes its own Adam step on its own gradient before the mix, where all-reduce "
                 "steps once on the average gradient)")
    return [f"**The GPT.** All-reduce's x̄ reached {ek.fmt_ci(ref['val_bits_per_byte'], ref['val_bits_per_byte_ci'], digits=4)} "
            f"bits per byte after {ref['steps']} steps; D-PSGD's x̄ minus that, paired by seed: " + "; ".join(parts)
            + tail + "."]


# ---------------------------------------------------------------- report

def gap_cell(r):
    if r["algorithm"] == "allreduce":
        return "1 (exact average)"
    if r["time_varying"]:
        return f"{r['spectral_gap']:.4g} (per step, from its {r['period']}-step period)"
    return f"{r['spectral_gap']:.4g}"


def contraction_cell(r):
    if r["algorithm"] == "allreduce":
        return "0"
    if r["time_varying"]:
        pc = r["inspect"].get("period", {}).get("contraction", float("nan"))
        return f"{pc:.3g} per {r['period']} steps"
    return f"{r['contraction_per_step']:.4g}"


def acc_ci(r, field="test_accuracy"):
    """An aggregated accuracy in percent, with its 95 % interval over the seeds."""
    return ek.fmt_ci(r[field], r.get(field + "_ci"), scale=100.0, digits=2)


def observations(runs, settings, alpha):
    obs = []
    for data in settings:
        rs = [r for r in runs if r["data"] == data]
        gossip = [r for r in rs if r["algorithm"] != "allreduce"]
        ref = next((r for r in rs if r["algorithm"] == "allreduce"), None)
        title = "iid" if data == "iid" else f"non-iid, α = {alpha}"
        best = max(gossip, key=lambda r: r["test_accuracy"]) if gossip else None
        worst = min(gossip, key=lambda r: r["test_accuracy"]) if gossip else None
        if best and worst:
            heading = data_title(data, alpha)
            if best is worst:
                s = (f"**{heading}.** The average model x̄ reached {acc_ci(best)} % on the "
                     f"{TOPO_TITLES[best['topology']]} after {best['epochs']:.3g} epochs")
            else:
                s = (f"**{heading}.** The average model x̄ reached {acc_ci(worst)} % on the "
                     f"{TOPO_TITLES[worst['topology']]} (lowest seed mean) to {acc_ci(best)} % on the "
                     f"{TOPO_TITLES[best['topology']]} (highest) after {best['epochs']:.3g} epochs")
            if ref:
                s += f"; the exact average (all-reduce) reached {acc_ci(ref)} %"
            obs.append(s + ".")
            # Where the gap to all-reduce comes from: on the complete graph W = J, so the topology
            # takes nothing away; what is left is the update form.
            complete = next((r for r in gossip if r["topology"] == "complete"), None)
            if ref and complete:
                gap, half, k = paired(complete, ref, "test_accuracy")
                spread = best["test_accuracy"] - worst["test_accuracy"]
                over = f"paired over {k} seeds, 95 % CI" if k > 1 else "one seed"
                s = (f"Where the gap to all-reduce comes from ({title}): the complete graph mixes with W = J, an "
                     f"exact average, and its x̄ ended {points_ci(gap, half)} points from all-reduce's ({over}), "
                     f"while the topologies' means differ among themselves by at most {100 * spread:.2f} points.")
                if resolved(gap, half) and gap < 0:
                    s += (" That gap is resolved, and it is the update form's, not the topology's: in D-PSGD's cta "
                          "step each peer takes its gradient at its own model after its own momentum step, not at x̄ "
                          "(experiments/heterogeneity splits it into the form's and the spectral gap's shares).")
                else:
                    s += " The complete graph's gap to all-reduce is not resolved at 95 %."
                # The topology's own share: what a sparser graph adds to the complete graph's gap.
                shares = [(r, *paired(r, complete, "test_accuracy")[:2]) for r in gossip if r is not complete]
                if shares:
                    worst_share = max(shares, key=lambda t: abs(t[1]))
                    s += (" What the sparser graphs add to it, paired by seed (x̄ minus the complete graph's): "
                          + ", ".join(f"{TOPO_TITLES[r['topology']]} {points_ci(d, h)}" for r, d, h in shares)
                          + f"; the largest, the {TOPO_TITLES[worst_share[0]['topology']]}'s, is "
                          + ("resolved" if resolved(worst_share[1], worst_share[2]) else "not resolved")
                          + " at 95 %.")
                    if gap is not None and gap < 0 and abs(worst_share[1]) < abs(gap):
                        s += (f" Every topology's mean share is smaller than the complete graph's own mean gap "
                              f"({100 * abs(gap):.2f} points): " +
                              ("the gap is resolved and already there with W = J, so it is the update form's, not "
                               "the topology's" if resolved(gap, half) else
                               "consistent with a gap that is the update form's rather than the topology's, though "
                               "neither the gap nor the shares are resolved at 95 % over these seeds") +
                              " (in D-PSGD's cta step each peer takes its gradient at its own model, not at x̄; "
                              "experiments/heterogeneity splits the two shares over α with more runs).")
                obs.append(s)
            # Which differences between topologies the seeds resolve (paired by seed).
            pairs = [(a, b) for i, a in enumerate(gossip) for b in gossip[i + 1:]]
            sure, unsure = [], []
            for a, b in pairs:
                d, half, _ = paired(a, b, "test_accuracy")
                if d is None:
                    continue
                hi, lo = (a, b) if d > 0 else (b, a)
                text = f"{TOPO_TITLES[hi['topology']]} over {TOPO_TITLES[lo['topology']]} by {points_ci(abs(d), half)}"
                (sure if resolved(d, half) else unsure).append(text)
            if sure or unsure:
                s = f"x̄ accuracy between gossip topologies, paired by seed ({title}): "
                s += (f"{len(sure)} of {len(sure) + len(unsure)} pairs resolved at 95 % ("
                      + "; ".join(sure) + ")") if sure else f"none of the {len(unsure)} pairs is resolved at 95 %"
                widths = [h for h in (paired(a, b, "test_accuracy")[1] for a, b in pairs) if h is not None]
                if unsure and widths:
                    s += (f"; {'the others are' if sure else 'they are'} within their noise (intervals up to "
                          f"± {100 * max(widths):.2f} points), so they are not ranked")
                if sure:
                    s += (f" (no correction for the {len(sure) + len(unsure)} comparisons: at 95 % about one in "
                          f"twenty resolves by chance)")
                obs.append(s + ".")
            # Local models vs the average.
            lags = [r["test_accuracy"] - r["mean_local_accuracy"] for r in gossip]
            parts = [f"{TOPO_TITLES[r['topology']]} {lag:+.4f}" for r, lag in zip(gossip, lags)]
            s = f"x̄ minus the mean local accuracy ({title}): " + ", ".join(parts)
            agree, pairs = ek.concordant_pairs([r["consensus_distance"] for r in gossip], lags)
            if pairs:
                s += (f"; a larger final consensus distance goes with a larger lag in {agree} of {pairs} pairs "
                      f"of topologies")
            obs.append(s + ".")
            # Does the consensus distance fall as the gap grows? (static graphs; a time-varying
            # graph's per-step gap is the equivalent of its period, so it is placed separately)
            static = sorted((r for r in gossip if not r["time_varying"]), key=lambda r: r["spectral_gap"])
            seq = ", ".join(f"{TOPO_TITLES[r['topology']]} (gap {r['spectral_gap']:.3g}) {ek.sci(r['consensus_distance'])}"
                            for r in static)
            violations = [(a, b) for a, b in zip(static, static[1:])
                          if b["spectral_gap"] > a["spectral_gap"] + 1e-9 and b["consensus_distance"] > a["consensus_distance"]]
            if len(static) < 2:
                verdict = "one static topology only, nothing to compare"
            elif violations:
                a, b = violations[0]
                verdict = (f"not monotone: the {TOPO_TITLES[b['topology']]} has the larger gap but also the larger "
                           f"distance than the {TOPO_TITLES[a['topology']]}")
            else:
                verdict = "the final distance falls as the spectral gap grows"
            if static:
                obs.append(f"Final consensus distance of the static graphs by spectral gap ({title}): {seq}; {verdict}.")
            for r in (r for r in gossip if r["time_varying"]):
                above = [s for s in static if s["consensus_distance"] < r["consensus_distance"]]
                obs.append(f"The {TOPO_TITLES[r['topology']]} graph (one partner per step; per-step equivalent gap "
                           f"{r['spectral_gap']:.3g} from its {r['period']}-step period) ended at {ek.sci(r['consensus_distance'])}, "
                           f"above {len(above)} of the {len(static)} static graphs"
                           + (f" ({', '.join(TOPO_TITLES[s['topology']] for s in above)})" if above else "") + ".")
            # The spectrum's steady state against the second half's measured level.
            predicted = [r for r in gossip if r.get("predicted_xi") and r["topology"] != "complete"]
            if predicted:
                parts = ", ".join(f"{TOPO_TITLES[r['topology']]} {r['xi_half'] / r['predicted_xi']:.2f}" for r in predicted)
                obs.append(f"Consensus distance over the second half, measured / predicted from W's spectrum "
                           f"(scaled by the complete graph; {title}): {parts}. experiments/consensus tests this "
                           f"prediction across ring sizes and graphs with 3 seeds.")
            # Bytes and time to an accuracy every run reached.
            target = min(r["test_accuracy"] for r in rs)
            target = math.floor(target * 100) / 100
            reach = []
            for r in rs:
                p = ek.first_reaching(r["curve"], "avg_accuracy", target)
                if p:
                    reach.append((r, p))
            if reach:
                parts = [f"{TOPO_TITLES[r['topology']]} {ek.human_bytes(p['bytes_sent_peer0'])} / {p['wall_s_max']:.1f} s "
                         f"(epoch {p['epoch']:.2f})" for r, p in sorted(reach, key=lambda t: t[1]['bytes_sent_peer0'])]
                obs.append(f"Data sent per peer and wall time (slowest peer) until x̄ first reached {target:.2f} accuracy ({title}): "
                           + ", ".join(parts) + ".")
            ring_b = next((r["train_bytes_per_peer_per_step_peer0"] for r in rs if r["topology"] == "ring"), None)
            if ring_b:
                parts = [f"{TOPO_TITLES[r['topology']]} {r['train_bytes_per_peer_per_step_peer0'] / ring_b:.2f}×" for r in rs]
                obs.append(f"Training traffic per peer per step relative to the ring ({title}): " + ", ".join(parts) + ".")
            slow = max(rs, key=lambda r: r["wall_s"])
            fast = min(rs, key=lambda r: r["wall_s"])
            s = (f"Wall time ({title}): {fast['wall_s']:.3g} s ({TOPO_TITLES[fast['topology']]}) to "
                 f"{slow['wall_s']:.3g} s ({TOPO_TITLES[slow['topology']]})")
            agree, pairs = ek.concordant_pairs([r["train_bytes_per_peer_per_step_peer0"] for r in rs],
                                               [r["wall_s"] for r in rs])
            if pairs:
                s += f"; more training bytes per step went with a longer wall time in {agree} of {pairs} pairs"
                if 2 * agree > pairs:
                    s += (f" (all {slow['peers']} peers share this machine's cores and its loopback, so copying "
                          f"bytes competes with computing gradients)")
            obs.append(s + ".")
    if "iid" in settings and "noniid" in settings:
        parts = []
        for r in runs:
            if r["data"] != "noniid":
                continue
            base = next((b for b in runs if b["data"] == "iid" and b["topology"] == r["topology"]), None)
            if base:
                parts.append(f"{TOPO_TITLES[r['topology']]} x̄ {r['test_accuracy'] - base['test_accuracy']:+.4f}, "
                             f"local {r['mean_local_accuracy'] - base['mean_local_accuracy']:+.4f}")
        if parts:
            obs.append("Non-iid minus iid accuracy (seed means): " + "; ".join(parts) + ".")
    return obs


def write_readme(results, runs, settings, figures, meta, alpha, gpt=None, gpt_figure=None):
    n = runs[0]["peers"]
    hidden = runs[0]["hidden"]
    params = ek.mlp_parameters(hidden)
    lines = [
        "# Topologies: how the gossip graph changes D-PSGD",
        "",
        "Generated by `experiments/topologies/report.py` from the CSVs in this folder; every number below is "
        "read from the runs' `metrics.csv`, `summary.json` and `topology inspect` output.",
        "",
        "## Setup",
        "",
        ek.machine_section(meta),
        f"- Peers: {n}, every one a process on this machine talking over loopback TCP, so the wall time of a run "
        f"grows with n and with the bytes copied (the peers share {meta.get('nproc', '?')} cores).",
        f"- Model: MLP 784-{hidden.replace(',', '-')}-10 ({params:,} parameters, {ek.human_bytes(4 * params)} per message); "
        f"Fashion-MNIST; batch {runs[0]['batch']} per peer; lr {runs[0]['lr']}; momentum 0.9; "
        f"seeds {', '.join(str(x) for x in runs[0]['seeds'])} (the seed draws the model, the shards and the batches); "
        f"{runs[0]['steps']} steps ({runs[0]['epochs']:.3g} epochs); evaluation every {runs[0]['eval_every']} steps.",
        f"- Data: {', '.join(data_title(d, alpha) for d in settings)}.",
        "- Topologies (Metropolis weights): " + ", ".join(sorted({TOPO_TITLES[r['topology']] for r in runs})) + ". "
        "All-reduce is C-PSGD (ring all-reduce of the gradients), the exact-average reference.",
        "- Runs: `runs/<data>-<topology>-s<seed>/` and `runs/gpt-<topology>-s<seed>/` (metrics.csv, summary.json, "
        "topology.yaml, inspect.json, logs, command.txt). "
        "Combined: `runs.csv` (one row per run), `curves.csv` (every run's evaluations, stacked).",
        "",
        "## Figures",
        "",
        ek.md_table(["figure", "file"], [(title, f"[{name}]({name})") for name, title, _ in figures]
                    + ([(gpt_figure[1], f"[{gpt_figure[0]}]({gpt_figure[0]})")] if gpt_figure else [])),
        "",
    ]
    for data in settings:
        rs = [r for r in runs if r["data"] == data]
        lines += [f"## Results: {data_title(data, alpha)}", ""]
        ref = next((r for r in rs if r["algorithm"] == "allreduce"), None)
        rows = []
        for r in rs:
            if ref and r is not ref:
                d, half, _ = paired(r, ref, "test_accuracy")
                vs_ref = points_ci(d, half) + (" *" if resolved(d, half) else "")
            else:
                vs_ref = "—"
            rows.append((TOPO_TITLES[r["topology"]], gap_cell(r), contraction_cell(r), acc_ci(r), vs_ref,
                         acc_ci(r, "mean_local_accuracy"), ek.sci(r["consensus_distance"]),
                         ek.human_bytes(r["bytes_per_peer_per_step"]),
                         ek.human_bytes(r["train_bytes_per_peer_per_step_peer0"]),
                         ek.fmt_ci(r["wall_s"], r["wall_s_ci"], digits=1)))
        lines += [ek.md_table(["topology", "spectral gap", "(1−gap)²", "x̄ accuracy %", "x̄ − all-reduce, points",
                               "mean local accuracy %", "consensus distance", "bytes/peer/step", "of which training",
                               "wall s"], rows), ""]
    lines += [
        f"Columns: the accuracies and wall s are means over the {len(runs[0]['seeds'])} seed(s), ± the half-width of "
        "their 95 % confidence interval (Student's t; none for one seed); consensus distance and bytes are seed means; "
        "*x̄ − all-reduce* is paired by seed (the same seed draws the same "
        "model, shards and batches for both), and * marks an interval that excludes zero. Spectral gap and "
        "(1−gap)² from `peertrain topology inspect` (for the one-peer exponential graph "
        "inspect reports the per-step equivalent of its period's contraction); accuracies, consensus distance and "
        "wall time (slowest peer's summed step times) from `summary.json`; bytes/peer/step = "
        "`bytes_sent_per_peer / steps`; *of which training* = peer 0's sent bytes / steps (peer 0 sends no "
        "evaluation reports; every topology here is regular, so peer 0 sends what every peer sends).",
        "",
        "## Plots",
        "",
    ]
    for name, title, _ in figures:
        lines += [f"### {title}", "", f"![{title}]({name})", ""]
    lines += [
        "In the consensus plot the dashed lines are the steady state the spectrum predicts over the second half of "
        "training: with white gradient noise of the same size on every peer, D-PSGD's disagreement settles where each "
        "mode of W (eigenvalue λ) holds η²σ̂²/(1 − λ²), with the momentum's filtering included "
        "(experiments/lib/consensus_model.py; experiments/consensus tests it across graphs). The one unknown scale "
        "η²σ̂² is the complete graph's measured level (W = J), so the complete graph has no line of its own; the "
        "one-peer exponential graph is iterated over its period. On non-iid shards the peers' gradients differ "
        "persistently, not as white noise, so the model is not expected to hold there; all-reduce keeps every model "
        "identical (distance 0, not drawn on the log scale).",
        "",
    ]
    if gpt:
        lines += gpt_lines(gpt, gpt_figure)
    lines += ["## Observations (computed from runs.csv and curves.csv)", ""]
    lines += [f"- {o}" for o in observations(runs, settings, alpha) + (gpt_observations(gpt) if gpt else [])]
    lines += [
        "",
        "## Notes",
        "",
        "- Byte counters: peertrain leaves the evaluation reports (each peer's parameters sent to peer 0 at every "
        "evaluation) out of `bytes_sent`, so `bytes_sent_per_peer` is training traffic; the *of which training* "
        "column, from peer 0's own counter, is shown beside it as a check.",
        "- Wall time: every peer is a process on one machine, so a topology that sends more bytes also takes CPU "
        "from the gradients of the others; on separate machines its cost would be network time instead.",
        "- Evaluation is outside the timings: peer 0 evaluates x̄ while the others wait for its release, and "
        "neither is counted in `wall_s` (the slowest peer's summed step times).",
    ]
    if meta.get("note"):
        lines.append(f"- This run: {meta['note']}")
    lines.append("")
    with open(os.path.join(results, "README.md"), "w") as f:
        f.write("\n".join(lines))


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: report.py RESULTS_DIR")
    results = os.path.abspath(sys.argv[1])
    runs = load(results)
    meta = ek.read_json(os.path.join(results, "meta.json"))
    alpha = 0.1
    ek.write_csv(os.path.join(results, "runs.csv"), RUN_FIELDS, runs)
    ek.write_csv(os.path.join(results, "curves.csv"), CURVE_FIELDS,
                 [dict(p, label=r["label"], model=r["model"], data=r["data"], topology=r["topology"],
                       algorithm=r["algorithm"], seed=r["seed"]) for r in runs for p in r["curve"]])
    for r in runs:
        r["results"] = results
    settings_all = aggregate(runs)
    mlp = [a for a in settings_all if a["model"] == "mlp"]
    gpt = [a for a in settings_all if a["model"] == "gpt"]
    if not mlp:
        raise SystemExit(f"error: {results}/manifest.tsv lists no MLP run")
    settings = [d for d in ("iid", "noniid") if any(r["data"] == d for r in mlp)]
    predict_steady_states(results, mlp, meta)
    figures = plot_all(results, mlp, settings, alpha)
    gpt_figure = plot_gpt(results, gpt) if gpt else None
    write_readme(results, mlp, settings, figures, meta, alpha, gpt, gpt_figure)


if __name__ == "__main__":
    main()
