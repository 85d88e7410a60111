"""--repeat N: OUTDIR/results.md and results.json of N rounds, every number
of the rounds' tables as the median of the rounds with the range (median
(min–max)); the goals compare the medians of each side, a check of each
run is met when every round met it.

  aggregate        the rounds' runs, faults, worker kills, partition and
                   outage as medians with ranges
  summary_goals    the goals from those
  results_text     the tables
"""

import argparse
import collections
import dataclasses
import os
from typing import Optional

from chaos_scenario.checks import REPLICA_ROUNDING_FACTOR
from chaos_scenario.job import TARGET
from chaos_scenario.report import (RUN_NAMES, UNRELIABLE, UNRELIABLE_TEXT,
                                   accuracy_goal, fmt, kill_stats,
                                   partition_goal, preamble)
from chaos_scenario.schedule import FAULT_NAMES
from scenariolib import goals as goal_rows, repeats, tables
from scenariolib.goals import Goal

mr = repeats.median_range
med = repeats.median


def reached(t: Optional[float]) -> Optional[float]:
    """The report's time to target: negative = not reached (None)."""
    return None if t is None or t < 0 else t


def common(texts: list[Optional[str]], n: int) -> str:
    """The most common text, '(k of n rounds)' when not every round had
    it."""
    texts = [t for t in texts if t]
    if not texts:
        return "—"
    top, k = collections.Counter(texts).most_common(1)[0]
    return top if k == n else f"{top} ({k} of {n} rounds)"


def runs_of(rounds: list[dict]) -> dict:
    """Each run (fault-free, chaos) over the rounds."""
    runs = {}
    for name in RUN_NAMES:
        ss = [r["summaries"][name] for r in rounds]
        reps = [r["replicas"][name] for r in rounds]
        lefts = [r["left"][name] for r in rounds]
        runs[name] = {
            "exit_codes": [s["exit_code"] for s in ss],
            "final_accuracy": mr(s.get("final_accuracy") for s in ss),
            "time_to_target_s": mr((reached(s.get("time_to_target_s"))
                                    for s in ss), True),
            "lost_commits": mr(s.get("lost_commits") for s in ss),
            "events": mr(s.get("events") for s in ss),
            "wall_s": mr(s.get("wall_s") for s in ss),
            "wan_bytes_total": mr(s.get("wan_bytes_total") for s in ss),
            "updates_sent_total": mr(s.get("updates_sent_total") for s in ss),
            "updates_received_total": mr(s.get("updates_received_total")
                                         for s in ss),
            "replica_max_abs_diff": mr(rep.get("max_abs_diff")
                                       for rep in reps),
            "replica_rounding_bound": mr(rep.get("rounding_bound")
                                         for rep in reps),
            "flushed_rounds": sum(
                1 for s in ss if s.get("sites") and
                all(v.get("flushed") for v in s["sites"].values())),
            "processes_left": sum(len(l["processes"]) for l in lefts),
            "ports_left": sum(l["ports_left"] for l in lefts),
            "ports_checked": sum(l["ports_checked"] for l in lefts),
        }
    return runs


def faults_of(schedule_desc: list[dict], rounds: list[dict]) -> dict:
    """The faults of the schedule (each round has the same) but the worker
    kills, by kind."""
    n = len(rounds)
    faults = {}
    for d in schedule_desc:
        kind = d["fault"]
        if kind == "worker_kill" or kind in faults:
            continue
        rows = [next((x for x in r["faults"] if x["fault"] == kind), None)
                for r in rounds]
        got = [x for x in rows if x]
        faults[kind] = {
            "target": got[0]["target"] if got else d["target"],
            "rounds": len(got),
            "offset_s": mr(x["offset_s"] for x in got),
            "duration_s": mr(x["duration_s"] for x in got),
            "detection_s": mr((x["detection_s"] if x else None
                               for x in rows), True),
            "recovery_s": mr((x["recovery_s"] if x else None
                              for x in rows), True),
            "lost_training_s": mr(x["lost_training_s"] if x else None
                                  for x in rows),
            "detected_by": common([x["detected_by"] for x in got], n),
            "recovered_by": common([x["recovered_by"] for x in got], n),
        }
    return faults


def kills_of(rounds: list[dict]) -> dict:
    """The worker kills: each round's median, max and sum (kill_stats),
    and the median and range of those over the rounds."""
    kill_rounds = []
    for r in rounds:
        k = kill_stats([x for x in r["faults"] if x["fault"] == "worker_kill"])
        k["undetected"] = len(k["undetected"])
        k["unrecovered"] = len(k["unrecovered"])
        kill_rounds.append(k)
    return {"rounds": kill_rounds, **repeats.summarize(kill_rounds)}


