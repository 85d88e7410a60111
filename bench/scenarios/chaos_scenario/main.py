"""Chaos: the three-region job with faults injected on a schedule.

    bench/scenarios/chaos OUTDIR [--quick] [--repeat N] [--binary PATH]
                          [--seed N] [--budget SECONDS] [--reanalyse]
                          [--workload builtin|pytorch-mlp]
                          [--slow-link-rates R1,R2,...|none]
                          [--dry-run] [--publish | --no-publish]

Runs deploy/configs/three-regions.pbtxt (sites us, eu, ap, 4 workers each,
MLP on Fashion-MNIST, Gaia through `meridian wanem`, target 0.87) twice
with the same training budget, through `meridian run`: first fault-free,
then with faults injected on a schedule. Each run has its own directory
OUTDIR/fault-free and OUTDIR/chaos holding its job file (job.pbtxt), the
run's output (--out is that directory), launcher.out, the metrics the
script sampled once a second (samples.jsonl) and what it injected
(injections.json). The job file is the shipped one with: the time budget
set, stop_at_target false, sync { adaptive_threshold: true } (both runs:
the slowed link should move the threshold), security { curve: false }
(plaintext links on loopback, as the other scenarios; a restarted site
server then needs no key exchange) and fault { } at its defaults.

--workload pytorch-mlp trains the same MLP as the user's own PyTorch
model: model { kind: EXTERNAL } with the built-in model's initial weights
(`meridian export-weights`, OUTDIR/<run>/initial.safetensors), every worker
group running examples/mlp/train.py and every site an evaluator running
examples/mlp/evaluate.py (one PyTorch thread each), with the package
installed in build/python-venv as docs/python.md says (made when missing,
offline). The killed workers are then those Python processes (found by
their MERIDIAN_* environment), restarted by `meridian run` as any program.
Its results publish as chaos-pytorch-mlp.

Schedule of the chaos run, in seconds after every site has committed
(full run; --quick in brackets):
  from 5, every 10-20 s  kill -9 of a random worker (seeded), restarted by
                         `meridian run`
  20  [12]   kill -9 of a random site server (restarted with --resume
             from its checkpoint)
  26  [17]   kill -9 of the same site server again, once restarted: within
             its checkpoint period (10 s), so the commits it answered since
             its restart are in no checkpoint (its workers replay them)
  45  [25]   kill -9 of the emulator (`meridian wanem`; restarted, its
             routes added again)
  70  [38]   partition of ap from us and eu (`wanem ctl partition us-ap`,
             `eu-ap`) for 90 s [40 s], then heal both
  180 [88]   SIGSTOP of a random site server for 30 s [15 s], then SIGCONT
  235 [110]  link us-eu slowed 20x (its bandwidth / 20, both directions)
             for 60 s [30 s], then set back
The sites killed and stopped and the workers (and when) come from --seed
[1]; the partitioned site (ap) and the slowed link (us-eu) are fixed.
Training budget 330 s [155 s]; --budget stretches or shrinks the start
times in proportion (the durations stay). Both runs take about 12 minutes
[6 minutes] together. Timed faults end even if the script is interrupted
(SIGCONT, heal). build/bin/meridian is built with tools/build when it is
missing; a binary replaced while the scenario runs is reported.

Measured (OUTDIR/results.json, a table in OUTDIR/results.md): per fault
the detection time (injection to the first matching event of report.json),
the recovery time (end of the fault to the event that ends it), the
training time lost (commit deficit of every site against the fault-free
run over the same window, in seconds of that site's fault-free training);
final accuracy and time to 0.87 of both runs; updates lost (report.json
lost_commits and each site's recovery: 0 wanted, both crashes included, and
the crashed site restarted once per crash); the largest difference between the
final replicas (OUTDIR/<run>/model-<site>.f32); processes and listening
ports left behind; the commit rate of us and eu during the partition
against the fault-free run; the issue's goals, met or missed. Each run's
report.json is copied to OUTDIR/<run>-report.json. --reanalyse runs
nothing and writes the results again from the run directories in OUTDIR.
--dry-run prints the schedule and the order of the runs, writes the job
file to OUTDIR/job.pbtxt, checks it with `meridian validate` and runs
nothing (it builds nothing either).

After the rounds comes the slow-link phase (chaos_scenario/slow_phase.py,
the runs of bench/scenarios/slow_link): the shipped three-region job once
per rate of --slow-link-rates (default 200kbit,50kbit; "none" skips it),
its us-ap link set to that rate 15 s into training to the end of the run.
A slow link must not pass for a dead peer: per rate, exit status 0, the
final flush complete, no peer declared unreachable, replicas identical up
to rounding. Its table and goals are a section of results.md (about 5
minutes for both rates).

--repeat N repeats the whole scenario: N rounds, each a fault-free run and
a chaos run back to back (round 1's two runs, then round 2's, ...: slow
drift of the machine hits both runs of a round, and every round, alike),
every round with the same fault schedule (--seed). One run already repeats
something, the worker kills (20-odd, their median and max in its table);
--repeat repeats the rounds. Round K has its own directory OUTDIR/rK
(OUTDIR/rK/fault-free, OUTDIR/rK/chaos, and its results.md, results.json
and <run>-report.json as a single round writes them in OUTDIR); OUTDIR/
results.md and results.json then aggregate the N rounds: every number of
the tables as the median of the rounds with the range, median (min–max)
(per fault its detection, recovery and training lost; the worker kills:
each round's median and max detection and recovery and its sum of training
lost; the partition's commit rates; the checks); for the time to 0.87 and
a fault's detection and recovery a round that did not reach (detect,
recover) counts as later than any that did (— when the median round did
not), the range is that of the rounds that did, "k of N reached" when not
all did. The goals compare medians of each side (final
accuracy against fault-free, time to 0.87 against fault-free + outage, the
partition's commit rate chaos / fault-free, against the quiet-time ratio
also from medians); a check of each run (updates lost, replica difference,
leftovers) is met when every round met it. results.json keeps every
round's results ("rounds") besides the medians ("summary"). With N = 1 the
layout and the output are as before. --reanalyse with --repeat N reads
OUTDIR/r1 ... OUTDIR/rN.

A run of both publishes OUTDIR/results.md into docs/results/chaos.md
(--quick: chaos-quick.md), with the command line, commit, date and
machine; --reanalyse publishes only with --publish, --no-publish never
(bench/scenarios/scenariolib/publish.py). The modules of chaos_scenario/
are listed in its __init__.py.
"""

