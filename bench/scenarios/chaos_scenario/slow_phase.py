"""The slow-link phase of the chaos scenario: after the rounds, the shipped
three-region job (deploy/configs/three-regions.pbtxt) once per rate, its
us-ap link set to that rate 15 s into training to the end of the run, both
directions (bench/scenarios/slow_link does the runs and sets the goals: exit
status 0, the final flush complete, no peer declared unreachable, replicas
identical up to rounding).

The phase's runs are OUTDIR/slow-link/RATE (the run's --out) with
RATE.out (the launcher's output); OUTDIR/slow-link/rows.json keeps what
they measured, which --reanalyse reads back.
"""

import json
import os
from typing import Optional

import slow_link
from chaos_scenario import log
from scenariolib import goals as goal_rows

DIRNAME = "slow-link"
ROWS = "rows.json"


def rates_of(text: str) -> list[str]:
    """--slow-link-rates: comma-separated wanem rates; "none" or "" for
    none."""
    if text.strip().lower() == "none":
        return []
    return [r.strip() for r in text.split(",") if r.strip()]


def run(binary: str, outdir: str, rates: list[str],
        reanalyse: bool) -> Optional[list[dict]]:
    """The phase's rows, one per rate (run now, or read back with
    `reanalyse`); None when there are no rates or nothing to read."""
    if not rates:
        return None
    phase_dir = os.path.join(outdir, DIRNAME)
    path = os.path.join(phase_dir, ROWS)
    if reanalyse:
        rows = slow_link.read_json(path)
        return [r for r in rows if r["rate"] in rates] if rows else None
    os.makedirs(phase_dir, exist_ok=True)
    rows = []
    for rate in rates:
        log(f"slow-link phase: link {slow_link.LINK} set to {rate} "
            f"{slow_link.AT_S:g} s into training")
        run_dir = os.path.join(phase_dir, rate)
        result = slow_link.run_slowed(binary, slow_link.CONFIG, run_dir,
                                      slow_link.LINK, rate, slow_link.AT_S)
        row = slow_link.analyse(result, run_dir, rate)
        row["set_output"] = (row["set_output"].splitlines() or [""])[0]
        rows.append(row)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    return rows


def goals(rows: Optional[list[dict]]) -> list[goal_rows.Goal]:
    """Every rate's goals (slow_link.row_goals), none without rows."""
    return [g for row in rows or [] for g in slow_link.row_goals(row)]


def section(rows: Optional[list[dict]]) -> list[str]:
    """results.md's section: the runs' table and their goals."""
    if not rows:
        return []
    return (["", "## Slow-link phase", "",
             f"`{os.path.basename(slow_link.CONFIG)}`, link "
             f"{slow_link.LINK} set to each rate {slow_link.AT_S:g} s into "
             "training, to the end of the run (both directions); one run per "
             "rate. A slow link must not pass for a dead peer: exit status "
             "0, the final flush complete, no peer declared unreachable, "
             "replicas identical up to rounding "
             f"(≤ {slow_link.REPLICA_TOLERANCE:g}).", ""]
            + slow_link.table(rows) + [""] + goal_rows.table(goals(rows)))
