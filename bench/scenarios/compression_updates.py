#!/usr/bin/env python3
"""The compression pipelines on each workload's real updates.

    bench/scenarios/compression_updates OUTDIR [--workload a,b,...] [--quick]
                                        [--updates N] [--warmup-steps N]
                                        [--theta X] [--min-time S]
                                        [--binary PATH] [--dry-run]
                                        [--publish | --no-publish]

For each workload of bench/scenarios/scenariolib/workloads.py (default: mlp,
cnn, cnn-gn, mf), writes a one-site job with the workload's model, data and
optimizer, the scenarios' local steps per commit (the workload's own, else 4)
and Gaia's default filter (threshold 0.05, RELATIVE), and runs
`compression_bench --job=FILE` on it: the model trained in that process,
`--updates` changes of it recorded after `--warmup-steps` steps, every
pipeline run on three kinds of update, tensor by tensor as the servers
encode them (bench/compression/compression_bench.cc):

  commit              the change over one commit's local steps
  significant         what the significance filter takes from the
                      accumulated commits (what a site sends its peers)
  significant-random  the same values at random positions: what the real
                      positions' structure is worth to index coding and zstd

Defaults: 16 updates after 1000 steps, 0.5 s per measurement. --quick: 4
updates after 200 steps, 0.05 s. The CNN's warm-up takes a few seconds of
training; MF's generates its 2 M ratings first (about 2 s).

Writes OUTDIR/<workload>.pbtxt (the job), OUTDIR/<workload>.md
(compression_bench's table), OUTDIR/results.json (per workload, pipeline and
kind: entries, density, encoded bytes per update, bytes per entry, ratio to
the dense fp32 model, encode and decode throughput) and OUTDIR/results.md
(a side-by-side table of the encoded size per update for the pipelines
Meridian's sync uses, and the ratio of real to random positions).
--dry-run writes the jobs and checks them with `meridian validate` only.
Exits non-zero when a run fails. A run of every default workload publishes
results.md into docs/results/compression_updates.md (--quick:
compression_updates-quick.md), with the command line, commit, date and
machine; a run of fewer workloads publishes only with --publish,
--no-publish never (bench/scenarios/scenariolib/publish.py).
"""

import argparse
import json
import os
import subprocess
import sys

from scenariolib import ROOT, cli, jobs, results, runner, tables, workloads

SCENARIO = results.Scenario("compression_updates",
                            "Compression pipelines on real updates")
TAG = SCENARIO.name
DEFAULT_WORKLOADS = ("mlp", "cnn", "cnn-gn", "mf")
KINDS = ("commit", "significant", "significant-random")
# The pipelines of the side-by-side table: what Meridian's sync sends by
# default (int8 blocks + zstd), int4 (Streaming DiLoCo's), fp32 (no coding).
SUMMARY_PIPELINES = ("fp32", "int8+zstd1", "int4+zstd1")
THETA = 0.05
DEFAULT_BENCH = os.path.join(ROOT, "build", "bin", "compression_bench")


def job_text(w: workloads.Workload, theta: float) -> str:
    """A one-site job of the workload, one worker, the scenarios' local
    steps per commit and Gaia's default filter."""
    lines = [f'name: "compression-{w.name}"', "seed: 1",
             workloads.training_blocks(w, 1),
             'site { name: "one" workers { count: 1 } }',
             f"policy {{ kind: ASYNC local_steps: {w.local_steps or 4} }}",
             jobs.gaia_sync(theta)]
    return "\n".join(lines) + "\n"


def run_one(args: argparse.Namespace, w: workloads.Workload,
            job_path: str) -> tuple[dict, object]:
    """compression_bench on the job: its table in OUTDIR/<workload>.md, its
    measurements parsed."""
    cmd = [args.binary, f"--job={job_path}", f"--updates={args.updates}",
           f"--warmup_steps={args.warmup_steps}",
           f"--benchmark_min_time={args.min_time}",
           "--benchmark_format=json"]
    print("$ " + " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{w.name}: compression_bench exited {done.returncode}:\n"
                 f"{done.stderr[-2000:]}")
    table = done.stderr[done.stderr.find("\nReal updates"):].strip()
    with open(os.path.join(args.outdir, w.name + ".md"), "w") as f:
        f.write(table + "\n")
    print(table, flush=True)
    return parse(json.loads(done.stdout))


def parse(report: dict) -> tuple[dict, object]:
    """{(pipeline, kind): row} from compression_bench's JSON output."""
    rows = {}
    memcpy = None
    for b in report.get("benchmarks", []):
        name = b.get("name", "")
        if name.startswith("BM_MemcpyModel"):
            memcpy = b.get("bytes_per_second")
            continue
        parts = name.split("/")
        if len(parts) < 3 or parts[0] not in ("BM_EncodeReal",
                                              "BM_DecodeReal"):
            continue
        row = rows.setdefault((parts[1], parts[2]), {})
        if b.get("error_occurred"):
            row["error"] = b.get("error_message", "failed")
            continue
        if parts[0] == "BM_EncodeReal":
            row["model_elements"] = b.get("model_elements")
            row["encoded_bytes"] = b.get("encoded_bytes")
            row["entries"] = b.get("entries")
            row["encode_bytes_per_second"] = b.get("bytes_per_second")
        else:
            row["decode_bytes_per_second"] = b.get("bytes_per_second")
    return rows, memcpy


def human(n: float) -> str:
    """A size as compression_bench's table prints it: "1.23 MB",
    "4.5 kB"."""
    return tables.data_size(n, missing="n/a", kilo_digits=1)


def fraction(ratio: float) -> str:
    """A size ratio as the C++ table prints it: 1/250, 1/42.3."""
    return f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.1f}"


