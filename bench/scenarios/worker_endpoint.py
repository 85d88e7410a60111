#!/usr/bin/env python3
"""The worker endpoint under abuse (issue 13): PULL round trips of a
well-behaved worker and the server's memory while others misbehave.

    bench/scenarios/worker_endpoint [--out DIR] [--quick]
                                    [--seconds-per-phase S] [--model-hidden H]
                                    [--flood-connections N]
                                    [--repeat N] [--binary PATH]
                                    [--driver PATH]
                                    [--publish | --no-publish]

Runs build/bin/worker_endpoint_bench (bench/worker_endpoint_bench.cc)
against a real `meridian site`: one site, policy ASYNC, an MLP 784-H-10
(default H = 256, about 0.8 MB of parameters), two worker slots. Worker 0
PULLs the whole model in a loop; its round trip p50/p99 is measured in five
phases of S seconds (default 10):

  idle         nothing else talks to the server
  flood        N anonymous connections (default 20) send STATUS_REQUESTs,
               garbage headers, strangers' PULLs and bad HELLOs as fast as
               they are answered (4 in flight each), reading every reply
  slow reader  worker 1's connection stops reading its replies and keeps
               sending PULLs of the whole model
  endless messages
               N strangers each stream one multipart message that never
               ends (raw ZMTP, half in 1 KiB frames, half in empty ones)
  dripping connections
               500 connections each send a byte every 100 ms
  held connections
               up to 10,000 connections opened and held, saying nothing
               (RSS goal for the last three: idle RSS + the front's bound)

with the server's RSS before, at most during and after each phase. The goal
line: p99 during abuse at most 2x idle p99 plus the flood's own service time
(the server's time per flood message); RSS bounded by idle RSS +
connections x (send_queue + receive_queue) x (model bytes + 1 MiB), the
defaults of job.proto server.limits. The driver runs --repeat times
(default 3, --quick 1), each into DIR/run-K; between runs the scenario
waits until the held phase's sockets have left TIME_WAIT (they would
exhaust the loopback's ephemeral ports). DIR/results.md and results.json
(default DIR: build/worker_endpoint) give every phase's median over the
runs with the range, and the goal met by the medians (p99: the median p99
against the median goal; RSS: every run within its bound). --quick: 3 s
per phase, one run. Whether the goal is met never changes the exit status. A run with
the default model and flood publishes results.md into
docs/results/worker_endpoint.md (--quick: worker_endpoint-quick.md), with
the command line, commit, date and machine; a run with its own
--seconds-per-phase, --model-hidden or --flood-connections (the smoke test)
publishes only with --publish, --no-publish never
(bench/scenarios/scenariolib/publish.py). A missing build/bin/meridian or
build/bin/worker_endpoint_bench is built with tools/build first. Only the
standard library is used.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Optional

from scenariolib import ROOT, cli, repeats, results, runner, tables

SCENARIO = results.Scenario("worker_endpoint",
                            "The worker endpoint under abuse")
TAG = SCENARIO.name
DEFAULT_DRIVER = os.path.join(ROOT, "build", "bin", "worker_endpoint_bench")
MODEL_HIDDEN = 256
FLOOD_CONNECTIONS = 20
REPEAT = 3
# The held phase leaves its closed sockets in TIME_WAIT for 60 s; the next
# run starts when fewer than this many are left (or after the deadline).
TIME_WAIT_LEFT = 1000
TIME_WAIT_DEADLINE_S = 120.0


def parse_args() -> argparse.Namespace:
    parser = cli.parser(
        "PULL round trips of a well-behaved worker while the worker "
        "endpoint is flooded and while a connection stops reading")
    parser.add_argument("--out", default=os.path.join(ROOT, "build",
                                                      "worker_endpoint"),
                        help="directory for results.md and results.json")
    parser.add_argument("--quick", action="store_true", help="3 s per phase")
    parser.add_argument("--seconds-per-phase", type=float, default=None)
    parser.add_argument("--model-hidden", type=int, default=MODEL_HIDDEN,
                        help="hidden units of the MLP (the model's size)")
    parser.add_argument("--flood-connections", type=int,
                        default=FLOOD_CONNECTIONS)
    parser.add_argument("--repeat", type=repeats.repeat_count, default=None,
                        metavar="N",
                        help=f"runs of the driver [{REPEAT}; --quick: 1]")
    cli.add_binary(parser, text="the meridian binary")
    parser.add_argument("--driver", default=DEFAULT_DRIVER,
                        help="the worker_endpoint_bench binary")
    cli.add_publishing(parser, "--seconds-per-phase, --model-hidden, "
                       "--flood-connections or --repeat")
    return cli.parse(parser)


def time_wait_sockets() -> int:
    """Sockets in TIME_WAIT (state 06 of /proc/net/tcp and tcp6)."""
    count = 0
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                next(f, None)
                count += sum(1 for line in f if line.split()[3] == "06")
        except OSError:
            pass
    return count


def wait_for_time_wait() -> None:
    """Until fewer than TIME_WAIT_LEFT sockets are in TIME_WAIT, at most
    TIME_WAIT_DEADLINE_S."""
    deadline = time.monotonic() + TIME_WAIT_DEADLINE_S
    left = time_wait_sockets()
    if left >= TIME_WAIT_LEFT:
        print(f"worker_endpoint: waiting for {left} sockets to leave "
              "TIME_WAIT", flush=True)
    while left >= TIME_WAIT_LEFT and time.monotonic() < deadline:
        time.sleep(1.0)
        left = time_wait_sockets()


def run_driver(driver: str, binary: str, args: argparse.Namespace,
               seconds: float, out: str) -> Optional[dict]:
    """One run of the driver into `out`: its results.json, None when it
    failed."""
    os.makedirs(out, exist_ok=True)
    command = [driver, "--meridian", binary,
               "--seconds-per-phase", str(seconds),
               "--model-hidden", str(args.model_hidden),
               "--flood-connections", str(args.flood_connections),
               "--out", out]
    print("worker_endpoint: " + " ".join(command), flush=True)
    if subprocess.run(command, check=False).returncode != 0:
        return None
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def phase_rows(runs: list[dict]) -> list[dict]:
    """Per phase (in the driver's order): the medians and ranges over the
    runs, and whether the goals hold."""
    goal = repeats.median_range(r["p99_goal_ms"] for r in runs)
    rows = []
    for i, first in enumerate(runs[0]["phases"]):
        phases = [r["phases"][i] for r in runs]
        row = {"phase": first["phase"],
               "pulls": repeats.median_range(p["pulls"] for p in phases),
               "failed": sum(p["failed"] for p in phases),
               "p50_ms": repeats.median_range(p["p50_ms"] for p in phases),
               "p99_ms": repeats.median_range(p["p99_ms"] for p in phases),
               "rss_max_mb": repeats.median_range(
                   p["rss_max_bytes"] / 1e6 for p in phases),
               "rss_bound_mb": max(p["rss_bound_bytes"] for p in phases) / 1e6,
               "rss_ok": all(p["rss_max_bytes"] <= p["rss_bound_bytes"]
                             for p in phases)}
        if i == 0:
            row["p99_ok"] = None
        else:
            row["p99_ok"] = (repeats.median(row["p99_ms"]) <=
                             repeats.median(goal))
            row["p99_ok_runs"] = sum(p["p99_ms"] <= r["p99_goal_ms"]
                                     for p, r in zip(phases, runs))
        rows.append(row)
    return rows


def summary_text(args: argparse.Namespace, seconds: float, runs: list[dict],
                 rows: list[dict]) -> str:
    """results.md: the medians table and the goals."""
    ms = lambda v: f"{v:.2f}"  # noqa: E731
    mb = lambda v: f"{v:.1f}"  # noqa: E731
    n = len(runs)
    lines = [f"Worker endpoint under abuse: MLP 784-{args.model_hidden}-10 "
             f"({runs[0]['model_parameters']} parameters, "
             f"{runs[0]['model_parameters'] * 4 / 1e6:.2f} MB), "
             f"{seconds:g} s per phase, {args.flood_connections} flood "
             f"connections, {os.cpu_count()} cores; medians of {n} run"
             f"{'s' if n > 1 else ''} with [ranges] (one run each: "
             "run-K/results.md)", ""]
    header = ["phase", "PULLs", "failed", "p50 ms", "p99 ms",
              "p99 ≤ goal", "RSS max MB", "RSS bound MB", "goal"]
    body = []
    for row in rows:
        p99 = ("-" if row["p99_ok"] is None else
               f"{'yes' if row['p99_ok'] else 'no'} "
               f"({row['p99_ok_runs']} of {n} runs)")
        # The p99 goal is the flood's (issue 38); every abuse phase must
        # keep the worker served (no failed PULL) within its RSS bound.
        served = row["rss_ok"] and row["failed"] == 0
        met = ("-" if row["p99_ok"] is None and served else
               "met" if served and (row["p99_ok"] or
                                    row["phase"] != "flood") else
               "NOT met")
        body.append([row["phase"],
                     repeats.fmt_cell(row["pulls"], lambda v: f"{v:.0f}"),
                     row["failed"], repeats.fmt_cell(row["p50_ms"], ms),
                     repeats.fmt_cell(row["p99_ms"], ms), p99,
                     repeats.fmt_cell(row["rss_max_mb"], mb),
                     mb(row["rss_bound_mb"]), met])
    lines += tables.table(header, body)
    goal = repeats.median_range(r["p99_goal_ms"] for r in runs)
    idle = repeats.median_range(r["idle_p99_ms"] for r in runs)
    service = repeats.median_range(r["flood_service_ms"] for r in runs)
    lines += ["", "Goal (flood): a joined worker's PULL p99 at most 2 × "
              "idle p99 + the flood's service time (the server's CPU time "
              "per flood message), per run: "
              f"{repeats.fmt_cell(goal, ms)} ms (idle p99 "
              f"{repeats.fmt_cell(idle, ms)} ms, service time "
              f"{repeats.fmt_cell(service, lambda v: f'{v:.3f}')} ms); the "
              "median p99 against the median goal; the other phases are "
              "held to the same p99 in the column \"p99 ≤ goal\", but their "
              "goal is that no PULL fails. RSS (every phase): at most the "
              "phase's bound in every run (queued phases: idle RSS + "
              "connections × (send_queue + receive_queue) × (model bytes + "
              "1 MiB); endless, dripping and held: idle RSS + the front's "
              "logged bound)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    args = parse_args()
    seconds = args.seconds_per_phase
    if seconds is None:
        seconds = 3.0 if args.quick else 10.0
    repeat = args.repeat or (1 if args.quick else REPEAT)
    binary = runner.require_binary(args.binary, TAG)
    driver = runner.require_binary(args.driver, TAG, default=DEFAULT_DRIVER,
                                   target="worker_endpoint_bench")
    os.makedirs(args.out, exist_ok=True)
    runs = []
    for k in range(1, repeat + 1):
        if k > 1:
            wait_for_time_wait()
        run = run_driver(driver, binary, args, seconds,
                         os.path.join(args.out, f"run-{k}"))
        if run is None:
            print(f"worker_endpoint: run {k} failed", file=sys.stderr)
            return 1
        runs.append(run)
    rows = phase_rows(runs)
    text = summary_text(args, seconds, runs, rows)
    results.write(args.out, text, {"runs": runs, "phases": rows})
    print(f"worker_endpoint: results in {args.out}/results.md and "
          "results.json")
    return results.publish_if_wanted(
        SCENARIO, args, text, restricted=(
            args.seconds_per_phase is not None or
            args.model_hidden != MODEL_HIDDEN or
            args.flood_connections != FLOOD_CONNECTIONS or
            args.repeat not in (None, REPEAT)))


if __name__ == "__main__":
    sys.exit(main())