import argparse
import json
import os
import random
import shutil
import sys
from typing import Optional

import chaos_scenario
from chaos_scenario import (analyse, checks, log, report, schedule,
                            slow_phase, summary)
from chaos_scenario.inject import run_schedule
from chaos_scenario.job import WORKLOADS, job_text, write_weights
from chaos_scenario.run import Run
from scenariolib import cli, pytorch, repeats, results, runner
from scenariolib import goals as goal_rows

SCENARIO = results.Scenario("chaos", "Chaos scenario")
SCENARIOS = {"builtin": SCENARIO,
             "pytorch-mlp": results.Scenario(
                 "chaos-pytorch-mlp",
                 "Chaos scenario, the MLP as a PyTorch model")}
RUN_NAMES = report.RUN_NAMES


def run_round(args: argparse.Namespace, runs: dict[str, Run],
              events: list[schedule.Event]) -> Optional[int]:
    """Runs a round's fault-free and chaos runs (or, --reanalyse, loads
    them); 130 when interrupted."""
    current = None
    try:
        for name in (() if args.reanalyse else RUN_NAMES):
            run = current = runs[name]
            run.prepare()
            run.launch()
            if run.wait_training():
                run.note_route_ports()
                if name == "chaos":
                    run_schedule(run, events)
                    run.note_route_ports()
            run.wait()
            current = None
    except KeyboardInterrupt:
        if current:
            current.abort()
        log("interrupted")
        return 130
    except BaseException:
        if current:
            current.abort()
        raise
    if args.reanalyse:
        for run in runs.values():
            run.load()
    return None


