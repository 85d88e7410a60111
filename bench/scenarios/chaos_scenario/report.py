"""One round's tables and goals: OUTDIR/results.md and results.json (with
--repeat N, OUTDIR/rK's).

  goals_of        the issue's goals from the two runs of the round
  outage_of       the total outage the time-to-target goal allows for
  results_text    the tables: the runs, every fault, the worker kills one
                  by one, the partition's commit rates, conservation and
                  cleanup, the outage and the goals
"""

import argparse
import os
import statistics
from typing import Callable, Optional

from chaos_scenario.analyse import subject_site
from chaos_scenario.checks import REPLICA_ROUNDING_FACTOR
from chaos_scenario.job import SHIPPED_JOB, WORKERS_PER_SITE
from chaos_scenario.schedule import FAULT_NAMES, SITE_CRASHES, schedule_line
from scenariolib import ROOT, goals as goal_rows, tables
from scenariolib.goals import Goal

fmt = tables.number
RUN_NAMES = ("fault-free", "chaos")
# The quiet-time control more than this far from 1: the two runs are not
# comparable (machine load).
UNRELIABLE = 0.15
UNRELIABLE_TEXT = (" **More than 15% apart: rates and times compared "
                   "between the two runs are unreliable (machine load); run "
                   "again on a quieter machine.**")


def outage_of(faults: list[dict]) -> tuple[float, list[str]]:
    """The total outage (site crash and emulator: injection to recovery;
    partition and SIGSTOP: their length) and its parts, named."""
    outage = 0.0
    parts = []
    for r in faults:
        if r["fault"] in (*SITE_CRASHES, "wanem_crash"):
            dur = r["recovery_s"]
            if dur is None:
                dur = 0.0
            outage += dur
            parts.append(f"{FAULT_NAMES[r['fault']]} {dur:.1f}")
        elif r["fault"] in ("partition", "sigstop"):
            outage += r["duration_s"]
            parts.append(f"{FAULT_NAMES[r['fault']]} {r['duration_s']:.1f}")
    return outage, parts


def accuracy_goal(fault_free: Optional[float], chaos: Optional[float],
                  of: str = "") -> Optional[Goal]:
    """The chaos run's final accuracy within 0.5 points of the fault-free
    run's (or better); `of`: "; medians" for --repeat. None without both."""
    if fault_free is None or chaos is None:
        return None
    d = (chaos - fault_free) * 100
    return Goal("final accuracy vs fault-free", "within 0.5 points (or "
                "better)", f"{chaos:.4f} vs {fault_free:.4f} ({d:+.2f} "
                f"points{of})", d >= -0.5)


def partition_goal(part: Optional[dict], quiet: Optional[float],
                   of: str = "") -> Optional[Goal]:
    """The commit rate of us and eu during the partition, against 80% of
    fault-free (and against `quiet`, the quiet-time ratio, beside it); `of`:
    " of the medians" for --repeat. None when not measured."""
    if not part or part.get("ratio") is None:
        return None
    per = ", ".join(f"{s} {v['ratio'] * 100:.0f}%"
                    for s, v in part["sites"].items()
                    if s != "together" and v["ratio"] is not None)
    control = (f"; {part['ratio'] / quiet * 100:.0f}% against the "
               f"quiet-time ratio {quiet * 100:.0f}%" if quiet else "")
    return Goal("commit rate of us and eu during the partition",
                "≥ 80% of fault-free", f"{part['ratio'] * 100:.0f}%{of} "
                f"({per}{control})", part["ratio"] >= 0.8)


