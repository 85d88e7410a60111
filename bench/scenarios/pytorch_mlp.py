#!/usr/bin/env python3
"""The same MLP as the built-in C++ model and as a PyTorch model through the
package, the job otherwise the same: where the difference goes.

    bench/scenarios/pytorch_mlp OUTDIR [--repeat N] [--quick] [--budget S]
                                [--binary PATH] [--venv DIR] [--dry-run]
                                [--summarize-only]
                                [--publish | --no-publish]

Two jobs, run through `meridian run` in round-robin order (builtin-r1,
pytorch-r1, builtin-r2, ...):
  builtin  deploy/configs/three-regions.pbtxt as shipped: 3 sites x 4 C++
           workers, MLP 784-256-10, SGD lr 0.01 momentum 0.9 batch 64,
           ASYNC 4 local steps, Gaia θ 0.05 with int8 values through
           `meridian wanem`, target 0.87, 60 s of training; the site
           servers evaluate it.
  pytorch  the same text with model { kind: EXTERNAL } whose initial
           weights `meridian export-weights` wrote from the built-in
           model (the same values), each worker group running
           examples/mlp/train.py (meridian.Session: the same architecture
           and tensor names, the job's optimizer, batch size and schedule,
           each worker's shard from meridian.data, one thread) and every
           site an evaluator, examples/mlp/evaluate.py (test accuracy and
           loss on the job's test set).
The PyTorch programs run with the package installed as docs/python.md says
(--venv, default build/python-venv: made by the ctest
python_package_install, else here with the documented commands), its bin
first on PATH. After each round, the step alone: `meridian local` of the
built-in job (the C++ worker's step of the model and batch) and
pytorch_mlp_step.py (the PyTorch worker's loop without the session: its
DataLoader batch, its forward/backward/SGD step).

Measured per run (medians of N with ranges): time to 0.87 (every site's
first evaluation at or above it: the latest), WAN bytes until then
(wanem's traffic.csv on the sites' clock: run.json's wanem start and each
site's log line "all N workers joined; training"), final accuracy, worker
steps/s, the commit round trip (blocked_s / commits of report.json's
workers: push the change, get and load the model), compute time per step
(compute_s / steps), site commits until 0.87, the evaluator's cadence,
start-up and the CPU time of the whole run; then where the difference per
worker step goes (computing the step, the commit round trip, the rest) and
the step alone. --quick: one round, shorter step measurements (publishes
into docs/results/pytorch_mlp-quick.md). --budget S sets time_budget_s of
both jobs (default: the shipped 60 s). --dry-run writes and validates both
jobs (exporting the weights) and runs nothing; --summarize-only rebuilds the
tables from OUTDIR's runs. A complete run publishes OUTDIR/results.md into
docs/results/pytorch_mlp.md.
"""

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Optional

from scenariolib import (ROOT, cli, jobs, pytorch, reports, repeats,
                         results, runner, shown, tables)

SCENARIO = results.Scenario(
    "pytorch_mlp", "The same MLP: built-in C++ model against PyTorch through "
    "the package")
TAG = SCENARIO.name
JOBS = ("builtin", "pytorch")
NAMES = {"builtin": "built-in C++ MLP", "pytorch": "PyTorch MLP (package)"}
SHIPPED = "three-regions"
TARGET = 0.87
STEP_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "pytorch_mlp_step.py")
# The step alone: samples `meridian local` trains (64 a step), seconds per
# PyTorch measurement; --quick in brackets.
LOCAL_SAMPLES = (64 * 4000, 64 * 1000)
STEP_SECONDS = (2.0, 0.5)
TRAINING_LINE = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) .*all \d+ workers "
                           r"joined; training")


# ---- the jobs ----------------------------------------------------------------

