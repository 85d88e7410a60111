"""Markdown tables and the number formats of their cells.

  row, table   "| a | b |" lines; a header, its rule and the rows
  number       a value with a fixed number of digits, "—" for none,
               "∞" for infinity
  data_size    bytes as "12.34 MB", "5.00 kB", "17 B"
"""

import math
from typing import Iterable, Optional, Sequence

MISSING = "—"  # a cell without a value (not measured, not reached)


def row(cells: Iterable[object]) -> str:
    """One table line: "| a | b |" (an empty cell is "|  |")."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str],
          rows: Iterable[Sequence[object]]) -> list[str]:
    """The lines of a markdown table: the header, its rule, the rows."""
    return [row(header), "|" + "---|" * len(header)] + [row(r) for r in rows]


def number(value: Optional[float], digits: int = 1, unit: str = "",
           missing: str = MISSING) -> str:
    """`value` with `digits` decimals and `unit` ("12.3", "95%");
    `missing` for None, "∞" for infinity."""
    if value is None:
        return missing
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return f"{value:.{digits}f}{unit}"


def data_size(size: Optional[float], missing: str = MISSING,
              kilo_digits: int = 2) -> str:
    """Bytes in the largest unit of at least one: "1.23 GB", "12.34 MB",
    "5.00 kB" (`kilo_digits` decimals), "17 B"; `missing` for None."""
    if size is None:
        return missing
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 2),
                                ("kB", 1e3, kilo_digits)):
        if size >= scale:
            return f"{size / scale:.{digits}f} {unit}"
    return f"{size:.0f} B"