def goals_of(ff_s: dict, ch_s: dict, faults: list[dict],
             part: Optional[dict], replicas: dict, left: dict,
             report: Optional[dict]) -> tuple[list[Goal], float, list[str]]:
    """The round's goals, its total outage and the outage's parts."""
    goals = [g for g in [accuracy_goal(ff_s.get("final_accuracy"),
                                       ch_s.get("final_accuracy"))] if g]
    outage, parts = outage_of(faults)
    ft, ct = ff_s.get("time_to_target_s"), ch_s.get("time_to_target_s")
    if ft is not None and ct is not None:
        if ft < 0:
            goals.append(Goal("time to 0.87", "≤ fault-free + outage",
                              "the fault-free run did not reach 0.87",
                              False))
        else:
            allowed = ft + outage
            goals.append(Goal("time to 0.87", f"≤ fault-free + outage "
                              f"({ft:.1f} + {outage:.1f} = {allowed:.1f} s)",
                              "not reached" if ct < 0 else f"{ct:.1f} s",
                              0 <= ct <= allowed))
    goal = partition_goal(
        part, part and (part.get("quiet_ratio") or {}).get("ratio"))
    if goal:
        goals.append(goal)
    if report is not None:
        goals.append(updates_lost_goal(ch_s, faults))
    for name, rep in replicas.items():
        d = rep.get("max_abs_diff")
        bound = rep.get("rounding_bound") or 0.0
        goals.append(Goal(f"replica difference ({name})",
                          f"≤ rounding: {REPLICA_ROUNDING_FACTOR:g}·√N·ε·"
                          f"max‖w‖ = {bound:.3g} (N = "
                          f"{rep.get('updates_applied_max')} updates "
                          "applied)",
                          "model files missing" if d is None else f"{d:.3g}",
                          d is not None and d <= bound))
    for name, l in left.items():
        goals.append(Goal(f"processes and ports left ({name})", "0",
                          f"{len(l['processes'])} processes, "
                          f"{l['ports_left']} ports (of {l['ports_checked']} "
                          "checked)",
                          not l["processes"] and l["ports_left"] == 0))
    return goals, outage, parts


def updates_lost_goal(ch_s: dict, faults: list[dict]) -> Goal:
    """No answered commit lost, the crashed site's crashes included (its
    workers replay what no checkpoint held): lost_commits 0 in the report
    and in every site's recovery, and the crashed site restarted once per
    crash."""
    crashes: dict[str, int] = {}
    for r in faults:
        if r["fault"] in SITE_CRASHES:
            site = subject_site(r["target"])
            crashes[site] = crashes.get(site, 0) + 1
    recovery = {name: s.get("recovery") or {}
                for name, s in ch_s["sites"].items()}
    lost_at = {name: rec.get("lost_commits", 0)
               for name, rec in recovery.items() if rec.get("lost_commits")}
    restarts = {site: recovery.get(site, {}).get("restarts", 0)
                for site in crashes}
    lost = ch_s.get("lost_commits", 0)
    crashed = ", ".join(f"{site} crashed {n}×, restarted {restarts[site]}×"
                        for site, n in sorted(crashes.items())) or "no crash"
    return Goal("updates lost", "lost_commits 0, every crash included",
                f"lost_commits {lost} ({crashed}"
                + (f"; lost at {lost_at}" if lost_at else "") + ")",
                lost == 0 and not lost_at and all(
                    restarts[site] >= n for site, n in crashes.items()))


def preamble(args: argparse.Namespace, schedule_desc: list[dict],
             extra: str = "") -> list[str]:
    """The job, the budget and the schedule; `extra` after the job's
    sentence."""
    model = ("MLP" if getattr(args, "workload", "builtin") == "builtin"
             else "the MLP as a PyTorch model (examples/mlp's programs, "
             "model.kind EXTERNAL)")
    return [f"{os.path.relpath(SHIPPED_JOB, ROOT)}: 3 sites × "
            f"{WORKERS_PER_SITE} workers, {model} on Fashion-MNIST, Gaia through "
            f"`meridian wanem`, adaptive θ, plaintext links, fault {{ }} "
            f"defaults; training budget {args.budget:g} s per run; "
            f"{'--quick; ' if args.quick else ''}seed {args.seed}." + extra,
            "", schedule_line(schedule_desc), ""]


def runs_table(runs: dict) -> list[str]:
    """Exit, final accuracy, time to 0.87, lost commits, events, wall."""
    return tables.table(
        ["run", "exit", "final accuracy", "time to 0.87 (s)", "lost_commits",
         "events", "wall (s)"],
        [[s["name"], s["exit_code"], fmt(s.get("final_accuracy"), 4),
          fmt(s.get("time_to_target_s")), s.get("lost_commits", "—"),
          s.get("events", "—"), fmt(s.get("wall_s"), 0)]
         for s in (runs[n] for n in RUN_NAMES)])


