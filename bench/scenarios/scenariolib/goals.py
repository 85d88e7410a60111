"""Goal checks: what a scenario wants, what it measured, and whether that
is met, as the rows of a "| goal | wanted | measured | met |" table and of
results.json's "goals".
"""

from typing import Iterable, NamedTuple, Optional

from scenariolib import tables


class Goal(NamedTuple):
    """One goal: its name, what is wanted ("≥ 20×"), what was measured
    ("30.0×") and whether it is met."""
    goal: str
    wanted: str
    measured: str
    met: bool


def table(goals: Iterable[Goal]) -> list[str]:
    """The lines of the goal table (met: yes / no)."""
    return tables.table(("goal", "wanted", "measured", "met"),
                        [(g.goal, g.wanted, g.measured,
                          "yes" if g.met else "no") for g in goals])


def to_json(goals: Iterable[Goal]) -> list[dict]:
    """results.json's "goals": [{goal, wanted, measured, met}]."""
    return [g._asdict() for g in goals]


def met(goals: Iterable[Goal], name: str) -> Optional[bool]:
    """Whether the goal named `name` is met; None when there is none."""
    return next((g.met for g in goals if g.goal == name), None)
