#!/usr/bin/env python3
"""Intra-site commit scheduling under device heterogeneity (ADSP, AAAI 2020).

    bench/scenarios/heterogeneity OUTDIR [--quick] [--repeat N]
                                  [--only POLICY,...]
                                  [--h 1.45,2.0,...] [--budget SECONDS]
                                  [--workload mlp|cnn|cnn-bn|cnn-gn|mf]
                                  [--dry-run]
                                  [--network NAME,...] [--delays MS,...]
                                  [--binary PATH] [--summarize-only]
                                  [--publish | --no-publish]

One site, 18 workers (MLP 784-256-10 on Fashion-MNIST), each an emulated
device with a fixed step time: 11 fast ones at 30 ms a step and 7 slowed so
that H = mean(v) / min(v) takes the paper's values 1.45, 2.0, 2.6 and 3.2
(slow step = 30 ms x k with H = (11k + 7) / 18). Every policy runs the same
job through `meridian run`:

  ADSP            equal commit rate for every worker, dC and momentum
                  searched online
  BSP             every worker commits every step; all wait for the slowest
  SSP             staleness 40 commits
  TAP             fully asynchronous (policy ASYNC), a commit every step
  FIXED_ADACOMM   tau = 40 local steps, then synchronous averaging
  ADACOMM         tau = ceil(sqrt(L / L0) tau0), tau0 = 40

Convergence time is the paper's rule: seconds of training until the 10th
test-set evaluation (one per second) with a loss below --loss-target; the
time to --accuracy-target is recorded too. ADSP's search time is inside its
convergence time and also shown on its own. A run that does not converge
within --budget reports no time (the table says so). Also 36 workers at
H = 3.2 (the paper's scalability point).

--workload cnn, cnn-bn or cnn-gn (bench/scenarios/scenariolib/workloads.py):
the LeNet-5-style CNN (without a norm, with BatchNorm, with GroupNorm) on the
same data, fast devices at 100 ms a step (a LeNet step takes 5-8 ms of one
core: eighteen workers and the site server's evaluation every second then
leave the two cores headroom) and a 300 s budget; the same targets as the
MLP.
--workload mf: matrix factorisation on a
generated rating matrix instead, fast devices at 5 ms a step (an MF step is
~0.1 ms; the commit, whose reply is the whole 3.7 MB model, is the cost),
apply rule MEAN with its optimizer, and BSP, SSP and TAP commit every 32
local steps rather than every step. Its metric is the test RMSE (lower is
better): convergence is the 10th evaluation with RMSE <= 0.75 (the
workload's easier target) and the time to --accuracy-target (default 0.70)
is the first evaluation at or below it.

--quick: H = 3.2 with 18 workers for ADSP, FIXED_ADACOMM and BSP only.
--dry-run writes the configs and checks each with `meridian validate` (with
--repeat N it also prints the order of the runs). --summarize-only runs
nothing and rebuilds the tables from the runs already in OUTDIR (given the
flags they ran with), for example after the script's summaries changed.

--repeat N runs every cell (policy, H, workers) N times, as NAME-r1 ...
NAME-rN (configs and run directories), in round-robin order: run 1 of
every cell, then run 2 of every cell, ..., so that slow drift of the
machine hits every cell alike. The table's cells are then the median of the
N runs with the range, median (min–max); for a convergence time or time
to the target a run that did not converge or reach it counts as later than
any that did (— when the median run did not), the range is that of the
runs that did, "2 of 3 converged" when not all did; the goals' "% faster"
is computed from the medians of each side. results.json keeps every run's
numbers ("runs") and each cell's median, min and max of every quantity
("cells"); with N = 1 the table is as before. Every run has the same seed:
repeats differ by timing, as runs on a shared machine do
(bench/scenarios/scenariolib/repeats.py).

--network NAME[,NAME...] (default none) puts the workers behind emulated
access links (the job file's workers.link; `meridian run` routes each
worker's traffic to its site server through the WAN emulator, which shapes
and counts it as edge traffic):

  none            loopback, as without --network: heterogeneity of compute
                  only
  edge            a mixed edge population, so that communication is as
                  heterogeneous as compute and the slower devices also have
                  the slower networks: the fast devices half on "campus",
                  half on "home-broadband" (the odd one on campus), the slow
                  ones half on "5g", half on "4g" (the odd one on 5g); 18
                  workers: 6 campus, 5 home-broadband, 4 5g, 3 4g; 36: 11,
                  11, 7, 7. The order is that of the presets' uplink (a
                  commit's direction) and latency alike
  home-broadband, 4g, 5g, campus
                  every worker behind that preset

The presets (wan/presets.cc; down / up Mbit/s, one-way latency ms, no
jitter): campus 1000 / 1000 / 0.5, home-broadband 79 / 34.92 / 4.5, 5g
203.04 / 18.93 / 22, 4g 21.3 / 6.3 / 27.625. The scenario reads them from
`meridian presets --json` (a delay is added to their latency).

--delays MS[,MS...] sweeps an extra one-way delay (ms, both directions of
every worker's access link, on top of the network's own): with a preset (or
edge) the link's latency becomes the preset's plus MS (both.latency; the
preset's bandwidths stay); with none a link of unlimited bandwidth and MS of
latency (both { bandwidth: "unlimited" latency: ... }) -- except MS = 0,
which stays loopback, the same run as without --delays. Default: no sweep
(0 only).

The cells are then network x delay x H x policy (and the 36-worker runs per
network and delay), named NAME[-NETWORK][-dMSms] (no suffix for none and for
0 ms: adsp-h3.2-w18, adsp-h3.2-w18-edge-d20ms), run H by H, within an H
network by network and delay by delay (--repeat: round-robin over all of
them). The table gains a network column (and a delay column with --delays)
and the edge traffic of the run (MB, both directions; "loopback": not
emulated, not counted), and a second table sets each policy's convergence
time side by side per network and delay, with ADSP's lead ("% faster" than
FIXED_ADACOMM and BSP, from the medians; "≥" when the rival did not
converge within the budget, counted against the budget or, for BSP, a
lower bound extrapolated from the loopback BSP run of the same round when
that is later: the steps after which that run's loss first fell below the
target, at the run's own measured step rate; BSP makes the same steps
whatever the network) per column, so that one reads across whether
the lead grows with the delay. The goals are checked per network and delay.
results.json then also records per run the network, delay_ms,
edge_bytes_total (edge_up_bytes: worker -> server, edge_down_bytes; None
for loopback), each worker's link and the mean blocked_s per link. Without
--network and --delays the output is as before.

Writes OUTDIR/results.md and OUTDIR/results.json. A complete run publishes
results.md into docs/results/heterogeneity.md (--quick:
heterogeneity-quick.md), with the command line, commit, date and machine;
--only, --h, --no-36 and --summarize-only runs publish only with --publish,
--no-publish never (bench/scenarios/scenariolib/publish.py). Only the
standard library is used.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Mapping, Optional

from scenariolib import (cli, goals as goal_rows, reports, repeats, results,
                         runner, tables, workloads)
from scenariolib.goals import Goal

SCENARIO = results.Scenario("heterogeneity",
                            "Heterogeneous workers in one site")
TAG = SCENARIO.name

# The workloads this scenario is set up for, with their fast device step
# (s) and default budget (s).
FAST_STEPS = {"mlp": 0.03, "cnn": 0.1, "cnn-bn": 0.1, "cnn-gn": 0.1,
              "mf": 0.005}
BUDGETS = {"cnn": 300.0, "cnn-bn": 300.0, "cnn-gn": 300.0}
DEFAULT_BUDGET = 150.0
FASHION_MNIST = ('data { dir: "/usr/share/datasets/fashion-mnist" '
                 'normalization: STANDARDIZE }')
H_VALUES = (1.45, 2.0, 2.6, 3.2)
POLICIES = ("ADSP", "BSP", "SSP", "TAP", "FIXED_ADACOMM", "ADACOMM")
QUICK_POLICIES = ("ADSP", "FIXED_ADACOMM", "BSP")
CONVERGED_EVALUATIONS = 10  # the paper's rule: the 10th evaluation below
# The networks besides the access presets' own names.
MIXED_NETWORKS = ("none", "edge")
# edge: the presets of the fast devices and of the slow ones (first half,
# rest), fastest first.
EDGE_TIERS = {"fast": ("campus", "home-broadband"), "slow": ("5g", "4g")}
# ADSP's goals at H = 3.2: % faster than each rival (the paper's numbers).
RIVALS = (("FIXED_ADACOMM", 62.4), ("BSP", 90.0))

# A cell: (policy, H, workers, network, delay ms).
Cell = tuple[str, float, int, str, float]
# An access preset: (down Mbit/s, up Mbit/s, one-way latency ms).
Preset = tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every cell of one invocation shares (from the flags)."""
    workload: workloads.Workload = workloads.get("mlp")
    fast_step_s: float = 0.03
    budget: float = DEFAULT_BUDGET
    loss_target: float = 0.40       # convergence: test loss below it
    accuracy_target: float = 0.86   # the metric's target
    networks: tuple[str, ...] = ("none",)
    delays: Optional[tuple[float, ...]] = None  # --delays; None: no sweep
    # The access presets of the binary (load_access_presets), by name.
    access_presets: Mapping[str, Preset] = dataclasses.field(
        default_factory=dict)

    @property
    def sweep(self) -> bool:
        """Whether --delays sweeps a delay (a delay column)."""
        return self.delays is not None

    @property
    def extended(self) -> bool:
        """With --network or --delays the tables and results gain their
        columns and fields; without, the output is as before."""
        return self.networks != ("none",) or self.sweep

    @property
    def combos(self) -> list[tuple[str, float]]:
        """(network, delay) in column order."""
        return [(n, d) for n in self.networks for d in (self.delays or
                                                         (0.0,))]

    @property
    def final_key(self) -> str:
        return workloads.row_key(self.workload)

    @property
    def to_key(self) -> str:
        """The key of the time to accuracy_target (time_to_accuracy_s)."""
        return f"time_to_{self.workload.metric}_s"


