"""Writes experiments/heterogeneity's README.md, CSVs and plots from the runs in a results folder.

Usage: report.py RESULTS_DIR. Everything is computed from the runs' summary.json (x̄'s final
test accuracy, the spectral gap), listed in manifest.tsv.

The split of the gap to all-reduce, per seed (the same seed draws the same shards, model and
batches for every setting, so the differences are paired):
  gap(graph, form)      = acc(all-reduce) − acc(graph, form)
  form's share          = acc(all-reduce) − acc(complete, form)   (W = J: no spectral gap left)
  spectral gap's share  = acc(complete, form) − acc(graph, form)
The two shares add up to the gap exactly, seed by seed; each is given as a mean with a 95 %
confidence interval over the seeds (Student's t).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import expkit as ek  # noqa: E402

FORM_NAMES = {"cta": "cta (D-PSGD)", "atc": "atc", "d2": "D²", "allreduce": "all-reduce"}


def alpha_label(a):
    return "∞ (iid)" if a == "inf" else a


def alpha_value(a):
    return float("inf") if a == "inf" else float(a)


def main(out):
    runs = ek.read_tsv(os.path.join(out, "manifest.tsv"))
    meta = ek.read_json(os.path.join(out, "meta.json"))
    acc, gaps = {}, {}
    for r in runs:
        s = ek.read_json(os.path.join(out, r["run_dir"], "summary.json"))
        r["accuracy"], r["spectral_gap"] = s["test_accuracy"], s.get("spectral_gap", float("nan"))
        r["local_accuracy"] = s.get("mean_local_accuracy", float("nan"))
        acc[(r["alpha"], r["graph"], r["form"], r["momentum"], r["seed"])] = r["accuracy"]
        if r["graph"] != "allreduce":
            gaps[r["graph"]] = r["spectral_gap"]
    alphas = sorted({r["alpha"] for r in runs}, key=alpha_value, reverse=True)
    momenta = sorted({r["momentum"] for r in runs}, key=float)
    graphs = [g for g in ("ring", "exponential", "complete") if g in gaps]
    forms = [f for f in ("cta", "atc", "d2") if any(r["form"] == f for r in runs)]
    seeds = sorted({r["seed"] for r in runs}, key=int)
    curves = [{"label": r["label"], **p} for r in runs
              for p in ek.per_evaluation(ek.read_metrics(os.path.join(out, r["run_dir"], "metrics.csv")))]
    ek.write_csv(os.path.join(out, "curves.csv"), ["label", "step", "epoch", "train_loss", "avg_accuracy",
                                                   "mean_local_accuracy", "consensus_distance"], curves)
    ek.write_csv(os.path.join(out, "runs.csv"),
                 ["label", "alpha", "graph", "form", "momentum", "seed", "peers", "accuracy", "local_accuracy",
                  "spectral_gap"], runs)

    def accuracies(alpha, graph, form, momentum):
        return [acc[k] for k in ((alpha, graph, form, momentum, s) for s in seeds) if k in acc]

    def paired(alpha, momentum, first, second):
        """Per seed: acc(first) − acc(second), over the seeds both ran."""
        out_ = []
        for s in seeds:
            a, b = (alpha, *first, momentum, s), (alpha, *second, momentum, s)
            if a in acc and b in acc:
                out_.append(acc[a] - acc[b])
        return out_

    settings = [("allreduce", "allreduce")] + [(g, f) for g in graphs for f in forms]
    accuracy_rows, split_rows = [], []
    for m in momenta:
        for g, f in settings:
            row = {"momentum": m, "graph": g, "form": f}
            for a in alphas:
                values = accuracies(a, g, f, m)
                mean, half = ek.mean_ci95(values) if values else (float("nan"), None)
                row[f"acc_a{a}"], row[f"ci_a{a}"] = mean, half if half is not None else float("nan")
            accuracy_rows.append(row)
        for a in alphas:
            for g in graphs:
                for f in forms:
                    total = paired(a, m, ("allreduce", "allreduce"), (g, f))
                    form_share = paired(a, m, ("allreduce", "allreduce"), ("complete", f))
                    spectral = paired(a, m, ("complete", f), (g, f))
                    if not total:
                        continue
                    row = {"alpha": a, "momentum": m, "graph": g, "form": f, "seeds": len(total)}
                    for name, values in (("gap", total), ("form_share", form_share), ("spectral_share", spectral)):
                        mean, half = ek.mean_ci95(values) if values else (float("nan"), None)
                        row[name], row[name + "_ci95"] = mean, half if half is not None else float("nan")
                    split_rows.append(row)
    acc_fields = ["momentum", "graph", "form"] + [k for a in alphas for k in (f"acc_a{a}", f"ci_a{a}")]
    ek.write_csv(os.path.join(out, "accuracy.csv"), acc_fields, accuracy_rows)
    split_fields = ["alpha", "momentum", "graph", "form", "seeds", "gap", "gap_ci95", "form_share", "form_share_ci95",
                    "spectral_share", "spectral_share_ci95"]
    ek.write_csv(os.path.join(out, "gap_split.csv"), split_fields, split_rows)

    pngs = plot(out, alphas, momenta, graphs, forms, accuracy_rows, split_rows)
    peers = runs[0]["peers"]
    lines = ["# Non-iid data, taken apart: the update form against the spectral gap", "",
             f"Command: `{meta.get('command', 'experiments/heterogeneity/run.sh')}` ({meta.get('mode', '?')} mode). "
             f"{peers} peers, MLP, Dirichlet shards of α = {', '.join(alpha_label(a) for a in alphas)}; "
             f"graphs {', '.join(graphs)} (spectral gap 1 − max|λ| {', '.join(f'{gaps[g]:.3f}' for g in graphs)}) and "
             f"all-reduce; update forms {', '.join(FORM_NAMES[f] for f in forms)}; momentum {' and '.join(momenta)}; "
             f"{len(seeds)} seed(s). Metric: x̄'s final test accuracy (the peers' average model).", "",
             "The split of each gap to all-reduce: the complete graph's W is J, the exact average, so the gap it "
             "leaves with an update form is that form's own (**form's share**); what a sparser graph adds with the "
             "same form is its spectral gap's (**spectral share**). The two add up to the gap seed by seed. "
             + ("Means over the seeds with 95 % confidence intervals (Student's t, paired by seed)."
                if len(seeds) > 1 else "One seed: no confidence intervals; differences below about 0.5 points are "
                                       "within evaluation noise."), ""]
    lines += findings(alphas, momenta, graphs, forms, split_rows, len(seeds))
    lines += ["## x̄'s test accuracy (%)", "", f"![accuracy against α]({pngs[0]})", ""]
    for m in momenta:
        header = ["momentum " + m, *[f"α = {alpha_label(a)}" for a in alphas]]
        body = [[f"{g if g != 'allreduce' else ''} {FORM_NAMES[f]}".strip(),
                 *[ek.fmt_ci(r[f'acc_a{a}'], None if r[f'ci_a{a}'] != r[f'ci_a{a}'] else r[f'ci_a{a}'], scale=100)
                   for a in alphas]] for r in accuracy_rows if r["momentum"] == m for g, f in [(r["graph"], r["form"])]]
        lines += [ek.md_table(header, body), ""]
    lines += ["## The gap to all-reduce, split (points of accuracy)", "", f"![the gap split]({pngs[1]})", ""]
    header = ["α", "momentum", "graph", "form", "gap", "form's share", "spectral share", "spectral share of the gap"]
    body = []
    for r in (r for r in split_rows if r["graph"] != "complete"):
        ratio = f"{100 * r['spectral_share'] / r['gap']:.0f} %" if abs(r["gap"]) >= 0.005 else "– (gap < 0.5)"
        body.append([alpha_label(r["alpha"]), r["momentum"], r["graph"], FORM_NAMES[r["form"]],
                     *[ek.fmt_ci(r[k], None if r[k + "_ci95"] != r[k + "_ci95"] else r[k + "_ci95"], scale=100)
                       for k in ("gap", "form_share", "spectral_share")], ratio])
    lines += [ek.md_table(header, body), "",
              "Rows of the complete graph are left out: its spectral share is zero by definition.", "",
              "## Machine and run", "", ek.machine_section(meta), ""]
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def significant(mean, half):
    return half is not None and half == half and abs(mean) > half


def findings(alphas, momenta, graphs, forms, split_rows, n_seeds):
    """The claims, each with its figure: at the most skewed α, for every momentum, the ring's
    gap with each form, split; and which form leaves the smallest gap on the complete graph."""
    hardest = alphas[-1]
    sparse = graphs[0] if graphs else None
    lines = ["## Observations", ""]
    if sparse is None or sparse == "complete":
        return lines + ["(No sparse graph in this run.)", ""]
    for m in momenta:
        rows = {(r["graph"], r["form"]): r for r in split_rows if r["alpha"] == hardest and r["momentum"] == m}
        for f in forms:
            r = rows.get((sparse, f))
            if not r:
                continue
            ci = lambda k: None if r[k + "_ci95"] != r[k + "_ci95"] else r[k + "_ci95"]
            verdict = []
            if significant(r["form_share"], ci("form_share")):
                verdict.append("the form's share is above zero at 95 %" if r["form_share"] > 0
                               else "the form's share is below zero at 95 %")
            elif n_seeds > 1:
                verdict.append("the form's share is not distinguishable from zero")
            if significant(r["spectral_share"], ci("spectral_share")):
                verdict.append("the spectral share is above zero at 95 %" if r["spectral_share"] > 0
                               else "the spectral share is below zero at 95 %")
            elif n_seeds > 1:
                verdict.append("the spectral share is not distinguishable from zero")
            lines.append(f"- α = {alpha_label(hardest)}, momentum {m}, {sparse}, {FORM_NAMES[f]}: gap "
                         f"{ek.fmt_ci(r['gap'], ci('gap'), scale=100)} points = form "
                         f"{ek.fmt_ci(r['form_share'], ci('form_share'), scale=100)} + spectral "
                         f"{ek.fmt_ci(r['spectral_share'], ci('spectral_share'), scale=100)}"
                         + (f" ({'; '.join(verdict)})." if verdict else "."))
        best = min((r for r in split_rows if r["alpha"] == hardest and r["momentum"] == m and r["graph"] == sparse),
                   key=lambda r: r["gap"], default=None)
        if best:
            overlap = any(r is not best and r["alpha"] == hardest and r["momentum"] == m and r["graph"] == sparse
                          and abs(r["gap"] - best["gap"]) < (r["gap_ci95"] if r["gap_ci95"] == r["gap_ci95"] else 0)
                          + (best["gap_ci95"] if best["gap_ci95"] == best["gap_ci95"] else 0) for r in split_rows)
            lines.append(f"- α = {alpha_label(hardest)}, momentum {m}: the smallest mean gap on the {sparse} is "
                         f"{FORM_NAMES[best['form']]}'s, {100 * best['gap']:.2f} points"
                         + (" (its interval overlaps the others': not a ranking)." if overlap else "."))
    spread = lambda a: [r["gap_ci95"] for r in split_rows if r["alpha"] == a and r["graph"] == sparse
                        and r["gap_ci95"] == r["gap_ci95"]]
    if n_seeds > 1 and spread(hardest) and spread("inf") and hardest != "inf" and \
            max(spread(hardest)) > max(spread("inf")):
        lines.append(f"- The confidence intervals widen with the skew: the {sparse}'s gap is known to ± "
                     f"{100 * max(spread('inf')):.2f} points at most on iid shards and to ± "
                     f"{100 * max(spread(hardest)):.2f} at α = {hardest}, where each seed draws very different "
                     f"shards; {n_seeds} seeds separate only the larger shares from zero.")
    iid = [r for r in split_rows if r["alpha"] == "inf" and r["graph"] == sparse]
    if iid:
        lo, hi = min(iid, key=lambda r: r["gap"]), max(iid, key=lambda r: r["gap"])
        lines.append(f"- iid shards (α = ∞), the reference without skew: the {sparse}'s gaps to all-reduce run from "
                     f"{100 * lo['gap']:.2f} ({FORM_NAMES[lo['form']]}, momentum {lo['momentum']}) to "
                     f"{100 * hi['gap']:.2f} points ({FORM_NAMES[hi['form']]}, momentum {hi['momentum']}).")
    exact = [r for r in split_rows if r["graph"] == "complete" and r["form"] == "atc"]
    if exact:
        worst = max(abs(r["form_share"]) for r in exact)
        lines.append(f"- atc on the complete graph is all-reduce (x ← J(x − u) is the averaged step): its accuracy "
                     f"differs from all-reduce's by at most {100 * worst:.2f} points over {len(exact)} settings.")
    return lines + [""]


def plot(out, alphas, momenta, graphs, forms, accuracy_rows, split_rows):
    """accuracy_vs_alpha.png: x̄'s accuracy against α, one panel per momentum; gap_split.png:
    the ring's gap split into the form's share and the spectral share, one panel per momentum."""
    os.makedirs(os.path.join(out, "plotdata"), exist_ok=True)
    term = ek.gnuplot_terminal()
    xtics = "(" + ", ".join(f"{ek.gp_quote(alpha_label(a).split()[0])} {i}" for i, a in enumerate(alphas)) + ")"
    colours = {"cta": "#1f77b4", "atc": "#2ca02c", "d2": "#d62728", "allreduce": "#000000"}
    dashes = {"ring": 1, "exponential": 3, "complete": 2, "allreduce": 1}
    width = 560 * len(momenta)

    def series(momentum, graph, form):
        r = next(r for r in accuracy_rows if r["momentum"] == momentum and r["graph"] == graph and r["form"] == form)
        return [(i, 100 * r[f"acc_a{a}"], 100 * (r[f"ci_a{a}"] if r[f"ci_a{a}"] == r[f"ci_a{a}"] else 0))
                for i, a in enumerate(alphas)]

    png_a = os.path.join(out, "accuracy_vs_alpha.png")
    gp = [f"set terminal {term} size {width},460", f"set output {ek.gp_quote(png_a)}",
          f"set multiplot layout 1,{len(momenta)} title \"x̄'s test accuracy against the shards' skew (error bars: 95 % CI)\"",
          f"set xtics {xtics}", "set xlabel 'Dirichlet α (right: more skewed)'", "set ylabel 'accuracy (%)'",
          "set grid", "set key bottom left font ',8'", f"set xrange [-0.3:{len(alphas) - 0.7}]"]
    for m in momenta:
        plots = []
        for g, f in [("allreduce", "allreduce")] + [(g, f) for g in graphs for f in forms]:
            path = os.path.join(out, "plotdata", f"acc-{g}-{f}-m{m}.dat")
            ek.write_dat(path, ["x", "accuracy", "ci"], series(m, g, f))
            title = "all-reduce" if g == "allreduce" else f"{g} {FORM_NAMES[f]}"
            plots.append(f"{ek.gp_quote(path)} using 1:2:3 with yerrorlines lw 2 dt {dashes[g]} "
                         f"lc rgb '{colours[f]}' pt 7 ps 0.6 title {ek.gp_quote(title)}")
        gp += [f"set title 'momentum {m}'", "plot " + ", ".join(plots)]
    gp.append("unset multiplot")
    ek.render(os.path.join(out, "plotdata", "accuracy.gp"), gp, png_a)

    png_s = os.path.join(out, "gap_split.png")
    sparse = [g for g in graphs if g != "complete"]
    gp = [f"set terminal {term} size {width},460", f"set output {ek.gp_quote(png_s)}",
          f"set multiplot layout 1,{len(momenta)} title \"The {sparse[0] if sparse else '?'}'s gap to all-reduce, split\\n"
          f"dashed: the form's share (the complete graph's gap); solid: the spectral share\"",
          f"set xtics {xtics}", "set xlabel 'Dirichlet α (right: more skewed)'", "set ylabel 'points of accuracy'",
          "set grid", "set key top left font ',8'", f"set xrange [-0.3:{len(alphas) - 0.7}]"]
    for m in momenta:
        plots = []
        for f in forms:
            for share, dt in (("form_share", 2), ("spectral_share", 1)):
                pts = []
                for i, a in enumerate(alphas):
                    r = next((r for r in split_rows if r["alpha"] == a and r["momentum"] == m and r["form"] == f
                              and sparse and r["graph"] == sparse[0]), None)
                    if r:
                        ci = r[share + "_ci95"]
                        pts.append((i, 100 * r[share], 100 * (ci if ci == ci else 0)))
                path = os.path.join(out, "plotdata", f"split-{f}-{share}-m{m}.dat")
                ek.write_dat(path, ["x", "points", "ci"], pts)
                what = "form" if share == "form_share" else "spectral"
                plots.append(f"{ek.gp_quote(path)} using 1:2:3 with yerrorlines lw 2 dt {dt} lc rgb '{colours[f]}' "
                             f"pt 7 ps 0.6 title {ek.gp_quote(FORM_NAMES[f] + ': ' + what)}")
        gp += [f"set title 'momentum {m}'", "plot " + ", ".join(plots) + ", 0 lc rgb 'grey' notitle"]
    gp.append("unset multiplot")
    ek.render(os.path.join(out, "plotdata", "split.gp"), gp, png_s)
    return [os.path.basename(png_a), os.path.basename(png_s)]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RESULTS_DIR")
    main(sys.argv[1])
