"""Writes experiments/networks's README.md, CSVs and plots from the runs in a results folder.

Usage: report.py RESULTS_DIR. Everything is computed from the runs' metrics.csv and
summary.json, listed in manifest.tsv.

- A step's time is peer 0's summed step time (its wall_s) over the steps: peer 0 is the
  parameter server and the tree's root, so its step is the whole step; the sweep's runs
  evaluate once, at the end, so no evaluation hides a transfer.
- Steps to the target: the first evaluation at which x̄'s test accuracy reaches it,
  interpolated linearly between evaluations, on the fast network; the mean over the seeds.
- Time to the target on a network: those steps times the step's time there (measured, or
  predicted by the fitted α-β model of lib/netmodel.py).
"""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402
import netmodel as nm  # noqa: E402

SAMPLES = 60000  # Fashion-MNIST's training set: an epoch is SAMPLES / (n · batch) steps
OVERLAPPED = ("dpsgd", "choco")  # their exchange overlaps the gradient (cta)
FRAME_HEADER = 48  # bytes of a frame's header (net/frame.h), counted in bytes_sent


def main(out):
    runs = ek.read_tsv(os.path.join(out, "manifest.tsv"))
    meta = ek.read_json(os.path.join(out, "meta.json"))
    for r in runs:
        r["summary"] = ek.read_json(os.path.join(out, r["run_dir"], "summary.json"))
        r["points"] = ek.per_evaluation(ek.read_metrics(os.path.join(out, r["run_dir"], "metrics.csv")))
        r["n"] = int(r["peers"])
        last = r["points"][-1]
        r["steps_run"] = last["step"]
        r["step_s"] = last["wall_s_peer0"] / last["step"]
        r["batch"] = int(r["summary"]["batch_per_peer"])
    parts = {p: [r for r in runs if r["part"] == p] for p in ("accuracy", "sweep", "uneven", "netns")}
    sweep = parts["sweep"]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in sweep))
    n = sweep[0]["n"]
    batch = sweep[0]["batch"]
    steps_per_epoch = SAMPLES // (n * batch)
    target = float(runs[0]["target"])
    sizes = message_sizes(sweep, n)
    size = sizes["dpsgd"] if "dpsgd" in sizes else next(iter(sizes.values()))

    to_target, single = steps_to_target(parts["accuracy"], target)
    for r in sweep + parts["uneven"] + parts["netns"]:
        r["K"], r["M"] = nm.critical_path(r["algorithm"], r["n"], sizes[r["algorithm"]])
        if r["part"] != "uneven":
            r["latency_s"], r["bandwidth"] = float(r["latency_ms"]) / 1e3, float(r["bandwidth_mbps"]) * 1e6
        r["measured_s"] = r["step_s"]
    # D-PSGD and CHOCO (cta) exchange while the gradient is computed: a step is the longer of
    # the two, never shorter than on the fastest network of the sweep, where it is all
    # computation. So their c is fitted where communication dominates (a step over 1.5× that).
    fastest = max(float(r["bandwidth_mbps"]) for r in sweep)
    floor = {r["algorithm"]: r["measured_s"] for r in sweep
             if float(r["bandwidth_mbps"]) == fastest and float(r["latency_ms"]) == 0 and r["algorithm"] in OVERLAPPED}
    fitted = [r for r in sweep if r["algorithm"] not in floor or r["measured_s"] > 1.5 * floor[r["algorithm"]]]
    c, alpha, beta = nm.fit(fitted, algorithms)
    for r in sweep:
        r["predicted_s"] = max(floor.get(r["algorithm"], 0.0),
                               nm.predict_uniform(c, alpha, beta, r["algorithm"], r["K"], r["M"], r["latency_s"],
                                                  r["bandwidth"]))
        r["error"] = r["predicted_s"] / r["measured_s"] - 1
    for r in parts["uneven"]:
        network = uneven_network(os.path.join(out, r["run_dir"], "topology.yaml"), r["n"])
        r["predicted_s"] = max(floor.get(r["algorithm"], 0.0),
                               nm.step_time_flow(r["algorithm"], network, sizes[r["algorithm"]], c[r["algorithm"]],
                                                 alpha, beta))
        r["error"] = r["predicted_s"] / r["measured_s"] - 1
    write_tables(out, runs, sweep, parts, to_target, steps_per_epoch)

    lines = ["# Time to accuracy on swept and uneven networks", "",
             f"Command: `{meta.get('command', 'experiments/networks/run.sh')}` ({meta.get('mode', '?')} mode). "
             f"{n} peers on a ring (the parameter server and the all-reduces use their own partners), MLP of "
             f"{(size - FRAME_HEADER) / 4:,.0f} parameters ({size:,.0f} bytes a message, its 48-byte header included"
             + (f"; CHOCO's qsgd:4 messages {sizes['choco']:,.0f} bytes" if "choco" in sizes else "") + f"), batch {batch} per peer, iid shards; an epoch is "
             f"{steps_per_epoch} steps. Every peer is a process on this machine, over loopback; each sender "
             f"emulates its links and its card (`links:` in the topology file) unless said otherwise.", ""]
    lines += accuracy_section(to_target, single, target, algorithms, steps_per_epoch)
    lines += sweep_section(out, sweep, fitted, algorithms, c, alpha, beta, to_target, single, steps_per_epoch)
    crossover_lines, sweep_crossovers = crossover_section(sweep, algorithms, c, alpha, beta, to_target)
    lines += crossover_lines
    lines += uneven_section(parts["uneven"], sweep)
    lines += netns_section(out, parts["netns"], sweep)
    lines += observations(sweep, parts["uneven"], parts["netns"], sweep_crossovers)
    lines += ["## Machine and run", "", ek.machine_section(meta), ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def message_sizes(sweep, n):
    """Bytes of one message per algorithm, from the runs' own counters: D-PSGD and CHOCO send
    one message to each of their 2 neighbours a step; the others carry the whole model."""
    sizes = {}
    for r in sweep:
        per_step = r["summary"]["bytes_sent_per_peer"] / max(1, r["summary"]["steps"])
        if r["algorithm"] in ("dpsgd", "choco") and r["algorithm"] not in sizes:
            sizes[r["algorithm"]] = per_step / min(2, n - 1)
    model = sizes.get("dpsgd")
    if model is None:  # ring all-reduce: 2 (n − 1) / n of the model a step
        ring = next(r for r in sweep if r["algorithm"] == "ring")
        model = ring["summary"]["bytes_sent_per_peer"] / ring["summary"]["steps"] * n / (2 * (n - 1))
    for a in ("ps", "ring", "tree", "dpsgd"):
        sizes.setdefault(a, model)
    return sizes


def steps_to_target(accuracy_runs, target):
    """{algorithm: [steps per seed]} and one worker's (steps, seconds per step)."""
    out, single = {}, None
    for r in accuracy_runs:
        steps = None
        prev = None
        for p in r["points"]:
            if p["avg_accuracy"] >= target:
                if prev is None:
                    steps = p["step"]
                else:
                    frac = (target - prev["avg_accuracy"]) / (p["avg_accuracy"] - prev["avg_accuracy"])
                    steps = prev["step"] + frac * (p["step"] - prev["step"])
                break
            prev = p
        if r["algorithm"] == "single":
            single = (steps, r["step_s"])
        elif steps is not None:
            out.setdefault(r["algorithm"], []).append(steps)
        else:
            out.setdefault(r["algorithm"] + "!missed", []).append(r["points"][-1]["avg_accuracy"])
    return out, single


def mean(values):
    return sum(values) / len(values)


def uneven_network(topology_path, n):
    """The links of a run's topology file as a netmodel.Network (the subset of YAML run.sh writes)."""
    import re
    text = open(topology_path).read()
    number = lambda key, s: (float(m.group(1)) if (m := re.search(key + r":\s*([0-9.]+)", s)) else None)
    default = re.search(r"default:\s*\{([^}]*)\}", text).group(1)
    lat, bw = number("latency_ms", default) or 0.0, number("bandwidth_mbps", default) or 0.0
    card, card_in = number("node_bandwidth_mbps", text), number("node_ingress_mbps", text)
    net = nm.Network(n, lat / 1e3, bw * 1e6 if bw else math.inf, card * 1e6 if card else math.inf,
                     card_in * 1e6 if card_in else math.inf)
    for m in re.finditer(r"\{between: \[(\d+), (\d+)\]([^}]*)\}", text):
        i, j, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        b, l_ = number("bandwidth_mbps", rest), number("latency_ms", rest)
        net.set_link(i, j, l_ / 1e3 if l_ is not None else None, b * 1e6 if b else None)
    return net


def write_tables(out, runs, sweep, parts, to_target, steps_per_epoch):
    rows = []
    for r in runs:
        rows.append({k: r.get(k, "") for k in ("label", "part", "algorithm", "peers", "bandwidth_mbps", "latency_ms",
                                               "network", "seed", "steps_run", "step_s", "predicted_s", "error")}
                    | {"test_accuracy": r["summary"]["test_accuracy"],
                       "bytes_per_step_per_peer": r["summary"]["bytes_sent_per_peer"] / max(1, r["summary"]["steps"])})
    ek.write_csv(os.path.join(out, "runs.csv"), list(rows[0].keys()), rows)
    curves = [{"label": r["label"], **p} for r in parts["accuracy"] for p in r["points"]]
    ek.write_csv(os.path.join(out, "curves.csv"), ["label", "step", "epoch", "train_loss", "avg_accuracy",
                                                   "wall_s_peer0"], curves)
    sweep_rows = []
    for r in sweep:
        steps = to_target.get(r["algorithm"])
        sweep_rows.append({"bandwidth_mbps": r["bandwidth_mbps"], "latency_ms": r["latency_ms"],
                           "algorithm": r["algorithm"], "step_s_measured": r["measured_s"],
                           "step_s_predicted": r["predicted_s"], "error": r["error"],
                           "epoch_s_measured": r["measured_s"] * steps_per_epoch,
                           "epoch_s_predicted": r["predicted_s"] * steps_per_epoch,
                           "time_to_target_s": r["measured_s"] * mean(steps) if steps else float("nan")})
    ek.write_csv(os.path.join(out, "sweep.csv"), list(sweep_rows[0].keys()), sweep_rows)


def accuracy_section(to_target, single, target, algorithms, steps_per_epoch):
    rows = []
    for a in algorithms:
        if a in to_target:
            m, h = ek.mean_ci95(to_target[a])
            rows.append([nm.NAMES[a], ek.fmt_ci(m, h, digits=0), f"{m / steps_per_epoch:.2f}", len(to_target[a])])
        if a + "!missed" in to_target:
            rows.append([nm.NAMES[a], f"not reached by {len(to_target[a + '!missed'])} seed(s) (best "
                                      f"{100 * max(to_target[a + '!missed']):.1f} %)", "–", ""])
    if single:
        rows.append([nm.NAMES["single"] + " (batch of all the peers: all-reduce's iterates)",
                     f"{single[0]:.0f}" if single[0] is not None else "not reached", "", 1])
    return [f"## 1. Steps until x̄ reaches {100 * target:.0f} % test accuracy (fast network)", "",
            "The algorithms are synchronous: with the same seed their iterates are the same on every network, so "
            "the time to the target on a network is these steps times a step's time there (section 2). "
            "Means with 95 % confidence intervals over the seeds.", "",
            ek.md_table(["algorithm", "steps (mean ± CI)", "epochs", "seeds"], rows), ""]


def sweep_section(out, sweep, fitted, algorithms, c, alpha, beta, to_target, single, steps_per_epoch):
    networks = sorted({(float(r["bandwidth_mbps"]), float(r["latency_ms"])) for r in sweep}, key=lambda x: (-x[0], x[1]))
    at = {(float(r["bandwidth_mbps"]), float(r["latency_ms"]), r["algorithm"]): r for r in sweep}
    within = [r for r in sweep if abs(r["error"]) <= 0.2]
    errors = sorted(abs(r["error"]) for r in sweep)
    worst = max(sweep, key=lambda r: abs(r["error"]))
    pngs = plot_sweep(out, sweep, algorithms, networks, to_target, c, alpha, beta)
    lines = ["## 2. The sweep: time per epoch, measured and by the α-β model", "",
             f"Fitted over {len(fitted)} of the {len(sweep)} points (least squares on the relative error; D-PSGD's "
             f"and CHOCO's where communication dominates, their step over 1.5× the fastest network's): **α = "
             f"{1e6 * alpha:.0f} µs per round** (a message on the critical path) beyond the link's latency, "
             f"**β = {1e9 * beta:.2f} ns per byte** "
             + (f"beyond the wire ({8 / beta / 1e9:.2f} Gbit/s of software)" if beta > 0 else
                "beyond the wire (a negative β: the wire's own 1/B already accounts for the bytes, and the fit "
                "trades a little of it against the c's)")
             + ", and each "
             f"algorithm's own cost per step c (the fit's intercept, so it can come out slightly negative where α's rounds over-count a fast step): " + ", ".join(f"{nm.NAMES[a]} {1e3 * c[a]:.2f} ms" for a in algorithms)
             + ". Model: T = c + K (L + α) + M (1/B + β), K the rounds of a step and M the bytes through the busiest "
               "resource of each round (lib/netmodel.py); for D-PSGD and CHOCO, whose exchange overlaps the gradient, "
               "never below their step on the fastest network, which is all computation.", "",
             f"**{len(within)} of {len(sweep)} points within 20 %** of the model (target: every point); median "
             f"error {100 * errors[len(errors) // 2]:.1f} %, worst {100 * abs(worst['error']):.1f} % "
             f"({nm.NAMES[worst['algorithm']]} at {worst['bandwidth_mbps']} Mbit/s, {worst['latency_ms']} ms).", "",
             f"![time to the target against latency]({pngs[0]})", "", f"![predicted against measured]({pngs[1]})", "",
             "Time per epoch in seconds, measured / predicted (error):", ""]
    header = ["Mbit/s", "ms"] + [nm.NAMES[a] for a in algorithms] + ["fastest to the target (measured / model)"]
    body = []
    for bw, lat in networks:
        row = [f"{bw:g}", f"{lat:g}"]
        t2a_m, t2a_p = {}, {}
        for a in algorithms:
            r = at.get((bw, lat, a))
            if not r:
                row.append("–")
                continue
            row.append(f"{r['measured_s'] * steps_per_epoch:.3g} / {r['predicted_s'] * steps_per_epoch:.3g} "
                       f"({100 * r['error']:+.0f} %)")
            if a in to_target:
                t2a_m[a], t2a_p[a] = r["measured_s"] * mean(to_target[a]), r["predicted_s"] * mean(to_target[a])
        best_m = min(t2a_m, key=t2a_m.get) if t2a_m else None
        best_p = min(t2a_p, key=t2a_p.get) if t2a_p else None
        row.append(f"{nm.NAMES[best_m]} / {nm.NAMES[best_p]}" if best_m else "–")
        body.append(row)
    lines += [ek.md_table(header, body), ""]
    agree = sum(1 for row in body if " / " in row[-1] and row[-1].split(" / ")[0] == row[-1].split(" / ")[1])
    lines += [f"The model names the measured fastest algorithm on {agree} of {len(body)} networks.", ""]
    if single and single[0] is not None:
        t1 = single[0] * single[1]
        best = max(((t1 / (r["measured_s"] * mean(to_target[r["algorithm"]])), r) for r in sweep
                    if r["algorithm"] in to_target), key=lambda pair: pair[0])
        lines += [f"Speed-up over one worker (its {single[0]:.0f} steps at {1e3 * single[1]:.2f} ms, "
                  f"{1e3 * t1:.0f} ms to the target, alone on this machine: the same steps as all-reduce, each doing "
                  f"all {sweep[0]['n']} peers' batches), each algorithm's time to the target on each network. All "
                  f"{sweep[0]['n']} peers share this machine's cores, so the fast networks' figures are bound by the "
                  f"CPU, not the links; and this MLP (sized so that the 1 Mbit/s runs finish) computes so little "
                  f"that one worker is faster on every network: the best is {best[0]:.2g}× "
                  f"({nm.NAMES[best[1]['algorithm']]} at {best[1]['bandwidth_mbps']} Mbit/s, "
                  f"{best[1]['latency_ms']} ms). Below 1×, the table measures what each network costs, not a "
                  f"speed-up:", ""]
        header = ["Mbit/s", "ms"] + [nm.NAMES[a] for a in algorithms]
        body = []
        for bw, lat in networks:
            row = [f"{bw:g}", f"{lat:g}"]
            for a in algorithms:
                r = at.get((bw, lat, a))
                row.append(f"{t1 / (r['measured_s'] * mean(to_target[a])):.2g}×" if r and a in to_target else "–")
            body.append(row)
        lines += [ek.md_table(header, body), ""]
    return lines


def crossings(xs, ys):
    """Where ys (a difference) changes sign between consecutive xs, linearly interpolated."""
    out = []
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if y0 == 0:
            out.append(x0)
        elif y0 * y1 < 0:
            out.append(x0 + (x1 - x0) * y0 / (y0 - y1))
    return out


def crossover_section(sweep, algorithms, c, alpha, beta, to_target):
    """Along latency at each bandwidth, and along 1/bandwidth at each latency: where one
    algorithm's time to the target crosses another's, measured (interpolated between grid
    points) and predicted by the linear model, without D-PSGD's and CHOCO's floor (linear
    along both axes, so its crossing is solved exactly; where the floor binds, a crossing
    inside the compute-bound corner can go unpredicted)."""
    at = {(float(r["bandwidth_mbps"]), float(r["latency_ms"]), r["algorithm"]): r for r in sweep}
    bws = sorted({float(r["bandwidth_mbps"]) for r in sweep}, reverse=True)
    lats = sorted({float(r["latency_ms"]) for r in sweep})
    have = [a for a in algorithms if a in to_target]
    rows, matched, good, unmatched = [], 0, 0, 0
    for i, a in enumerate(have):
        for b in have[i + 1:]:
            sa, sb = mean(to_target[a]), mean(to_target[b])
            k_a, m_a = at[(bws[0], lats[0], a)]["K"], at[(bws[0], lats[0], a)]["M"]
            k_b, m_b = at[(bws[0], lats[0], b)]["K"], at[(bws[0], lats[0], b)]["M"]
            for bw in bws:  # along latency (ms)
                ys = [at[(bw, l_, a)]["measured_s"] * sa - at[(bw, l_, b)]["measured_s"] * sb for l_ in lats]
                meas = crossings(lats, ys)
                per_l = sa * k_a - sb * k_b  # d(difference)/dL, in seconds per second
                rest = sa * (c[a] + k_a * alpha + m_a * (8 / (bw * 1e6) + beta)) - \
                    sb * (c[b] + k_b * alpha + m_b * (8 / (bw * 1e6) + beta))
                pred = -rest / per_l * 1e3 if per_l != 0 else None
                pred = pred if pred is not None and lats[0] <= pred <= lats[-1] else None
                row, ok = compare(meas, pred)
                if row:
                    rows.append([f"{nm.NAMES[a]} vs {nm.NAMES[b]}", f"latency, at {bw:g} Mbit/s", *row])
                    matched, good, unmatched = matched + (ok is not None), good + bool(ok), unmatched + (ok is None)
            for lat in lats:  # along bandwidth: linear in x = 1/B
                xs = [1 / bw for bw in bws]
                ys = [at[(bw, lat, a)]["measured_s"] * sa - at[(bw, lat, b)]["measured_s"] * sb for bw in bws]
                meas = [1 / x for x in crossings(xs, ys)]
                per_x = (sa * m_a - sb * m_b) * 8 / 1e6  # per (1 / Mbit/s)
                rest = sa * (c[a] + k_a * (lat / 1e3 + alpha) + m_a * beta) - \
                    sb * (c[b] + k_b * (lat / 1e3 + alpha) + m_b * beta)
                x = -rest / per_x if per_x != 0 else None
                pred = 1 / x if x and x > 0 and bws[-1] <= 1 / x <= bws[0] else None
                row, ok = compare(meas, pred, unit="Mbit/s")
                if row:
                    rows.append([f"{nm.NAMES[a]} vs {nm.NAMES[b]}", f"bandwidth, at {lat:g} ms", *row])
                    matched, good, unmatched = matched + (ok is not None), good + bool(ok), unmatched + (ok is None)
    lines = ["## 3. Crossovers: where one algorithm starts to beat another (time to the target)", ""]
    if not rows:
        return lines + ["No pair of algorithms crosses inside the grid, measured or predicted.", ""], (0, 0, 0)
    lines += [f"**{good} of {matched} crossovers found by both are predicted within 1.5× of the measured** (target: "
              f"all); {unmatched} appear in only one of the two (a crossing near a grid point can fall on either "
              f"side of it).", "",
              ek.md_table(["pair", "along", "measured", "predicted", "predicted / measured"], rows), ""]
    return lines, (good, matched, unmatched)


def observations(sweep, uneven, netns, crossovers):
    """The targets, each with its figure and whether it is met."""
    within = sum(1 for r in sweep if abs(r["error"]) <= 0.2)
    good, matched, unmatched = crossovers
    lines = ["## Observations", "",
             f"- Time per epoch within 20 % of the α-β model: {within} of {len(sweep)} sweep points "
             f"({'met' if within == len(sweep) else 'missed'}); uneven networks "
             f"{sum(1 for r in uneven if abs(r['error']) <= 0.2)} of {len(uneven)}.",
             f"- Crossovers within 1.5× of the measured: {good} of {matched} found by both "
             f"({'met' if good == matched else 'missed'}), {unmatched} found by only one."]
    if netns:
        ref = {(r["bandwidth_mbps"], r["algorithm"]): r for r in sweep if float(r["latency_ms"]) == 0}
        diffs = [ref[(r["bandwidth_mbps"], r["algorithm"])]["measured_s"] / r["measured_s"] - 1 for r in netns
                 if (r["bandwidth_mbps"], r["algorithm"]) in ref]
        if diffs:
            lines.append(f"- The engine's emulation against the kernel's tbf: from {100 * min(diffs):+.1f} % to "
                         f"{100 * max(diffs):+.1f} % ({sum(1 for d in diffs if abs(d) <= 0.1)} of {len(diffs)} "
                         f"within 10 %).")
    return lines + [""]


def compare(measured, predicted, unit="ms"):
    if not measured and predicted is None:
        return None, None
    text = lambda v: f"{v:.3g} {unit}"
    if measured and predicted is not None:
        m = min(measured, key=lambda v: abs(math.log(max(v, 1e-9) / max(predicted, 1e-9))))
        ratio = predicted / m if m > 0 else math.inf
        ok = 1 / 1.5 <= ratio <= 1.5
        return [", ".join(text(v) for v in measured), text(predicted), f"{ratio:.2f}" + ("" if ok else " ✗")], ok
    return [", ".join(text(v) for v in measured) or "none in the grid",
            text(predicted) if predicted is not None else "none in the grid", "–"], None


def uneven_section(uneven, sweep):
    if not uneven:
        return []
    ref = {r["algorithm"]: r for r in sweep if float(r["bandwidth_mbps"]) == 100 and float(r["latency_ms"]) == 1}
    rows = []
    for r in uneven:
        base = ref.get(r["algorithm"])
        rows.append([r["network"], nm.NAMES[r["algorithm"]], f"{1e3 * r['measured_s']:.1f}",
                     f"{1e3 * r['predicted_s']:.1f}", f"{100 * r['error']:+.0f} %",
                     f"{r['measured_s'] / base['measured_s']:.2f}×" if base else "–"])
    within = sum(1 for r in uneven if abs(r["error"]) <= 0.2)
    return ["## 4. Uneven networks", "",
            "`straggler`: 100 Mbit/s links and cards, 1 ms, but one ring link (0–1) at 10 Mbit/s. `lognormal`: every "
            "pair's bandwidth drawn log-normal around 100 Mbit/s (σ = 1, seed 7; the parameter server's and the "
            "all-reduces' partners included), 1 ms, no card cap. Predicted with the fitted α, β and c, the step "
            "replayed message by message (lib/netmodel.py's step_time_flow: a peer sends a round's messages once it "
            "has the ones addressed to it before, a slow link delays what waits for it and the rounds behind it "
            "pipeline; on a uniform network it equals the sweep's model).", "",
            f"**{within} of {len(uneven)} within 20 % of the model.**", "",
            ek.md_table(["network", "algorithm", "ms per step, measured", "model", "error",
                         "vs 100 Mbit/s 1 ms uniform"], rows), ""]


def netns_section(out, netns, sweep):
    skipped = os.path.join(out, "netns-skipped.txt")
    if not netns:
        why = open(skipped).read().strip() if os.path.exists(skipped) else "not run in this mode"
        return ["## 5. The emulation against the kernel", "", f"Not run: {why}", ""]
    ref = {(r["bandwidth_mbps"], r["algorithm"]): r for r in sweep if float(r["latency_ms"]) == 0}
    rows, over = [], []
    for r in netns:
        base = ref.get((r["bandwidth_mbps"], r["algorithm"]))
        diff = base["measured_s"] / r["measured_s"] - 1 if base else None
        if diff is not None and abs(diff) > 0.1:
            over.append(f"{nm.NAMES[r['algorithm']]} at {r['bandwidth_mbps']} Mbit/s ({100 * diff:+.0f} %)")
        rows.append([f"{r['bandwidth_mbps']}", nm.NAMES[r["algorithm"]], f"{1e3 * r['measured_s']:.1f}",
                     f"{1e3 * base['measured_s']:.1f}" if base else "–",
                     f"{100 * diff:+.1f} %" if diff is not None else "–"])
    return ["## 5. The emulation against the kernel", "",
            "The same runs with every peer in its own network namespace (one address each, a veth cable into a "
            "bridge, `tc tbf` on both ends of every cable at the rate, netlab's 64 KB bucket and 100 ms queue: scripts/netlab.sh) and no emulation in "
            "peertrain, against the engine's emulation of the same network (links and cards at the rate, both "
            "ways, 0 ms).", "",
            ek.md_table(["Mbit/s", "algorithm", "ms per step, kernel (tbf)", "engine's emulation",
                         "emulation vs kernel"], rows), "",
            (f"Over 10 %: {', '.join(over)} — see docs/net.md's limits of the emulation." if over
             else "Every point within 10 %."), ""]


def plot_sweep(out, sweep, algorithms, networks, to_target, c, alpha, beta):
    os.makedirs(os.path.join(out, "plotdata"), exist_ok=True)
    term = ek.gnuplot_terminal()
    colours = {"dpsgd": "#1f77b4", "choco": "#9467bd", "ps": "#ff7f0e", "ring": "#2ca02c", "tree": "#d62728"}
    bws = sorted({bw for bw, _ in networks}, reverse=True)
    lats = sorted({lat for _, lat in networks})
    at = {(float(r["bandwidth_mbps"]), float(r["latency_ms"]), r["algorithm"]): r for r in sweep}
    png_t = os.path.join(out, "time_to_target.png")
    gp = [f"set terminal {term} size {380 * len(bws)},420", f"set output {ek.gp_quote(png_t)}",
          f"set multiplot layout 1,{len(bws)} title 'Time to the target accuracy against latency "
          f"(points: measured; lines: the fitted α-β model)'",
          "set logscale y", "set grid", "set xlabel 'one-way latency (ms)'", "set ylabel 'seconds'",
          "set key top left font ',8'"]
    for bw in bws:
        plots = []
        for a in algorithms:
            if a not in to_target:
                continue
            steps = mean(to_target[a])
            pts = [(lat, at[(bw, lat, a)]["measured_s"] * steps) for lat in lats if (bw, lat, a) in at]
            path = os.path.join(out, "plotdata", f"t2a-{bw:g}-{a}.dat")
            ek.write_dat(path, ["latency_ms", "seconds"], pts)
            r0 = at[(bw, lats[0], a)]
            line = os.path.join(out, "plotdata", f"t2a-model-{bw:g}-{a}.dat")
            ek.write_dat(line, ["latency_ms", "seconds"],
                         [(x, steps * nm.predict_uniform(c, alpha, beta, a, r0["K"], r0["M"], x / 1e3, bw * 1e6))
                          for x in [lats[0] + (lats[-1] - lats[0]) * i / 50 for i in range(51)]])
            plots.append(f"{ek.gp_quote(path)} using 1:2 with points pt 7 ps 0.8 lc rgb '{colours[a]}' "
                         f"title {ek.gp_quote(nm.NAMES[a])}")
            plots.append(f"{ek.gp_quote(line)} using 1:2 with lines lw 1.5 lc rgb '{colours[a]}' notitle")
        gp += [f"set title '{bw:g} Mbit/s'", "plot " + ", ".join(plots)]
    gp.append("unset multiplot")
    ek.render(os.path.join(out, "plotdata", "t2a.gp"), gp, png_t)

    png_s = os.path.join(out, "predicted_vs_measured.png")
    lo = min(min(r["measured_s"], r["predicted_s"]) for r in sweep) / 1.5
    hi = max(max(r["measured_s"], r["predicted_s"]) for r in sweep) * 1.5
    plots = []
    for a in algorithms:
        path = os.path.join(out, "plotdata", f"scatter-{a}.dat")
        ek.write_dat(path, ["measured_ms", "predicted_ms"],
                     [(1e3 * r["measured_s"], 1e3 * r["predicted_s"]) for r in sweep if r["algorithm"] == a])
        plots.append(f"{ek.gp_quote(path)} using 1:2 with points pt 7 ps 1 lc rgb '{colours[a]}' "
                     f"title {ek.gp_quote(nm.NAMES[a])}")
    plots += ["x lc rgb 'black' title 'predicted = measured'", "1.2*x dt 2 lc rgb 'grey' title '±20 %'",
              "x/1.2 dt 2 lc rgb 'grey' notitle"]
    gp = [f"set terminal {term} size 640,560", f"set output {ek.gp_quote(png_s)}",
          "set title 'Time per step: the α-β model against the measurement'", "set logscale xy", "set grid",
          f"set xrange [{1e3 * lo}:{1e3 * hi}]", f"set yrange [{1e3 * lo}:{1e3 * hi}]",
          "set xlabel 'measured (ms)'", "set ylabel 'predicted (ms)'", "set key top left font ',9'",
          "plot " + ", ".join(plots)]
    ek.render(os.path.join(out, "plotdata", "scatter.gp"), gp, png_s)
    return [os.path.basename(png_t), os.path.basename(png_s)]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_DIR")
    main(sys.argv[1])