def write_jobs(args: argparse.Namespace, outdir: str) -> dict[str, str]:
    """OUTDIR/configs/builtin.pbtxt (the shipped job; --budget applied),
    OUTDIR/configs/initial.safetensors (its model's initial weights) and
    OUTDIR/configs/pytorch.pbtxt; name -> path."""
    text = jobs.shipped(SHIPPED)
    if args.budget is not None:
        text = jobs.set_field(text, "time_budget_s", f"{args.budget:g}")
    paths = {"builtin": runner.write_config(outdir, "builtin", text)}
    weights = os.path.join(outdir, "configs", "initial.safetensors")
    pytorch.export_weights(args.binary, paths["builtin"], weights, TAG)
    paths["pytorch"] = runner.write_config(
        outdir, "pytorch", pytorch.external_job(text, "initial.safetensors"))
    return paths


# ---- measuring a run ---------------------------------------------------------

def _local_unix(day_of: float, hh: str, mm: str, ss: str) -> float:
    """HH:MM:SS.mmm of a log line (local time) on the day of `day_of`."""
    day = time.localtime(day_of)
    midnight = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, 0, 0, 0, 0,
                            0, -1))
    t = midnight + int(hh) * 3600 + int(mm) * 60 + float(ss)
    return t + 86400 if t < day_of - 43200 else t  # past midnight


def run_times(run_dir: str) -> dict:
    """{"started": launch, "wanem": wanem's start, "sites": {site: when it
    began training}} in Unix seconds, from run.json and the site logs
    (None when missing)."""
    try:
        with open(os.path.join(run_dir, "run.json")) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return {"started": None, "wanem": None, "sites": {}}
    started = manifest.get("started_unix_s")
    wanem = (manifest.get("wanem") or [{}])[0].get("started_unix_s")
    sites = {}
    logs = os.path.join(run_dir, "logs")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if not (name.startswith("site-") and name.endswith(".log")):
            continue
        with open(os.path.join(logs, name), errors="replace") as f:
            for line in f:
                m = TRAINING_LINE.match(line)
                if m and started:
                    sites[name[5:-4]] = _local_unix(started, *m.groups())
                    break
    return {"started": started, "wanem": wanem, "sites": sites}


def wan_bytes_at(run_dir: str, t_wanem: Optional[float]) -> Optional[float]:
    """Cross-site bytes wanem counted until `t_wanem` seconds after its
    start (linear between the samples of traffic.csv)."""
    path = os.path.join(run_dir, "traffic.csv")
    if t_wanem is None or not os.path.exists(path):
        return None
    totals: dict[float, float] = {}
    for row in reports.traffic(path):
        t = float(row["t_s"])
        totals[t] = totals.get(t, 0.0) + float(row["bytes"])
    series = sorted(totals.items())
    if not series:
        return None
    for (t0, b0), (t1, b1) in zip(series, series[1:]):
        if t0 <= t_wanem <= t1:
            return b0 + (b1 - b0) * ((t_wanem - t0) / (t1 - t0)
                                     if t1 > t0 else 1.0)
    return series[0][1] if t_wanem < series[0][0] else series[-1][1]


