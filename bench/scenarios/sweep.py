#!/usr/bin/env python3
"""Fair baselines: every sync method tuned on the same budget, then best
against best.

    bench/scenarios/sweep OUTDIR [--workload NAME] [--methods NAME,...]
                          [--trials N] [--repeat N] [--budget SECONDS]
                          [--seed N] [--binary PATH] [--dry-run]
                          [--summarize-only | --resume]
                          [--publish | --no-publish]

Every method runs geo_vs_lan's three-region job (the same workers, links,
data, device step and time budget: bench/scenarios/geo_vs_lan.py; the
--workload of bench/scenarios/scenariolib/workloads.py, mlp by default) and
gets the same tuning budget: --trials settings of its key knobs (default 6),
its documented setting first, then settings drawn without replacement from
its grid below in an order fixed by --seed. Each trial runs once. A
method's best setting is the one that reaches the workload's target first
(one that misses it ranks after every one that reaches it, by its final
metric); trials within one evaluation period of the fastest count as
tied, and of those the one with the fewest WAN bytes to the target wins.
Then every method's best setting runs --repeat more times (default 3), in
round-robin order across methods, and the table gives their medians and
ranges (bench/scenarios/scenariolib/repeats.py): time to the target, WAN
bytes to it, the final metric, WAN bytes over the run.

Knobs and grids ("inner lr" scales the workers' learning rate: the job's
optimizer block, or the programs' --lr for the language model):
  gaia         θ 0.01 0.02 0.05 0.1 0.2; schedule constant, inverse-sqrt;
               inner lr x0.5 x1 x2; server momentum 0 0.5 0.9 (the site
               servers' momentum on their workers' updates, which is what
               they exchange: Gaia's outer momentum) (int8 blocks of 256 +
               zstd, DS 8: Meridian's default sync)
  diloco       H 20 40 80 160 clocks; outer lr 0.5 0.7 1.0; outer
               momentum 0.8 0.9 (Nesterov); inner lr x0.5 x1 x2 (int8)
  diloco-stream
               Streaming DiLoCo: H 40 80 160 in 4 fragments overlapping
               training, int4 values; outer lr 0.5 0.7 1.0; inner lr
  sparseloco   H 20 40 80; top-k density 1% 2% 3% of each tensor, 2-bit
               values, error feedback (beta 0.95); outer lr 0.7 1.0 (no
               momentum); inner lr
  fedavg       averaging period 10 25 50 100 clocks; inner lr
  gaia-topk    a candidate for the default: Gaia's accumulators (what is
               not sent stays, quantisation error included: error
               feedback) sending the top-k of each tensor every clock at
               density 0.1% 0.25% 0.5% 1%, values in 2 or 4 bits with
               stochastic rounding; DS 8; inner lr; server momentum

Goals (issue 37, from the medians of the best settings): the default
(gaia) reaches the target no later than the best DiLoCo / Streaming
DiLoCo, with at most 0.5x its WAN bytes to the target and no more than the
SparseLoCo baseline's.

OUTDIR/configs and OUTDIR/runs hold every trial (METHOD-tN) and repeat
(METHOD-best-rN); OUTDIR/results.md and results.json the trials, the best
settings and the goals. --dry-run writes and validates every trial's job and
runs nothing. --summarize-only rebuilds the tables from the runs in OUTDIR
(the same flags); --resume runs only what did not finish there (a sweep
that was stopped goes on). A complete run publishes results.md into
docs/results/sweep.md (the language model's: language_model.md); --methods
and --summarize-only runs publish only with --publish.
"""

import dataclasses
import itertools
import os
import random
import re
import shutil
import sys
from typing import Callable, Optional

import geo_vs_lan as geo
from scenariolib import (cli, goals as goal_rows, jobs, pytorch, reports,
                         repeats, results, runner, tables, workloads)
from scenariolib.goals import Goal

SCENARIO = results.Scenario("sweep", "Every sync method tuned, best against "
                            "best")
TAG = SCENARIO.name
DEFAULT_METHOD = "gaia"
INNER_LR = (1.0, 0.5, 2.0)  # multipliers; the first is the default
# The site servers' momentum on their workers' updates (server { momentum }:
# v = mu*v + U; W += v, and v is what the sites exchange): Gaia's
# counterpart of DiLoCo's outer momentum. The first is the default.
SERVER_MOMENTUM = (0.0, 0.5, 0.9)


