#!/usr/bin/env python3
"""The worker endpoint under abuse (issue 13): PULL round trips of a
well-behaved worker and the server's memory while others misbehave.

    bench/scenarios/worker_endpoint [--out DIR] [--quick]
                                    [--seconds-per-phase S] [--model-hidden H]
                                    [--flood-connections N]
                                    [--binary PATH] [--driver PATH]
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
  held connections
               up to 10,000 connections opened and held, saying nothing
               (RSS goal for these two: idle RSS + the front's bound)

with the server's RSS before, at most during and after each phase. The goal
line: p99 during abuse at most 2x idle p99 plus the flood's own service time
(the server's time per flood message); RSS bounded by idle RSS +
connections x (send_queue + receive_queue) x (model bytes + 1 MiB), the
defaults of job.proto server.limits. Writes DIR/results.md and
DIR/results.json (default DIR: build/worker_endpoint). --quick: 3 s per
phase. Whether the goal is met never changes the exit status. A run with
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
import os
import subprocess
import sys

from scenariolib import ROOT, cli, results, runner

SCENARIO = results.Scenario("worker_endpoint",
                            "The worker endpoint under abuse")
TAG = SCENARIO.name
DEFAULT_DRIVER = os.path.join(ROOT, "build", "bin", "worker_endpoint_bench")
MODEL_HIDDEN = 256
FLOOD_CONNECTIONS = 20


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
    cli.add_binary(parser, text="the meridian binary")
    parser.add_argument("--driver", default=DEFAULT_DRIVER,
                        help="the worker_endpoint_bench binary")
    cli.add_publishing(parser, "--seconds-per-phase, --model-hidden or "
                       "--flood-connections")
    return cli.parse(parser)


def main() -> int:
    args = parse_args()
    seconds = args.seconds_per_phase
    if seconds is None:
        seconds = 3.0 if args.quick else 10.0
    binary = runner.require_binary(args.binary, TAG)
    driver = runner.require_binary(args.driver, TAG, default=DEFAULT_DRIVER,
                                   target="worker_endpoint_bench")
    os.makedirs(args.out, exist_ok=True)
    command = [driver, "--meridian", binary,
               "--seconds-per-phase", str(seconds),
               "--model-hidden", str(args.model_hidden),
               "--flood-connections", str(args.flood_connections),
               "--out", args.out]
    print("worker_endpoint: " + " ".join(command), flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        return result.returncode
    print(f"worker_endpoint: results in {args.out}/results.md and "
          "results.json")
    with open(os.path.join(args.out, "results.md")) as f:
        text = f.read()
    return results.publish_if_wanted(
        SCENARIO, args, text, restricted=(
            args.seconds_per_phase is not None or
            args.model_hidden != MODEL_HIDDEN or
            args.flood_connections != FLOOD_CONNECTIONS))


if __name__ == "__main__":
    sys.exit(main())
