"""Conservation and cleanup of a run: its summary (updates sent and
received, commits applied, recoveries), the difference between the sites'
final replicas against float32 rounding, and the processes and listening
ports it left behind."""

import array
import math
import os
import sys
import time
from typing import Optional

from chaos_scenario import processes
from chaos_scenario.job import SITES
from chaos_scenario.run import Run
from chaos_scenario.sampler import cumulative_commits

# Replicas apply the same updates in different orders; float32 rounding
# then random-walks: about sqrt(N) * eps * |w| after N updates. Allowed:
# REPLICA_ROUNDING_FACTOR times that, N the most updates a site applied.
FLOAT32_EPS = 2.0 ** -23
REPLICA_ROUNDING_FACTOR = 4.0


def replica_difference(run: Run, report: Optional[dict] = None) -> dict:
    """The largest difference between the sites' final replicas
    (RUN_DIR/model-<site>.f32) of every pair, and the float32 rounding that
    allows: REPLICA_ROUNDING_FACTOR * sqrt(N) * eps * max |w|, N the most
    updates a site applied."""
    models = {}
    for site in SITES:
        path = os.path.join(run.dir, f"model-{site}.f32")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        values = array.array("f")
        values.frombytes(data[:len(data) - len(data) % 4])
        if sys.byteorder == "big":
            values.byteswap()
        models[site] = values
    result = {"sites": sorted(models), "pairs": {}, "max_abs_diff": None,
              "missing": [s for s in SITES if s not in models],
              "parameters": max((len(v) for v in models.values()), default=0),
              "max_abs_w": max((max((abs(x) for x in v), default=0.0)
                                for v in models.values()), default=0.0)}
    names = sorted(models)
    worst = 0.0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            va, vb = models[a], models[b]
            if len(va) != len(vb):
                result["pairs"][f"{a}-{b}"] = {"error": f"sizes {len(va)} and "
                                               f"{len(vb)}"}
                worst = float("inf")
                continue
            diff = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
            differing = sum(1 for x, y in zip(va, vb) if x != y)
            nonfinite = sum(1 for x in va if not math.isfinite(x))
            result["pairs"][f"{a}-{b}"] = {"max_abs_diff": diff,
                                           "differing": differing,
                                           "parameters": len(va),
                                           "non_finite": nonfinite}
            worst = max(worst, diff)
    if len(names) >= 2:
        result["max_abs_diff"] = worst
    applied = max((s.get("model_version", 0) for s in
                   (report or {}).get("sites", [])), default=0)
    result["updates_applied_max"] = applied
    result["rounding_bound"] = (REPLICA_ROUNDING_FACTOR * math.sqrt(
        max(applied, 1)) * FLOAT32_EPS * result["max_abs_w"])
    return result


def leftovers(run: Run) -> dict:
    """Processes naming the run directory, and ports the run used still
    listening (with their owner)."""
    time.sleep(2.0)
    procs = processes.run_processes(run.dir)
    run.sampler.ports |= processes.endpoint_ports(run.dir)
    listening = processes.listening_ports()
    ports = []
    for port in sorted(run.sampler.ports):
        if port in listening:
            pid, cmd = processes.socket_owner(listening[port])
            ports.append({"port": port, "pid": pid, "cmdline": cmd,
                          "ours": cmd is None or run.dir in (cmd or "")})
    return {"processes": [{"pid": pid, "cmdline": " ".join(argv)}
                          for pid, argv in sorted(procs.items())],
            "ports_checked": len(run.sampler.ports),
            "ports_listening": ports,
            "ports_left": sum(1 for p in ports if p["ours"])}


def run_summary(run: Run, report: Optional[dict]) -> dict:
    """A run's numbers for the tables: exit, accuracy, time to target,
    lost commits, events, and per site its commits, sync counters and
    recovery."""
    s = {"name": run.name, "dir": run.dir, "exit_code": run.exit_code,
         "wall_s": run.wall_s, "t0_unix_s": run.t0,
         "start_to_training_s": (run.t0 - run.started) if run.t0 else None,
         "report": report is not None}
    if report is None:
        return s
    sites = report.get("sites", [])
    s.update({
        "final_accuracy": report.get("final_accuracy"),
        "time_to_target_s": report.get("time_to_target_s"),
        "reached_target": report.get("reached_target"),
        "outcome": report.get("outcome"),
        "lost_commits": report.get("lost_commits", 0),
        "wan_bytes_total": report.get("wan_bytes_total"),
        "wanem_processes": report.get("wanem_processes"),
        "wan_uncounted_s": report.get("wan_uncounted_s"),
        "events": len(report.get("events", [])),
        "event_kinds": {},
        "sites": {},
    })
    for e in report.get("events", []):
        s["event_kinds"][e["kind"]] = s["event_kinds"].get(e["kind"], 0) + 1
    sent = received = 0.0
    for site in sites:
        sync = site.get("sync", {})
        workers = site.get("workers", []) or [
            w for w in report.get("workers", []) if w.get("site") ==
            site["name"]]
        applied = sum(w.get("commits_applied", 0) for w in workers)
        s["sites"][site["name"]] = {
            "final_accuracy": site.get("final_accuracy"),
            "training_s": site.get("training_s"),
            "commits": site.get("commits"),
            "worker_commits_applied": applied,
            "worker_incarnations": sum(w.get("incarnations", 1)
                                       for w in workers),
            "duplicate_commits": site.get("duplicate_commits", 0),
            "stop_reason": site.get("stop_reason"),
            "clock": sync.get("clock"),
            "final_theta": sync.get("final_theta"),
            "flushed": sync.get("flushed"),
            "updates_sent": sync.get("updates_sent", 0),
            "updates_received": sync.get("updates_received", 0),
            "resent": sync.get("resent", 0),
            "duplicates_dropped": sync.get("duplicates_dropped", 0),
            "gaps": sync.get("gaps", 0),
            "rejected": sync.get("rejected", 0),
            "unreachable_s": sync.get("unreachable_s", 0),
            "recovery": site.get("recovery"),
        }
        sent += sync.get("updates_sent", 0)
        received += sync.get("updates_received", 0)
    s["updates_sent_total"] = sent
    s["updates_received_total"] = received
    total = 0.0
    for site in SITES:
        series = cumulative_commits(run.sampler.site_samples(site))
        if series:
            total += series[-1][1]
    s["sampled_commits_total"] = total
    return s