def analyse_round(args: argparse.Namespace, outdir: str,
                  schedule_desc: list[dict], runs: dict[str, Run]) -> dict:
    """A round's analysis, written to outdir/results.md and results.json;
    returns what --repeat's summary reads of it."""
    args.binary_changed = [n for n, r in runs.items()
                           if r.binary_at_start != r.binary_at_end]
    if args.binary_changed:
        log(f"warning: {args.binary} was replaced during the "
            f"{' and '.join(args.binary_changed)} run (processes restarted "
            "after that ran the new binary)")
    ff, chaos = runs["fault-free"], runs["chaos"]
    reports = {n: analyse.load_report(r) for n, r in runs.items()}
    for n, r in runs.items():
        src = os.path.join(r.dir, "report.json")
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(outdir, f"{n}-report.json"))
    summaries = {n: checks.run_summary(r, reports[n])
                 for n, r in runs.items()}
    replicas = {n: checks.replica_difference(r, reports[n])
                for n, r in runs.items()}
    left = {n: checks.leftovers(r) for n, r in runs.items()}
    faults = (analyse.analyse_faults(chaos, ff, reports["chaos"])
              if chaos.t0 else [])
    part = analyse.partition_rates(chaos, ff, faults) if chaos.t0 else None
    if part is not None:
        part["quiet_ratio"] = analyse.quiet_ratio(chaos, ff, faults)
    goals, outage, outage_parts = report.goals_of(
        summaries["fault-free"], summaries["chaos"], faults, part, replicas,
        left, reports["chaos"])
    text = report.results_text(args, schedule_desc, summaries, faults, part,
                               replicas, left, goals, outage, outage_parts,
                               chaos.injections)
    results.write(outdir, text, report.results_json(
        args, schedule_desc, summaries, faults, part, replicas, left, goals,
        outage), default=str)
    return {"dir": outdir, "summaries": summaries, "faults": faults,
            "part": part, "replicas": replicas, "left": left, "goals": goals,
            "outage": outage, "binary_changed": list(args.binary_changed),
            "exit_codes": [r.exit_code for r in runs.values()],
            "text": text}


def dry_run(args: argparse.Namespace, outdir: str) -> int:
    """--dry-run: the order of the runs, the job file validated."""
    log("runs, in this order: " + ", ".join(
        (f"r{k}/{name}" if args.repeat > 1 else name)
        for k in range(1, args.repeat + 1) for name in RUN_NAMES))
    path = os.path.join(outdir, "job.pbtxt")
    if args.workload == "pytorch-mlp":
        write_weights(args.binary, outdir, "three-regions-chaos", args.budget)
    with open(path, "w") as f:
        f.write(job_text("three-regions-chaos", args.budget, args.workload))
    ok, output = runner.validate(args.binary, path)
    log(f"{path}: {output}")
    return 0 if ok else 1


def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__, whole_doc=True)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true",
                        help="budget 155 s, partition 40 s, SIGSTOP 15 s, "
                        "slowed link 30 s")
    parser.add_argument("--repeat", type=repeats.repeat_count, default=1,
                        metavar="N",
                        help="repeat the whole scenario N times (rounds of a "
                        "fault-free and a chaos run, in OUTDIR/r1 ... rN, the "
                        "same schedule) and report the median of the rounds "
                        "with their range [1]")
    cli.add_binary(parser, text="the meridian binary (default "
                   "build/bin/meridian; built with tools/build when it is "
                   "missing)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the fault schedule (which workers and "
                        "sites, when) [1]")
    parser.add_argument("--budget", type=float, default=None,
                        help="training seconds per run [330, --quick 155]")
    parser.add_argument("--reanalyse", action="store_true",
                        help="run nothing: write the results again from the "
                        "run directories an earlier invocation left in OUTDIR"
                        " (give it the same --quick/--budget/--seed/--repeat)")
    parser.add_argument("--workload", choices=WORKLOADS, default="builtin",
                        help="the job's model: the built-in MLP, or the same "
                        "MLP as a PyTorch model trained by examples/mlp's "
                        "programs [builtin]")
    parser.add_argument("--slow-link-rates", default="200kbit,50kbit",
                        metavar="RATES",
                        help="the slow-link phase after the rounds: one run "
                        "of the shipped job per rate, link us-ap set to it; "
                        "'none' skips the phase [200kbit,50kbit]")
    cli.add_dry_run(parser, "print the schedule and the order of the runs, "
                    "validate the job file (OUTDIR/job.pbtxt); run and build "
                    "nothing")
    cli.add_publishing(parser)
    args = cli.parse(parser)
    args.schedule = schedule.SCHEDULES["quick" if args.quick else "full"]
    if args.budget is None:
        args.budget = args.schedule["budget"]
    args.binary = os.path.abspath(args.binary)
    if not args.reanalyse:  # it runs nothing
        args.binary = runner.require_binary(
            args.binary, "chaos", build=not args.dry_run, error=parser.error)
    return args


