"""Shared by the experiments' report generators: read peertrain's run directories,
aggregate the per-peer rows, write CSVs and Markdown, and draw plots with gnuplot.

Python standard library only (no numpy or matplotlib on the machines this runs on).
"""

import csv
import json
import math
import os
import subprocess

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------- reading runs

def read_tsv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def read_metrics(path):
    """metrics.csv as a list of dicts of floats (peer and step as ints). Empty cells (the
    bits-per-byte columns of a classifier) are left out of the row."""
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {k: float(v) for k, v in r.items() if v != ""}
            row["peer"] = int(row["peer"])
            row["step"] = int(row["step"])
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def per_evaluation(rows):
    """One dict per evaluation (step), aggregating the peers' rows.

    bytes_sent_peer0 is peer 0's counter: peer 0 sends no evaluation reports, so in a
    regular topology it is the training traffic of one peer (the other peers' counters
    also count the reports they send to peer 0 at each evaluation). wall_s_peer0 is
    peer 0's step time; wall_s_max the slowest peer's, which also holds the time the
    others waited while peer 0 evaluated.
    """
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], []).append(r)
    out = []
    for step in sorted(by_step):
        group = sorted(by_step[step], key=lambda r: r["peer"])
        peer0 = group[0]
        if peer0["peer"] != 0:
            raise ValueError(f"step {step}: no row for peer 0")
        n = len(group)
        out.append({
            "step": step,
            "epoch": peer0["epoch"],
            "peers": n,
            "train_loss": sum(r["train_loss"] for r in group) / n,
            "avg_accuracy": peer0["avg_accuracy"],
            "mean_local_accuracy": sum(r["test_accuracy"] for r in group) / n,
            "consensus_distance": peer0["consensus_distance"],
            "bytes_sent_mean": sum(r["bytes_sent"] for r in group) / n,
            "bytes_sent_peer0": peer0["bytes_sent"],
            "wall_s_peer0": peer0["wall_s"],
            "wall_s_max": max(r["wall_s"] for r in group),
        })
    return out


def mlp_parameters(hidden):
    """Parameter count of peertrain's MLP 784-hidden...-10 (weights and biases)."""
    widths = [784] + [int(h) for h in str(hidden).split(",")] + [10]
    return sum(a * b + b for a, b in zip(widths, widths[1:]))


def interpolate_crossing(points, key, target, time_key):
    """First time `key` falls to `target` or below, linearly interpolated between the
    two evaluations around the crossing. Returns (time, index) or (None, None)."""
    for i, p in enumerate(points):
        if p[key] <= target:
            if i == 0:
                return p[time_key], i
            a = points[i - 1]
            frac = (a[key] - target) / (a[key] - p[key]) if a[key] != p[key] else 1.0
            return a[time_key] + frac * (p[time_key] - a[time_key]), i
    return None, None


def interpolate_rise(points, key, target, time_key):
    """First time `key` rises to `target` or above (a test accuracy, say), linearly
    interpolated between the two evaluations around the crossing: the mirror of
    interpolate_crossing. Returns (time, index) or (None, None)."""
    for i, p in enumerate(points):
        if p[key] >= target:
            if i == 0:
                return p[time_key], i
            a = points[i - 1]
            frac = (target - a[key]) / (p[key] - a[key]) if a[key] != p[key] else 1.0
            return a[time_key] + frac * (p[time_key] - a[time_key]), i
    return None, None


def first_reaching(points, key, target):
    """First point whose `key` is at least `target`, or None."""
    for p in points:
        if p[key] >= target:
            return p
    return None


def concordant_pairs(xs, ys):
    """How many of the pairs (i, j) order x and y the same way, out of the pairs whose x
    and y both differ: a plain count that a report can quote."""
    agree = total = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[j] - xs[i], ys[j] - ys[i]
            if dx == 0 or dy == 0:
                continue
            total += 1
            agree += (dx > 0) == (dy > 0)
    return agree, total


# ---------------------------------------------------------------- writing

# Student's t at 97.5 % for 1..30 degrees of freedom: the two-sided 95 % interval.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def mean_ci95(values):
    """(mean, half-width of the 95 % confidence interval of the mean; None for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, T975[min(n - 1, len(T975)) - 1] * (var / n) ** 0.5


def fmt_ci(mean, half, scale=1.0, digits=2):
    """'84.12 ± 0.31', or the mean alone without an interval."""
    if half is None:
        return f"{scale * mean:.{digits}f}"
    return f"{scale * mean:.{digits}f} ± {scale * half:.{digits}f}"


def write_csv(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: fmt_csv(r.get(k, "")) for k in fields})


def fmt_csv(v):
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    return v


def md_table(header, rows, align=None):
    align = align or ["---"] * len(header)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def human_bytes(b):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(b) >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def sci(x, digits=2):
    return f"{x:.{digits}e}" if x != 0 else "0"


def clock(seconds):
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def machine_section(meta):
    lines = [
        f"- Command: `{meta.get('command', '?')}` (mode: {meta.get('mode', '?')})",
        f"- Machine: {meta.get('nproc', '?')} cores (`nproc`), CPU `{meta.get('cpu', '?')}` "
        f"(`lscpu | grep 'Model name'`), {meta.get('mem_gib', '?')} GiB memory",
        f"- Date: {meta.get('started_utc', '?')} to {meta.get('finished_utc', '?')} "
        f"({clock(float(meta.get('total_s', 0)))} of trainings)",
        f"- Binary: `{meta.get('peertrain_version', '?')}`, git commit {meta.get('git_commit', '?')}",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- plots

def gnuplot_terminal():
    """pngcairo when this gnuplot has it, else the libgd png terminal."""
    try:
        probe = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True, timeout=30)
        if "pngcairo" in probe.stdout + probe.stderr:
            return "pngcairo enhanced font 'sans,10'"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "png enhanced font 'sans,10'"


def run_gnuplot(script_path, png_path):
    res = subprocess.run(["gnuplot", script_path], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"gnuplot {script_path} failed:\n{res.stderr}")
    if not is_png(png_path):
        raise RuntimeError(f"gnuplot {script_path} wrote no PNG at {png_path}:\n{res.stderr}")


def render(script_path, lines, png_path):
    """Writes a gnuplot script of `lines` and runs it into png_path (see run_gnuplot)."""
    with open(script_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    run_gnuplot(script_path, png_path)


def is_png(path):
    try:
        with open(path, "rb") as f:
            return os.path.getsize(path) > len(PNG_MAGIC) and f.read(8) == PNG_MAGIC
    except OSError:
        return False


def write_dat(path, columns, rows):
    """Whitespace-separated data for gnuplot, with a commented header."""
    with open(path, "w") as f:
        f.write("# " + " ".join(columns) + "\n")
        for r in rows:
            f.write(" ".join(repr(float(v)) if not isinstance(v, str) else v for v in r) + "\n")


def log_tics(lo, hi):
    """gnuplot tic list at 1, 2, 5 × 10^k inside [lo, hi], for log axes spanning less
    than a few decades (gnuplot's default labels only the decades)."""
    ticks = [m * 10.0 ** e for e in range(-6, 7) for m in (1, 2, 5) if lo <= m * 10.0 ** e <= hi]
    return "(" + ", ".join(f"'{t:g}' {t!r}" for t in ticks) + ")"


def gp_quote(s):
    return "'" + str(s).replace("'", "''") + "'"