def measure(run_dir: str, report: dict, extra: dict) -> dict:
    """The row of one run. `extra`: {"wall_s", "cpu_s"} the scenario
    measured around it."""
    sites = report.get("sites", [])
    reached = lambda p: (p.get("accuracy") or 0) >= TARGET  # noqa: E731
    times = run_times(run_dir)
    firsts = {s["name"]: reports.first(s.get("timeline", []), reached)
              for s in sites}
    row = {"time_to_target_s": reports.time_to(reports.timelines(report),
                                               reached),
           "final_accuracy": report.get("final_accuracy"),
           "wan_bytes": report.get("wan_bytes_total"),
           "wall_s": extra.get("wall_s"), "cpu_s": extra.get("cpu_s")}
    # Bytes until every site had reached the target, on wanem's clock.
    moments = [times["sites"].get(n, 0) + p["t_s"] if p else None
               for n, p in firsts.items()]
    if (moments and None not in moments and times["wanem"]
            and len(times["sites"]) == len(sites)):
        row["wan_bytes_to_target"] = wan_bytes_at(
            run_dir, max(moments) - times["wanem"])
    else:
        row["wan_bytes_to_target"] = None
    row["site_commits_to_target"] = (
        sum(p["commits"] for p in firsts.values())
        if firsts and None not in firsts.values() else None)
    workers = report.get("workers", [])
    steps = sum(w.get("steps", 0) for w in workers)
    commits = sum(w.get("commits", 0) for w in workers)

    def per(total_key: str, count: int) -> Optional[float]:
        return (sum(w.get(total_key, 0.0) for w in workers) / count * 1e3
                if count else None)

    row.update({
        "steps_per_s": (statistics.mean(w.get("steps_per_s", 0.0)
                                        for w in workers)
                        if workers else None),
        "round_trip_ms": per("blocked_s", commits),
        "compute_ms": per("compute_s", steps),
        "commit_per_step_ms": per("blocked_s", steps),
        "wait_per_step_ms": per("device_wait_s", steps),
        "steps_per_commit": steps / commits if commits else None,
    })
    points = [s.get("timeline", []) for s in sites]
    gaps = [b["t_s"] - a["t_s"] for tl in points for a, b in zip(tl, tl[1:])]
    row["eval_interval_s"] = statistics.median(gaps) if gaps else None
    row["eval_first_s"] = (statistics.median(tl[0]["t_s"] for tl in points
                                             if tl) if any(points) else None)
    row["startup_s"] = (min(times["sites"].values()) - times["started"]
                        if times["sites"] and times["started"] else None)
    row["cores"] = (extra["cpu_s"] / extra["wall_s"]
                    if extra.get("cpu_s") and extra.get("wall_s") else None)
    return row


def run_one(args: argparse.Namespace, name: str, label: str,
            config: str) -> dict:
    """`meridian run` of one job into OUTDIR/runs/LABEL; its row. The CPU
    time of every process of the run (they are all waited-for descendants)
    is saved in OUTDIR/runs/LABEL.json with the wall time."""
    run_dir = os.path.join(args.outdir, "runs", label)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = runner.run_job(args.binary, TAG, label, config, run_dir,
                          runner.timeout_for(args.budget or 60))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra = {"wall_s": done.wall_s,
             "cpu_s": (after.ru_utime - before.ru_utime +
                       after.ru_stime - before.ru_stime)}
    with open(run_dir + ".json", "w") as f:
        json.dump(extra, f)
    return measure(run_dir, done.report, extra)


def load_one(args: argparse.Namespace, label: str) -> dict:
    """--summarize-only: the row of OUTDIR/runs/LABEL."""
    run_dir = os.path.join(args.outdir, "runs", label)
    try:
        with open(run_dir + ".json") as f:
            extra = json.load(f)
    except (OSError, ValueError):
        extra = {}
    return measure(run_dir, reports.read(run_dir, TAG), extra)


# ---- the step alone ----------------------------------------------------------