def fault_notes(r: dict, budget: float, injections: list[dict]) -> str:
    """The notes cell of a fault's row: what its analysis found besides
    detection and recovery."""
    notes = "; ".join(r.get("notes", []))
    more = f"; {notes}" if notes else ""
    if r["fault"] in SITE_CRASHES and r.get("site_recovery"):
        rec = r["site_recovery"]
        back = fmt(r.get("workers_back_after_recovered_s"))
        return (f"its workers back {back} s after SITE_RECOVERED; it "
                "trained "
                f"{fmt(r.get('site_training_s'))} s of the "
                f"{budget:g} s budget; "
                f"recovery (the site's, after {rec.get('restarts', 0)} "
                f"restarts): lost clocks ({rec.get('lost_clock_from')}, "
                f"{rec.get('lost_clock_to')}], lost commits "
                f"{rec.get('lost_commits', 0)}, retracted "
                f"{rec.get('retracted_updates', 0)}, replayed by its "
                f"workers {rec.get('replayed_commits', 0)}; peers: "
                f"{r.get('peer_detected_by')} after "
                f"{fmt(r.get('peer_detection_s'))} s" + more)
    if r["fault"] == "slow_link":
        th = r.get("theta", {})
        inj = next(i for i in injections if i["kind"] == "slow_link")
        return (f"{inj['bandwidth_bps'] / 1e6:g} → "
                f"{inj['slowed_bps'] / 1e6:g} Mbit/s (from "
                f"{inj['bandwidth_source']}); the sites sent " +
                (", ".join(f"{k} {v / 1e6:.2f} Mbit/s" for k, v in
                           r.get("link_load_bps", {}).items()) or "—") +
                " meanwhile; " +
                "; ".join(
                    f"θ {s}: {v['during_min']:g}–{v['during_max']:g} "
                    f"while slowed, fault-free "
                    f"{v['fault_free_min']:g}–{v['fault_free_max']:g}"
                    for s, v in th.items()) + more)
    if r["fault"] == "wanem_crash" and r.get("side_events"):
        return "events: " + ", ".join(r["side_events"][:8]) + more
    if r["fault"] == "sigstop" and r.get("stopped_site_events_after_sigcont"):
        return ("the stopped site after SIGCONT: " +
                ", ".join(r["stopped_site_events_after_sigcont"][:6]) + more)
    return notes


def kill_stats(kills: list[dict]) -> dict:
    """The worker kills of a round: how many, the median and max detection
    and recovery, the sum of the training lost, the targets not detected
    and not recovered."""
    det = [r["detection_s"] for r in kills if r["detection_s"] is not None]
    rec = [r["recovery_s"] for r in kills if r["recovery_s"] is not None]
    lost = [r["lost_training_s"] for r in kills
            if r["lost_training_s"] is not None]
    return {"kills": len(kills),
            "detection_median_s": statistics.median(det) if det else None,
            "detection_max_s": max(det) if det else None,
            "recovery_median_s": statistics.median(rec) if rec else None,
            "recovery_max_s": max(rec) if rec else None,
            "lost_training_s_sum": sum(lost) if lost else None,
            "undetected": [r["target"] for r in kills
                           if r["detection_s"] is None],
            "unrecovered": [r["target"] for r in kills
                            if r["recovery_s"] is None]}


def faults_table(faults: list[dict], budget: float,
                 injections: list[dict]) -> list[str]:
    """Every fault but the worker kills a row, the kills one row."""
    rows = [[FAULT_NAMES[r["fault"]], r["target"], f"{r['offset_s']:.0f}",
             fmt(r["duration_s"]), fmt(r["detection_s"]),
             r["detected_by"] or "—", fmt(r["recovery_s"]),
             r["recovered_by"] or "—", fmt(r["lost_training_s"]),
             fault_notes(r, budget, injections)]
            for r in faults if r["fault"] != "worker_kill"]
    kills = [r for r in faults if r["fault"] == "worker_kill"]
    if kills:
        k = kill_stats(kills)
        note = f"{len(kills)} kills: {', '.join(r['target'] for r in kills)}"
        if k["undetected"]:
            note += f"; not detected: {', '.join(k['undetected'])}"
        if k["unrecovered"]:
            note += f"; not recovered: {', '.join(k['unrecovered'])}"
        rows.append([
            f"{FAULT_NAMES['worker_kill']} (every 10–20 s)", "random",
            f"{kills[0]['offset_s']:.0f}…", 0,
            f"median {fmt(k['detection_median_s'])}, max "
            f"{fmt(k['detection_max_s'])}", "PROCESS_FAILED (launcher)",
            f"median {fmt(k['recovery_median_s'])}, max "
            f"{fmt(k['recovery_max_s'])}", "WORKER_RESTARTED at the site",
            f"{fmt(k['lost_training_s_sum'])} (sum, own site only)", note])
    return ["", "Per fault (seconds; injected at t0 + offset, t0 = every site "
            "committing; detection from the injection, recovery from the end "
            "of the fault; training lost: Σ over sites of (fault-free − "
            "chaos commits) in the same window after t0, in seconds of that "
            "site's fault-free rate — negative when the others ran faster on "
            "the two CPUs the faulted processes left free):", ""] + \
        tables.table(["fault", "target", "at", "lasted", "detection",
                      "detected by", "recovery", "recovered by",
                      "training lost (site·s)", "notes"], rows)


