"""A shipped job's built-in MLP as the user's own PyTorch model: the same
job with model { kind: EXTERNAL }, trained by examples/mlp/train.py
(meridian.Session) and evaluated by examples/mlp/evaluate.py
(meridian.Evaluator), starting from the built-in model's initial weights.

  export_weights   `meridian export-weights JOB --out FILE`: the built-in
                   model's initial weights (what its site servers start
                   from) as a safetensors file
  external_job     a job's text with its MLP made EXTERNAL: the weights
                   file, the metrics accuracy and loss (loss_metric loss),
                   every worker group running train.py and every site an
                   evaluator running evaluate.py, each PyTorch process on
                   one thread (OMP_NUM_THREADS=1); everything else as it was
  ensure_venv      the package installed as docs/python.md says, in
                   build/python-venv (made by the ctest
                   python_package_install, else here with the same two
                   commands)
  use_venv         that venv's bin first on PATH of this process and its
                   children (the job's `python3`), PYTHONPATH dropped so
                   that the installed package is the one used

The programs run in the job file's directory under `meridian run`, so the
job names them by absolute path (examples/mlp of this repository).
"""

import os
import re
import shlex
import subprocess
from typing import Sequence

from scenariolib import ROOT, runner, shown, workloads

EXAMPLE_DIR = os.path.join(ROOT, "examples", "mlp")
DEFAULT_VENV = os.path.join(ROOT, "build", "python-venv")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch
METRICS = ('  metrics { name: "accuracy" higher_is_better: true }\n'
           '  metrics { name: "loss" higher_is_better: false }\n'
           '  loss_metric: "loss"\n')


def export_weights(binary: str, job_path: str, out: str, tag: str) -> str:
    """Writes the built-in model's initial weights of JOB_PATH to OUT;
    exits naming the job when the binary refuses it. Returns OUT."""
    proc = subprocess.run([binary, "export-weights", job_path, "--out", out],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[{tag}] meridian export-weights {shown(job_path)} "
                         f"failed (exit {proc.returncode}): "
                         f"{proc.stdout.strip()}")
    return out


def _command(program: str, hidden: Sequence[int]) -> str:
    return workloads.command_field(
        ["env", "OMP_NUM_THREADS=1", "python3",
         os.path.join(EXAMPLE_DIR, program), "--hidden", *map(str, hidden)])


def _model_block(text: str) -> re.Match:
    """The top-level `model { ... }` block (no nested braces)."""
    match = re.search(r"^model\s*\{[^{}]*\}", text, flags=re.M)
    if match is None:
        raise ValueError("no model { } block without nested blocks")
    return match


def hidden_widths(text: str) -> list[int]:
    """The hidden layers of the job's MLP; ValueError when its model is no
    MLP."""
    block = _model_block(text).group(0)
    if not re.search(r"\bkind:\s*MLP\b", block):
        raise ValueError(f"the model is not an MLP: {block!r}")
    return [int(w) for w in re.findall(r"\bhidden:\s*(\d+)", block)]


def external_job(text: str, weights: str) -> str:
    """The job `text` with its MLP as the PyTorch model of examples/mlp:
    model { kind: EXTERNAL weights: WEIGHTS (+ METRICS) }, a command in
    every worker group and an evaluator block. ValueError when the job has
    no MLP, or already names programs."""
    if re.search(r"\bcommand:", text):
        raise ValueError("the job already runs programs")
    hidden = hidden_widths(text)
    model = _model_block(text)
    block = (f'model {{\n  kind: EXTERNAL\n  weights: "{weights}"\n'
             f"{METRICS}}}\n"
             f"evaluator {{ {_command('evaluate.py', hidden)} }}")
    text = text[:model.start()] + block + text[model.end():]
    groups = len(re.findall(r"\bworkers\s*\{", text))
    if groups == 0:
        raise ValueError("no workers { } group")
    return re.sub(r"\bworkers\s*\{",
                  lambda m: m.group(0) + " " + _command("train.py", hidden),
                  text)


def ensure_venv(path: str, tag: str) -> str:
    """PATH/bin/python3 with the package `meridian` installed; a missing
    venv at the default place is made as docs/python.md says (offline).
    Exits naming what is missing otherwise."""
    python = os.path.join(path, "bin", "python3")
    if os.access(python, os.X_OK):
        return path
    if os.path.abspath(path) != DEFAULT_VENV:
        raise SystemExit(f"[{tag}] {path} is not a venv with the package "
                         "meridian (docs/python.md, Installation)")
    commands = [[SYSTEM_PYTHON, "-m", "venv", "--system-site-packages",
                 path],
                [os.path.join(path, "bin", "pip"), "install",
                 "--no-build-isolation", "--no-index",
                 os.path.join(ROOT, "python")]]
    for command in commands:
        runner.log(tag, shlex.join(command))
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return path


def prepare_workload(w: workloads.Workload, outdir: str, tag: str,
                     install: bool) -> workloads.Workload:
    """Workload `w` ready to run from OUTDIR: for the user's own PyTorch
    programs (w.worker_command) and `install`, the package as installed
    (docs/python.md, the default venv) first on PATH; the initial weights
    every site serves written into OUTDIR (workloads.with_weights)."""
    if w.worker_command and install:
        use_venv(ensure_venv(DEFAULT_VENV, tag))
    return workloads.with_weights(w, outdir)


def use_venv(path: str) -> None:
    """The venv's `python3` first on this process's PATH (inherited by
    `meridian run` and the programs it starts); PYTHONPATH dropped."""
    os.environ["PATH"] = (os.path.join(os.path.abspath(path), "bin") + ":" +
                          os.environ.get("PATH", ""))
    os.environ.pop("PYTHONPATH", None)