def slow_factor(h: float, fast: int, slow: int) -> float:
    """k such that mean(v) / min(v) = h with `fast` workers at v and `slow`
    at v / k: h = (fast k + slow) / (fast + slow)."""
    return (h * (fast + slow) - slow) / fast


def policy_block(s: Setup, policy: str) -> str:
    # Steps per commit of the step-synchronous policies: 1, or the
    # workload's (MF: 32; every commit's reply is the whole model).
    steps = s.workload.local_steps or 1
    if policy == "ADSP":
        return ("policy { kind: ADSP check_period_s: 10 "
                "initial_commits_per_period: 10 min_commit_interval_s: 0.1 }")
    if policy == "BSP":
        return f"policy {{ kind: BSP local_steps: {steps} }}"
    if policy == "SSP":
        return f"policy {{ kind: SSP staleness: 40 local_steps: {steps} }}"
    if policy == "TAP":
        return f"policy {{ kind: ASYNC local_steps: {steps} }}"
    if policy == "FIXED_ADACOMM":
        return "policy { kind: FIXED_ADACOMM tau: 40 }"
    if policy == "ADACOMM":
        return "policy { kind: ADACOMM tau0: 40 check_period_s: 10 }"
    raise ValueError(policy)


def worker_groups(workers: int,
                  network: str) -> list[tuple[int, str, Optional[str]]]:
    """[(count, "fast" or "slow", preset or None)]: the job's worker groups,
    in order (worker indices follow it); preset None: no preset (network
    none)."""
    slow = round(workers * 7 / 18)
    fast = workers - slow
    groups = []
    for tier, count in (("fast", fast), ("slow", slow)):
        if network == "edge":
            first = (count + 1) // 2
            for preset, n in zip(EDGE_TIERS[tier], (first, count - first)):
                if n:
                    groups.append((n, tier, preset))
        else:
            groups.append((count, tier,
                           None if network == "none" else network))
    return groups


