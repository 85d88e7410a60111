"""The chaos scenario's job: deploy/configs/three-regions.pbtxt (sites us,
eu, ap, 4 workers each, MLP on Fashion-MNIST, Gaia through `meridian
wanem`, target 0.87) with the scenario's changes; for the workload
pytorch-mlp the same MLP as the user's PyTorch model (examples/mlp's
worker and evaluator programs, model.kind EXTERNAL) with the built-in
model's initial weights."""

import os

from scenariolib import ROOT, jobs, pytorch

WORKLOADS = ("builtin", "pytorch-mlp")
WEIGHTS = "initial.safetensors"  # next to the job file (pytorch-mlp)
# pytorch-mlp: fifteen PyTorch processes (twelve workers, three
# evaluators) import torch and read Fashion-MNIST at once, which on a
# shared 2-core machine takes minutes; the sites wait that long for their
# workers to join (server.join_timeout_s, 60 s in the shipped job), the
# scenario for every site to commit.
PROGRAM_JOIN_TIMEOUT_S = 300
PROGRAM_START_TIMEOUT_S = 480

SHIPPED = "three-regions"
SHIPPED_JOB = os.path.join(jobs.CONFIGS_DIR, SHIPPED + ".pbtxt")
SITES = ("us", "eu", "ap")
WORKERS_PER_SITE = 4
TARGET = 0.87


def job_text(name: str, budget: float, workload: str = "builtin") -> str:
    """The shipped three-region job with the scenario's changes: the time
    budget, stop_at_target false, sync.adaptive_threshold true (the slowed
    link should move the threshold), plaintext links and fault { } at its
    defaults; for the workload pytorch-mlp its MLP made EXTERNAL (WEIGHTS
    next to the job file: write_weights)."""
    text = jobs.shipped(SHIPPED)
    text = jobs.set_field(text, "name", f'"{name}"')
    text = jobs.set_field(text, "time_budget_s", f"{budget:g}")
    text = jobs.set_field(text, "stop_at_target", "false")
    try:
        text = jobs.prepend_to_block(text, "sync",
                                     "adaptive_threshold: true")
    except ValueError:
        raise SystemExit(f"[chaos] {SHIPPED_JOB} has no sync {{ }} block")
    shipped = os.path.relpath(SHIPPED_JOB, ROOT)
    header = (f"# Written by bench/scenarios/chaos from {shipped}:\n"
              f"# time_budget_s {budget:g}, stop_at_target false, "
              "sync.adaptive_threshold true,\n# security { curve: false } "
              "(plaintext on loopback), fault { } at its defaults.\n")
    if workload == "pytorch-mlp":
        text = pytorch.external_job(text, WEIGHTS)
        text = jobs.prepend_to_block(
            text, "server", f"join_timeout_s: {PROGRAM_JOIN_TIMEOUT_S}")
        header += ("# The MLP as a PyTorch model: examples/mlp's train.py and "
                   "evaluate.py,\n# model.kind EXTERNAL from `meridian "
                   "export-weights` of the built-in job; server.join_timeout_s "
                   f"{PROGRAM_JOIN_TIMEOUT_S}.\n")
    return (header + text + f"\n# chaos scenario\n{jobs.PLAINTEXT}\n"
            "fault { }\n")


def write_weights(binary: str, directory: str, name: str,
                  budget: float) -> str:
    """DIRECTORY/WEIGHTS: the built-in job's initial weights (`meridian
    export-weights` of it, written to DIRECTORY/builtin.pbtxt), what the
    pytorch-mlp job's sites start from. Returns the path."""
    builtin = os.path.join(directory, "builtin.pbtxt")
    with open(builtin, "w") as f:
        f.write(job_text(name, budget))
    return pytorch.export_weights(binary, builtin,
                                  os.path.join(directory, WEIGHTS), "chaos")
