"""Running the binaries a scenario drives.

  require_binary  the absolute path of an executable; a missing default
                  binary is built with tools/build --target NAME (when the
                  scenario is about to run something: a dry run or a
                  --summarize-only run builds nothing), any other missing
                  one is an error naming it
  prepare_outdir  OUTDIR/configs and OUTDIR/runs
  write_config    OUTDIR/configs/NAME.pbtxt
  run_job         `meridian run CONFIG --out RUN_DIR` to its end: its output
                  in RUN_DIR.out, its report.json read back; exits naming
                  the run when it fails or outlives its timeout
  validate        `meridian validate FILE`: (accepted, what it printed)
  dry_run         writes every job, validates each, prints the verdicts
  stop            SIGINT to a launcher (it stops its children), SIGKILL if
                  it does not exit in time

Every message is prefixed with the scenario's tag, "[geo_vs_lan] ...".
"""

import dataclasses
import os
import signal
import subprocess
import time
from typing import Callable, Mapping, NoReturn, Optional

from scenariolib import ROOT, reports, repeats, shown

DEFAULT_MERIDIAN = os.path.join(ROOT, "build", "bin", "meridian")
BUILD_TOOL = os.path.join(ROOT, "tools", "build")
# A run gets its time budget plus this before it counts as hung: start-up
# (eleven site servers, MF's generated ratings), evaluation and shutdown
# take seconds, a checkpointed site's restart a few more.
RUN_TIMEOUT_MARGIN_S = 600.0
# What of a failed run's output is printed (the rest is in RUN_DIR.out).
FAILED_OUTPUT_TAIL = 3000


def log(tag: str, message: str) -> None:
    """Prints "[TAG] MESSAGE" at once (the scenarios run for minutes)."""
    print(f"[{tag}] {message}", flush=True)


def require_binary(path: str, tag: str, *, default: str = DEFAULT_MERIDIAN,
                   target: str = "meridian", build: bool = True,
                   error: Optional[Callable[[str], NoReturn]] = None) -> str:
    """The absolute path of `path`, an executable. When it is missing and is
    `default`, and `build`, builds it with `tools/build --target TARGET`;
    otherwise calls `error` (e.g. an argparse parser's) or exits, naming
    it."""
    path = os.path.abspath(path)
    if os.access(path, os.X_OK):
        return path
    if not build or path != os.path.abspath(default):
        message = (f"{path} is not an executable (build it: tools/build "
                   f"--target {target}, or pass its path)")
        if error is not None:
            error(message)
        raise SystemExit(f"[{tag}] {message}")
    log(tag, f"{shown(path)} is missing: tools/build --target {target}")
    subprocess.run([BUILD_TOOL, "--target", target], check=True)
    return path


def prepare_outdir(outdir: str) -> None:
    """OUTDIR/configs (the job files) and OUTDIR/runs (a directory and
    NAME.out per run)."""
    for sub in ("configs", "runs"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)


def write_config(outdir: str, name: str, text: str) -> str:
    """Writes OUTDIR/configs/NAME.pbtxt; returns its path."""
    os.makedirs(os.path.join(outdir, "configs"), exist_ok=True)
    path = os.path.join(outdir, "configs", name + ".pbtxt")
    with open(path, "w") as f:
        f.write(text)
    return path


@dataclasses.dataclass
class JobRun:
    """One finished `meridian run`: its run directory, its report.json and
    its wall-clock seconds (None for a run read back, --summarize-only)."""
    run_dir: str
    report: dict
    wall_s: Optional[float]


def stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """Stops a `meridian run` launcher the way Ctrl-C does (SIGINT: it stops
    its children and writes what it has); SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_job(binary: str, tag: str, name: str, config: str, run_dir: str,
            timeout_s: Optional[float] = None) -> JobRun:
    """`BINARY run CONFIG --out RUN_DIR` to its end, its output (stdout and
    stderr) in RUN_DIR.out. Exits naming the run when it fails or is still
    running after `timeout_s` (then stopped)."""
    log(tag, f"{name}: running ({config})")
    os.makedirs(os.path.dirname(os.path.abspath(run_dir)), exist_ok=True)
    start = time.time()
    proc = subprocess.Popen([binary, "run", config, "--out", run_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        stop(proc)
        output, _ = proc.communicate()
    except BaseException:  # Ctrl-C: leave no run behind
        stop(proc)
        raise
    wall = time.time() - start
    with open(run_dir + ".out", "w") as f:
        f.write(output)
    if timed_out or proc.returncode != 0:
        print(output[-FAILED_OUTPUT_TAIL:])
        why = (f"still running after {timeout_s:.0f} s, stopped" if timed_out
               else f"exit {proc.returncode}")
        raise SystemExit(f"[{tag}] {name} failed ({why}); output in "
                         f"{run_dir}")
    return JobRun(run_dir, reports.read(run_dir, tag), wall)


def timeout_for(budget_s: float) -> float:
    """The timeout of a run with a training budget of `budget_s`."""
    return budget_s + RUN_TIMEOUT_MARGIN_S


def validate(binary: str, path: str) -> tuple[bool, str]:
    """`BINARY validate PATH`: whether the job file is accepted, and what
    the binary printed (every problem with line:column, or "OK (...)")."""
    proc = subprocess.run([binary, "validate", path], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    return proc.returncode == 0, proc.stdout.strip()


def dry_run(binary: str, tag: str, outdir: str, jobs: Mapping[str, str],
            repeat: int = 1) -> int:
    """Writes each job (name -> text, in the order they run) to
    OUTDIR/configs/NAME.pbtxt and checks it with `meridian validate`,
    printing "[TAG] NAME: verdict"; with --repeat N > 1 prints the order of
    the runs first (NAME-r1, ..., round-robin). Returns the exit status: 1
    when the binary refused a job."""
    if repeat > 1:
        log(tag, "runs, in this order: " + ", ".join(
            repeats.label(name, r, repeat)
            for r, name in repeats.order(list(jobs), repeat)))
    failed = 0
    for name, text in jobs.items():
        ok, output = validate(binary, write_config(outdir, name, text))
        log(tag, f"{name}: {output}")
        failed += not ok
    return 1 if failed else 0