@dataclasses.dataclass(frozen=True)
class Method:
    """A sync method: its knobs' grids (the first value of each is the
    documented setting) and the sync block of one setting."""
    name: str
    grid: dict[str, tuple]
    sync: Callable[[dict], str]

    def settings(self, trials: int, seed: int) -> list[dict]:
        """`trials` settings: the documented one, then the rest of the grid
        in an order fixed by `seed` (and the method's name)."""
        keys = list(self.grid)
        every = [dict(zip(keys, values))
                 for values in itertools.product(*self.grid.values())]
        first, rest = every[0], every[1:]
        random.Random(f"{seed}/{self.name}").shuffle(rest)
        return [first] + rest[:max(trials - 1, 0)]


def diloco_sync(period: int, outer_lr: float, momentum: float,
                compression: str, extra: str = "") -> str:
    nesterov = "true" if momentum > 0 else "false"
    return (f"sync {{ kind: DILOCO averaging_period: {period} "
            f"diloco {{ outer_lr: {outer_lr:g} outer_momentum: {momentum:g} "
            f"nesterov: {nesterov} {extra}}} {compression} }}")


def sparseloco_sync(period: int, density: float, outer_lr: float) -> str:
    return diloco_sync(
        period, outer_lr, 0, "compression { selection: TOP_K "
        f"top_k_fraction: {density:g} value_coding: VALUE_INT2 block_size: "
        "256 rounding: ROUND_STOCHASTIC }",
        "error_feedback: true error_feedback_decay: 0.95 ")


METHODS = {m.name: m for m in [
    Method("gaia", {"theta": (0.05, 0.01, 0.02, 0.1, 0.2),
                    "schedule": ("THRESHOLD_CONSTANT",
                                 "THRESHOLD_INVERSE_SQRT"),
                    "inner_lr": INNER_LR,
                    "server_momentum": SERVER_MOMENTUM},
           lambda k: jobs.gaia_sync(k["theta"], jobs.INT8, 8, k["schedule"])),
    Method("diloco", {"H": (160, 20, 40, 80), "outer_lr": (0.7, 0.5, 1.0),
                      "momentum": (0.9, 0.8), "inner_lr": INNER_LR},
           lambda k: diloco_sync(k["H"], k["outer_lr"], k["momentum"],
                                 jobs.INT8)),
    Method("diloco-stream", {"H": (40, 80, 160), "outer_lr": (0.7, 0.5, 1.0),
                             "inner_lr": INNER_LR},
           lambda k: diloco_sync(k["H"], k["outer_lr"], 0.9, jobs.INT4,
                                 "fragments: 4 overlap: true ")),
    Method("sparseloco", {"H": (40, 20, 80), "density": (0.02, 0.01, 0.03),
                          "outer_lr": (1.0, 0.7), "inner_lr": INNER_LR},
           lambda k: sparseloco_sync(k["H"], k["density"], k["outer_lr"])),
    Method("fedavg", {"period": (50, 10, 25, 100), "inner_lr": INNER_LR},
           lambda k: jobs.model_averaging(k["period"])),
    Method("gaia-topk", {"density": (0.0025, 0.001, 0.005, 0.01),
                         "bits": (2, 4), "inner_lr": INNER_LR,
                         "server_momentum": SERVER_MOMENTUM},
           lambda k: jobs.gaia_sync(
               0, "compression { selection: TOP_K top_k_fraction: "
               f"{k['density']:g} value_coding: VALUE_INT{k['bits']} "
               "block_size: 256 rounding: ROUND_STOCHASTIC zstd_level: 1 }",
               8)),
]}


def with_inner_lr(w: workloads.Workload, scale: float) -> workloads.Workload:
    """`w` whose workers' learning rate is `scale` times its own: the
    programs' --lr (the language model's default 2e-3), else the job's
    optimizer block."""
    if scale == 1.0:
        return w
    if w.worker_command:
        return w._replace(worker_command=tuple(w.worker_command) +
                          ("--lr", f"{2e-3 * scale:g}"))
    if w.optimizer:
        return w._replace(optimizer=re.sub(
            r"learning_rate:\s*([0-9.eE-]+)",
            lambda m: f"learning_rate: {float(m.group(1)) * scale:g}",
            w.optimizer, count=1))
    return w._replace(optimizer_per_worker=w.optimizer_per_worker * scale,
                      optimizer_max_lr=w.optimizer_max_lr * scale)