def kills_table(faults: list[dict]) -> list[str]:
    """The worker kills one by one (none: [])."""
    kills = [r for r in faults if r["fault"] == "worker_kill"]
    if not kills:
        return []
    return ["", "Worker kills one by one (training lost: the worker's own "
            "site, injection to WORKER_RESTARTED):", ""] + tables.table(
        ["at", "worker", "detection", "recovery", "training lost (site·s)",
         "site saw it as", "launcher"],
        [[f"{r['offset_s']:.0f}", r["target"], fmt(r["detection_s"]),
          fmt(r["recovery_s"]), fmt(r["lost_training_s"]),
          r.get("site_detected_by") or "—",
          "; ".join(r.get("launcher", [])) or "—"] for r in kills])


def partition_section(part: Optional[dict]) -> list[str]:
    """The commit rate of the sites not partitioned during the partition,
    per window and site, and the quiet-time control (none: [])."""
    if not part:
        return []
    rows = []
    for label, w in part.get("windows", {}).items():
        if "error" in w:
            rows.append([label, "—", "—", "—", w["error"]])
            continue
        span = (f"{label} (t0+{w['start_offset_s']:.0f} s, "
                f"{w['length_s']:.1f} s)")
        for site, v in w["sites"].items():
            rows.append([span, site, f"{v['commits_per_s']:.1f}",
                         f"{v['fault_free_commits_per_s']:.1f}",
                         f"{v['ratio'] * 100:.0f}%"])
        rows.append([span, "together", "", "", f"{w['ratio'] * 100:.0f}%"])
    lines = ["", f"Commit rate of the sites not partitioned during the "
             f"partition ({fmt(part.get('window_s'))} s; the same window "
             "after t0 in the fault-free run; split at the first "
             "PEER_UNREACHABLE, "
             f"{fmt(part.get('detected_after_s'))} s in):", ""]
    lines += tables.table(["window", "site", "chaos (commits/s)",
                           "fault-free (commits/s)", "ratio"], rows)
    q = part.get("quiet_ratio") or {}
    if q.get("ratio") is not None:
        lines += ["", f"Control: over {q['seconds']} site·seconds with no "
                  "fault active at the site (each fault's window plus 3 s "
                  "left out; a worker kill only at its own site) the chaos "
                  f"run made {q['ratio'] * 100:.0f}% of the "
                  "fault-free run's commits: the difference between the two"
                  " runs that is not due to faults (other processes on the "
                  "same CPUs, a rebuilt cache, ...)." +
                  (UNRELIABLE_TEXT if abs(q["ratio"] - 1) > UNRELIABLE
                   else "")]
    return lines


def recoveries_text(run: dict) -> str:
    """Each site's recovery: (lost clocks], lost commits, retracted."""
    return ", ".join(
        f"{s}: ({(v['recovery'] or {}).get('lost_clock_from')}, "
        f"{(v['recovery'] or {}).get('lost_clock_to')}], "
        f"{(v['recovery'] or {}).get('lost_commits', 0)}, "
        f"{(v['recovery'] or {}).get('retracted_updates', 0)}"
        for s, v in run.get("sites", {}).items()
        if v.get("recovery")) or "none"


def updates_text(run: dict) -> str:
    """Σ updates sent / Σ received, and what the crashed site retracted."""
    retracted = sum(((v.get("recovery") or {}).get("retracted_updates", 0))
                    for v in run.get("sites", {}).values())
    sent = run.get("updates_sent_total", 0)
    got = run.get("updates_received_total", 0)
    text = f"{sent:.0f} / {got:.0f}"
    if retracted:
        text += (f" (received − sent = {got - sent:.0f}; retracted by "
                 f"the crashed site: {retracted})")
    return text


def replica_text(rep: dict) -> str:
    """The largest replica difference, against the largest weight."""
    if rep.get("max_abs_diff") is None:
        return "missing " + ",".join(rep["missing"])
    differing = max((p.get("differing", 0) for p in rep["pairs"].values()),
                    default=0)
    return (f"{rep['max_abs_diff']:.3g} (max ‖w‖ "
            f"{rep.get('max_abs_w', 0):.3g}; ≤ {differing} of "
            f"{rep.get('parameters', 0)} parameters differ in a pair)")