def ms(value: float) -> str:
    return f"{round(value, 6):g}ms"


def link_block(s: Setup, preset: Optional[str], delay: float) -> str:
    """A worker group's link block ('' for loopback): the preset, with
    `delay` ms added to its one-way latency; no preset: unlimited bandwidth
    and `delay` ms, loopback when that is 0."""
    if preset is None:
        if not delay:
            return ""
        return (f' link {{ both {{ bandwidth: "unlimited" '
                f'latency: "{ms(delay)}" }} }}')
    if not delay:
        return f' link {{ preset: "{preset}" }}'
    return (f' link {{ preset: "{preset}" both {{ latency: '
            f'"{ms(s.access_presets[preset][2] + delay)}" }} }}')


def job_text(s: Setup, name: str, cell: Cell) -> str:
    """The job of one cell: one site, its workers in groups of a step time
    (fast, or slowed to set H) and an access link each."""
    policy, h, workers, network, delay = cell
    slow = round(workers * 7 / 18)
    fast = workers - slow
    k = slow_factor(h, fast, slow)
    step = {"fast": f"{s.fast_step_s}", "slow": f"{s.fast_step_s * k:.4f}"}
    groups = "\n".join(
        f"  workers {{ count: {n} step_time_s: {step[tier]}"
        f"{link_block(s, preset, delay)} }}"
        for n, tier, preset in worker_groups(workers, network))
    # The MLP's blocks are the classifiers' (workloads.CLASSIFIER_OPTIMIZER)
    # on Fashion-MNIST, as before.
    training = workloads.training_blocks(s.workload, workers, FASHION_MNIST)
    return f"""name: "{name}"
seed: 1
{workloads.target_field(s.workload)}: {s.accuracy_target}
stop_at_target: false
time_budget_s: {s.budget}
site {{
  name: "edge"
{groups}
}}
{training}
server {{ apply_rule: MEAN eval_period_s: 1 }}
{policy_block(s, policy)}
"""


def cell_name(policy: str, h: float, workers: int, network: str = "none",
              delay: float = 0.0) -> str:
    """adsp-h3.2-w18; -NETWORK unless none, -dMSms unless 0 ms."""
    name = f"{policy.lower()}-h{h}-w{workers}"
    if network != "none":
        name += f"-{network}"
    if delay:
        name += f"-d{delay:g}ms"
    return name


# ---------------------------------------------------------------------------
# One run's numbers
# ---------------------------------------------------------------------------

def below_target(s: Setup, point: dict) -> bool:
    """Whether an evaluation counts towards convergence: test loss below
    the target (for a lower-is-better metric such as MF's RMSE: the metric
    at or below it)."""
    if s.workload.higher_is_better:
        return point.get("loss", 1e9) < s.loss_target
    return workloads.reached(s.workload, workloads.value(s.workload, point),
                             s.loss_target)


def convergence_time(s: Setup, timeline: list[dict]) -> Optional[float]:
    """The paper's rule: the 10th evaluation below the target."""
    below = 0
    for point in timeline:
        if below_target(s, point):
            below += 1
            if below == CONVERGED_EVALUATIONS:
                return point["t_s"]
    return None


