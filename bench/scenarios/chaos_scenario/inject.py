"""The faults injected into a chaos run, and a schedule carried out.

Every injection is recorded in the run's `injections` (kind, target, when,
pids or links, and for a timed fault its end), every `wanem ctl` in its
`ctl_log`; a SIGSTOPped pid stays in `stopped_pids` until its SIGCONT, so
that Run.abort can resume it.
"""

import os
import signal
import time

from chaos_scenario import log, processes, wan
from chaos_scenario.job import SITES
from chaos_scenario.run import Run
from chaos_scenario.schedule import SLOW_FACTOR, TIMED, Event


class Injector:
    """The fault actions on one Run (which owns what they record). Driven
    by run_schedule on the script's main thread."""

    def __init__(self, run: Run):
        self.run = run

    def ctl(self, args: list[str]) -> dict:
        """`meridian wanem ctl ARGS` on the run's emulator, logged."""
        return wan.wanem_ctl(self.run.binary, self.run.dir, args,
                             self.run.ctl_log)

    def record(self, kind: str, target: str, **extra) -> dict:
        """A new entry of run.injections: kind, target, when (Unix time and
        offset from t0), and `extra`."""
        entry = {"kind": kind, "target": target, "unix_s": time.time(),
                 "offset_s": time.time() - self.run.t0}
        entry.update(extra)
        self.run.injections.append(entry)
        return entry

    def kill9(self, kind: str, role: tuple, target: str,
              exclude: frozenset = frozenset(), tries: int = 6) -> dict:
        """kill -9 of the run's processes in `role` (processes.role_of),
        but not those in `exclude` (already killed: the kill waits, up to
        `tries` × 0.5 s, for their restarted successors)."""
        pids = []
        for _ in range(tries):  # restarting right now: try again shortly
            pids = [p for p in processes.find_pids(self.run.dir, role)
                    if p not in exclude]
            if pids:
                break
            time.sleep(0.5)
        if not pids:
            log(f"{self.run.name}: {kind} {target}: no process found")
            return self.record(kind, target, pids=[], note="no process found")
        entry = self.record(kind, target, pids=pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as e:
                entry["note"] = str(e)
        log(f"{self.run.name}: t+{entry['offset_s']:.1f} s kill -9 {target} "
            f"(pid {', '.join(map(str, pids))})")
        return entry

    def partition_start(self, site: str, duration: float) -> dict:
        """Cuts `site` off from every other site."""
        others = [s for s in SITES if s != site]
        links = [f"{o}-{site}" for o in others]
        entry = self.record("partition", site, links=links,
                            duration_s=duration, ctl=[])
        for link in links:
            entry["ctl"].append(self.ctl(["partition", link]))
        log(f"{self.run.name}: t+{entry['offset_s']:.1f} s partition "
            f"{', '.join(links)} for {duration:g} s")
        return entry

    def partition_end(self, entry: dict) -> None:
        entry["end_unix_s"] = time.time()
        for link in entry["links"]:
            entry["ctl"].append(self.ctl(["heal", link]))
        log(f"{self.run.name}: t+{time.time() - self.run.t0:.1f} s healed "
            f"{', '.join(entry['links'])}")

    def sigstop_start(self, site: str, duration: float) -> dict:
        """SIGSTOP of `site`'s server."""
        pids = processes.find_pids(self.run.dir, ("site", site))
        entry = self.record("sigstop", site, pids=pids, duration_s=duration)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            self.run.stopped_pids.add(pid)
        if not pids:
            entry["note"] = "no process found"
        log(f"{self.run.name}: t+{entry['offset_s']:.1f} s SIGSTOP site "
            f"server {site} (pid {', '.join(map(str, pids))}) for "
            f"{duration:g} s")
        return entry

    def sigstop_end(self, entry: dict) -> None:
        entry["end_unix_s"] = time.time()
        for pid in entry["pids"]:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError as e:
                entry["note"] = str(e)
            self.run.stopped_pids.discard(pid)
        log(f"{self.run.name}: t+{time.time() - self.run.t0:.1f} s SIGCONT "
            f"{entry['target']}")

    def slow_start(self, link: str, duration: float) -> dict:
        """`link` ("us-eu") at its bandwidth / SLOW_FACTOR, both
        directions."""
        a, b = link.split("-")
        status = self.ctl(["status"])
        bps, source = wan.link_bandwidth(
            status.get("output") if status else "", self.run.dir, a, b)
        slow = max(1000, int(bps / SLOW_FACTOR))
        entry = self.record("slow_link", link, duration_s=duration,
                            bandwidth_bps=bps, bandwidth_source=source,
                            slowed_bps=slow)
        entry["ctl"] = [self.ctl(["set", link, "--bandwidth",
                                  f"{slow}bit"])]
        log(f"{self.run.name}: t+{entry['offset_s']:.1f} s link {link} "
            f"{bps / 1e6:g} -> {slow / 1e6:g} Mbit/s (from {source}) for "
            f"{duration:g} s")
        return entry

    def slow_end(self, entry: dict) -> None:
        entry["end_unix_s"] = time.time()
        entry["ctl"].append(self.ctl(
            ["set", entry["target"], "--bandwidth",
             f"{int(entry['bandwidth_bps'])}bit"]))
        log(f"{self.run.name}: t+{time.time() - self.run.t0:.1f} s link "
            f"{entry['target']} back to {entry['bandwidth_bps'] / 1e6:g} "
            "Mbit/s")

    def finish_open_faults(self, open_faults: dict[str, dict]) -> None:
        """The run ended (or the script stops) with a timed fault on: end
        it, so nothing stays stopped."""
        for kind, entry in list(open_faults.items()):
            if kind == "sigstop":
                self.sigstop_end(entry)
            elif kind == "partition" and self.run.running():
                self.partition_end(entry)
            elif kind == "slow_link" and self.run.running():
                self.slow_end(entry)
            else:
                entry["end_unix_s"] = time.time()
            entry["note"] = "the run ended during the fault"
        open_faults.clear()


def run_schedule(run: Run, schedule: list[Event]) -> None:
    """Injects the faults in order. A timed fault is two actions, its start
    and its end, so the worker kills due meanwhile go on."""
    actions = []
    for offset, kind, target, duration in schedule:
        actions.append((offset, 0, kind, target, duration))
        if kind in TIMED:
            actions.append((offset + duration, 1, kind, target, duration))
    actions.sort(key=lambda a: (a[0], -a[1]))  # ends before starts
    inject = Injector(run)
    open_faults = {}
    killed: dict[str, list[int]] = {}  # site -> its server's killed pids
    try:
        for offset, is_end, kind, target, duration in actions:
            if not run.sleep_until(offset):
                log(f"{run.name}: the run ended before t+{offset:.0f} s "
                    f"({kind})")
                return
            if is_end:
                entry = open_faults.pop(kind)
                {"partition": inject.partition_end,
                 "sigstop": inject.sigstop_end,
                 "slow_link": inject.slow_end}[kind](entry)
            elif kind == "worker_kill":
                site, index = target
                inject.kill9("worker_kill", ("worker", site, index),
                             f"{site}/{index}")
            elif kind == "site_crash":
                killed[target] = inject.kill9(
                    "site_crash", ("site", target), f"site '{target}'")["pids"]
            elif kind == "site_crash_again":
                # The restarted server, however long its restart takes
                # (up to 20 s).
                inject.kill9("site_crash_again", ("site", target),
                             f"site '{target}'",
                             frozenset(killed.get(target, [])), tries=40)
            elif kind == "wanem_crash":
                inject.kill9("wanem_crash", ("wanem",), "wanem")
            elif kind == "partition":
                open_faults[kind] = inject.partition_start(target, duration)
            elif kind == "sigstop":
                open_faults[kind] = inject.sigstop_start(target, duration)
            elif kind == "slow_link":
                open_faults[kind] = inject.slow_start(target, duration)
    finally:
        inject.finish_open_faults(open_faults)