def per_site(run: dict, cell: Callable[[str, dict], str]) -> str:
    """"us ..., eu ..., ap ...": `cell` of each site of a run summary."""
    return ", ".join(cell(s, v) for s, v in run.get("sites", {}).items())


def conservation_table(runs: dict, replicas: dict, left: dict) -> list[str]:
    """Conservation and cleanup, both runs side by side."""
    checks: list[tuple[str, Callable[[str], str]]] = [
        ("report lost_commits",
         lambda n: str(runs[n].get("lost_commits", "—"))),
        ("site recoveries (lost clocks, lost commits, retracted)",
         lambda n: recoveries_text(runs[n])),
        ("Σ updates sent / Σ received (MIRROR_UPDATE, sites' counts)",
         lambda n: updates_text(runs[n])),
        ("every peer's final flush arrived", lambda n: per_site(
            runs[n],
            lambda s, v: f"{s} {'yes' if v.get('flushed') else 'NO'}")),
        ("site commits = Σ workers' commits_applied", lambda n: per_site(
            runs[n], lambda s, v: f"{s} {v.get('commits')}/"
            f"{v.get('worker_commits_applied')}")),
        ("resent / duplicates dropped / gaps / rejected", lambda n: per_site(
            runs[n], lambda s, v: f"{s} {v['resent']:.0f}/"
            f"{v['duplicates_dropped']:.0f}/{v['gaps']:.0f}/"
            f"{v['rejected']:.0f}")),
        ("duplicate commits (answered, not applied)", lambda n: per_site(
            runs[n], lambda s, v: f"{s} {v['duplicate_commits']}")),
        ("max abs replica difference (every pair of model-*.f32)",
         lambda n: replica_text(replicas[n])),
        ("processes left / ports left listening",
         lambda n: f"{len(left[n]['processes'])} / {left[n]['ports_left']} "
         f"(of {left[n]['ports_checked']})"),
        ("WAN: emulator processes counted / seconds maybe uncounted / bytes",
         lambda n: f"{runs[n].get('wanem_processes', '—')} / "
         f"{fmt(runs[n].get('wan_uncounted_s'))} / "
         f"{fmt((runs[n].get('wan_bytes_total') or 0) / 1e6, 2)} MB"),
        ("events by kind", lambda n: ", ".join(
            f"{k} {v}" for k, v in
            sorted(runs[n].get("event_kinds", {}).items())) or "none"),
    ]
    return ["", "Conservation and cleanup:", ""] + tables.table(
        ["check", *RUN_NAMES],
        [[check, *(cell(n) for n in RUN_NAMES)] for check, cell in checks])


def results_text(args: argparse.Namespace, schedule_desc: list[dict],
                 runs: dict, faults: list[dict], part: Optional[dict],
                 replicas: dict, left: dict, goals: list[Goal],
                 outage: float, outage_parts: list[str],
                 injections: list[dict]) -> str:
    """A round's results.md."""
    replaced = (f" **{args.binary} was replaced during the "
                f"{' and '.join(args.binary_changed)} run**: processes "
                "restarted after that ran the new binary."
                if args.binary_changed else "")
    lines = ["# Chaos scenario (bench/scenarios/chaos)", ""]
    lines += preamble(args, schedule_desc, replaced)
    lines += runs_table(runs)
    lines += faults_table(faults, args.budget, injections)
    lines += kills_table(faults)
    lines += partition_section(part)
    lines += conservation_table(runs, replicas, left)
    lines += ["", f"Total outage (time to 0.87 goal): {outage:.1f} s = "
              f"{' + '.join(outage_parts) or '0'} (site crash and emulator: "
              "injection to recovery; partition and SIGSTOP: their length; "
              "single-worker kills and the slowed link are not outages).",
              ""] + goal_rows.table(goals)
    return "\n".join(lines) + "\n"


def results_json(args: argparse.Namespace, schedule_desc: list[dict],
                 runs: dict, faults: list[dict], part: Optional[dict],
                 replicas: dict, left: dict, goals: list[Goal],
                 outage: float) -> dict:
    """A round's results.json."""
    return {"config": {"quick": args.quick, "seed": args.seed,
                       "workload": getattr(args, "workload", "builtin"),
                       "budget_s": args.budget, "binary": args.binary,
                       "schedule": schedule_desc},
            "runs": runs, "faults": faults,
            "partition_commit_rate": part, "replicas": replicas,
            "leftovers": left, "total_outage_s": outage,
            "goals": goal_rows.to_json(goals)}