def steps_to_first_below(s: Setup, timeline: list[dict],
                         workers: int) -> Optional[float]:
    """Steps (commits / workers) at the first evaluation below the
    convergence target; None if none was."""
    point = reports.first(timeline, lambda p: below_target(s, p))
    return None if point is None else point.get("commits", 0) / workers


def edge_traffic(report: dict, network: str, delay: float
                 ) -> tuple[Optional[float], Optional[float],
                            Optional[float]]:
    """(total, up, down) bytes of the workers' access links (report
    edge_links: from "<site>/w<i>" is the uplink); None each for a loopback
    run (network none, no delay), which has none and counts nothing."""
    if network == "none" and not delay:
        return None, None, None
    links = report.get("edge_links") or []
    up = sum(link.get("bytes", 0.0) for link in links
             if "/" in link.get("from_site", ""))
    down = sum(link.get("bytes", 0.0) for link in links
               if "/" not in link.get("from_site", ""))
    return report.get("edge_bytes_total", up + down), up, down


def network_fields(report: dict, workers: list[dict], cell: Cell
                   ) -> tuple[dict, list[str]]:
    """With --network / --delays: the run's network, delay, edge traffic
    and mean blocked seconds per link, and each worker's access network by
    index."""
    _, _, count, network, delay = cell
    total, up, down = edge_traffic(report, network, delay)
    fields = {"network": network, "delay_ms": delay,
              "edge_bytes_total": total, "edge_up_bytes": up,
              "edge_down_bytes": down}
    links: list[str] = []
    for n, _, preset in worker_groups(count, network):
        links += [preset or "none"] * n
    blocked: dict[str, list[float]] = {}
    for w in workers:
        i = w.get("index", 0)
        link = links[i] if i < len(links) else "?"
        blocked.setdefault(link, []).append(w.get("blocked_s", 0.0))
    fields["blocked_s_mean_by_link"] = {
        link: sum(v) / len(v) for link, v in blocked.items()}
    return fields, links


def measure(s: Setup, report: dict, wall: Optional[float], name: str,
            cell: Cell) -> dict:
    """The row of one run."""
    policy, h, workers, _, _ = cell
    site = report["sites"][0]
    timeline = site.get("timeline", [])
    worker_rows = report.get("workers", [])
    commits = [w.get("commits", 0) for w in worker_rows]
    extra, links = (network_fields(report, worker_rows, cell) if s.extended
                    else ({}, []))
    to_accuracy = reports.first(timeline, workloads.reached_at(
        s.workload, s.accuracy_target))
    row = {
        "name": name,
        "policy": policy,
        "H": h,
        "H_measured": report.get("heterogeneity", 0.0),
        "workers": workers,
        **extra,
        "convergence_time_s": convergence_time(s, timeline),
        s.to_key: None if to_accuracy is None else to_accuracy["t_s"],
        "search_time_s": report.get("search_time_s", 0.0),
        s.final_key: workloads.final(s.workload, report),
        "final_loss": report.get("final_loss", 0.0),
        # BSP's extrapolation (bound_unconverged_bsp) reads these.
        "steps": sum(commits) / max(workers, 1),
        "training_s": site.get("training_s", 0.0),
        "first_below_steps": steps_to_first_below(s, timeline, workers),
        "commits_min": min(commits) if commits else 0,
        "commits_max": max(commits) if commits else 0,
        "blocked_s_mean": (sum(w.get("blocked_s", 0.0)
                               for w in worker_rows) /
                           max(len(worker_rows), 1)),
        "wall_s": wall,
        "workers_detail": [
            {k: w.get(k) for k in ("index", "step_time_s", "steps_per_s",
                                   "steps", "commits", "blocked_s")}
            for w in worker_rows],
    }
    if s.extended:
        for w in row["workers_detail"]:
            i = w.get("index") or 0
            w["link"] = links[i] if i < len(links) else None
    return row


def bound_unconverged_bsp(rows: list[dict]) -> None:
    """Gives every BSP run "convergence_estimate_s": its convergence time
    when it converged; when it did not, a lower bound extrapolated from the
    loopback BSP run of the same round, H and workers (network none, no
    delay): BSP is the same algorithm step for step whatever the network,
    so it cannot converge before it has made the steps after which the
    loopback run's loss first fell below the target; at this run's
    measured step rate that takes steps / rate seconds. None when there is
    no loopback run or it never fell below. Marked "extrapolated"."""
    loopback = {(row["run"], row["H"], row["workers"]): row for row in rows
                if row["policy"] == "BSP" and row.get("network", "none") ==
                "none" and not row.get("delay_ms")}
    for row in rows:
        if row["policy"] != "BSP":
            continue
        row["extrapolated"] = False
        row["convergence_estimate_s"] = row["convergence_time_s"]
        if row["convergence_time_s"] is not None:
            continue
        base = loopback.get((row["run"], row["H"], row["workers"]))
        steps = base and base["first_below_steps"]
        rate = (row["steps"] / row["training_s"]
                if row["training_s"] else 0.0)
        if steps and rate > 0:
            row["convergence_estimate_s"] = steps / rate
            row["extrapolated"] = True


