#!/usr/bin/python3
"""Report of experiments/simulate: reads manifest.tsv and each run's summary.json, writes
fidelity.csv, lian2017.csv, scale.csv, the plots and README.md. Every number in the report
is read from the runs."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402

NAMES = {"dpsgd": "D-PSGD", "ring": "ring all-reduce", "ps": "parameter server"}
TOLERANCE = 0.15  # the issue's: simulated within 15 % of measured


def step_time(out, row):
    s = ek.read_json(os.path.join(out, row["run_dir"], "summary.json"))
    return s["wall_s"] / s["steps"], s


def fidelity(out, rows):
    pairs = {}
    for r in rows:
        if r["part"] == "fidelity":
            pairs.setdefault((r["network"], r["algorithm"]), {})[r["kind"]] = r
    table = []
    for (network, algorithm), kinds in pairs.items():
        if "real" not in kinds or "simulated" not in kinds:
            continue
        real_s, real = step_time(out, kinds["real"])
        sim_s, _ = step_time(out, kinds["simulated"])
        shipped_s = step_time(out, kinds["lv08-shipped"])[0] if "lv08-shipped" in kinds else None
        compute = real["mean_compute_s"] / real["steps"]
        table.append({"network": network, "algorithm": algorithm, "peers": int(kinds["real"]["peers"]),
                      "measured_step_s": real_s, "simulated_step_s": sim_s, "error": sim_s / real_s - 1,
                      "shipped_lv08_step_s": shipped_s,
                      "shipped_lv08_error": shipped_s / real_s - 1 if shipped_s else None,
                      "compute_per_step_s": compute, "host_speed": float(kinds["simulated"]["host_speed"])})
    return table


def lian(out, rows):
    table = []
    for r in rows:
        if r["part"] != "lian2017":
            continue
        t, s = step_time(out, r)
        n = int(r["peers"])
        flops = 2 * 128 * (784 * 512 * 2 + 512 * 512 * 3 + 512 * 10 * 3)  # model/mlp.cpp's count, batch 128
        one_step = flops / float(r["host_speed"])
        # One worker alone does n workers' steps one after another, with no communication.
        table.append({"network": r["network"], "algorithm": r["algorithm"], "peers": n, "step_s": t,
                      "one_worker_step_s": one_step, "speedup": n * one_step / t,
                      "bytes_sent_per_peer_per_step": s["bytes_sent_per_peer"] / s["steps"]})
    table.sort(key=lambda x: (x["network"], x["algorithm"], x["peers"]))
    return table


def scale(out, rows):
    table = []
    for r in rows:
        if r["part"] != "scale":
            continue
        s = ek.read_json(os.path.join(out, r["run_dir"], "summary.json"))
        n, steps = int(r["peers"]), int(r["steps"])
        rss_kb, real_s = float(r["rss_kb"]), float(r["real_s"])
        sim = s.get("simulation")
        table.append({"label": r["label"], "kind": r["kind"], "peers": n, "steps": steps,
                      "real_s": real_s, "real_ms_per_peer_step": 1e3 * real_s / (n * steps),
                      "memory_per_peer_mb": rss_kb / 1e3 / (n if r["kind"] == "simulated" else 1),
                      "simulated_s": sim["simulated_s"] if sim else None, "test_accuracy": s["test_accuracy"]})
    return table


def runs_and_curves(out, rows):
    runs, curves = [], []
    for r in rows:
        s = ek.read_json(os.path.join(out, r["run_dir"], "summary.json"))
        runs.append({"label": r["label"], "part": r["part"], "algorithm": r["algorithm"], "peers": int(r["peers"]),
                     "network": r["network"], "kind": r["kind"], "steps": s["steps"], "wall_s": s["wall_s"],
                     "step_s": s["wall_s"] / s["steps"], "test_accuracy": s["test_accuracy"],
                     "simulated": "simulation" in s})
        for e in ek.per_evaluation(ek.read_metrics(os.path.join(out, r["run_dir"], "metrics.csv"))):
            curves.append({"label": r["label"], **e})
    return runs, curves


def misses(fid):
    """What the pairs beyond the tolerance say, from the numbers (docs/simulate.md lists what
    the model leaves out)."""
    out = []
    ps = [t for t in fid if t["algorithm"] == "ps" and t["error"] > TOLERANCE]
    fast = [t for t in fid if t["error"] < -TOLERANCE]
    if not ps and not fast:
        return out
    out += ["### Where it misses, and why", ""]
    if ps:
        worst = max(ps, key=lambda t: t["error"])
        out.append(
            f"- **The parameter server on the kernel's shaping** is simulated slower than measured (up to "
            f"{100 * worst['error']:+.0f} %, {worst['network']}). The server's card carries every worker's "
            f"gradient in, then x out to every worker. SimGrid shares the card fairly among the concurrent flows, "
            f"so every worker gets x at the same moment, after all of them: the step is the two directions one "
            f"after the other. The kernel's tbf queue serves the flows first come, first served: the first worker "
            f"gets x early and sends its next gradient while the server still sends to the others, so the two "
            f"directions of the card overlap. Measured {worst['measured_step_s']:.3g} s a step, against "
            f"{worst['simulated_step_s']:.3g} s for the two directions in turn. A FIFO queue per card is not a "
            f"model SimGrid offers, and peertrain adds none of its own.")
    if fast:
        best = min(fast, key=lambda t: t["error"])
        out.append(
            f"- **At the highest rate** the real step is longer than its network and compute "
            f"({best['measured_step_s'] * 1e3:.2g} ms measured against {best['simulated_step_s'] * 1e3:.2g} ms "
            f"simulated for {NAMES[best['algorithm']]}, {best['network']}): what is left is the "
            f"{best['peers']} processes, their I/O threads and the kernel's network stack sharing this machine's "
            f"cores, which the real run's compute time does not hold and the simulation leaves out by design. "
            f"On a cluster, where each peer has its machine, that time is not there.")
    out.append("")
    return out


def observations(fid, lia, sca):
    """What the numbers say, each computed from the tables."""
    lines = ["## Observations (computed from fidelity.csv, lian2017.csv and scale.csv)", ""]
    if fid:
        within = [t for t in fid if abs(t["error"]) <= TOLERANCE]
        lines.append(f"- {len(within)} of {len(fid)} simulated steps are within 15 % of the measured ones; by "
                     "network: " + "; ".join(
                         f"{net} {sum(abs(t['error']) <= TOLERANCE for t in fid if t['network'] == net)} of "
                         f"{sum(t['network'] == net for t in fid)}" for net in sorted({t['network'] for t in fid})) + ".")
        shipped = [t for t in fid if t["shipped_lv08_error"] is not None]
        if shipped:
            lines.append(f"- With LV08's latency factor as shipped, the emulated-link steps are "
                         f"{min(100 * t['shipped_lv08_error'] for t in shipped):+.0f} % to "
                         f"{max(100 * t['shipped_lv08_error'] for t in shipped):+.0f} % off, against "
                         f"{min(100 * t['error'] for t in shipped):+.0f} % to {max(100 * t['error'] for t in shipped):+.0f} % "
                         "with the default's factor of 1.")
    for network in sorted({t["network"] for t in lia}):
        for algorithm in ("dpsgd", "ps"):
            pts = sorted((t["peers"], t["step_s"], t["speedup"]) for t in lia
                         if t["network"] == network and t["algorithm"] == algorithm)
            if len(pts) >= 2:
                lines.append(f"- {NAMES[algorithm]}, {network}: from n = {pts[0][0]} to {pts[-1][0]} the step goes from "
                             f"{pts[0][1] * 1e3:.3g} to {pts[-1][1] * 1e3:.3g} ms ({pts[-1][1] / pts[0][1]:.2f}×) and the "
                             f"speed-up from {pts[0][2]:.1f}× to {pts[-1][2]:.1f}×.")
    for t in sca:
        if t["kind"] == "simulated":
            lines.append(f"- {t['peers']} simulated peers × {t['steps']} steps took {ek.clock(t['real_s'])} of real "
                         f"time ({t['real_ms_per_peer_step']:.2f} ms a peer-step) and {t['memory_per_peer_mb']:.0f} MB "
                         "a peer.")
    return lines + [""]


def plot_fidelity(out, table):
    dat = os.path.join(out, "fidelity.dat")
    ek.write_dat(dat, ["measured", "simulated"], [(t["measured_step_s"], t["simulated_step_s"]) for t in table])
    lo = min(min(t["measured_step_s"], t["simulated_step_s"]) for t in table) / 1.5
    hi = max(max(t["measured_step_s"], t["simulated_step_s"]) for t in table) * 1.5
    ek.render(os.path.join(out, "fidelity.gp"), [
        f"set terminal {ek.gnuplot_terminal()} size 640,480",
        f"set output '{os.path.join(out, 'fidelity.png')}'",
        "set logscale xy", f"set xrange [{lo}:{hi}]", f"set yrange [{lo}:{hi}]",
        "set xlabel 'measured seconds per step'", "set ylabel 'simulated seconds per step'",
        "set key top left", "set grid",
        f"plot x title 'equal' lw 1 lc rgb 'black', {1 + TOLERANCE}*x title '+15 %' dt 2 lc rgb 'gray', "
        f"{1 - TOLERANCE}*x title '-15 %' dt 2 lc rgb 'gray', "
        f"'{dat}' using 1:2 title 'a run (network × algorithm)' with points pt 7 ps 1.2"],
        os.path.join(out, "fidelity.png"))


def plot_lian(out, table):
    lines = [f"set terminal {ek.gnuplot_terminal()} size 720,480",
             f"set output '{os.path.join(out, 'speedup_vs_n.png')}'",
             "set xlabel 'workers n'", "set ylabel 'speed-up of an epoch over one worker'", "set key top left",
             "set grid"]
    plots = ["x title 'linear (the paper: D-PSGD is close to it)' dt 2 lc rgb 'gray'"]
    for network in sorted({t["network"] for t in table}):
        for algorithm in ("dpsgd", "ps"):
            pts = [(t["peers"], t["speedup"]) for t in table if t["network"] == network and t["algorithm"] == algorithm]
            if not pts:
                continue
            dat = os.path.join(out, f"speedup-{network}-{algorithm}.dat")
            ek.write_dat(dat, ["n", "speedup"], pts)
            plots.append(f"'{dat}' using 1:2 with linespoints title '{NAMES[algorithm]}, {network}'")
    top = max(t["peers"] for t in table)
    lines += [f"set xrange [0:{top * 1.05}]", f"set yrange [0:{top * 1.05}]", "plot " + ", ".join(plots)]
    ek.render(os.path.join(out, "speedup_vs_n.gp"), lines, os.path.join(out, "speedup_vs_n.png"))


def main(out):
    rows = ek.read_tsv(os.path.join(out, "manifest.tsv"))
    meta = ek.read_json(os.path.join(out, "meta.json"))
    fid, lia, sca = fidelity(out, rows), lian(out, rows), scale(out, rows)
    runs, curves = runs_and_curves(out, rows)
    ek.write_csv(os.path.join(out, "runs.csv"), ["label", "part", "algorithm", "peers", "network", "kind", "steps",
                 "wall_s", "step_s", "test_accuracy", "simulated"], runs)
    ek.write_csv(os.path.join(out, "curves.csv"), ["label"] + [k for k in (curves[0] if curves else {}) if k != "label"],
                 curves)
    ek.write_csv(os.path.join(out, "fidelity.csv"), ["network", "algorithm", "peers", "measured_step_s",
                 "simulated_step_s", "error", "shipped_lv08_step_s", "shipped_lv08_error", "compute_per_step_s",
                 "host_speed"], fid)
    ek.write_csv(os.path.join(out, "lian2017.csv"), ["network", "algorithm", "peers", "step_s", "one_worker_step_s",
                 "speedup", "bytes_sent_per_peer_per_step"], lia)
    ek.write_csv(os.path.join(out, "scale.csv"), ["label", "kind", "peers", "steps", "real_s",
                 "real_ms_per_peer_step", "memory_per_peer_mb", "simulated_s", "test_accuracy"], sca)
    if fid:
        plot_fidelity(out, fid)
    if lia:
        plot_lian(out, lia)

    md = ["# Simulated clusters against real runs, and at the scale of Lian et al. 2017", "",
          "Generated by `experiments/simulate/report.py` from the runs in this folder; the model of the "
          "simulation is in [docs/simulate.md](../../../docs/simulate.md).", "", "## Setup", "",
          ek.machine_section(meta), ""]
    if fid:
        within = sum(abs(t["error"]) <= TOLERANCE for t in fid)
        worst = max(fid, key=lambda t: abs(t["error"]))
        md += ["## Fidelity: simulated against measured time per step", "",
               f"Each pair is one real run and its simulated twin: the same topology, flags and seed, MLP "
               f"784-32-10 (101,848 bytes a message), batch 32, the hosts' speed set to the gradient's FLOPs over "
               f"the real run's compute time per step (`mean_compute_s` / `steps` of its summary), so that the "
               f"comparison is of the network and the synchronisation, not of {fid[0]['peers']} processes sharing "
               f"this machine's cores. `emulated-…`: the engine's own link emulation (docs/net.md); `netns-…`: "
               f"peer r in network namespace r, every cable shaped by the kernel's tbf (scripts/netlab.sh), and "
               f"the twin's cards at that rate both ways. Time per step: `wall_s` / `steps` of each summary.", "",
               f"**{within} of {len(fid)} pairs are within 15 %**; the largest difference is "
               f"{100 * worst['error']:+.1f} % ({NAMES[worst['algorithm']]}, {worst['network']}).", "",
               ek.md_table(["network", "algorithm", "measured s/step", "simulated s/step", "difference",
                            "LV08 as shipped: s/step, difference", "real compute s/step", "host FLOP/s"],
                           [[t["network"], NAMES[t["algorithm"]], f"{t['measured_step_s']:.4g}",
                             f"{t['simulated_step_s']:.4g}", f"{100 * t['error']:+.1f} %",
                             f"{t['shipped_lv08_step_s']:.4g}, {100 * t['shipped_lv08_error']:+.1f} %"
                             if t["shipped_lv08_step_s"] else "",
                             f"{t['compute_per_step_s']:.3g}", f"{t['host_speed']:.3g}"] for t in fid]), "",
               "The simulated column uses the model's default (LV08 with a latency factor of 1, docs/simulate.md); "
               "the next, on the engine's emulated links, LV08 as SimGrid ships it (each route's latency times "
               "13.01).", "",
               "![simulated against measured seconds per step](fidelity.png)", ""] + misses(fid) + [""]
    if lia:
        md += ["## Lian et al. 2017 at their scale: D-PSGD against C-PSGD", "",
               "The paper (Lian et al., NeurIPS 2017) ran up to 112 GPUs and found D-PSGD's speed-up close to "
               "linear in n, while the centralized parameter server's flattens, the more so on the slower "
               "network. Here, simulated: n workers on a ring (D-PSGD) or around a parameter server on peer 0, "
               "MLP 784-512-512-10 (2.68 MB a message), batch 128 a worker, each host 20 GFLOP/s (the 411 MFLOP "
               "gradient in 20.5 ms), every card at the cluster's rate both ways, 0.1 ms a hop. The speed-up "
               "of an epoch over one worker alone: n × (one worker's step: the gradient, no communication) / "
               "(the run's simulated step). The paper's shape holds: D-PSGD's step does not grow with n, so "
               "its speed-up is linear (at 1 Gbit/s with a slope below 1: its two 2.68 MB messages take "
               "longer than the gradient); the parameter server's step grows with n, so its speed-up "
               "flattens at 10 Gbit/s and stays below one worker's at 1 Gbit/s.", "",
               ek.md_table(["network", "algorithm", "n", "s/step", "speed-up", "bytes/peer/step"],
                           [[t["network"], NAMES[t["algorithm"]], t["peers"], f"{t['step_s']:.4g}",
                             f"{t['speedup']:.1f}×", ek.human_bytes(t["bytes_sent_per_peer_per_step"])]
                            for t in lia]), "",
               "![speed-up against n](speedup_vs_n.png)", ""]
    if sca:
        md += ["## Scale: real time per simulated peer-step, memory per peer", "",
               "D-PSGD on an exponential graph, compute by FLOPs at 10 GFLOP/s, one evaluation at the end (its "
               "time included). Real time: the whole command, start to end (`/usr/bin/time`). Memory: the "
               "simulation's peak resident size over its peers; for the real run, the largest process (a "
               "peer).", "",
               ek.md_table(["run", "kind", "peers", "steps", "real time", "real ms per peer-step",
                            "memory per peer", "x̄ test accuracy"],
                           [[t["label"], t["kind"], t["peers"], t["steps"], ek.clock(t["real_s"]),
                             f"{t['real_ms_per_peer_step']:.2f}", f"{t['memory_per_peer_mb']:.0f} MB",
                             f"{t['test_accuracy']:.4f}"] for t in sca]), ""]
    md += observations(fid, lia, sca)
    md += ["## Files", "",
           "`manifest.tsv` (every run), `runs/<part>-…/` (each run's folder and command), `runs.csv` (a row per "
           "run), `curves.csv` (every evaluation of every run), `fidelity.csv`, "
           "`lian2017.csv`, `scale.csv`, the plots and their gnuplot scripts.", ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main(sys.argv[1])