def partition_of(rounds: list[dict]) -> Optional[dict]:
    """The partition: commit rates of the sites not partitioned; the ratio
    of the medians of each side; the quiet-time control likewise."""
    parts = [r["part"] for r in rounds if r["part"]]
    if not parts:
        return None
    sites = sorted({s for p in parts for s in p.get("sites", {})})
    part = {"window_s": mr(p.get("window_s") for p in parts),
            "detected_after_s": mr(p.get("detected_after_s")
                                   for p in parts),
            "round_ratios": mr(p.get("ratio") for p in parts),
            "sites": {}}
    for site in sites + ["together"]:
        def side(key, p, site=site):
            ss = p.get("sites", {})
            if not ss or (site != "together" and site not in ss):
                return None
            if site == "together":
                return sum(v[key] for v in ss.values())
            return ss[site][key]
        ch = mr(side("commits_per_s", p) for p in parts)
        ff = mr(side("fault_free_commits_per_s", p) for p in parts)
        part["sites"][site] = {
            "commits_per_s": ch, "fault_free_commits_per_s": ff,
            "ratio": (med(ch) / med(ff) if ch and ff and med(ff)
                      else None)}
    part["ratio"] = part["sites"]["together"]["ratio"]
    quiet = [p.get("quiet_ratio") or {} for p in parts]
    got = mr(q.get("commits") for q in quiet)
    ref = mr(q.get("fault_free_commits") for q in quiet)
    part["quiet"] = {
        "commits": got, "fault_free_commits": ref,
        "seconds": mr(q.get("seconds") for q in quiet),
        "round_ratios": mr(q.get("ratio") for q in quiet),
        "ratio": med(got) / med(ref) if got and ref and med(ref) else None}
    return part


@dataclasses.dataclass
class Summary:
    """The rounds aggregated (results.json's "summary")."""
    runs: dict
    faults: dict
    kills: dict
    part: Optional[dict]
    outage: Optional[repeats.Cell]

    @classmethod
    def of(cls, schedule_desc: list[dict], rounds: list[dict]) -> "Summary":
        return cls(runs_of(rounds), faults_of(schedule_desc, rounds),
                   kills_of(rounds), partition_of(rounds),
                   mr(r["outage"] for r in rounds))

    def to_json(self) -> dict:
        return {"runs": self.runs, "faults": self.faults,
                "worker_kills": self.kills,
                "partition_commit_rate": self.part,
                "total_outage_s": self.outage}


def cell(c: Optional[repeats.Cell], digits: int = 1,
         counted: str = "rounds", unit: str = "") -> str:
    """A median (range) cell of the rounds."""
    return repeats.fmt_cell(c, lambda v: fmt(v, digits, unit), counted)


def percent(v: float) -> str:
    return f"{v * 100:.0f}%"


def summary_goals(s: Summary, rounds: list[dict]) -> list[Goal]:
    """Goals: medians of each side; the checks of each run in every
    round."""
    n = len(rounds)
    runs = s.runs
    goals = [g for g in [accuracy_goal(
        med(runs["fault-free"]["final_accuracy"]),
        med(runs["chaos"]["final_accuracy"]), "; medians")] if g]
    ft_cell = runs["fault-free"]["time_to_target_s"]
    ct_cell = runs["chaos"]["time_to_target_s"]
    if any(r["summaries"]["chaos"].get("report") and
           r["summaries"]["fault-free"].get("report") for r in rounds):
        def missed(c):
            return f"{n - (c['runs'] if c else 0)} of {n} rounds"
        ft, ct = med(ft_cell), med(ct_cell)
        if ft is None:
            goals.append(Goal(f"time to {TARGET}", "≤ fault-free + outage",
                              f"the fault-free run did not reach {TARGET} in "
                              f"{missed(ft_cell)}", False))
        else:
            outage = med(s.outage) or 0.0
            allowed = ft + outage
            goals.append(Goal(
                f"time to {TARGET}", f"≤ fault-free + outage ({ft:.1f} + "
                f"{outage:.1f} = {allowed:.1f} s; medians"
                f"{repeats.partial(ft_cell, 'reached')})",
                f"not reached in {missed(ct_cell)}" if ct is None else
                f"{ct:.1f} s{repeats.partial(ct_cell, 'reached')}",
                ct is not None and ct <= allowed))
    goal = partition_goal(s.part, s.part and s.part["quiet"]["ratio"],
                          " of the medians")
    if goal:
        goals.append(goal)
    met = [goal_rows.met(r["goals"], "updates lost") for r in rounds]
    if any(m is not None for m in met):
        goals.append(Goal("updates lost",
                          "lost_commits 0, every crash included",
                          f"lost_commits "
                          f"{cell(runs['chaos']['lost_commits'], 0)}; met "
                          f"in {met.count(True)} of {n} rounds",
                          met.count(True) == n))
    for name in RUN_NAMES:
        met = [goal_rows.met(r["goals"], f"replica difference ({name})")
               for r in rounds]
        bound = med(runs[name]["replica_rounding_bound"]) or 0.0
        diff = runs[name]["replica_max_abs_diff"]
        goals.append(Goal(f"replica difference ({name})",
                          f"≤ rounding: {REPLICA_ROUNDING_FACTOR:g}·√N·ε·"
                          f"max‖w‖ (median bound {bound:.3g})",
                          ("model files missing" if diff is None else
                           repeats.fmt_cell(diff, lambda v: f"{v:.3g}")) +
                          f"; within the bound in {met.count(True)} of {n} "
                          "rounds", met.count(True) == n))
    for name in RUN_NAMES:
        met = [goal_rows.met(r["goals"], f"processes and ports left ({name})")
               for r in rounds]
        rr = runs[name]
        goals.append(Goal(f"processes and ports left ({name})", "0",
                          f"{rr['processes_left']} processes, "
                          f"{rr['ports_left']} ports (of "
                          f"{rr['ports_checked']} checked) over {n} rounds",
                          met.count(True) == n))
    return goals