# ---------------------------------------------------------------------------
# Goals and tables
# ---------------------------------------------------------------------------

def rival_bound(o_estimate: Optional[repeats.Cell], budget: float) -> float:
    """The least convergence time of a rival that did not converge within
    the budget: its extrapolated lower bound (BSP, the median over the
    runs; bound_unconverged_bsp) when that exceeds the budget, else the
    budget."""
    e = repeats.median(o_estimate)
    return e if e is not None and e > budget else budget


def lead(a_cell: Optional[repeats.Cell], o_cell: Optional[repeats.Cell],
         budget: float, o_estimate: Optional[repeats.Cell] = None) -> str:
    """ADSP's lead over a rival: "% faster" from the medians of their
    convergence times; "≥ x%" when the rival did not converge (against
    rival_bound), — when ADSP did not."""
    a, o = repeats.median(a_cell), repeats.median(o_cell)
    if a is None:
        return "—"
    if o is None:
        return f"≥ {(1 - a / rival_bound(o_estimate, budget)) * 100:.1f}%"
    return f"{(1 - a / o) * 100:.1f}%"


def network_label(network: str, delay: float, sweep: bool) -> str:
    """A column's or goal's name: "edge", "edge +20 ms" (with --delays)."""
    return f"{network} +{delay:g} ms" if sweep else network


def rival_goal(s: Setup, repeat: int, label: str, adsp: dict, rival: str,
               other: dict, wanted: float) -> Goal:
    """ADSP against one rival, from the medians of each side's convergence
    times."""
    def partial(who, cell):
        if cell is None or cell["runs"] >= cell["of"]:
            return ""
        return f"; {who} converged in {cell['runs']} of {cell['of']} runs"

    def missed(cell):  # " in k of N runs" (N > 1) that did not converge
        if repeat == 1:
            return ""
        return f" in {repeat - (cell['runs'] if cell else 0)} of {repeat} runs"

    a_cell = adsp["convergence_time_s"]
    o_cell = other["convergence_time_s"]
    a, o = repeats.median(a_cell), repeats.median(o_cell)
    want = f"≥ {wanted}% faster"
    if a is None:
        return Goal(label, want, "ADSP did not converge" + missed(a_cell),
                    False)
    if o is None:
        bound = rival_bound(other.get("convergence_estimate_s"), s.budget)
        how = f"; extrapolated ≥ {bound:.0f} s" if bound > s.budget else ""
        faster = (1 - a / bound) * 100
        return Goal(label, want,
                    f"{rival} did not converge in {s.budget:.0f} s"
                    f"{missed(o_cell)}{how} (ADSP {a:.1f} s): ≥ "
                    f"{faster:.1f}% faster{partial('ADSP', a_cell)}",
                    faster >= wanted)
    notes = partial("ADSP", a_cell) + partial(rival, o_cell)
    faster = (1 - a / o) * 100
    return Goal(label, want, f"{faster:.1f}%{notes}", faster >= wanted)


def evaluate_goals(s: Setup, cells: dict[Cell, dict],
                   repeat: int) -> list[Goal]:
    """ADSP against FIXED_ADACOMM and BSP at H = 3.2, from the medians of
    each side's convergence times; per network and delay (named with
    --network / --delays)."""
    goals = []
    for (network, delay), workers in [(c, w) for c in s.combos
                                      for w in (18, 36)]:
        adsp = cells.get(("ADSP", 3.2, workers, network, delay))
        for rival, wanted in RIVALS:
            other = cells.get((rival, 3.2, workers, network, delay))
            if not adsp or not other:
                continue
            label = f"ADSP vs {rival}, H = 3.2, {workers} workers"
            if s.extended:
                label += ", network " + network_label(network, delay,
                                                      s.sweep)
            goals.append(rival_goal(s, repeat, label, adsp, rival, other,
                                    wanted))
    return goals


def network_text(s: Setup) -> str:
    """The paragraph on the networks and delays (--network, --delays)."""
    parts = []
    for network in s.networks:
        if network == "none":
            parts.append("none = loopback, heterogeneity of compute only")
        elif network == "edge":
            counts = " / ".join(f"{n} {p}" for n, _, p in
                                worker_groups(18, "edge"))
            parts.append("edge = every worker behind an access link of its "
                         "own, the fast devices half on campus, half on "
                         "home-broadband, the slow ones half on 5g, half on "
                         f"4g (of 18 workers: {counts}): heterogeneity of "
                         "compute and communication")
        else:
            parts.append(f"{network} = every worker behind a {network} "
                         "access link")
    used = [p for p in s.access_presets
            if p in s.networks or ("edge" in s.networks)]
    text = "Networks: " + "; ".join(parts) + "."
    if used:
        text += (" Access presets (down / up Mbit/s, one-way latency): " +
                 ", ".join(f"{p} {d:g} / {u:g} / {l:g} ms" for p, (d, u, l)
                           in s.access_presets.items() if p in used) + ".")
    if s.sweep:
        text += (" +D ms: D ms more one-way latency on every worker's "
                 "access link, both directions (a preset's latency + D; "
                 "none +D ms: a link of unlimited bandwidth and D ms, none "
                 "+0 ms is loopback).")
    text += (" Edge traffic: the bytes over the workers' access links, both "
             "directions (loopback: none, not emulated, not counted); mean "
             "blocked: a worker's seconds waiting for its commit and pull "
             "answers (round trips and the policy's holds), the mean over "
             "the workers.")
    return text


