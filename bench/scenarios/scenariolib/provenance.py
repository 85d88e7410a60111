"""Where a measurement comes from: the command line, the git commit (and
whether the tree had changes), the date and the machine.

Captured when the scenario starts (Provenance.capture), written above the
tables a scenario publishes (publish.py).
"""

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from typing import Optional, Sequence

from scenariolib import ROOT, shown

# Changes under these paths do not make the tree dirty: they are what the
# scenarios themselves write (docs/results/<name>.md).
GENERATED_PATHS = ("docs/results",)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), "unknown" when not known."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def memory_bytes() -> Optional[int]:
    """The machine's memory (MemTotal of /proc/meminfo), None when not
    known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _git(*args: str) -> Optional[str]:
    try:
        proc = subprocess.run(["git", "-C", ROOT, *args], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_state() -> tuple[Optional[str], Optional[bool]]:
    """(commit of HEAD, whether tracked files differ from it, not counting
    GENERATED_PATHS); None each when ROOT is not a git work tree."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no", "--",
                  ".", *(f":(exclude){p}" for p in GENERATED_PATHS))
    return commit.strip(), None if status is None else bool(status.strip())


def command_line(argv: Sequence[str]) -> str:
    """The command as typed, its program relative to the repository when it
    is in it: "bench/scenarios/geo_vs_lan /tmp/out --quick"."""
    return shlex.join([shown(argv[0]) if argv else "?", *argv[1:]])


@dataclasses.dataclass(frozen=True)
class Provenance:
    """What a published measurement names besides its tables."""
    command: str
    commit: Optional[str]
    dirty: Optional[bool]
    started: float           # Unix time
    cpu: str
    logical_cpus: Optional[int]
    memory_bytes: Optional[int]

    @classmethod
    def capture(cls, argv: Optional[Sequence[str]] = None) -> "Provenance":
        """This process's command line (sys.argv), the repository's commit
        and the machine, now."""
        commit, dirty = git_state()
        return cls(command=command_line(sys.argv if argv is None else argv),
                   commit=commit, dirty=dirty, started=time.time(),
                   cpu=cpu_model(), logical_cpus=os.cpu_count(),
                   memory_bytes=memory_bytes())

    def lines(self, finished: Optional[float] = None) -> list[str]:
        """Markdown list items: command, commit, date, machine."""
        if self.commit is None:
            commit = "unknown (not a git work tree)"
        else:
            tree = {True: "with uncommitted changes",
                    False: "clean tree"}.get(self.dirty, "tree state unknown")
            commit = f"`{self.commit}` ({tree})"
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.started))
        if finished is not None:
            took = finished - self.started
            date += (f" (took {took:.0f} s)" if took < 90 else
                     f" (took {took / 60:.0f} min)")
        memory = ("memory unknown" if self.memory_bytes is None else
                  f"{self.memory_bytes / 2 ** 30:.1f} GiB memory")
        cpus = ("?" if self.logical_cpus is None else str(self.logical_cpus))
        return [f"- Command: `{self.command}`",
                f"- Commit: {commit}",
                f"- Date: {date}",
                f"- Machine: {self.cpu}, {cpus} logical CPUs, {memory}"]