def step_alone(args: argparse.Namespace, configs: dict[str, str],
               label: str) -> dict:
    """The C++ step (`meridian local` of the built-in job: ms per step of
    batch 64) and the PyTorch worker's loop (pytorch_mlp_step.py), one after
    the other; saved in OUTDIR/runs/LABEL.json."""
    samples = LOCAL_SAMPLES[args.quick]
    local = subprocess.run([args.binary, "local", configs["builtin"],
                            "--samples", str(samples)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    m = re.search(r"(\d+) steps, (\d+) samples in ([\d.]+) s", local.stdout)
    out = {"cpp_step_ms": (float(m.group(3)) / int(m.group(1)) * 1e3
                           if m and local.returncode == 0 else None)}
    if out["cpp_step_ms"] is None:
        runner.log(TAG, f"meridian local failed: {local.stdout[-500:]}")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    step = subprocess.run(["python3", STEP_HELPER, configs["pytorch"],
                           "--site", "us", "--seconds",
                           str(STEP_SECONDS[args.quick])],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env)
    try:
        torch_step = json.loads(step.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        runner.log(TAG, f"{shown(STEP_HELPER)} failed: {step.stderr[-500:]}")
        torch_step = {}
    out.update({f"torch_{k}": v for k, v in torch_step.items()
                if k.endswith("_ms")})
    with open(os.path.join(args.outdir, "runs", label + ".json"), "w") as f:
        json.dump(out, f)
    runner.log(TAG, f"{label}: {out}")
    return out


# ---- tables ------------------------------------------------------------------

def ms(v: float) -> str:
    return f"{v:.2f}"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{b / a:.2f}×" if a and b is not None else tables.MISSING


ROWS = (  # key, what, format, counted, unreached
    ("time_to_target_s", f"time to {TARGET} (s of training, every site)",
     lambda v: f"{v:.1f}", "reached", True),
    ("wan_bytes_to_target", f"WAN bytes to {TARGET}", tables.data_size,
     "reached", True),
    ("final_accuracy", "final accuracy", lambda v: f"{v:.4f}", "runs", False),
    ("steps_per_s", "worker steps/s (mean of 12)", lambda v: f"{v:.1f}",
     "runs", False),
    ("round_trip_ms", "commit round trip (ms; blocked_s / commits)", ms,
     "runs", False),
    ("compute_ms", "compute time per step (ms; compute_s / steps)", ms,
     "runs", False),
    ("site_commits_to_target", f"commits applied to {TARGET} (3 sites)",
     lambda v: f"{v:.0f}", "reached", True),
    ("wan_bytes", "WAN bytes in all", tables.data_size, "runs", False),
    ("eval_first_s", "first evaluation (s of training)",
     lambda v: f"{v:.1f}", "runs", False),
    ("eval_interval_s", "evaluations every (s, median)",
     lambda v: f"{v:.1f}", "runs", False),
    ("startup_s", "start-up: launch to training (s)", lambda v: f"{v:.1f}",
     "runs", False),
    ("cores", "CPU in use (cores: CPU s of every process / wall s)",
     lambda v: f"{v:.2f}", "runs", False),
)
UNREACHED = [key for key, *_, unreached in ROWS if unreached]


def main_table(summary: dict[str, dict]) -> list[str]:
    rows = []
    for key, what, fmt, counted, _ in ROWS:
        a, b = summary["builtin"].get(key), summary["pytorch"].get(key)
        rows.append([what, repeats.fmt_cell(a, fmt, counted),
                     repeats.fmt_cell(b, fmt, counted),
                     ratio(repeats.median(a), repeats.median(b))])
    return tables.table(["", NAMES["builtin"], NAMES["pytorch"],
                         "PyTorch / C++"], rows)


def breakdown(med: dict[str, dict]) -> tuple[list[str], dict]:
    """Where the difference per worker step goes (ms, medians): computing
    the step, the commit round trip per step, the rest of the cycle; and
    the parts' shares of the difference."""
    parts = {}
    for name in JOBS:
        row = med[name]
        cycle = 1e3 / row["steps_per_s"] if row.get("steps_per_s") else None
        compute, commit = row.get("compute_ms"), row.get("commit_per_step_ms")
        wait = row.get("wait_per_step_ms") or 0.0
        rest = (cycle - compute - commit - wait
                if None not in (cycle, compute, commit) else None)
        parts[name] = {"compute": compute, "commit": commit, "wait": wait,
                       "rest": rest, "cycle": cycle}
    a, b = parts["builtin"], parts["pytorch"]
    total = (b["cycle"] - a["cycle"]
             if None not in (a["cycle"], b["cycle"]) else None)
    lines = []
    labels = (("compute", "computing the step (compute_s / steps)"),
              ("commit", "commit round trip, per step (blocked_s / steps)"),
              ("wait", "emulated device wait"),
              ("rest", "the rest (bookkeeping, scheduling, heartbeats)"),
              ("cycle", "a worker step (1 / steps/s)"))
    shares = {}
    for key, what in labels:
        x, y = a[key], b[key]
        diff = y - x if None not in (x, y) else None
        share = (diff / total if diff is not None and total and
                 key != "cycle" else None)
        shares[key] = share
        lines.append([what, tables.number(x, 2), tables.number(y, 2),
                      tables.number(diff, 2, missing="—"),
                      "100%" if key == "cycle" and total else
                      tables.number(None if share is None else share * 100,
                                    0, "%")])
    return (tables.table(["ms per worker step", "C++", "PyTorch",
                          "difference", "share of the difference"], lines),
            {"parts": parts, "shares": shares, "difference_ms": total})


def step_table(steps: dict) -> list[str]:
    cell = lambda k: repeats.fmt_cell(steps.get(k), ms)  # noqa: E731
    return tables.table(
        ["ms per step, one process", "value"],
        [["C++ worker step (`meridian local`: sample the batch, forward, "
          "backward, SGD)", cell("cpp_step_ms")],
         ["PyTorch: a batch from the DataLoader", cell("torch_loader_ms")],
         ["PyTorch: forward, backward, optimizer and schedule step",
          cell("torch_step_ms")],
         ["PyTorch: both, as train.py's loop (no session)",
          cell("torch_loop_ms")]])


def note(med: dict, shares: dict, steps_med: dict) -> list[str]:
    """Where the difference goes, in words, from the medians."""
    a, b = med["builtin"], med["pytorch"]
    out = []
    ta, tb = a.get("time_to_target_s"), b.get("time_to_target_s")
    ca, cb = a.get("site_commits_to_target"), b.get("site_commits_to_target")
    if ta and tb:
        out.append(f"The PyTorch job took {tb / ta:.2f}× the built-in job's "
                   f"time to {TARGET}" +
                   (f" with {cb / ca:.2f}× its commits (the same learning "
                    "per commit within that factor): the difference is speed, "
                    "not statistics." if ca and cb else "."))
    sa, sb = a.get("steps_per_s"), b.get("steps_per_s")
    if sa and sb:
        out.append(f"Its workers made {sb / sa:.2f}× the built-in workers' "
                   "steps per second.")
    if shares.get("compute") is not None and shares.get("commit") is not None:
        out.append(
            f"Of the longer worker step, {shares['compute'] * 100:.0f}% is "
            "computing it (Python, the DataLoader and PyTorch's step against "
            "the C++ step, all twelve workers sharing two cores with the "
            f"site servers), {shares['commit'] * 100:.0f}% the commit round "
            "trip (the protocol through the package: the change computed "
            "from the model's tensors, the frames, the model loaded back)"
            + (f" and {shares['rest'] * 100:.0f}% the rest."
               if shares.get("rest") is not None else "."))
    c, lo, st = (steps_med.get(k) for k in ("cpp_step_ms", "torch_loader_ms",
                                            "torch_step_ms"))
    if c and lo is not None and st:
        out.append(f"Alone in one process the PyTorch step is {st / c:.2f}× "
                   f"the C++ step ({st:.2f} against {c:.2f} ms) and its "
                   f"DataLoader adds {lo:.2f} ms a batch "
                   f"({lo / (lo + st) * 100:.0f}% of the loop).")
    ea, eb = a.get("eval_interval_s"), b.get("eval_interval_s")
    fa, fb = a.get("eval_first_s"), b.get("eval_first_s")
    if ea and eb and fa is not None and fb is not None:
        out.append(f"Evaluation: a point every {eb:.1f} s from the evaluator "
                   f"process against {ea:.1f} s from the server's thread "
                   f"(both every eval_period_s, stamped when done); the "
                   f"first at {fb:.1f} s against {fa:.1f} s of training (the "
                   "evaluator joins when its program has loaded), so a time "
                   "to target is seen up to one interval late on either "
                   "side.")
    return out


def results_text(args: argparse.Namespace, summary: dict, steps: dict,
                 med: dict, split: list[str], shares: dict) -> str:
    steps_med = {k: repeats.median(v) for k, v in steps.items()}
    lines = [
        f"# The same MLP: built-in C++ model against PyTorch through the "
        "package", "",
        f"Job: {shown(os.path.join(jobs.CONFIGS_DIR, SHIPPED + '.pbtxt'))} "
        "(3 sites × 4 workers, MLP 784-256-10, batch 64, ASYNC 4 local "
        "steps, Gaia θ 0.05 int8 through `meridian wanem`, "
        f"{args.budget or 60:g} s of training) as shipped (built-in), and "
        "the same job with `model { kind: EXTERNAL }` from `meridian "
        "export-weights` of it, trained by examples/mlp/train.py "
        "(`meridian.Session`, one thread) and evaluated by "
        "examples/mlp/evaluate.py (PyTorch). "
        f"{args.repeat} round(s), round-robin.", "",
        *main_table(summary), "",
        repeats.note(args.repeat, "reached"), "",
        "## Where the difference goes", "",
        *split, "",
        "The step alone, after each round:", "",
        *step_table(steps), "",
        *[f"- {line}" for line in note(med, shares, steps_med)], ""]
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__, whole_doc=True)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true",
                        help="one round, shorter step measurements")
    repeats.add_argument(parser, "job")
    parser.add_argument("--budget", type=float, default=None,
                        help="time_budget_s of both jobs (default: the "
                        "shipped job's, 60)")
    parser.add_argument("--venv", default=pytorch.DEFAULT_VENV,
                        help="a venv with the package installed (default "
                        "build/python-venv, made when missing)")
    cli.add_binary(parser)
    cli.add_dry_run(parser, "write and validate both jobs, run nothing")
    cli.add_summarize_only(parser)
    cli.add_publishing(parser)
    args = cli.parse(parser)
    if args.quick:
        args.repeat = 1
    args.outdir = os.path.abspath(args.outdir)
    args.binary = runner.require_binary(args.binary, TAG,
                                        build=not args.dry_run,
                                        error=parser.error)
    return args


def main() -> int:
    args = parse_args()
    runner.prepare_outdir(args.outdir)
    configs = write_jobs(args, args.outdir)
    if args.dry_run:
        return runner.dry_run(args.binary, TAG, args.outdir,
                              {n: open(configs[n]).read() for n in JOBS},
                              args.repeat)
    if not args.summarize_only:
        pytorch.use_venv(pytorch.ensure_venv(args.venv, TAG))
    rows = {name: [] for name in JOBS}
    steps = []
    for r in range(1, args.repeat + 1):
        for name in JOBS:
            label = repeats.label(name, r, args.repeat)
            rows[name].append(load_one(args, label) if args.summarize_only
                              else run_one(args, name, label, configs[name]))
        label = repeats.label("step", r, args.repeat)
        if args.summarize_only:
            try:
                with open(os.path.join(args.outdir, "runs",
                                       label + ".json")) as f:
                    steps.append(json.load(f))
            except (OSError, ValueError):
                pass
        else:
            steps.append(step_alone(args, configs, label))
    summary = {n: repeats.summarize(rows[n], UNREACHED) for n in JOBS}
    med = {n: repeats.median_row(summary[n]) for n in JOBS}
    step_summary = repeats.summarize(steps)
    split, parts = breakdown(med)
    text = results_text(args, summary, step_summary, med, split,
                        parts["shares"])
    results.write(args.outdir, text, {
        "rows": rows, "summary": summary, "steps": steps,
        "step_summary": step_summary, "breakdown": parts})
    return results.publish_if_wanted(SCENARIO, args, text,
                                     restricted=args.summarize_only)


if __name__ == "__main__":
    sys.exit(main())