def fmt_mb(value: Optional[float]) -> str:
    return tables.number(None if value is None else value / 1e6,
                         missing="loopback")


def comparison_lines(s: Setup, plan: list[Cell],
                     cells: dict[Cell, dict]) -> list[str]:
    """Each policy's convergence time per network and delay (columns), the
    rows grouped by H and workers, with ADSP's lead over FIXED_ADACOMM and
    BSP in each column."""
    lines = ["Convergence time (s) per network" +
             (" and added delay" if s.sweep else "") +
             " (columns), and ADSP's lead: % faster than FIXED_ADACOMM and "
             "than BSP, from the medians (≥: the rival did not converge "
             f"within the {s.budget:.0f} s budget, the lead counted "
             "against the budget or, for BSP, against its extrapolated "
             "lower bound when that is later; —: ADSP did not converge). "
             "BSP's lower bound: the steps after which the loopback BSP "
             "run of the same round first had its loss below the target, "
             "at this run's measured step rate (BSP makes the same steps "
             "whatever the network).",
             ""]
    rows = []
    groups = list(dict.fromkeys((h, w) for _, h, w, _, _ in plan))
    for h, workers in groups:
        policies = list(dict.fromkeys(p for p, ph, pw, _, _ in plan
                                      if (ph, pw) == (h, workers)))

        def ran(policy, n, d):
            return (policy, h, workers, n, d) in cells

        def conv(policy, network, delay, key="convergence_time_s"):
            c = cells.get((policy, h, workers, network, delay))
            return None if c is None else c.get(key)

        for policy in policies:
            rows.append([h, workers, policy] + [
                repeats.fmt_cell(conv(policy, n, d), tables.number,
                                 "converged") if ran(policy, n, d) else ""
                for n, d in s.combos])
        if any(conv("BSP", n, d) is None and
               conv("BSP", n, d, "convergence_estimate_s")
               for n, d in s.combos):
            rows.append([h, workers, "BSP, extrapolated lower bound"] + [
                repeats.fmt_cell(conv("BSP", n, d, "convergence_estimate_s"),
                                 tables.number)
                if conv("BSP", n, d) is None else "" for n, d in s.combos])
        for rival, _ in RIVALS:
            if "ADSP" not in policies or rival not in policies:
                continue
            rows.append([h, workers, f"ADSP lead over {rival}"] + [
                lead(conv("ADSP", n, d), conv(rival, n, d), s.budget,
                     conv(rival, n, d, "convergence_estimate_s"))
                if ran("ADSP", n, d) and ran(rival, n, d) else ""
                for n, d in s.combos])
    return lines + tables.table(
        ["H", "workers", "policy"] +
        [network_label(n, d, s.sweep) for n, d in s.combos], rows)


def cells_table(s: Setup, plan: list[Cell],
                cells: dict[Cell, dict]) -> list[str]:
    """Per cell: H measured, convergence, time to the target, search time,
    final metric, commits, mean blocked (and, with --network / --delays,
    the network and delay first and the edge traffic last)."""
    def cell(key_cell, key, fmt_value, counted="runs"):
        return repeats.fmt_cell(cells[key_cell].get(key), fmt_value, counted)

    def f0(v):
        return f"{v:.0f}"

    def f1(v):
        return f"{v:.1f}"

    def f2(v):
        return f"{v:.2f}"

    metric = s.workload.metric_name
    header = (["network"] + (["delay (ms)"] if s.sweep else [])
              if s.extended else [])
    header += ["policy", "H", "H measured", "workers", "convergence (s)",
               f"to {s.accuracy_target} {metric} (s)", "search (s)",
               f"final {metric}", "commits min–max", "mean blocked (s)"]
    if s.extended:
        header.append("edge traffic (MB)")
    rows = []
    for key in plan:
        policy, h, workers, network, delay = key
        c = cells[key]
        first = ([network] + ([f"{delay:g}"] if s.sweep else [])
                 if s.extended else [])
        last = ([repeats.fmt_cell(c.get("edge_bytes_total"), fmt_mb,
                                  missing="loopback")]
                if s.extended else [])
        rows.append(first + [
            policy, h, cell(key, "H_measured", f2), workers,
            cell(key, "convergence_time_s", tables.number, "converged"),
            cell(key, s.to_key, tables.number, "reached"),
            cell(key, "search_time_s", f1),
            cell(key, s.final_key, lambda v: f"{v:.4f}"),
            f"{f0(c['commits_min']['median'])}–"
            f"{f0(c['commits_max']['median'])}",
            cell(key, "blocked_s_mean", f1)] + last)
    return tables.table(header, rows)


