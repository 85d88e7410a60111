"""What the chaos run injects when.

The schedule is in seconds after t0 (when every site commits); --budget
stretches or shrinks the start times in proportion (the durations stay).
The sites killed and stopped and the workers (and when) come from the
seed; the partitioned site (ap) and the slowed link (us-eu) are fixed.
The crashed site is killed a second time a few seconds after the first,
once it has restarted: within one checkpoint period (10 s, the job's
default), so what it answered since its restart is in no checkpoint yet.
"""

import random
from typing import Union

from chaos_scenario.job import SITES, WORKERS_PER_SITE

PARTITIONED = "ap"          # cut off from both others
SLOW_LINK = ("us", "eu")    # the only link not touching the partitioned site
SLOW_FACTOR = 20

# name -> (start offset s, duration s), full and --quick.
SCHEDULES = {
    "full": {"budget": 330.0, "site_crash": (20, 0),
             "site_crash_again": (26, 0), "wanem_crash": (45, 0),
             "partition": (70, 90), "sigstop": (180, 30),
             "slow_link": (235, 60)},
    "quick": {"budget": 155.0, "site_crash": (12, 0),
              "site_crash_again": (17, 0), "wanem_crash": (25, 0),
              "partition": (38, 40), "sigstop": (88, 15),
              "slow_link": (110, 30)},
}
WORKER_KILL_FIRST_S = 5.0
WORKER_KILL_GAP_S = (10.0, 20.0)
SETTLE_S = 10.0             # quiet time wanted after the last fault
# The crashes of a site server (the second one kills the restarted server).
SITE_CRASHES = ("site_crash", "site_crash_again")
# The faults that last (a start and an end) rather than happen once.
TIMED = ("partition", "sigstop", "slow_link")

FAULT_NAMES = {
    "worker_kill": "kill -9 worker",
    "site_crash": "kill -9 site server",
    "site_crash_again": "kill -9 site server again",
    "wanem_crash": "kill -9 emulator",
    "partition": "partition",
    "sigstop": "SIGSTOP site server",
    "slow_link": f"link slowed {SLOW_FACTOR}x",
}

# (offset_s, kind, target, duration_s); a worker kill's target is (site,
# index), every other's a string.
Event = tuple[float, str, Union[str, tuple[str, int]], float]


def build_schedule(rng: random.Random, sched: dict,
                   budget: float) -> list[Event]:
    """[(offset_s, kind, target, duration_s)] of the chaos run."""
    scale = budget / sched["budget"]
    events = []
    crash_site = rng.choice(SITES)
    stop_site = rng.choice(SITES)
    for kind, target in (("site_crash", crash_site),
                         ("site_crash_again", crash_site),
                         ("wanem_crash", "wanem"),
                         ("partition", PARTITIONED), ("sigstop", stop_site),
                         ("slow_link", "-".join(SLOW_LINK))):
        start, duration = sched[kind]
        events.append((start * scale, kind, target, float(duration)))
    last_end = max(s + d for s, _, _, d in events)
    if last_end + SETTLE_S > budget:
        raise SystemExit(f"[chaos] --budget {budget:g} s is too short for the "
                         f"schedule (the last fault ends at {last_end:g} s; "
                         f"wanted {SETTLE_S:g} s after it)")
    t = WORKER_KILL_FIRST_S
    while t < budget - SETTLE_S:
        events.append((t, "worker_kill",
                       (rng.choice(SITES), rng.randrange(WORKERS_PER_SITE)),
                       0.0))
        t += rng.uniform(*WORKER_KILL_GAP_S)
    return sorted(events, key=lambda e: e[0])


def describe(schedule: list[Event]) -> list[dict]:
    """The schedule as results.json and the tables name it: offset_s
    (0.1 s), fault, target ("us/2" for a worker), duration_s."""
    return [{"offset_s": round(o, 1), "fault": k,
             "target": t if isinstance(t, str) else f"{t[0]}/{t[1]}",
             "duration_s": d} for o, k, t, d in schedule]


def schedule_line(schedule_desc: list[dict]) -> str:
    """The schedule in one line of a table's preamble."""
    return "Schedule (s after t0, when every site commits): " + ", ".join(
        f"{d['offset_s']:.0f} {FAULT_NAMES[d['fault']]} {d['target']}"
        + (f" for {d['duration_s']:g} s" if d["duration_s"] else "")
        for d in schedule_desc) + "."