def runs_table(runs: dict) -> list[str]:
    return tables.table(
        ["run", "exit", "final accuracy", f"time to {TARGET} (s)",
         "lost_commits", "events", "wall (s)"],
        [[name, ", ".join(str(c) for c in rr["exit_codes"]),
          cell(rr["final_accuracy"], 4),
          cell(rr["time_to_target_s"], 1, "reached"),
          cell(rr["lost_commits"], 0), cell(rr["events"], 0),
          cell(rr["wall_s"], 0)] for name, rr in runs.items()])


def faults_table(s: Summary, n: int) -> list[str]:
    """Each fault of the schedule, the worker kills in one row."""
    rows = [[FAULT_NAMES[kind], fr["target"], cell(fr["offset_s"], 0),
             cell(fr["duration_s"]),
             cell(fr["detection_s"], 1, "detected"), fr["detected_by"],
             cell(fr["recovery_s"], 1, "recovered"), fr["recovered_by"],
             cell(fr["lost_training_s"]), f"{fr['rounds']} of {n}"]
            for kind, fr in s.faults.items()]
    kill_rounds, kills = s.kills["rounds"], s.kills
    footnote = []
    if any(k["kills"] for k in kill_rounds):
        undetected = sum(k["undetected"] for k in kill_rounds)
        unrecovered = sum(k["unrecovered"] for k in kill_rounds)
        rows.append([
            f"{FAULT_NAMES['worker_kill']} (every 10–20 s; "
            f"{cell(kills['kills'], 0)} a round)", "random", "5…", 0,
            f"median {cell(kills['detection_median_s'])}, max "
            f"{cell(kills['detection_max_s'])}", "PROCESS_FAILED (launcher)",
            f"median {cell(kills['recovery_median_s'])}, "
            f"max {cell(kills['recovery_max_s'])}",
            "WORKER_RESTARTED at the site",
            f"{cell(kills['lost_training_s_sum'])} (a round's sum, own site "
            "only)", f"{n} of {n}"
            + (f"; not detected: {undetected}" if undetected else "")
            + (f"; not recovered: {unrecovered}" if unrecovered else "")])
        footnote = ["", "Worker kills: median and max are each round's over "
                    "its kills; the cell is the median of the rounds with the "
                    "range."]
    return ["", "Per fault (seconds, as in a round's table; the median of the "
            f"{n} rounds with the range, \"k of {n} detected\" when not every "
            "round's was):", ""] + tables.table(
        ["fault", "target", "at", "lasted", "detection", "detected by",
         "recovery", "recovered by", "training lost (site·s)", "rounds"],
        rows) + footnote


