#!/usr/bin/env python3
"""Print finished runs side by side: what each delivered (x̄'s accuracy or bits per byte),
how far the replicas stayed apart, what it sent and how long it took, from each run's
summary.json (docs/outputs.md).

    /usr/bin/python3 scripts/compare_runs.py runs/compare-ring16 runs/compare-exponential16
"""
import argparse
import json
import os
import sys

COLUMNS = [  # (summary.json field, heading, format)
    ("topology", "topology", "{}"),
    ("algorithm", "algorithm", "{}"),
    ("spectral_gap", "spectral gap", "{:.4f}"),
    ("steps", "steps", "{:.0f}"),
    ("test_accuracy", "x̄ accuracy", "{:.4f}"),
    ("val_bits_per_byte", "x̄ bits/byte", "{:.4f}"),
    ("consensus_distance", "consensus", "{:.3e}"),
    ("bytes_sent_per_peer", "MB sent/peer", None),
    ("wall_s", "wall s", "{:.1f}"),
]


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path) as f:
            summary = json.load(f)
    except OSError as e:
        sys.exit(f"error: {path}: cannot read: {e.strerror} (is {run_dir} a finished run's --out?)")
    except json.JSONDecodeError as e:
        sys.exit(f"error: {path}:{e.lineno}: not JSON: {e.msg}")
    if "error" in summary:
        sys.exit(f"error: {path}: the run failed: {summary['error']}")
    return summary


def cell(summary, field, fmt):
    if field not in summary:
        return "—"
    if field == "bytes_sent_per_peer":
        return f"{summary[field] / 1e6:.1f}"
    return fmt.format(summary[field])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (launch --out)")
    args = parser.parse_args()
    summaries = [read_summary(r) for r in args.runs]
    columns = [c for c in COLUMNS if any(c[0] in s for s in summaries)]
    rows = [["run"] + [c[1] for c in columns]]
    for run_dir, s in zip(args.runs, summaries):
        rows.append([os.path.basename(os.path.normpath(run_dir))] + [cell(s, f, fmt) for f, _, fmt in columns])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))


if __name__ == "__main__":
    main()
