#!/usr/bin/env python3
"""A slow link is not a dead peer: the shipped three-region job with one
link slowed at run time, once per rate.

    bench/scenarios/slow_link [--out DIR] [--rates R1,R2,...] [--link L]
                              [--at S] [--config FILE] [--binary PATH]
                              [--publish | --no-publish]

For each rate (default 200kbit,50kbit) runs `meridian run CONFIG` (default
deploy/configs/three-regions.pbtxt) and, S seconds (default 15) after every
site's workers train (each site's meridian_site_worker_steps_total above
0), `meridian wanem ctl set LINK --bandwidth RATE` (default link us-ap),
both directions, to the end of the run. Then it reads what the run left:
its exit status, report.json (flush_complete, the sites' flush times,
PEER_UNREACHABLE events) and the replicas (OUTDIR/model-SITE.f32). The
goals, per rate: exit status 0, the flush complete, no peer declared
unreachable, and replicas identical up to rounding (largest difference
between any two at most 1e-4). Writes DIR/results.md and DIR/results.json
(default DIR: build/slow_link; --summarize-only writes them again from
DIR/results.json); a run with the default rates, link, time
and job publishes results.md into docs/results/slow_link.md, others only
with --publish. The exit status is 0 whether the goals are met or not (1
when a run could not start). A missing build/bin/meridian is built first.
Only the standard library is used.
"""

import argparse
import array
import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Optional

from scenariolib import ROOT, cli, goals, results, runner, tables

SCENARIO = results.Scenario("slow_link", "A slow link is not a dead peer")
TAG = SCENARIO.name
RATES = "200kbit,50kbit"
LINK = "us-ap"
AT_S = 15.0
CONFIG = os.path.join(ROOT, "deploy", "configs", "three-regions.pbtxt")
# Identical up to rounding: the flush sends what is left losslessly, but
# sites add the same changes in different orders.
REPLICA_TOLERANCE = 1e-4
RUN_TIMEOUT_S = 1800.0


def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("--out", default=os.path.join(ROOT, "build",
                                                      "slow_link"),
                        help="directory for the runs and results")
    parser.add_argument("--rates", default=RATES,
                        help="comma-separated wanem rates, one run each")
    parser.add_argument("--link", default=LINK, help="the link to slow")
    parser.add_argument("--at", type=float, default=AT_S,
                        help="seconds of training before it is slowed")
    parser.add_argument("--config", default=CONFIG, help="the job")
    cli.add_binary(parser, text="the meridian binary")
    cli.add_summarize_only(parser)
    cli.add_publishing(parser, "--rates, --link, --at or --config")
    parser.set_defaults(quick=False)  # publish.py's; this has no quick form
    return cli.parse(parser)


def read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def worker_steps(metrics_address: str) -> float:
    """meridian_site_worker_steps_total at a site's /metrics (0 when it
    does not answer yet)."""
    try:
        with urllib.request.urlopen(f"http://{metrics_address}/metrics",
                                    timeout=5) as reply:
            text = reply.read().decode(errors="replace")
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("meridian_site_worker_steps_total"):
            try:
                return float(line.split()[-1])
            except ValueError:
                return 0.0
    return 0.0


def training_control(run_dir: str) -> Optional[str]:
    """wanem's control endpoint once every site's workers train."""
    endpoints = read_json(os.path.join(run_dir, "endpoints.json"))
    if not endpoints:
        return None
    control, sites, training = None, 0, 0
    for process in endpoints.get("process", []):
        if process.get("role") == "wanem":
            control = process.get("control_address")
        elif process.get("role") == "site":
            sites += 1
            if worker_steps(process.get("metrics_address", "")) > 0:
                training += 1
    return control if sites and training == sites else None


def run_slowed(binary: str, config: str, run_dir: str, link: str,
               rate: str, at_s: float) -> dict:
    """One run with `link` set to `rate` `at_s` after training began."""
    runner.log(TAG, f"{rate}: running {config}; {link} to {rate} {at_s:g} s "
               "into training")
    start = time.time()
    with open(run_dir + ".out", "w") as out:
        proc = subprocess.Popen([binary, "run", config, "--out", run_dir],
                                stdout=out, stderr=subprocess.STDOUT)
        set_result, trained_at, control = None, None, None
        try:
            while proc.poll() is None:
                if time.time() - start > RUN_TIMEOUT_S:
                    runner.stop(proc)
                    break
                time.sleep(0.5)
                if trained_at is None:
                    control = training_control(run_dir)
                    if control:
                        trained_at = time.time()
                elif set_result is None and time.time() - trained_at >= at_s:
                    set_result = subprocess.run(
                        [binary, "wanem", "ctl", "--control", control, "set",
                         link, "--bandwidth", rate],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True)
        except BaseException:
            runner.stop(proc)
            raise
    return {"exit": proc.returncode, "wall_s": time.time() - start,
            "slowed": bool(set_result and set_result.returncode == 0),
            "set_output": (set_result.stdout.strip().splitlines() or [""])[0]
            if set_result else ""}


