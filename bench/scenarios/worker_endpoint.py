#!/usr/bin/env python3
"""The worker endpoint under abuse (issue 13): PULL round trips of a
well-behaved worker and the server's memory while others misbehave.

    bench/scenarios/worker_endpoint [--out DIR] [--quick]
                                    [--seconds-per-phase S] [--model-hidden H]
                                    [--flood-connections N]
                                    [--binary PATH] [--driver PATH]

Runs build/bin/worker_endpoint_bench (bench/worker_endpoint_bench.cc; build
it and `meridian` first: tools/build --target meridian worker_endpoint_bench)
against a real `meridian site`: one site, policy ASYNC, an MLP 784-H-10
(default H = 256, about 0.8 MB of parameters), two worker slots. Worker 0
PULLs the whole model in a loop; its round trip p50/p99 is measured in three
phases of S seconds (default 10):

  idle         nothing else talks to the server
  flood        N anonymous connections (default 20) send STATUS_REQUESTs,
               garbage headers, strangers' PULLs and bad HELLOs as fast as
               they are answered (4 in flight each), reading every reply
  slow reader  worker 1's connection stops reading its replies and keeps
               sending PULLs of the whole model

with the server's RSS before, at most during and after each phase. The goal
line: p99 during abuse at most 2x idle p99 plus the flood's own service time
(the server's time per flood message); RSS bounded by idle RSS +
connections x (send_queue + receive_queue) x (model bytes + 1 MiB), the
defaults of job.proto server.limits. Writes DIR/results.md and
DIR/results.json (default DIR: build/worker_endpoint). --quick: 3 s per
phase. Whether the goal is met never changes the exit status. Only the
standard library is used.
"""

import argparse
import os
import subprocess
import sys

from scenariolib import ROOT


def main():
    parser = argparse.ArgumentParser(
        description="PULL round trips of a well-behaved worker while the "
        "worker endpoint is flooded and while a connection stops reading")
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "worker_endpoint"),
                        help="directory for results.md and results.json")
    parser.add_argument("--quick", action="store_true", help="3 s per phase")
    parser.add_argument("--seconds-per-phase", type=float, default=None)
    parser.add_argument("--model-hidden", type=int, default=256,
                        help="hidden units of the MLP (the model's size)")
    parser.add_argument("--flood-connections", type=int, default=20)
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "meridian"),
                        help="the meridian binary")
    parser.add_argument("--driver",
                        default=os.path.join(ROOT, "build", "bin", "worker_endpoint_bench"),
                        help="the worker_endpoint_bench binary")
    args = parser.parse_args()
    seconds = args.seconds_per_phase
    if seconds is None:
        seconds = 3.0 if args.quick else 10.0
    for path in (args.binary, args.driver):
        if not os.access(path, os.X_OK):
            sys.exit(f"worker_endpoint: {path} is missing; build it first: "
                     "tools/build --target meridian worker_endpoint_bench")
    os.makedirs(args.out, exist_ok=True)
    command = [args.driver, "--meridian", args.binary,
               "--seconds-per-phase", str(seconds),
               "--model-hidden", str(args.model_hidden),
               "--flood-connections", str(args.flood_connections),
               "--out", args.out]
    print("worker_endpoint: " + " ".join(command), flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode == 0:
        print(f"worker_endpoint: results in {args.out}/results.md and results.json")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
