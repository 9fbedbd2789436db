#!/usr/bin/python3
"""The chaos soak: peers train the MLP with D-PSGD while, every --event-every seconds or
so, one of them is killed (SIGKILL, then restarted with --rejoin) or stalled (SIGSTOP for a
random time, then SIGCONT; one stalled past the deadline is dropped, stops when it wakes,
and is restarted with --rejoin too). One peer is out at a time. Then a fault-free run of
the same flags trains as many samples.

Reported (stdout, chaos.json, and README.md with the targets), against the fault-free run:
  goodput       samples trained per second (peers in × steps × batch, between the first and
                the last evaluation the coordinator wrote) over the fault-free run's;
  accuracy      x̄'s test accuracy at the end against the fault-free run's at equal samples;
  longest stall over each interval between two evaluations of one coordinator, its time
                (the coordinator's wall_s) less its steps at the median time per step:
                time lost beyond steady training, against the failure detector's
                deadline (--peer-timeout / 2) plus 3 median steps;
  membership    every survivor's view after each switch (lost set, coordinator, epoch and
                the whole recomputed W, hashed: "membership view at step S ... hash H" in
                each peer's log), compared across the peers that switched at S.
Exit status 0 when no peer stopped that was not the one an event hit, every hit peer came
back, every switch's hashes agree, and the runs trained (x̄ above chance); 1 otherwise.
Network cuts (scripts/netlab.sh) and peers joining a running set are not among the events.

Usage: chaos.py --bin build/peertrain --out DIR [--minutes 60] [--peers 8] [--event-every 15]
                [--peer-timeout 4] [--seed 1]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

VIEW = re.compile(r"membership view at step (\d+): .* hash ([0-9a-f]{16})")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the peertrain binary")
    p.add_argument("--out", required=True, help="a folder for the runs, the logs and chaos.json")
    p.add_argument("--minutes", type=float, default=60, help="how long the faulty run trains (default 60)")
    p.add_argument("--peers", type=int, default=8, help="peers on an exponential graph (default 8)")
    p.add_argument("--event-every", type=float, default=15, help="mean seconds between events (default 15)")
    p.add_argument("--peer-timeout", type=float, default=4, help="the peers' --peer-timeout (default 4)")
    p.add_argument("--eval-every", type=int, default=1000, help="steps between evaluations (default 1000)")
    p.add_argument("--seed", type=int, default=1, help="seeds the events (default 1)")
    p.add_argument("--report-only", action="store_true",
                   help="recompute the figures from the runs already in --out and rewrite its report")
    a = p.parse_args()
    if a.minutes <= 0 or a.peers < 3 or a.event_every <= 0 or a.peer_timeout <= 0 or a.eval_every < 1:
        sys.exit("error: chaos.py: --minutes, --event-every and --peer-timeout must be positive, --peers at least 3")
    if not a.report_only and not os.access(a.bin, os.X_OK):
        sys.exit(f"error: chaos.py: --bin {a.bin}: not an executable")
    return a


class Run:
    """One training run of `peers` processes started as `peertrain peer`, its logs appended
    per rank across restarts, and the coordinator's evaluations timestamped as they appear."""

    def __init__(self, args, name, max_steps, base_port):
        self.args, self.dir = args, os.path.join(args.out, name)
        shutil.rmtree(self.dir, ignore_errors=True)  # a rerun into the same --out starts afresh
        os.makedirs(self.dir)
        self.topology = os.path.join(self.dir, "topology.yaml")
        with open(self.topology, "w") as f:
            f.write(f"name: chaos{args.peers}\ngraph: {{generator: exponential, n: {args.peers}}}\npeers:\n")
            for r in range(args.peers):
                f.write(f"  - {{id: {r}, host: 127.0.0.1, port: {base_port + r}}}\n")
        self.flags = ["--topology", self.topology, "--hidden", "32", "--batch", "16", "--epochs", "100000",
                      "--max-steps", str(max_steps), "--eval-every", str(args.eval_every), "--connect-timeout", "60",
                      "--peer-timeout", str(args.peer_timeout), "--out", os.path.join(self.dir, "out")]
        self.procs, self.seen, self.evals = {}, 0, []  # evals: (time seen, json)

    def start(self, rank, rejoin=False):
        log = open(os.path.join(self.dir, f"peer-{rank}.log"), "a")
        cmd = [self.args.bin, "peer", "--rank", str(rank)] + self.flags + (["--rejoin"] if rejoin else [])
        self.procs[rank] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        log.close()

    def poll_evals(self):
        path = os.path.join(self.dir, "out", "evals.jsonl")
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return
        for line in lines[self.seen:]:
            try:
                self.evals.append((time.monotonic(), json.loads(line)))
            except json.JSONDecodeError:
                return  # a line still being written: read it next time
            self.seen += 1

    def stop(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            p.wait()

    def samples(self, batch=16):
        """(seconds, samples) between the first and the last evaluation seen."""
        total, last_step = 0, None
        for _, e in self.evals:
            step, inside = int(e["step"]), self.args.peers - len(e.get("lost", []))
            if last_step is not None:
                total += (step - last_step) * inside * batch
            last_step = step
        return (self.evals[-1][0] - self.evals[0][0]) if len(self.evals) > 1 else 0.0, total

    def views(self):
        """{switch step: {rank: set of hashes}} from every peer's log."""
        out = {}
        for r in range(self.args.peers):
            try:
                text = open(os.path.join(self.dir, f"peer-{r}.log"), errors="replace").read()
            except FileNotFoundError:
                continue
            for step, h in VIEW.findall(text):
                out.setdefault(int(step), {}).setdefault(r, set()).add(h)
        return out


def chaos(args, rng):
    """The faulty run: returns it and the list of events."""
    run = Run(args, "chaos", 10**9, 20000 + (os.getpid() * 16) % 20000)
    for r in range(args.peers):
        run.start(r)
    end = time.monotonic() + 60 * args.minutes
    events, out, problems = [], None, []  # out: (rank, kind, back at) while a peer is out
    next_event = time.monotonic() + rng.uniform(0.5, 1.5) * args.event_every
    last_progress = time.monotonic()
    while time.monotonic() < end:
        time.sleep(0.2)
        run.poll_evals()
        now = time.monotonic()
        if len(run.evals) == 0 and now - last_progress > 120:
            problems.append("no evaluation within 2 minutes of the start")
            break
        for r, p in run.procs.items():
            code = p.poll()
            if code is None:
                continue
            if out and out[0] == r:  # the peer the event hit: it comes back
                if out[1] != "kill" or now >= out[2]:
                    run.start(r, rejoin=True)
                    events[-1]["restarts"] = events[-1].get("restarts", 0) + 1
                    out = (r, "back", now)
            else:
                problems.append(f"peer {r} stopped (exit {code}) though no event hit it; see peer-{r}.log")
                run.start(r, rejoin=True)
        if out and out[1] == "stall" and now >= out[2]:
            os.kill(run.procs[out[0]].pid, signal.SIGCONT)
            out = (out[0], "woke", now)
        if out and out[1] in ("woke", "back") and now >= out[2] + 2 * args.peer_timeout:
            out = None  # back (a woken peer that was dropped exits, and is restarted above)
        if out is None and now >= next_event:
            victim = rng.randrange(args.peers)
            if rng.random() < 0.5:
                run.procs[victim].kill()
                out = (victim, "kill", now + rng.uniform(1, 3))
                events.append({"t": round(now - end + 60 * args.minutes, 1), "kind": "kill", "peer": victim})
            else:
                stall = rng.uniform(0.2, 2.5) * args.peer_timeout
                os.kill(run.procs[victim].pid, signal.SIGSTOP)
                out = (victim, "stall", now + stall)
                events.append({"t": round(now - end + 60 * args.minutes, 1), "kind": "stall", "peer": victim,
                               "seconds": round(stall, 2)})
            print(f"[{events[-1]['t']:7.1f} s] {events[-1]['kind']} peer {victim}", flush=True)
            next_event = now + rng.uniform(0.5, 1.5) * args.event_every
    run.poll_evals()
    run.stop()
    return run, events, problems


def baseline(args, samples):
    steps = max(args.eval_every, -(-samples // (args.peers * 16)))
    steps = -(-steps // args.eval_every) * args.eval_every
    run = Run(args, "fault-free", steps, 20000 + (os.getpid() * 16 + 8 * 1024) % 20000)
    for r in range(args.peers):
        run.start(r)
    while any(p.poll() is None for p in run.procs.values()):
        time.sleep(0.2)
        run.poll_evals()
    run.poll_evals()
    bad = [r for r, p in run.procs.items() if p.returncode != 0]
    return run, bad


def machine():
    """'2 cores (AMD EPYC 7B13), Linux 6.x' for the report."""
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model or 'unknown CPU'}), Linux {os.uname().release}"


def write_report(args, r, command):
    """OUT/README.md: the figures beside the targets, with the date, machine and command."""
    met = lambda ok: "yes" if ok else "**no**"
    rows = [
        ("no survivor stops", "peers an event did not hit that stopped", str(len(r["problems"])), "0",
         met(not r["problems"])),
        ("goodput", "samples/s against the fault-free run's", f'{r["goodput"]:.3f}', "≥ 0.80", met(r["goodput"] >= 0.8)),
        ("accuracy", "x̄'s test accuracy at equal samples (points)",
         f'{100 * r["accuracy"]:.2f} against {100 * r["fault_free_accuracy"]:.2f}', "within 1 point",
         met(abs(r["accuracy"] - r["fault_free_accuracy"]) <= 0.01)),
        ("longest stall", "time lost beyond steady training between two evaluations (s)", f'{r["longest_stall_s"]:.2f}',
         f'≤ {r["stall_bound_s"]:.2f} (deadline {args.peer_timeout / 2:g} s + 3 median steps)',
         met(r["longest_stall_s"] <= r["stall_bound_s"])),
        ("membership", "switches whose survivors' views (W included) differ", str(len(r["switches_disagreeing"])),
         f'0 of {r["switches"]}', met(not r["switches_disagreeing"])),
    ]
    lines = [f"# The chaos soak: {r['events']} events in {args.minutes:g} minutes", "",
             f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}, by", "",
             "```", command, "```", "",
             f"{args.peers} peers on an exponential graph train the MLP (hidden 32, batch 16) with D-PSGD, "
             f"`--peer-timeout {args.peer_timeout:g}`; every {args.event_every:g} s or so one peer is killed "
             f"({r['kills']} times) or stalled ({r['stalls']} times, {r['stalls_past_deadline']} of them past the "
             f"deadline, so dropped and restarted with `--rejoin`). The fault-free run trained "
             f"{r['fault_free_samples']:,} samples in {r['fault_free_seconds']} s, the faulty one {r['samples']:,} in "
             f"{r['seconds']} s. What each figure measures: tests/chaos/chaos.py.", "",
             "| figure | what | measured | target | met |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows]
    lines += ["", "Events (seconds from the start): " + ", ".join(
        f'{e["t"]:g} {e["kind"]} {e["peer"]}' + (f' ({e["seconds"]:g} s)' if "seconds" in e else "")
        for e in r["event_log"]), ""]
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write("\n".join(lines))


def stall_figures(evals):
    """(longest stall, median step) from the evaluations' steps and the coordinator's wall_s,
    over the intervals with one coordinator (another's wall_s starts elsewhere)."""
    intervals = [(b["wall_s"] - a["wall_s"], b["step"] - a["step"]) for a, b in zip(evals, evals[1:])
                 if a["coordinator"] == b["coordinator"] and b["step"] > a["step"] and b["wall_s"] > a["wall_s"]]
    median_step = statistics.median(dt / ds for dt, ds in intervals)
    return max(dt - ds * median_step for dt, ds in intervals), median_step


def report_only(args):
    """--report-only: recompute the stall from the runs in OUT and rewrite chaos.json and README.md."""
    with open(os.path.join(args.out, "chaos.json")) as f:
        result = json.load(f)
    with open(os.path.join(args.out, "chaos", "out", "evals.jsonl")) as f:
        evals = [json.loads(line) for line in f if line.strip()]
    stall, median_step = stall_figures(evals)
    result.update(longest_stall_s=round(stall, 2), median_step_s=round(median_step, 5),
                  stall_bound_s=round(args.peer_timeout / 2 + 3 * median_step, 2))
    with open(os.path.join(args.out, "chaos.json"), "w") as f:
        json.dump(result, f, indent=1)
    write_report(args, result, os.environ.get("CHAOS_COMMAND") or result.get("command", "tests/chaos/chaos.py"))


def main():
    args = parse_args()
    if args.report_only:
        return report_only(args)
    os.makedirs(args.out, exist_ok=True)
    rng = random.Random(args.seed)
    run, events, problems = chaos(args, rng)
    if len(run.evals) < 2:
        sys.exit(f"error: chaos.py: the faulty run wrote {len(run.evals)} evaluations; see {run.dir}/peer-*.log")
    seconds, samples = run.samples()
    ref, bad = baseline(args, samples)
    if bad or len(ref.evals) < 2:
        sys.exit(f"error: chaos.py: the fault-free run failed (peers {bad}); see {ref.dir}/peer-*.log")
    ref_seconds, ref_samples = ref.samples()
    goodput = (samples / seconds) / (ref_samples / ref_seconds)
    stall, median_step = stall_figures([e for _, e in run.evals])
    bound = args.peer_timeout / 2 + 3 * median_step
    views = run.views()
    disagree = {s: sorted({h for hs in by_rank.values() for h in hs}) for s, by_rank in views.items()
                if len({h for hs in by_rank.values() for h in hs}) > 1}
    acc, ref_acc = run.evals[-1][1]["avg_acc"], ref.evals[-1][1]["avg_acc"]
    kills = sum(e["kind"] == "kill" for e in events)
    result = {
        "minutes": args.minutes, "peers": args.peers, "events": len(events), "kills": kills,
        "stalls": len(events) - kills, "stalls_past_deadline": sum(e.get("restarts", 0) for e in events if e["kind"] == "stall"),
        "goodput": round(goodput, 4), "samples": samples, "seconds": round(seconds, 1),
        "fault_free_samples": ref_samples, "fault_free_seconds": round(ref_seconds, 1),
        "accuracy": acc, "fault_free_accuracy": ref_acc,
        "longest_stall_s": round(stall, 2), "stall_bound_s": round(bound, 2), "median_step_s": round(median_step, 5),
        "switches": len(views), "switches_disagreeing": {str(k): v for k, v in disagree.items()},
        "problems": problems, "event_log": events,
        "command": os.environ.get("CHAOS_COMMAND") or " ".join(["tests/chaos/chaos.py"] + sys.argv[1:]),
    }
    with open(os.path.join(args.out, "chaos.json"), "w") as f:
        json.dump(result, f, indent=1)
    # bench/chaos.sh names itself as the command to rerun; run directly, this script does.
    write_report(args, result, os.environ.get("CHAOS_COMMAND") or " ".join(["tests/chaos/chaos.py"] + sys.argv[1:]))
    print(f"chaos: {len(events)} events ({kills} kills, {len(events) - kills} stalls) in {args.minutes:g} min on "
          f"{args.peers} peers\n"
          f"  goodput {goodput:.3f} of the fault-free run's ({samples / seconds:.0f} against "
          f"{ref_samples / ref_seconds:.0f} samples/s)\n"
          f"  x̄ accuracy {acc:.4f} against {ref_acc:.4f} fault-free at {samples} against {ref_samples} samples\n"
          f"  longest stall {stall:.2f} s beyond steady training (detector deadline + 3 median steps: {bound:.2f} s)\n"
          f"  membership views: {len(views)} switches, {len(disagree)} disagreeing\n"
          f"  problems: {problems if problems else 'none'}")
    trained = acc > 0.5 and ref_acc > 0.5  # ten classes: chance is 0.1
    sys.exit(0 if not problems and not disagree and trained else 1)


if __name__ == "__main__":
    main()