def add_slow_phase(outdir: str, data_path: str, text: str,
                   rows: list[dict]) -> str:
    """results.md and results.json (at `data_path`, the round's or the
    rounds' summary) with the slow-link phase added; returns the text."""
    section = "\n".join(slow_phase.section(rows)) + "\n"
    print(section)
    text = text.rstrip("\n") + "\n" + section
    with open(data_path) as f:
        data = json.load(f)
    phase_goals = slow_phase.goals(rows)
    data["slow_link"] = {"rows": rows,
                         "goals": goal_rows.to_json(phase_goals)}
    met = sum(g.met for g in phase_goals)
    log(f"slow-link phase: {met} of {len(phase_goals)} goals met")
    results.write(outdir, text, data, default=str, echo=False)
    return text


def main() -> int:
    args = parse_args()
    events = schedule.build_schedule(random.Random(args.seed), args.schedule,
                                     args.budget)
    schedule_desc = schedule.describe(events)
    os.makedirs(args.outdir, exist_ok=True)
    outdir = os.path.abspath(args.outdir)
    log("schedule: " + ", ".join(
        f"{d['offset_s']:.0f} s {d['fault']} {d['target']}"
        + (f" {d['duration_s']:g} s" if d["duration_s"] else "")
        for d in schedule_desc))
    if args.dry_run:
        return dry_run(args, outdir)
    if args.workload == "pytorch-mlp" and not args.reanalyse:
        # `python3` of the job's programs: the venv's, with the package.
        pytorch.use_venv(pytorch.ensure_venv(pytorch.DEFAULT_VENV, "chaos"))

    rounds = []
    for k in range(1, args.repeat + 1):
        # One round: OUTDIR itself, or OUTDIR/rK (--repeat N).
        chaos_scenario.set_round(k, args.repeat)
        round_dir = (outdir if args.repeat == 1
                     else os.path.join(outdir, f"r{k}"))
        os.makedirs(round_dir, exist_ok=True)
        runs = {name: Run(args.binary, round_dir, name, args.budget,
                          args.workload)
                for name in RUN_NAMES}
        stopped = run_round(args, runs, events)
        if stopped:
            return stopped
        rounds.append(analyse_round(args, round_dir, schedule_desc, runs))
    chaos_scenario.set_round(0, args.repeat)
    slow_rows = slow_phase.run(args.binary, outdir,
                               slow_phase.rates_of(args.slow_link_rates),
                               args.reanalyse)
    text = rounds[0]["text"]
    data_path = os.path.join(rounds[0]["dir"], "results.json")
    if args.repeat > 1:
        s = summary.Summary.of(schedule_desc, rounds)
        goals = summary.summary_goals(s, rounds)
        text = summary.results_text(args, outdir, schedule_desc, rounds, s,
                                    goals)
        results.write(outdir, text, summary.results_json(
            args, schedule_desc, rounds, s, goals), default=str)
        data_path = os.path.join(outdir, "results.json")
    if slow_rows:
        text = add_slow_phase(outdir, data_path, text, slow_rows)
    failed = any(code != 0 for r in rounds for code in r["exit_codes"])
    published = results.publish_if_wanted(SCENARIOS[args.workload], args,
                                          text,
                                          restricted=args.reanalyse)
    return 1 if failed else published


if __name__ == "__main__":
    sys.exit(main())
