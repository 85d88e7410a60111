"""Repeated runs of the end-to-end scenarios (`--repeat N`).

geo_vs_lan, heterogeneity, noniid and chaos run each variant (cell; for
chaos the fault-free and chaos pair) N times and report the median of the N
runs with their range. What they share is here:

  add_argument   --repeat N (default 1; N < 1 is a parser error)
  label          NAME-r1, NAME-r2, ... when N > 1; NAME alone when N = 1,
                 so that a single run's files keep their names
  order          round-robin: run 1 of every variant, then run 2 of every
                 variant, ...; slow drift of the machine (another job, a
                 warming page cache, thermal throttling) then hits every
                 variant alike instead of the last ones
  median_range   {median, min, max, runs, of} of one quantity over the runs
  fmt_cell       a markdown cell: "median (min–max)", or the value alone
                 when there was one run
  summarize      median_range of every numeric quantity of a list of rows

A time to a target (or the bytes, steps until it) that a run did not reach
is None, and counts as later than every run that reached it: the median of
10.1, 14.0 and not reached is 14.0, of 10.1 and two not reached is "not
reached" (—). The range is that of the runs that reached it, and the cell
says how many did: "14.0 (10.1–14.0; 2 of 3 reached)", "— (10.1; 1 of 3
reached)". Any other None (nothing to measure: no SkewScout, no samples) is
left out of the median and range ("0.12 (0.10–0.14; 2 of 3 runs)"). A ratio
or difference between two variants is computed from the medians of each
side, not as the median of per-run ratios. Only the standard library is
used.
"""

import argparse
import math
import statistics
from typing import Callable, Iterable, Optional, Sequence, Union

Cell = dict  # {median, min, max, runs, of} (median_range); None: no value


def repeat_count(text: str) -> int:
    """argparse type of --repeat: an integer of at least 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {n})")
    return n


def add_argument(parser: argparse.ArgumentParser,
                 what: str = "variant", default: int = 1) -> None:
    """--repeat N, every `what` N times (`default` when not given)."""
    parser.add_argument(
        "--repeat", type=repeat_count, default=default, metavar="N",
        help=f"run every {what} N times (round-robin: run 1 of every {what}, "
             "then run 2, ...) and report the median of the N runs with "
             f"their range [{default}]")


def label(name: str, run: int, repeat: int) -> str:
    """The label of run `run` (1-based) of `name`: NAME-rK when repeat > 1."""
    return f"{name}-r{run}" if repeat > 1 else name


def order(names: Sequence, repeat: int) -> list[tuple[int, object]]:
    """[(run, name)] in round-robin order, run 1-based."""
    return [(run, name) for run in range(1, repeat + 1) for name in names]


def median_range(values: Iterable[Optional[float]],
                 unreached: bool = False) -> Optional[Cell]:
    """{median, min, max, runs, of}: min and max of the `runs` values that
    are not None, `of` values in all; None when no value is. The median is
    that of the values that are not None, or with `unreached` (times to a
    target) of all of them with None later than any value: None when it
    falls on a None (the median run did not reach the target)."""
    values = list(values)
    present = [v for v in values if v is not None]
    if not present:
        return None
    if unreached:
        mid = statistics.median(
            [math.inf if v is None else v for v in values])
        mid = None if math.isinf(mid) else mid
    else:
        mid = statistics.median(present)
    return {"median": mid, "min": min(present), "max": max(present),
            "runs": len(present), "of": len(values)}


def median(cell: Optional[Cell]) -> Optional[float]:
    """The median of a median_range cell (None for None)."""
    return None if cell is None else cell["median"]


def fmt_cell(cell: Optional[Cell],
             fmt: Callable[[float], str] = lambda v: f"{v:g}",
             counted: str = "runs", missing: str = "—") -> str:
    """A markdown cell: `fmt(median)` alone after one run, else
    "median (min–max)"; "k of n <counted>" added when only k of the n runs
    had a value (counted: "runs", "reached", "converged", ...); `missing`
    for no value or a median that was not reached."""
    if cell is None:
        return missing
    text = missing if cell["median"] is None else fmt(cell["median"])
    of = cell.get("of", cell["runs"])
    if of <= 1:
        return text
    inside = []
    if cell["runs"] > 1:
        inside.append(f"{fmt(cell['min'])}–{fmt(cell['max'])}")
    elif cell["median"] is None:  # the one run that reached it
        inside.append(fmt(cell["min"]))
    if cell["runs"] < of:
        inside.append(f"{cell['runs']} of {of} {counted}")
    return f"{text} ({'; '.join(inside)})"


def partial(cell: Optional[Cell], counted: str = "runs") -> str:
    """' (k of n <counted>)' when only some runs had the value, else ''."""
    if cell is None or cell["runs"] >= cell.get("of", cell["runs"]):
        return ""
    return f" ({cell['runs']} of {cell['of']} {counted})"


def is_number(v: object) -> bool:
    """An int or a float, not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize(rows: Sequence[dict],
              unreached: Iterable[str] = ()) -> dict[str, Optional[Cell]]:
    """{key: median_range} of every key whose values are numbers (or None)
    in the rows, the keys in `unreached` (times to a target) with None as
    not reached; a boolean key becomes {"true": k, "of": n}. Other keys
    (names, lists, dicts) are left out."""
    keys = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    out = {}
    for key in keys:
        values = [row.get(key) for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            out[key] = {"true": sum(1 for v in present if v),
                        "of": len(values)}
        elif present and all(is_number(v) for v in present):
            out[key] = median_range(values, key in unreached)
        elif not present:
            out[key] = None
    return out


def median_row(summary: dict[str, Optional[Cell]]) -> dict:
    """{key: median} of a summarize() result (booleans: True when most runs
    had it)."""
    row = {}
    for key, cell in summary.items():
        if cell is None:
            row[key] = None
        elif "true" in cell:
            row[key] = cell["true"] * 2 > cell["of"]
        else:
            row[key] = cell["median"]
    return row


def note(repeat: int, counted: Union[str, Sequence[str]] = "reached",
         runs: str = "runs", sides: str = "variants") -> str:
    """The footnote of a table of medians ('' for one run); `counted`: the
    word (or words) of "k of N <counted>" in its cells; `runs`: what was
    repeated; `sides`: what the ratios compare."""
    if repeat <= 1:
        return ""
    words = counted if isinstance(counted, str) else " / ".join(counted)
    return (f"Cells: median of {repeat} {runs} (range: min–max over the "
            f"{runs}). Ratios and differences between {sides} are computed "
            "from the medians of each side. A time to a target counts the "
            f"{runs} that did not reach it as later than any that did (— : "
            f"the median one did not); its range is that of the {runs} that "
            f"did, with \"k of {repeat} {words}\" when not all did.")

