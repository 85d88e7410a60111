#!/usr/bin/env python3
"""Training throughput per step: Meridian's C++ trainer against PyTorch.

    bench/scenarios/workload_speed OUTDIR [--quick] [--repeat N]
                                   [--presets a,b,...] [--batches 16,64]
                                   [--threads T] [--min-time S]
                                   [--binary PATH] [--torch-only]
                                   [--publish | --no-publish]

For each model preset and batch size, N repetitions of one measurement on
each side, interleaved (Meridian, PyTorch, Meridian, PyTorch, ...) so that
the load of a shared machine weighs on both alike; never both at once.
Both sides time the same step on a minibatch already in memory: forward,
mean cross-entropy, backward, SGD update (lr 0.01, momentum 0.9, no weight
decay), input 1x28x28, 10 classes, random data.

  Meridian  `meridian_bench --benchmark_filter='^ModelStep/<preset>/batch:<B>$'
            --benchmark_format=json --benchmark_min_time=S`, one process per
            measurement, one thread; samples/s = items_per_second of the
            Google Benchmark JSON (a `/real_time` suffix on the name is
            accepted too). A binary without that benchmark gives a missing
            cell, not an error.
  PyTorch   in this process (bench/scenarios/torch_models.py: the same
            presets, build() and measure()), torch.set_num_threads(T),
            one inter-op thread, warm-up, then whole steps timed for at least
            S seconds: samples/s = steps * B / elapsed.

Presets (torch_models.py has the layers): lenet5, lenet5-bn, lenet5-gn,
vgg-small, vgg-small-bn, vgg-small-gn, mlp (784-256-10), and mf, matrix
factorisation (users 10000, items 2000, rank 16, l2 0.02, plain SGD lr
0.05, momentum 0; samples are ratings, Zipf-popular random (user, item)
pairs rated 1..5). Default: all of them at batches 16 and 64 (mf: 64 and
1024; --batches applies to every preset), 3 repetitions, 2 s a
measurement, T = 1. `--presets mf` measures matrix factorisation alone.
mf's PyTorch side is measured twice per repetition, nn.Embedding dense
(sparse=False, the default) and sparse (sparse=True), interleaved with
Meridian as one side; the baseline of the cell is the variant with the
higher median, named in the table, the other one in a note.
--quick: lenet5, lenet5-bn, lenet5-gn and vgg-small at batch 64, one
repetition of 0.3 s (explicit flags override it). --torch-only: PyTorch
alone (no binary needed).

The table: samples/s median [min–max] per side, the ratio Meridian/PyTorch
(median of the per-repetition ratios) and whether it meets the goal >= 1.0.
Writes OUTDIR/results.md and OUTDIR/results.json (every raw number). Exits 0
whether or not goals are met; non-zero on a broken setup: no torch (Debian's
python3-torch; without torch here the script re-executes itself under
/usr/bin/python3), a --binary that is not an executable (a missing
build/bin/meridian_bench is built with tools/build first), or a Meridian
benchmark that ran and failed. A run of every preset at the default batches
publishes results.md into docs/results/workload_speed.md (--quick:
workload_speed-quick.md), with the command line, commit, date and machine;
--presets, --batches and --torch-only runs publish only with --publish,
--no-publish never (bench/scenarios/scenariolib/publish.py). Only the
standard library and torch are used.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Optional

import torch_models  # (needs no torch until measuring)
from scenariolib import (ROOT, cli, provenance, results, runner, shown,
                         tables)
from scenariolib.repeats import median_range

SCENARIO = results.Scenario(
    "workload_speed", "Training step throughput: Meridian against PyTorch")
TAG = SCENARIO.name
DEFAULT_BENCH = os.path.join(ROOT, "build", "bin", "meridian_bench")

GOAL = 1.0
# Set in the environment, these change what is measured; the header shows
# them.
ENV_OF_NOTE = ("LD_PRELOAD", "LD_LIBRARY_PATH", "GLIBC_TUNABLES",
               "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_",
               "MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "OMP_WAIT_POLICY",
               "GOMP_SPINCOUNT", "KMP_AFFINITY", "DNNL_MAX_CPU_ISA",
               "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
               "MERIDIAN_NO_SIMD", "MERIDIAN_NO_AVX512")
QUICK_PRESETS = ("lenet5", "lenet5-bn", "lenet5-gn", "vgg-small")


def benchmark_name(preset: str, batch: int) -> str:
    """The name of meridian_bench's step benchmark of a preset and batch."""
    return f"ModelStep/{preset}/batch:{batch}"


