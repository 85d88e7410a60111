"""What a worker keeps of its answered commits until its site holds them
durably, for a replay after the site restarts (docs/worker-protocol.md
§14). The C++ worker's UndurableCommits (src/worker/undurable_commits.h)
does the same; see there for the reasoning.

Every WELCOME and MODEL of a site that keeps checkpoints carries a
DurablePoint: commits at or below its commit_id are dropped; the rest are
kept as sums of consecutive commits, two neighbours summed unless a pending
checkpoint's id lies between them. Bound: at most MAX_KEPT sums of the
model's size; past it the two oldest are merged, logged (a restart from a
checkpoint between them loses them, and the site counts them lost).
"""

import logging
from typing import List, Optional

import numpy as np

_LOG = logging.getLogger("meridian")

MAX_KEPT = 4


class Kept:
    """The summed change of commits first_id .. last_id."""

    def __init__(self, first_id: int, last_id: int, total: np.ndarray):
        self.first_id = first_id
        self.last_id = last_id
        self.sum = total


class UndurableCommits:
    def __init__(self):
        self.kept: List[Kept] = []
        self._pending: List[int] = []
        self.forced_merges = 0

    def add(self, commit_id: int, change: np.ndarray, point) -> None:
        """Commit `commit_id` was answered with DurablePoint `point`; the
        site applied `change` (flat float32, copied here)."""
        self.kept.append(Kept(commit_id, commit_id,
                              np.array(change, dtype=np.float32)))
        self.on_point(point)

    def on_point(self, point) -> None:
        self._pending = list(point.pending)
        self.kept = [k for k in self.kept if k.last_id > point.commit_id]
        self._compact()

    def clear(self) -> None:
        self.kept = []
        self._pending = []

    def commits(self) -> int:
        return sum(k.last_id - k.first_id + 1 for k in self.kept)

    def _separated(self, a: Kept, b: Kept) -> bool:
        return any(a.last_id <= p < b.first_id for p in self._pending)

    def _compact(self) -> None:
        i = 0
        while i + 1 < len(self.kept):
            a, b = self.kept[i], self.kept[i + 1]
            if self._separated(a, b):
                i += 1
                continue
            a.sum += b.sum
            a.last_id = b.last_id
            del self.kept[i + 1]
        while len(self.kept) > MAX_KEPT:
            a, b = self.kept[0], self.kept[1]
            if self.forced_merges % 100 == 0:
                _LOG.warning("more than %d sums of commits the site does not "
                             "hold durably: commits %d to %d are kept as one "
                             "sum (a restart of the site from a checkpoint "
                             "between them loses them)", MAX_KEPT,
                             a.first_id, b.last_id)
            self.forced_merges += 1
            a.sum += b.sum
            a.last_id = b.last_id
            del self.kept[1]


def durable_point(header) -> Optional[object]:
    """The DurablePoint of a WELCOME or MODEL header (None: the site keeps
    no checkpoints)."""
    if header.HasField("welcome") and header.welcome.HasField("durable"):
        return header.welcome.durable
    if header.HasField("model") and header.model.HasField("durable"):
        return header.model.durable
    return None
