"""Reading what a run left in its run directory.

  read        RUN_DIR/report.json; exits naming a missing or broken one
  timelines   each site's [timeline point] of a report
  first       the first point of a timeline that satisfies a predicate
  time_to     when every site's timeline has satisfied it (the latest of
              their first points), None when one never did
  traffic     the rows of a wanem traffic CSV (t_s, link, from_site, bytes,
              bandwidth_bps, ...) by column name
"""

import csv
import json
import os
from typing import Callable, Iterable, Optional

Point = dict  # a timeline point: t_s, accuracy or metric, loss, commits, ...


def read(run_dir: str, tag: str) -> dict:
    """RUN_DIR/report.json (just run, or already there for
    --summarize-only); exits naming a missing or broken one, the message
    prefixed with [TAG]."""
    path = os.path.join(run_dir, "report.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise SystemExit(f"[{tag}] cannot read {path}: {error}")


def timelines(report: dict) -> list[list[Point]]:
    """Each site's evaluations, the sites in the report's order."""
    return [s.get("timeline", []) for s in report.get("sites", [])]


def first(points: Iterable[Point],
          reached: Callable[[Point], bool]) -> Optional[Point]:
    """The first point for which `reached` holds, or None."""
    return next((p for p in points if reached(p)), None)


def time_to(site_timelines: Iterable[list[Point]],
            reached: Callable[[Point], bool]) -> Optional[float]:
    """Seconds until every site has reached (the latest of the sites' first
    points that satisfy `reached`); None when a site never did, or there is
    no site."""
    times = []
    for points in site_timelines:
        point = first(points, reached)
        if point is None:
            return None
        times.append(point["t_s"])
    return max(times) if times else None


def traffic(path: str) -> list[dict[str, str]]:
    """The rows of a traffic CSV written by wanem, by column name; rows of
    another length than the header's are left out (a line being written
    when the run ended)."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return []
        return [dict(zip(header, row)) for row in reader
                if len(row) == len(header)]