def partition_section(part: Optional[dict]) -> list[str]:
    """The partition's commit rates (the whole window) and the quiet-time
    control (none: [])."""
    if not part:
        return []
    lines = ["", "Commit rate of the sites not partitioned during the "
             f"partition ({cell(part['window_s'])} s; the same window after "
             "t0 in the fault-free run; first PEER_UNREACHABLE "
             f"{cell(part['detected_after_s'])} s in), the whole window; the"
             " ratio is that of the medians:", ""]
    lines += tables.table(
        ["site", "chaos (commits/s)", "fault-free (commits/s)", "ratio"],
        [[site, cell(v["commits_per_s"]),
          cell(v["fault_free_commits_per_s"]),
          fmt(v["ratio"] and v["ratio"] * 100, 0, "%")]
         for site, v in part["sites"].items()])
    lines += ["", "The rounds' own ratios (together): "
              f"{repeats.fmt_cell(part['round_ratios'], percent)}."]
    q = part["quiet"]
    if q["ratio"] is not None:
        lines += ["", f"Control: over {cell(q['seconds'], 0)} site·seconds a "
                  "round with no fault active at the site, the chaos runs "
                  f"made {q['ratio'] * 100:.0f}% of the fault-free runs' "
                  "commits (ratio of the medians; the rounds' own: "
                  f"{repeats.fmt_cell(q['round_ratios'], percent)})"
                  ": the difference between the two runs that is not due to "
                  "faults." +
                  (UNRELIABLE_TEXT if abs(q["ratio"] - 1) > UNRELIABLE
                   else "")]
    return lines


def conservation_table(runs: dict, n: int) -> list[str]:
    checks = [
        ("report lost_commits", lambda rr: cell(rr["lost_commits"], 0)),
        ("Σ updates sent / Σ received (sites' counts)",
         lambda rr: f"{cell(rr['updates_sent_total'], 0)} / "
         f"{cell(rr['updates_received_total'], 0)}"),
        ("every peer's final flush arrived",
         lambda rr: f"{rr['flushed_rounds']} of {n} rounds"),
        ("max abs replica difference (rounding bound)",
         lambda rr: repeats.fmt_cell(rr["replica_max_abs_diff"],
                                     lambda v: f"{v:.3g}") +
         f" ({med(rr['replica_rounding_bound']) or 0:.3g})"),
        ("processes left / ports left (all rounds)",
         lambda rr: f"{rr['processes_left']} / {rr['ports_left']} (of "
         f"{rr['ports_checked']})"),
        ("WAN bytes (MB)",
         lambda rr: repeats.fmt_cell(rr["wan_bytes_total"],
                                     lambda v: f"{v / 1e6:.2f}")),
    ]
    return ["", "Conservation and cleanup (median of the rounds, range):",
            ""] + tables.table(
        ["check", *RUN_NAMES],
        [[check, *(text(runs[name]) for name in RUN_NAMES)]
         for check, text in checks])


def results_text(args: argparse.Namespace, outdir: str,
                 schedule_desc: list[dict], rounds: list[dict], s: Summary,
                 goals: list[Goal]) -> str:
    """OUTDIR/results.md of --repeat N."""
    n = len(rounds)
    changed = [f"r{i + 1} {c}" for i, r in enumerate(rounds)
               for c in r["binary_changed"]]
    extra = (f" Median of {n} rounds (range), each round a fault-free run and "
             "a chaos run back to back with the same schedule; each round's "
             "own tables: " + ", ".join(
                 f"{os.path.relpath(r['dir'], outdir)}/results.md"
                 for r in rounds) + "." +
             (f" **{args.binary} was replaced during the "
              f"{', '.join(changed)} run**: processes restarted after that "
              "ran the new binary." if changed else ""))
    lines = [f"# Chaos scenario (bench/scenarios/chaos), {n} rounds", ""]
    lines += preamble(args, schedule_desc, extra)
    lines += runs_table(s.runs)
    lines += faults_table(s, n)
    lines += partition_section(s.part)
    lines += conservation_table(s.runs, n)
    lines += ["", f"Total outage (time to {TARGET} goal): {cell(s.outage)} s "
              "(site crash and emulator: injection to recovery; partition "
              "and SIGSTOP: their length).", ""] + goal_rows.table(goals)
    lines += ["", repeats.note(n, ("reached", "detected", "recovered"),
                               "rounds", "the fault-free and the chaos runs")
              + " A check of each run is met when every round met it."]
    return "\n".join(lines) + "\n"


def results_json(args: argparse.Namespace, schedule_desc: list[dict],
                 rounds: list[dict], s: Summary, goals: list[Goal]) -> dict:
    """OUTDIR/results.json of --repeat N: the summary and every round."""
    return {"config": {"quick": args.quick, "seed": args.seed,
                       "budget_s": args.budget, "binary": args.binary,
                       "repeat": len(rounds), "schedule": schedule_desc},
            "summary": s.to_json(),
            "goals": goal_rows.to_json(goals),
            "rounds": [{"dir": r["dir"], "runs": r["summaries"],
                        "faults": r["faults"],
                        "partition_commit_rate": r["part"],
                        "replicas": r["replicas"], "leftovers": r["left"],
                        "total_outage_s": r["outage"],
                        "goals": goal_rows.to_json(r["goals"])}
                       for r in rounds]}