def parse_benchmark_json(text: str, preset: str,
                         batch: int) -> Optional[dict]:
    """The measurement of ModelStep/<preset>/batch:<B> in Google Benchmark's
    JSON output `text`: a dict with samples_per_s (items_per_second) and the
    raw fields, None when the output holds no such benchmark. Raises
    ValueError on output that is not Google Benchmark JSON, or when the
    benchmark reported an error."""
    text = text.strip()
    if not text:
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error}): {text[:200]!r}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"),
                                                   list):
        raise ValueError("no 'benchmarks' list in the JSON output")
    wanted = benchmark_name(preset, batch)
    for entry in doc["benchmarks"]:
        name = entry.get("name", "")
        if name not in (wanted, wanted + "/real_time"):
            continue
        if entry.get("run_type", "iteration") != "iteration":
            continue  # aggregates (mean, median, ...) of --repetitions
        if entry.get("error_occurred"):
            raise ValueError(f"{name}: {entry.get('error_message', 'error')}")
        if "items_per_second" not in entry:
            raise ValueError(f"{name}: no items_per_second in its entry")
        rate = float(entry["items_per_second"])
        real = float(entry.get("real_time", 0.0))
        cpu = float(entry.get("cpu_time", 0.0))
        real_time_based = name.endswith("/real_time")
        # items_per_second divides by CPU time unless the benchmark uses
        # real time; the wall-clock rate is what PyTorch's number is.
        wall = rate if real_time_based or real <= 0 else rate * cpu / real
        return {
            "name": name,
            "kernels": (doc.get("context") or {}).get("meridian_kernels"),
            "samples_per_s": rate,
            "wall_samples_per_s": wall,
            "rate_from": "real_time" if real_time_based else "cpu_time",
            "iterations": entry.get("iterations"),
            "real_time": real,
            "cpu_time": cpu,
            "time_unit": entry.get("time_unit", "ns"),
        }
    return None


def list_benchmarks(binary: str) -> Optional[list[str]]:
    """Names meridian_bench offers (--benchmark_list_tests), or None."""
    try:
        proc = subprocess.run([binary, "--benchmark_list_tests"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()]


def run_meridian(binary: str, preset: str, batch: int, min_time: float
                 ) -> tuple[Optional[dict], Optional[str]]:
    """One Meridian measurement: (result dict or None, error text or None).
    None and None: the binary has no such benchmark."""
    # Preset names are [a-z0-9-]: nothing to escape in the regex.
    pattern = f"^{benchmark_name(preset, batch)}(/real_time)?$"
    command = [binary, f"--benchmark_filter={pattern}",
               "--benchmark_format=json", f"--benchmark_min_time={min_time}"]
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              timeout=120 + 30 * min_time)
    except subprocess.TimeoutExpired:
        return None, f"timed out: {' '.join(command)}"
    except OSError as error:
        return None, f"cannot run {binary}: {error}"
    try:
        result = parse_benchmark_json(proc.stdout, preset, batch)
    except ValueError as error:
        return None, f"{error} (exit {proc.returncode}; stderr: " \
                     f"{proc.stderr.strip()[-300:]!r})"
    if result is None:
        if proc.returncode != 0:
            return None, (f"exit {proc.returncode}: "
                          f"{proc.stderr.strip()[-300:]}")
        return None, None
    return result, None


def loaded_blas() -> Optional[str]:
    """The BLAS library this process loaded (torch's Linear layers use it):
    the real path of libblas/libopenblas/libmkl from /proc/self/maps."""
    found = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                base = os.path.basename(path)
                if re.match(r"lib(open)?blas|libmkl_(rt|core)|libblis", base):
                    found.add(os.path.realpath(path))
    except OSError:
        return None
    return ", ".join(sorted(found)) or None


def torch_build_info(torch) -> dict:
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=([^,\s]+)", config)
    return {
        "blas_info": blas.group(1) if blas else None,
        "cpu_capability": (re.search(r"CPU capability usage: (\S+)", config)
                           or [None, None])[1],
        "blas_library": loaded_blas(),
    }


def meridian_build_type(binary: str) -> Optional[str]:
    """CMAKE_BUILD_TYPE of the build tree holding `binary` (bin/..)."""
    cache = os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(binary))), "CMakeCache.txt")
    try:
        with open(cache) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    return line.split("=", 1)[1].strip() or "(none)"
    except OSError:
        pass
    return None


def fmt_rate(cell: Optional[dict]) -> str:
    """Samples/s of a cell: "12,345 [11,000–13,000]" (one repetition: the
    value alone)."""
    if cell is None:
        return "—"
    text = f"{cell['median']:,.0f}"
    if cell["runs"] > 1:
        text += f" [{cell['min']:,.0f}–{cell['max']:,.0f}]"
    return text