def with_server_momentum(w: workloads.Workload,
                         momentum: float) -> workloads.Workload:
    """`w` whose site servers apply their workers' updates with momentum
    `momentum` (0: as they are)."""
    if momentum == 0:
        return w
    return w._replace(server=f"{w.server} momentum: {momentum:g}".strip())


def setting_text(setting: dict) -> str:
    """"θ 0.05, schedule constant, inner lr x1"."""
    def value(key, v):
        if key == "schedule":
            return v.replace("THRESHOLD_", "").lower().replace("_", "-")
        if key == "density":
            return f"{v * 100:g}%"
        if key == "inner_lr":
            return f"x{v:g}"
        return f"{v:g}"
    names = {"theta": "θ", "inner_lr": "inner lr", "outer_lr": "outer lr",
             "server_momentum": "server momentum"}
    return ", ".join(f"{names.get(k, k)} {value(k, v)}"
                     for k, v in setting.items())


def job_for(s: geo.Setup, name: str, method: Method, setting: dict) -> str:
    """The three-region job of geo_vs_lan with the method's sync at
    `setting` and its inner learning rate."""
    tuned = dataclasses.replace(s, workload=with_server_momentum(
        with_inner_lr(s.workload, setting.get("inner_lr", 1.0)),
        setting.get("server_momentum", 0.0)))
    w = tuned.workload
    program = workloads.command_field(w.worker_command)
    placement = (jobs.sites(tuned.sites, tuned.per_site, w.step_time_s,
                            None, program) + "\n" +
                 geo.links_block(tuned, tuned.sites))
    policy = f"policy {{ kind: ASYNC local_steps: {w.local_steps or 4} }}"
    return geo.job_text(tuned, name, tuned.budget, placement, policy,
                        method.sync(setting))