def results_text(s: Setup, repeat: int, plan: list[Cell],
                 cells: dict[Cell, dict], goals: list[Goal]) -> str:
    """results.md."""
    converged = (f"loss < {s.loss_target}" if s.workload.higher_is_better
                 else f"{s.workload.metric_name} <= {s.loss_target}")
    lines = ["# Heterogeneous workers in one site "
             "(bench/scenarios/heterogeneity)",
             "",
             f"{s.workload.description} on {s.workload.dataset}, one site; "
             f"fast devices {s.fast_step_s * 1000:.0f} ms a step, 7 of 18 "
             "slowed to set H; test evaluation every 1 s; convergence = the "
             f"{CONVERGED_EVALUATIONS}th evaluation with test {converged}; "
             f"budget {s.budget:.0f} s per run." +
             (f" Median of {repeat} runs (range) per cell, the runs in "
              "round-robin order." if repeat > 1 else ""),
             ""]
    if s.extended:
        lines += [network_text(s), ""]
    lines += cells_table(s, plan, cells)
    if repeat == 1:
        lines += ["", "— : not converged within the budget."]
    else:
        lines += ["", repeats.note(repeat, ("converged", "reached")) +
                  " commits min–max: the medians of the fewest and the most "
                  "commits of a worker in a run."]
    if s.extended:
        lines += [""] + comparison_lines(s, plan, cells)
    lines += [""] + goal_rows.table(goals)
    return "\n".join(lines) + "\n"


def results_json(s: Setup, repeat: int, plan: list[Cell], rows: list[dict],
                 cells: dict[Cell, dict], goals: list[Goal]) -> dict:
    """results.json: every run's row, each cell's summary, the goals."""
    def cell_keys(key):
        return {"network": key[3], "delay_ms": key[4]} if s.extended else {}

    extended = ({"networks": list(s.networks),
                 "delays_ms": list(s.delays or [0.0])} if s.extended else {})
    return {"repeat": repeat,
            **extended,
            "runs": rows,
            "cells": [{"name": cell_name(*key), "policy": key[0],
                       "H": key[1], "workers": key[2], **cell_keys(key),
                       "summary": cells[key]} for key in plan],
            "goals": goal_rows.to_json(goals)}


# ---------------------------------------------------------------------------
# Flags and the runs
# ---------------------------------------------------------------------------

