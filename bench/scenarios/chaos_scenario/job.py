"""The chaos scenario's job: deploy/configs/three-regions.pbtxt (sites us,
eu, ap, 4 workers each, MLP on Fashion-MNIST, Gaia through `meridian
wanem`, target 0.87) with the scenario's changes."""

import os

from scenariolib import ROOT, jobs

SHIPPED = "three-regions"
SHIPPED_JOB = os.path.join(jobs.CONFIGS_DIR, SHIPPED + ".pbtxt")
SITES = ("us", "eu", "ap")
WORKERS_PER_SITE = 4
TARGET = 0.87


def job_text(name: str, budget: float) -> str:
    """The shipped three-region job with the scenario's changes: the time
    budget, stop_at_target false, sync.adaptive_threshold true (the slowed
    link should move the threshold), plaintext links and fault { } at its
    defaults."""
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
    return (header + text + f"\n# chaos scenario\n{jobs.PLAINTEXT}\n"
            "fault { }\n")