def pick_torch_variant(reps: list[dict]) -> Optional[str]:
    """For PyTorch presets measured in several variants (mf: dense and
    sparse embeddings): the variant with the highest median samples/s
    becomes each repetition's "torch" entry. Returns the variant (None for
    presets with one)."""
    medians = {}
    for rep in reps:
        for variant, result in rep["torch_variants"].items():
            medians.setdefault(variant, []).append(result["samples_per_s"])
    best = max(medians, key=lambda v: statistics.median(medians[v]))
    for rep in reps:
        rep["torch"] = rep["torch_variants"][best]
    return None if best == "default" else best


def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=None,
                        help="repetitions per cell (default 3; quick 1)")
    parser.add_argument("--presets", default="",
                        help=", ".join(torch_models.PRESETS))
    parser.add_argument("--batches", default="",
                        help="default 16,64, mf 64,1024 (quick 64)")
    parser.add_argument("--threads", type=int, default=1,
                        help="PyTorch intra-op threads (Meridian: one)")
    parser.add_argument("--min-time", type=float, default=None,
                        help="seconds per measurement (default 2.0; "
                             "quick 0.3)")
    cli.add_binary(parser, DEFAULT_BENCH)
    parser.add_argument("--torch-only", action="store_true",
                        help="measure PyTorch alone")
    cli.add_publishing(parser, "--presets, --batches or --torch-only")
    args = cli.parse(parser)

    args.preset_list = list(QUICK_PRESETS if args.quick
                            else torch_models.PRESETS)
    if args.presets:
        args.preset_list = [p for p in args.presets.split(",") if p]
    unknown = [p for p in args.preset_list if p not in torch_models.PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {', '.join(unknown)} (one of "
                     f"{', '.join(torch_models.PRESETS)})")
    try:
        args.given_batches = ([int(b) for b in args.batches.split(",") if b]
                              if args.batches else None)
    except ValueError:
        parser.error(f"--batches {args.batches!r}: comma-separated integers")
    if args.given_batches is not None and (not args.given_batches or
                                           min(args.given_batches) < 1):
        parser.error("--batches must be positive")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.min_time is None:
        args.min_time = 0.3 if args.quick else 2.0
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.min_time <= 0:
        parser.error("--min-time must be positive")
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    return args


def batches_of(args: argparse.Namespace, preset: str) -> list[int]:
    """The batch sizes a preset is measured at."""
    if args.given_batches is not None:
        return args.given_batches
    if args.quick:
        return [64]
    return torch_models.default_batches(preset)


def measure_cell(args: argparse.Namespace, binary: str, preset: str,
                 batch: int) -> tuple[dict, int]:
    """One cell: `repeat` repetitions of each side, interleaved; returns
    the cell and how many Meridian measurements failed."""
    reps = []
    failures = 0
    for r in range(args.repeat):
        rep = {"repetition": r + 1}
        label = f"{preset} batch {batch} rep {r + 1}/{args.repeat}"
        if not args.torch_only:
            result, error = run_meridian(binary, preset, batch,
                                         args.min_time)
            rep["meridian"] = result
            if error:
                rep["meridian_error"] = error
                failures += 1
                runner.log(TAG, f"{label}: Meridian failed: {error}")
        rep["torch_variants"] = {
            variant or "default": torch_models.measure(
                preset, batch, args.min_time, seed=r, variant=variant)
            for variant in torch_models.variants(preset)}
        reps.append(rep)
        m = rep.get("meridian")
        mer = ("—" if args.torch_only else
               f"{m['samples_per_s']:,.0f}" if m else
               "failed" if rep.get("meridian_error") else "missing")
        tor = ", ".join(
            f"{result['samples_per_s']:,.0f}" +
            ("" if variant == "default" else f" ({variant})")
            for variant, result in rep["torch_variants"].items())
        unit = "ratings/s" if preset == "mf" else "samples/s"
        runner.log(TAG, f"{label}: Meridian {mer}, PyTorch {tor} {unit}")
    torch_variant = pick_torch_variant(reps)
    for rep in reps:
        m = rep.get("meridian")
        t = rep["torch"]["samples_per_s"]
        rep["ratio"] = m["samples_per_s"] / t if m and t else None
    ratio = median_range([r["ratio"] for r in reps])
    measured = [r["meridian"] for r in reps if r.get("meridian")]
    return {
        "preset": preset,
        "batch": batch,
        "parameters": torch_models.parameter_count(preset),
        "meridian": median_range([m["samples_per_s"] for m in measured]),
        "meridian_wall": median_range(
            [m["wall_samples_per_s"] for m in measured]),
        "torch": median_range([r["torch"]["samples_per_s"] for r in reps]),
        "torch_variant": torch_variant,
        "torch_variants": {
            variant: median_range(
                [r["torch_variants"][variant]["samples_per_s"]
                 for r in reps])
            for variant in reps[0]["torch_variants"]},
        "ratio": ratio,
        "goal_met": None if ratio is None else ratio["median"] >= GOAL,
        "repetitions": reps,
    }, failures


def setup_lines(args: argparse.Namespace, binary: str, cells: list[dict],
                info: dict, environment: dict, started: str,
                load: tuple[list[float], list[float]],
                build_type: Optional[str], kernels: list[str]) -> list[str]:
    """What was measured and how: the step of each kind of model, the
    Meridian binary, PyTorch's build and threads, the environment, the
    repetitions, the CPU and its load."""
    lines = []
    if any(c["preset"] != "mf" for c in cells):
        lines += [
            "One SGD step (momentum 0.9, lr 0.01) on a random in-memory "
            "batch, input 1x28x28, 10 classes; samples/s = steps x batch / "
            "seconds.", "",
        ]
    if any(c["preset"] == "mf" for c in cells):
        lines += [
            "mf (matrix factorisation, users 10000, items 2000, rank 16, l2 "
            "0.02 per rating on the rows it touches): one plain SGD step "
            "(lr 0.05, momentum 0) on an in-memory batch of Zipf-popular "
            "(user, item) pairs rated 1..5; its samples are ratings "
            "(ratings/s). Its PyTorch baseline is the faster of "
            "nn.Embedding dense (sparse=False) and sparse (sparse=True), "
            "named in the cell.", "",
        ]
    if args.torch_only:
        meridian_line = "Meridian: not measured (--torch-only)"
    else:
        meridian_line = (f"Meridian: `{shown(binary)}` "
                         f"(build type {build_type or 'unknown'}), "
                         f"{'/'.join(kernels) or 'unknown'} kernels, one "
                         "thread, Google Benchmark items_per_second")
    environment_text = (", ".join(f"`{k}={v}`" for k, v in environment.items())
                        or "no allocator, BLAS or threading variables set")
    mkldnn = ("yes" if info["mkldnn_available"] and info["mkldnn_enabled"]
              else "available, disabled" if info["mkldnn_available"]
              else "no")
    return lines + [
        f"- {meridian_line}",
        f"- PyTorch {info['torch_version']} ({info['python']}), MKL-DNN "
        f"(oneDNN) {mkldnn}, {info['intra_op_threads']} intra-op / "
        f"{info['interop_threads']} inter-op thread(s), BLAS "
        f"{info['blas_info']} ({info['blas_library'] or 'not loaded'}), "
        f"CPU capability {info['cpu_capability']}",
        f"- Environment: {environment_text}",
        f"- {args.repeat} repetition(s) per cell of at least "
        f"{args.min_time:g} s, sides interleaved; cells are median "
        "[min–max]; ratio = median of the per-repetition Meridian/PyTorch "
        "ratios",
        f"- CPU: {provenance.cpu_model()} ({os.cpu_count()} logical CPUs); "
        f"load average {load[0][0]:.2f} at start, {load[1][0]:.2f} at end",
        f"- Date: {started}", "",
    ]


def cells_table(args: argparse.Namespace, cells: list[dict]) -> list[str]:
    """Per preset and batch: each side's samples/s, their ratio, the
    goal."""
    rows = []
    for cell in cells:
        ratio = cell["ratio"]
        if ratio is None:
            ratio_text, met = "—", "—"
        else:
            ratio_text = f"{ratio['median']:.2f}"
            if ratio["runs"] > 1:
                ratio_text += f" [{ratio['min']:.2f}–{ratio['max']:.2f}]"
            met = "yes" if cell["goal_met"] else "**no**"
        if cell["meridian"] is not None:
            meridian_text = fmt_rate(cell["meridian"])
        elif args.torch_only:
            meridian_text = "not measured"
        elif any(r.get("meridian_error") for r in cell["repetitions"]):
            meridian_text = "failed"
        else:
            meridian_text = "missing (no benchmark)"
        torch_text = fmt_rate(cell["torch"])
        if cell["torch_variant"]:
            torch_text += f" ({cell['torch_variant']})"
        rows.append([cell["preset"], f"{cell['parameters']:,}",
                     cell["batch"], meridian_text, torch_text, ratio_text,
                     met])
    return tables.table(
        ["preset", "parameters", "batch", "Meridian samples/s",
         "PyTorch samples/s", "ratio (Meridian/PyTorch)",
         f"goal ≥ {GOAL:.1f} met?"], rows)


def notes(cells: list[dict]) -> list[str]:
    """The goal's count, and notes on CPU-time rates, slower PyTorch
    variants and failed benchmarks (none: [])."""
    measured = [c for c in cells if c["goal_met"] is not None]
    lines = [""]
    if measured:
        met = sum(1 for c in measured if c["goal_met"])
        lines.append(f"Goal (Meridian ≥ {GOAL:.1f}× PyTorch) met in {met} of "
                     f"{len(measured)} measured cells.")
    cpu_based = [r["meridian"] for c in cells for r in c["repetitions"]
                 if r.get("meridian")
                 and r["meridian"]["rate_from"] == "cpu_time"
                 and r["meridian"]["real_time"] > 0
                 and abs(r["meridian"]["cpu_time"] /
                         r["meridian"]["real_time"] - 1) > 0.05]
    if cpu_based:
        lines.append(f"Note: {len(cpu_based)} Meridian measurement(s) report "
                     "items_per_second from CPU time that differs by more "
                     "than 5% from wall time (results.json: "
                     "wall_samples_per_s); PyTorch's rate is wall time.")
    for cell in cells:
        others = [(v, r) for v, r in cell["torch_variants"].items()
                  if v != "default" and v != cell["torch_variant"]]
        if others:
            lines.append(
                f"- {cell['preset']} batch {cell['batch']}: PyTorch " +
                ", ".join(f"{v} {fmt_rate(r)}" for v, r in others) +
                f" (slower than {cell['torch_variant']}; results.json: "
                "torch_variants)")
    errors = [(c["preset"], c["batch"], r["meridian_error"]) for c in cells
              for r in c["repetitions"] if r.get("meridian_error")]
    for preset, batch, error in errors[:5]:
        lines.append(f"- Meridian {preset} batch {batch} failed: {error}")
    return lines if len(lines) > 1 else []


def main() -> int:
    args = parse_args()
    binary = os.path.abspath(args.binary)
    if not args.torch_only:
        binary = runner.require_binary(binary, TAG, default=DEFAULT_BENCH,
                                       target="meridian_bench")

    torch = torch_models.require_torch(os.path.abspath(sys.argv[0]),
                                       sys.argv[1:])
    torch_models.set_threads(args.threads)
    info = torch_models.torch_info()
    info.update(torch_build_info(torch))

    offered = None
    if not args.torch_only:
        offered = list_benchmarks(binary)
        if offered is None:
            raise SystemExit(f"[{TAG}] {binary} --benchmark_list_tests "
                             "failed: not a working meridian_bench")
        if not any(n.startswith("ModelStep/") for n in offered):
            runner.log(TAG, f"{binary} has no ModelStep benchmarks: "
                       "Meridian cells will be missing")

    os.makedirs(args.outdir, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    load_start = os.getloadavg()
    cells = []
    failures = 0
    for preset in args.preset_list:
        for batch in batches_of(args, preset):
            cell, failed = measure_cell(args, binary, preset, batch)
            cells.append(cell)
            failures += failed
    load_end = os.getloadavg()

    build_type = None if args.torch_only else meridian_build_type(binary)
    kernels = sorted({r["meridian"].get("kernels") or "unknown"
                      for c in cells for r in c["repetitions"]
                      if r.get("meridian")})
    environment = {k: os.environ[k] for k in ENV_OF_NOTE if k in os.environ}
    lines = ["# Training step throughput: Meridian against PyTorch "
             "(bench/scenarios/workload_speed)", ""]
    lines += setup_lines(args, binary, cells, info, environment, started,
                         (load_start, load_end), build_type, kernels)
    lines += cells_table(args, cells) + notes(cells)
    text = "\n".join(lines) + "\n"
    results.write(args.outdir, text, {
        "date": started,
        "cpu_model": provenance.cpu_model(),
        "logical_cpus": os.cpu_count(),
        "load_average_start": load_start,
        "load_average_end": load_end,
        "torch": info,
        "environment": environment,
        "threads": args.threads,
        "repeat": args.repeat,
        "min_time_s": args.min_time,
        "torch_only": args.torch_only,
        "binary": None if args.torch_only else binary,
        "meridian_build_type": build_type,
        "meridian_kernels": kernels,
        "meridian_benchmarks_offered": offered,
        "goal_ratio": GOAL,
        "cells": cells,
    }, indent=2)
    published = results.publish_if_wanted(
        SCENARIO, args, text,
        restricted=bool(args.presets or args.batches) or args.torch_only)
    return 1 if failures else published


if __name__ == "__main__":
    sys.exit(main())