def replicas(run_dir: str, sites: list[str]) -> tuple[Optional[float], float]:
    """(largest difference between two replicas, largest |weight|)."""
    models = {}
    for site in sites:
        values = array.array("f")
        try:
            with open(os.path.join(run_dir, f"model-{site}.f32"), "rb") as f:
                values.frombytes(f.read())
        except OSError:
            return None, 0.0
        models[site] = values
    first = models[sites[0]]
    if any(len(m) != len(first) for m in models.values()):
        return None, 0.0
    difference = max((abs(a - b) for m in models.values()
                      for a, b in zip(first, m)), default=0.0)
    return difference, max(abs(v) for v in first)


def analyse(run: dict, run_dir: str, rate: str) -> dict:
    report = read_json(os.path.join(run_dir, "report.json")) or {}
    sites = [s["name"] for s in report.get("sites", [])]
    difference, largest = replicas(run_dir, sites) if sites else (None, 0.0)
    unreachable = [e.get("subject", "") for e in report.get("events", [])
                   if e.get("kind") == "PEER_UNREACHABLE"]
    return {
        "rate": rate, **run,
        "flush_complete": bool(report.get("flush_complete")),
        "unreachable": unreachable,
        "replica_difference": difference, "largest_weight": largest,
        "accuracy": {s["name"]: s.get("final_accuracy")
                     for s in report.get("sites", [])},
        "flush_s": {s["name"]: s.get("sync", {}).get("flush_s")
                    for s in report.get("sites", [])},
    }


def row_goals(row: dict) -> list[goals.Goal]:
    rate = row["rate"]
    difference = row["replica_difference"]
    return [
        goals.Goal(f"{rate}: link slowed", "set", row["set_output"] or
                   "not set", row["slowed"]),
        goals.Goal(f"{rate}: exit status", "0", str(row["exit"]),
                   row["exit"] == 0),
        goals.Goal(f"{rate}: final flush", "complete",
                   "complete" if row["flush_complete"] else "incomplete",
                   row["flush_complete"]),
        goals.Goal(f"{rate}: peers declared unreachable", "none",
                   ", ".join(row["unreachable"]) or "none",
                   not row["unreachable"]),
        goals.Goal(f"{rate}: largest difference between replicas",
                   f"≤ {REPLICA_TOLERANCE:g}",
                   "no replicas" if difference is None else
                   f"{difference:.3g} (largest weight "
                   f"{row['largest_weight']:.3g})",
                   difference is not None and
                   difference <= REPLICA_TOLERANCE),
    ]


def table(rows: list[dict]) -> list[str]:
    cells = []
    for row in rows:
        flush = ", ".join(f"{s} {v:.1f}" for s, v in row["flush_s"].items()
                          if v is not None)
        accuracy = ", ".join(f"{s} {v:.4f}"
                             for s, v in row["accuracy"].items()
                             if v is not None)
        difference = row["replica_difference"]
        cells.append((row["rate"], str(row["exit"]),
                      "yes" if row["flush_complete"] else "NO", flush,
                      str(len(row["unreachable"])),
                      "—" if difference is None else f"{difference:.2g}",
                      accuracy, f"{row['wall_s']:.0f}"))
    return tables.table(("rate", "exit", "flush complete",
                         "flush (s, per site)", "unreachable",
                         "replica difference", "final accuracy", "wall (s)"),
                        cells)


def main() -> int:
    args = parse_args()
    rates = [r.strip() for r in args.rates.split(",") if r.strip()]
    if args.summarize_only:
        previous = read_json(os.path.join(args.out, "results.json"))
        if not previous:
            raise SystemExit(f"[{TAG}] no results.json in {args.out}")
        rows = [r for r in previous["rows"] if r["rate"] in rates]
    else:
        binary = runner.require_binary(args.binary, TAG)
        os.makedirs(args.out, exist_ok=True)
        rows = []
        for rate in rates:
            run_dir = os.path.join(args.out, "runs", rate)
            os.makedirs(os.path.dirname(run_dir), exist_ok=True)
            run = run_slowed(binary, os.path.abspath(args.config), run_dir,
                             args.link, rate, args.at)
            rows.append(analyse(run, run_dir, rate))
    for row in rows:
        row["set_output"] = (row["set_output"].splitlines() or [""])[0]
    all_goals = [goal for row in rows for goal in row_goals(row)]
    text = "\n".join(
        [f"`{os.path.basename(args.config)}`, link {args.link} slowed "
         f"{args.at:g} s into training to each rate, to the end of the run "
         "(both directions); one run per rate.", ""] + table(rows) +
        ["", "Goals:", ""] + goals.table(all_goals)) + "\n"
    results.write(args.out, text, {"rows": rows,
                                   "goals": goals.to_json(all_goals)})
    return results.publish_if_wanted(
        SCENARIO, args, text, restricted=(
            args.rates != RATES or args.link != LINK or args.at != AT_S or
            os.path.abspath(args.config) != CONFIG))


if __name__ == "__main__":
    sys.exit(main())