def network_list(text: str) -> list[str]:
    """argparse type of --network: names, comma-separated, each once
    (checked against the presets in main())."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no network named")
    return list(dict.fromkeys(names))


def delay_list(text: str) -> list[float]:
    """argparse type of --delays: milliseconds >= 0, comma-separated, each
    once."""
    delays = []
    for item in text.split(","):
        try:
            d = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of ms: {item!r}")
        if not d >= 0 or d == float("inf"):
            raise argparse.ArgumentTypeError(
                f"a delay is at least 0 ms (got {item!r})")
        delays.append(d + 0.0)  # -0 -> 0
    return list(dict.fromkeys(delays))


def load_access_presets(binary: str) -> dict[str, Preset]:
    """The access presets of `binary` (meridian presets --json): name ->
    (down Mbit/s, up Mbit/s, one-way latency ms); exits naming the problem
    when the binary cannot tell."""
    try:
        proc = subprocess.run([binary, "presets", "--json"],
                              capture_output=True, text=True, check=True)
        presets = {p["name"]: (p["down_mbps"], p["up_mbps"], p["one_way_ms"])
                   for p in json.loads(proc.stdout)["access_networks"]}
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError,
            TypeError) as error:
        sys.exit(f"heterogeneity: cannot read the access presets from "
                 f"`{binary} presets --json`: {error}")
    missing = [p for tier in EDGE_TIERS.values() for p in tier
               if p not in presets]
    if missing:
        sys.exit(f"heterogeneity: {binary} has no access preset "
                 f"{', '.join(missing)} (the edge network needs them)")
    return presets


def parse_args() -> argparse.Namespace:
    parser = cli.parser(__doc__)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--h", default="")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per run (default 150; the CNNs 300)")
    parser.add_argument("--loss-target", type=float, default=None,
                        help="convergence: test loss below it (default 0.40);"
                             " for mf the RMSE at or below it (default 0.75)")
    parser.add_argument("--accuracy-target", type=float, default=None,
                        help="the metric's target (default 0.86 accuracy; "
                             "for mf RMSE 0.70)")
    parser.add_argument("--workload", default="mlp",
                        choices=sorted(FAST_STEPS),
                        help="bench/scenarios/scenariolib/workloads.py")
    cli.add_summarize_only(parser, " (the same other flags as when they ran)")
    cli.add_dry_run(parser)
    parser.add_argument("--no-36", action="store_true",
                        help="skip the 36-worker runs")
    parser.add_argument(
        "--network", type=network_list, default=["none"], metavar="NAME,...",
        help="the workers' access networks, a column each: none, edge, "
             "or an access preset (`meridian presets`; see above) [none]")
    parser.add_argument(
        "--delays", type=delay_list, default=None, metavar="MS,...",
        help="sweep an extra one-way delay (ms) on every access link, a "
             "column each [no sweep]")
    repeats.add_argument(parser, "cell")
    cli.add_binary(parser)
    cli.add_publishing(parser, "--only, --h or --no-36")
    args = cli.parse(parser)
    # The presets name the networks --network may give.
    binary = runner.require_binary(
        args.binary, TAG, build=not (args.dry_run or args.summarize_only),
        error=parser.error)
    args.access_presets = load_access_presets(binary)
    networks = MIXED_NETWORKS + tuple(args.access_presets)
    unknown = [n for n in args.network if n not in networks]
    if unknown:
        parser.error(f"--network: unknown network {unknown[0]!r}; use "
                     f"{', '.join(networks)}")
    args.binary = binary
    return args


def setup_of(args: argparse.Namespace) -> Setup:
    """The Setup of the flags (their defaults per workload filled in)."""
    w = workloads.get(args.workload)
    return Setup(
        workload=w, fast_step_s=FAST_STEPS[args.workload],
        budget=(args.budget if args.budget is not None
                else BUDGETS.get(args.workload, DEFAULT_BUDGET)),
        loss_target=(args.loss_target if args.loss_target is not None else
                     0.40 if w.higher_is_better else w.targets[0]),
        accuracy_target=(args.accuracy_target
                         if args.accuracy_target is not None else
                         0.86 if w.higher_is_better else w.targets[1]),
        networks=tuple(args.network),
        delays=None if args.delays is None else tuple(args.delays),
        access_presets=args.access_presets)


def plan_of(s: Setup, args: argparse.Namespace) -> list[Cell]:
    """The cells in the order they run: H by H, within an H network by
    network and delay by delay, policy by policy; then the 36-worker ones.
    """
    plan = []
    h_values = [float(h) for h in args.h.split(",")] if args.h else H_VALUES
    policies = POLICIES
    if args.quick:
        h_values = [3.2]
        policies = QUICK_POLICIES
    if args.only:
        policies = [p for p in policies if p in args.only.split(",")]
    for h in h_values:
        for network, delay in s.combos:
            for policy in policies:
                plan.append((policy, h, 18, network, delay))
    if not args.quick and not args.no_36:
        for network, delay in s.combos:
            for policy in ("ADSP", "FIXED_ADACOMM"):
                if policy in policies:
                    plan.append((policy, 3.2, 36, network, delay))
    return list(dict.fromkeys(plan))  # each cell once (--h 3.2,3.2)


def run_all(s: Setup, args: argparse.Namespace,
            plan: list[Cell]) -> list[dict]:
    """Every run (or, --summarize-only, every run read back), in the order
    they ran: one row each."""
    rows = []
    for r, cell in repeats.order(plan, args.repeat):
        name = repeats.label(cell_name(*cell), r, args.repeat)
        run_dir = os.path.join(args.outdir, "runs", name)
        if args.summarize_only:
            # The wall time of a run read back is not known.
            report, wall = reports.read(run_dir, TAG), None
        else:
            config = runner.write_config(args.outdir, name,
                                         job_text(s, name, cell))
            done = runner.run_job(args.binary, TAG, name, config, run_dir,
                                  runner.timeout_for(s.budget))
            report, wall = done.report, done.wall_s
        row = measure(s, report, wall, name, cell)
        row["cell"] = cell_name(*cell)
        row["run"] = r
        rows.append(row)
        edge = ""
        if s.extended:
            edge = (", edge traffic " + fmt_mb(row["edge_bytes_total"]) +
                    (" MB" if row["edge_bytes_total"] is not None else ""))
        runner.log(TAG, f"{name}: converged "
                   f"{tables.number(row['convergence_time_s'])} s, to "
                   f"{s.accuracy_target} {tables.number(row[s.to_key])} s,"
                   f" final {row[s.final_key]:.4f}, H measured "
                   f"{row['H_measured']:.2f}{edge}")
    return rows


def main() -> int:
    args = parse_args()
    s = setup_of(args)
    plan = plan_of(s, args)
    runner.prepare_outdir(args.outdir)
    if args.dry_run:
        return runner.dry_run(
            args.binary, TAG, args.outdir,
            {cell_name(*cell): job_text(s, cell_name(*cell), cell)
             for cell in plan}, args.repeat)
    rows = run_all(s, args, plan)
    bound_unconverged_bsp(rows)
    # Per cell: the median and range of each quantity over its runs.
    cells = {cell: repeats.summarize(
        [row for row in rows if row["cell"] == cell_name(*cell)],
        ("convergence_time_s", s.to_key)) for cell in plan}
    goals = evaluate_goals(s, cells, args.repeat)
    text = results_text(s, args.repeat, plan, cells, goals)
    results.write(args.outdir, text,
                  results_json(s, args.repeat, plan, rows, cells, goals))
    return results.publish_if_wanted(
        SCENARIO, args, text, restricted=bool(args.only or args.h) or
        args.no_36 or args.summarize_only)


if __name__ == "__main__":
    sys.exit(main())