def summary(results: dict) -> str:
    """The side-by-side table: per workload and kind of update, the encoded
    size of each SUMMARY_PIPELINES pipeline against the dense fp32 model,
    int8+zstd1's bytes per entry and real / random positions."""
    rows = []
    for name, r in results.items():
        dense = r["parameters"] * 4
        for kind in ("commit", "significant"):
            cells = []
            for p in SUMMARY_PIPELINES:
                b = r["rows"].get(f"{p}/{kind}", {}).get("encoded_bytes")
                cells.append(f"{human(b)} (1/{fraction(dense / b)})" if b
                             else "n/a")
            goal = r["rows"].get(f"int8+zstd1/{kind}", {})
            per_entry = (f"{goal['encoded_bytes'] / goal['entries']:.2f}"
                         if goal.get("entries") else "n/a")
            ratio = "—"
            if kind == "significant":
                rnd = r["rows"].get("int8+zstd1/significant-random", {})
                if goal.get("encoded_bytes") and rnd.get("encoded_bytes"):
                    real = goal["encoded_bytes"]
                    ratio = f"{real / rnd['encoded_bytes']:.2f}"
            density = (f"{100 * goal['entries'] / r['parameters']:.2f}%"
                       if goal.get("entries") is not None else "n/a")
            rows.append([name, f"{r['parameters']:,}", kind, density, *cells,
                         per_entry, ratio])
    return "\n".join(tables.table(
        ["workload", "parameters", "update", "density",
         *(f"{p} per update (vs dense fp32)" for p in SUMMARY_PIPELINES),
         "int8+zstd1 bytes per entry",
         "real / random positions (int8+zstd1)"], rows)) + "\n"


def workload_results(w: workloads.Workload, rows: dict,
                     memcpy: object) -> dict:
    """results.json's entry of one workload: its rows by PIPELINE/KIND with
    bytes per entry, density and the ratio to the dense fp32 model."""
    parameters = next((int(v["model_elements"]) for v in rows.values()
                       if v.get("model_elements")), None)
    entry = {
        "description": w.description, "parameters": parameters,
        "memcpy_bytes_per_second": memcpy,
        "rows": {f"{p}/{k}": v for (p, k), v in rows.items()},
    }
    for v in entry["rows"].values():
        if v.get("entries"):
            v["bytes_per_entry"] = v["encoded_bytes"] / v["entries"]
        if parameters and v.get("entries") is not None:
            v["density"] = v["entries"] / parameters
        if parameters and v.get("encoded_bytes"):
            v["dense_fp32_over_encoded"] = (parameters * 4 /
                                            v["encoded_bytes"])
    return entry


def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__, whole_doc=True)
    parser.add_argument("outdir")
    parser.add_argument("--workload", default=",".join(DEFAULT_WORKLOADS),
                        help="comma-separated, of: " +
                        ", ".join(workloads.WORKLOADS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--updates", type=int)
    parser.add_argument("--warmup-steps", type=int)
    parser.add_argument("--theta", type=float, default=THETA)
    parser.add_argument("--min-time", type=float)
    cli.add_binary(parser, DEFAULT_BENCH, "the compression_bench binary")
    parser.add_argument("--meridian", default=runner.DEFAULT_MERIDIAN)
    cli.add_dry_run(parser, "write the jobs and validate them, run nothing")
    cli.add_publishing(parser, "--workload (fewer than the defaults)")
    args = cli.parse(parser)
    args.names = [n for n in args.workload.split(",") if n]
    for n in args.names:
        if n not in workloads.WORKLOADS:
            parser.error(f"--workload {n}: not one of "
                         f"{', '.join(workloads.WORKLOADS)}")
    if args.updates is None:
        args.updates = 4 if args.quick else 16
    if args.warmup_steps is None:
        args.warmup_steps = 200 if args.quick else 1000
    if args.min_time is None:
        args.min_time = 0.05 if args.quick else 0.5
    if args.updates < 1 or args.warmup_steps < 0 or args.min_time <= 0:
        parser.error("--updates >= 1, --warmup-steps >= 0, --min-time > 0")
    if not args.theta >= 0:
        parser.error("--theta must be >= 0")
    return args


def main() -> int:
    args = parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    if args.dry_run:
        meridian = runner.require_binary(args.meridian, TAG, build=False)
    else:
        args.binary = runner.require_binary(args.binary, TAG,
                                            default=DEFAULT_BENCH,
                                            target="compression_bench")
    measured = {}
    for n in args.names:
        w = workloads.get(n)
        job_path = os.path.join(args.outdir, n + ".pbtxt")
        with open(job_path, "w") as f:
            f.write(job_text(w, args.theta))
        if args.dry_run:
            ok, output = runner.validate(meridian, job_path)
            if not ok:
                sys.exit(f"{n}: {job_path} is not valid:\n{output}")
            print(f"{n}: {job_path} valid")
            continue
        measured[n] = workload_results(w, *run_one(args, w, job_path))
    if args.dry_run:
        return 0
    settings = {"updates": args.updates, "warmup_steps": args.warmup_steps,
                "theta": args.theta, "min_time_s": args.min_time}
    text = (f"Real updates: {args.updates} per workload after "
            f"{args.warmup_steps} steps, significance filter θ "
            f"{args.theta:g} RELATIVE; sizes are means per update.\n\n" +
            summary(measured))
    results.write(args.outdir, text,
                  {"settings": settings, "workloads": measured}, echo=False)
    print("\n" + text)
    return results.publish_if_wanted(
        SCENARIO, args, text,
        restricted=not set(DEFAULT_WORKLOADS) <= set(args.names))


if __name__ == "__main__":
    sys.exit(main())