def rank_key(s: geo.Setup, row: dict, tie_s: float) -> tuple:
    """Sorts trials best first: reached the target (its time in steps of
    `tie_s`, then fewer WAN bytes to it), then the rest by final metric."""
    t = row.get("time_to_target_s")
    if t is None:
        final = row.get(s.final) or 0.0
        return (1, -final if s.workload.higher_is_better else final, 0.0)
    return (0, int(t // tie_s), row.get(f"wan_bytes_to_{s.high}") or 0.0)


def best_trial(s: geo.Setup, trials: list[dict]) -> dict:
    """The best trial: the fastest to the target, of those within one
    evaluation period of it the fewest WAN bytes to it."""
    tie_s = max(s.workload.eval_period_s, 1.0)
    reached = [r for r in trials if r.get("time_to_target_s") is not None]
    if reached:
        fastest = min(r["time_to_target_s"] for r in reached)
        tied = [r for r in reached
                if r["time_to_target_s"] <= fastest + tie_s]
        return min(tied, key=lambda r: (
            r.get(f"wan_bytes_to_{s.high}") or 0.0, r["time_to_target_s"]))
    return min(trials, key=lambda r: rank_key(s, r, tie_s))


def run_or_read(args, s: geo.Setup, label: str, text: str) -> dict:
    """The row of run `label` (geo_vs_lan's measure): run now, or read back
    with --summarize-only (and with --resume when it finished before)."""
    run_dir = os.path.join(args.outdir, "runs", label)
    finished = os.path.exists(os.path.join(run_dir, "report.json"))
    if args.summarize_only or (args.resume and finished):
        report = reports.read(run_dir, TAG)
        wall = report.get("wall_s")
    else:
        if args.resume and os.path.exists(run_dir):
            shutil.rmtree(run_dir)  # a run cut short: run it again
        config = runner.write_config(args.outdir, label, text)
        done = runner.run_job(args.binary, TAG, label, config, run_dir,
                              runner.timeout_for(s.budget))
        report, wall = done.report, done.wall_s
    row = geo.measure(s, label, run_dir, report, wall)
    runner.log(TAG, f"{label}: to {s.high:g} "
               f"{tables.number(row['time_to_target_s'])} s, WAN to it "
               f"{tables.data_size(row[f'wan_bytes_to_{s.high}'])}, final "
               f"{row[s.final]:.4f}")
    return row


def sweep_goals(s: geo.Setup, medians: dict[str, dict]) -> list[Goal]:
    """Issue 37's goals from the medians of the best settings."""
    goals = []
    mine = medians.get(DEFAULT_METHOD)
    if not mine:
        return goals
    t_m, b_m = mine["time_to_target_s"], mine[f"wan_bytes_to_{s.high}"]
    for other in ("diloco", "diloco-stream"):
        row = medians.get(other)
        if not row or row["time_to_target_s"] is None:
            continue
        t_o, b_o = row["time_to_target_s"], row[f"wan_bytes_to_{s.high}"]
        if t_m is not None:
            goals.append(Goal(f"{DEFAULT_METHOD}: time to {s.high:g} vs "
                              f"{other}'s best", "no later",
                              f"{t_m / t_o:.2f}×", t_m <= t_o))
        if b_m and b_o:
            goals.append(Goal(f"{DEFAULT_METHOD}: WAN bytes to {s.high:g} "
                              f"vs {other}'s best", "≤ 0.50×",
                              f"{b_m / b_o:.2f}×", b_m <= 0.5 * b_o))
    row = medians.get("sparseloco")
    if row and b_m and row[f"wan_bytes_to_{s.high}"]:
        b_o = row[f"wan_bytes_to_{s.high}"]
        goals.append(Goal(f"{DEFAULT_METHOD}: WAN bytes to {s.high:g} vs "
                          "sparseloco's best", "≤ 1.00×",
                          f"{b_m / b_o:.2f}×", b_m <= b_o))
    return goals


def trials_table(s: geo.Setup, methods: list[Method],
                 trials: dict[str, list[tuple[dict, dict]]],
                 best: dict[str, int]) -> list[str]:
    rows = []
    for m in methods:
        for i, (setting, row) in enumerate(trials[m.name]):
            rows.append([m.name if i == 0 else "", str(i + 1),
                         setting_text(setting),
                         tables.number(row["time_to_target_s"]),
                         tables.data_size(row[f"wan_bytes_to_{s.high}"]),
                         f"{row[s.final]:.4f}",
                         tables.data_size(row["wan_bytes"]),
                         "best" if best[m.name] == i else ""])
    return tables.table(["method", "trial", "setting",
                         f"time to {s.high:g} (s)",
                         f"WAN bytes to {s.high:g}",
                         f"final {s.workload.metric_name}", "WAN bytes (run)",
                         ""], rows)


def best_table(s: geo.Setup, methods: list[Method], settings: dict,
               summary: dict, n: int) -> list[str]:
    rows = []
    for m in methods:
        cells = summary[m.name]

        def cell(key, fmt, counted="runs"):
            return repeats.fmt_cell(cells.get(key), fmt, counted)
        rows.append([m.name, setting_text(settings[m.name]),
                     cell("time_to_target_s", tables.number, "reached"),
                     cell(f"wan_bytes_to_{s.high}", tables.data_size,
                          "reached"),
                     cell(s.final, lambda v: f"{v:.4f}"),
                     cell("wan_bytes", tables.data_size),
                     cell("wan_cost_usd", lambda v: f"${v:.2g}"),
                     cell("compute_utilization", lambda v: f"{v * 100:.0f}%"),
                     cell("round_density", lambda v: f"{v * 100:.3g}%"),
                     cell("bits_per_entry", lambda v: f"{v:.1f}")])
    return tables.table(["method", "best setting",
                         f"time to {s.high:g} (s)",
                         f"WAN bytes to {s.high:g}",
                         f"final {s.workload.metric_name}",
                         "WAN bytes (run)", "WAN bill (run)",
                         "compute utilization",
                         "density of an exchange",
                         "wire bits per entry"], rows) + (
        ["", repeats.note(n)] if n > 1 else [])


def parse_args():
    parser = cli.parser(__doc__)
    parser.add_argument("outdir")
    parser.add_argument("--methods", default="",
                        help="comma-separated (default: all)")
    parser.add_argument("--trials", type=int, default=6,
                        help="settings tried per method (default 6)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per run (default geo_vs_lan's: 1.5x "
                             "the workload's)")
    parser.add_argument("--seed", type=int, default=1,
                        help="the order settings are drawn in")
    parser.add_argument("--resume", action="store_true",
                        help="read back the runs that finished in OUTDIR "
                             "(report.json written) and run the rest: a "
                             "sweep stopped midway goes on; the same flags")
    # Medians of 3 by default: the comparisons are best against
    # best, each a median with its range.
    repeats.add_argument(parser, "best setting", default=3)
    workloads.add_argument(parser)
    cli.add_binary(parser)
    cli.add_dry_run(parser)
    cli.add_summarize_only(parser)
    cli.add_publishing(parser, "--methods")
    args = cli.parse(parser)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    unknown = [m for m in args.methods.split(",") if m and m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {', '.join(unknown)}; known: "
                     f"{', '.join(METHODS)}")
    return args


def main() -> int:
    args = parse_args()
    runner.prepare_outdir(args.outdir)
    w = pytorch.prepare_workload(
        workloads.get(args.workload), args.outdir, TAG,
        install=not (args.summarize_only or args.dry_run))
    s = geo.Setup(workload=w, budget=(args.budget if args.budget is not None
                                      else w.budget_s * 1.5))
    methods = [METHODS[m] for m in (args.methods.split(",") if args.methods
                                    else METHODS) if m]
    plan = {m.name: m.settings(args.trials, args.seed) for m in methods}
    if args.dry_run:
        binary = runner.require_binary(args.binary, TAG, build=False)
        return runner.dry_run(binary, TAG, args.outdir, {
            f"{m.name}-t{i + 1}": job_for(s, f"{m.name}-t{i + 1}", m, k)
            for m in methods for i, k in enumerate(plan[m.name])}, 1)
    if not args.summarize_only:
        args.binary = runner.require_binary(args.binary, TAG)

    # The trials: round-robin over methods, so drift hits each alike.
    trials: dict[str, list[tuple[dict, dict]]] = {m.name: [] for m in
                                                   methods}
    for i in range(args.trials):
        for m in methods:
            if i < len(plan[m.name]):
                label = f"{m.name}-t{i + 1}"
                row = run_or_read(args, s, label,
                                  job_for(s, label, m, plan[m.name][i]))
                trials[m.name].append((plan[m.name][i], row))
    best = {}
    for m in methods:
        rows = [row for _, row in trials[m.name]]
        best[m.name] = rows.index(best_trial(s, rows))
    settings = {m.name: trials[m.name][best[m.name]][0] for m in methods}

    # The best settings, --repeat runs each.
    runs: dict[str, list[dict]] = {m.name: [] for m in methods}
    for r, name in repeats.order([m.name for m in methods], args.repeat):
        label = f"{name}-best-r{r}"
        runs[name].append(run_or_read(args, s, label, job_for(
            s, label, METHODS[name], settings[name])))
    summary = {name: repeats.summarize(rows, [
        key for key in rows[0] if key.startswith(geo.TO_TARGET)])
        for name, rows in runs.items()}
    medians = {name: {"name": name, **repeats.median_row(summary[name])}
               for name in runs}
    goals = sweep_goals(s, medians)

    wl = s.workload
    text = "\n".join([
        "# Every sync method tuned, best against best (bench/scenarios/"
        "sweep)", "",
        f"{wl.description} on {wl.dataset}, geo_vs_lan's three-region job "
        f"({len(s.sites)} sites × {s.per_site} workers, links "
        f"{s.bandwidth}), {s.budget:.0f} s per run, target {s.high:g}; "
        f"{args.trials} trials per method (seed {args.seed}), the best "
        f"setting of each run {args.repeat} more times.", "",
        "Best settings (medians of their repeat runs):", "",
        *best_table(s, methods, settings, summary, args.repeat), "",
        *goal_rows.table(goals), "", "Every trial:", "",
        *trials_table(s, methods, trials, best)]) + "\n"
    results.write(args.outdir, text, {
        "workload": wl.name, "trials": args.trials, "seed": args.seed,
        "repeat": args.repeat, "budget_s": s.budget,
        "methods": [{"method": m.name, "best_setting": settings[m.name],
                     "trials": [{"setting": k, **row}
                                for k, row in trials[m.name]],
                     "best_runs": runs[m.name],
                     "summary": summary[m.name]} for m in methods],
        "goals": goal_rows.to_json(goals)})
    return results.publish_if_wanted(
        dataclasses.replace(SCENARIO, file=wl.results_file), args, text,
        restricted=bool(args.methods) or args.summarize_only)


if __name__ == "__main__":
    sys.exit(main())
