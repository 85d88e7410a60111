#!/usr/bin/env python3
"""Geo-distributed training against LAN and BSP-over-WAN, on equal terms.

    bench/scenarios/geo_vs_lan OUTDIR [--quick] [--repeat N] [--only NAME,...]
                               [--budget SECONDS] [--workload NAME]
                               [--regions 3|11] [--bandwidth RATE]
                               [--step-time SECONDS]
                               [--binary PATH] [--dry-run]
                               [--summarize-only] [--publish | --no-publish]

Runs every variant of the same job (MLP on Fashion-MNIST, or another
--workload of bench/scenarios/scenariolib/workloads.py: mlp-small (784-64-10,
50 ms device steps, targets 0.83 and 0.85: the eleven-region job's model), cnn,
cnn-bn, cnn-gn, or mf, matrix factorisation on a generated rating matrix; 12
workers with a fixed device step time, 20 ms for the MLP; preset inter-region
latencies, links scaled to 64 Mbit/s so that one dense MLP transfer (0.8 MB)
takes five worker steps) through `meridian run`, and writes OUTDIR/results.md
and OUTDIR/results.json. Targets: 0.85 and 0.87 for the MLP, 0.85 and 0.88 for
the CNNs (the higher one is "the target"); for mf the metric is the test RMSE,
lower is better, targets 0.75 and 0.70 (0.70 is the target), with 32 local
steps per asynchronous commit, apply rule MEAN and a 5 ms device step; a time
to target is the first time the metric is at or below it.

Variants:
  lan              all 12 workers in one site, asynchronous (no WAN)
  lan-bsp          the same site under BSP, one step per commit: counts the
                   BSP steps the algorithm needs to reach each target
  bsp-over-wan     one global parameter server (us); the eu and ap workers
                   push and pull through their WAN links every step (BSP);
                   run for a bounded time, its time to target extrapolated
                   from its measured step rate and lan-bsp's step count
  gaia             3 sites x 4 workers, significance-filtered sync, fp32
  gaia-compressed  the same with int8 blocks of 256 + zstd 1
  gaia-hierarchy   6 sites x 2 workers in two groups with hubs, compressed
  gaia-mesh6       the same 6 sites in a full mesh: the hierarchy's baseline
                   for WAN messages per clock
  dense            3 sites, every change to every site every clock (fp32)
  fedavg           3 sites, models averaged every 50 clocks
  diloco-hH        3 sites, DiLoCo: H clocks of local training, then an
                   outer Nesterov step (lr 0.7, momentum 0.9) on the
                   averaged int8 outer gradients; H = 10, 40, 160
  diloco-stream    Streaming DiLoCo: H = 40 in 4 fragments (a fragment
                   every 10 clocks), int4 values, training overlaps the
                   exchange
  sparseloco       SparseLoCo as DiLoCo's rounds: H = 40, error feedback
                   (beta 0.95), the top 2% of each tensor in 2-bit values,
                   outer lr 1 without momentum
                   (deploy/configs/three-regions-sparseloco.pbtxt's sync)
The goals compare gaia-compressed (Meridian's default sync) with the DiLoCo
setting that reached the higher target with the fewest WAN bytes: fewer
bytes and no later.
--regions 11 runs the geo-distributed variants on Gaia's eleven EC2
regions instead (us, ca, or, sa, ie, eu, in, sg, jp, kr, au; one worker
each, so 11 workers in all, LAN too; every pair on its preset latency and
the same 64 Mbit/s); gaia-hierarchy is then three groups with hubs us, eu,
sg, gaia-mesh6 is left out, and the BSP goal is Gaia's best reported
speed-up over BSP, 53.5× (20× with 3 regions). With the default MLP the
eleven site servers saturate two cores; --workload mlp-small keeps the
host out of the measurement.
--bandwidth RATE sets every inter-site link's bandwidth (default 64mbit;
wanem's syntax: 2mbit, 500kbit, ...), latencies staying the presets'. BSP
over the WAN moves the whole model twice per step, Gaia only its
significant changes, so the speed-up over BSP grows as links narrow
relative to the model: at 64 Mbit/s a dense MLP transfer takes five
device steps; at 500kbit a dense mlp-small transfer takes about 65 (the
eleven-region run of docs/results/eleven_regions.md).
--step-time S sets every worker's emulated device step instead of the
workload's. The table's "s per step" is what a worker's step took
(computing, the emulated device and waiting for the server, over every
worker): more than the device step when the machine could not keep the pace
(every variant's site servers, evaluators and wanem share its cores with
the workers) or the sync held the workers; compare variants at equal pace.
"steps to" the target is the time to it divided by that: the steps a worker
had taken, what the algorithm needed whatever the machine's pace.
--quick runs lan, lan-bsp, bsp-over-wan (bounded) and gaia-compressed
only. --dry-run writes the configs of the selected variants to
OUTDIR/configs, checks each with `meridian validate` and runs nothing (with
--repeat N it also prints the order of the runs).
--summarize-only runs nothing and rebuilds the tables from the runs already
in OUTDIR/runs (given the flags they ran with), for example after the
script's summaries changed; a missing run is an error naming it.

--repeat N runs every variant N times, as NAME-r1 ... NAME-rN (configs and
run directories), in round-robin order: run 1 of every variant, then run 2
of every variant, ..., so that slow drift of the machine hits every variant
alike. BSP over WAN's extrapolation uses the lan-bsp run of the same round.
The table cells are then the median of the N runs with the range, median
(min–max); for a time (and WAN bytes) to a target a run that did not reach
it counts as later than any that did (— when the median run did not), the
range is that of the runs that did, "2 of 3 reached" when not all did
(bench/scenarios/scenariolib/repeats.py). The goals' ratios (time vs LAN,
speed-up and bytes vs BSP over WAN) and differences are computed from the
medians of each side. When lan-bsp reaches the target sooner than lan (the
asynchronous site's twelve workers commit on models up to eleven commits
stale, which slows a CNN), a Gaia variant's time is also held against lan-bsp:
the faster LAN is the one to match. results.json keeps every run's numbers
("runs"), each variant's median, min and max of every quantity ("summary") and
the medians ("variants"; with N = 1 the run's own numbers, as before); with
N = 1 the tables are as before. Every run has the same seed: repeats differ by
timing, as runs on a shared machine do.

A complete run publishes OUTDIR/results.md into docs/results/geo_vs_lan.md
(--quick: geo_vs_lan-quick.md), with the command line, commit, date and
machine; --only and --summarize-only runs publish only with --publish,
--no-publish never (bench/scenarios/scenariolib/publish.py).
"""

import dataclasses
import os
import sys
from typing import Optional

from scenariolib import (cli, goals as goal_rows, jobs, pytorch, reports,
                         repeats, results, runner, tables, workloads)
from scenariolib.goals import Goal

SCENARIO = results.Scenario("geo_vs_lan", "Geo-distributed vs LAN training")
TAG = SCENARIO.name
DEFAULT_LINK_BANDWIDTH = "64mbit"

# Plaintext links: the scenario measures what each technique saves, and
# wanem counts ZMTP messages (under CURVE it sees only encrypted frames).
# CURVE's own cost is measured by meridian_bench (docs/operations.md, "Security").
SECURITY = ("# Plaintext links: the scenario measures what each technique "
            "saves, and\n# wanem counts ZMTP messages (under CURVE it sees "
            "only encrypted frames).\n# CURVE's own cost is measured by "
            'meridian_bench (docs/operations.md, "Security").\n' + jobs.PLAINTEXT)

THREE_SITES = jobs.THREE_REGIONS
# Gaia's eleven EC2 regions (Hsieh et al., NSDI'17, section 6), one site
# each; every pair has a preset (wan/presets.cc).
ELEVEN_SITES = (("us", "us-east-1"), ("ca", "us-west-1"), ("or", "us-west-2"),
                ("sa", "sa-east-1"), ("ie", "eu-west-1"),
                ("eu", "eu-central-1"), ("in", "ap-south-1"),
                ("sg", "ap-southeast-1"), ("jp", "ap-northeast-1"),
                ("kr", "ap-northeast-2"), ("au", "ap-southeast-2"))
ELEVEN_GROUPS = ('topology: GROUPS '
                 'group { hub: "us" site: "ca" site: "or" site: "sa" } '
                 'group { hub: "eu" site: "ie" site: "in" } '
                 'group { hub: "sg" site: "jp" site: "kr" site: "au" }')
# Two groups of three; hubs eu and ap. Every hub-member and hub-hub pair
# has a measured preset.
SIX_SITES = (("eu", "eu-central-1"), ("ie", "eu-west-1"), ("us", "us-east-1"),
             ("ap", "ap-southeast-1"), ("jp", "ap-northeast-1"),
             ("or", "us-west-2"))
SIX_GROUPS = ('topology: GROUPS group { hub: "eu" site: "ie" site: "us" } '
              'group { hub: "ap" site: "jp" site: "or" }')

DILOCO_PERIODS = (10, 40, 160)
DILOCO_VARIANTS = [f"diloco-h{h}" for h in DILOCO_PERIODS] + ["diloco-stream"]
VARIANTS = ["lan", "lan-bsp", "bsp-over-wan", "gaia", "gaia-compressed",
            "gaia-hierarchy", "gaia-mesh6", "dense", "fedavg",
            *DILOCO_VARIANTS, "sparseloco"]
SPARSELOCO_SYNC = (
    "sync { kind: DILOCO averaging_period: 40 "
    "diloco { outer_lr: 1.0 outer_momentum: 0 nesterov: false "
    "error_feedback: true error_feedback_decay: 0.95 } "
    "compression { selection: TOP_K top_k_fraction: 0.02 "
    "value_coding: VALUE_INT2 block_size: 256 rounding: ROUND_STOCHASTIC } }")
QUICK_VARIANTS = ["lan", "lan-bsp", "bsp-over-wan", "gaia-compressed"]
# The quantities of a run that are times (or bytes, steps) to a target: a
# run that did not reach it counts as later than any that did.
TO_TARGET = ("time_to_", "wan_bytes_to_", "lan_bsp_steps_to_",
             "steps_to_target")


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every variant of one invocation shares (from the flags)."""
    workload: workloads.Workload = workloads.get("mlp")
    regions: int = 3          # sites of the geo-distributed variants
    bandwidth: str = DEFAULT_LINK_BANDWIDTH  # of every inter-site link
    budget: float = 90.0      # seconds per run
    bsp_budget: float = 60.0  # bsp-over-wan's (bounded, then extrapolated)
    theta: float = 0.05
    skew: int = 8
    schedule: str = "THRESHOLD_CONSTANT"

    @property
    def eleven(self) -> bool:
        return self.regions == 11

    @property
    def sites(self) -> tuple[tuple[str, str], ...]:
        """(name, region) of the geo-distributed variants' sites."""
        return ELEVEN_SITES if self.eleven else THREE_SITES

    @property
    def per_site(self) -> int:
        if self.workload.workers_per_site:
            return self.workload.workers_per_site
        return 1 if self.eleven else 4

    @property
    def workers(self) -> int:
        return len(self.sites) * self.per_site

    @property
    def bsp_speedup_goal(self) -> float:
        """Gaia's best reported speed-up over BSP: 53.5x with eleven
        regions, 20x with three."""
        return 53.5 if self.eleven else 20

    @property
    def low(self) -> float:
        return self.workload.targets[0]

    @property
    def high(self) -> float:
        """"The target"."""
        return self.workload.targets[1]

    @property
    def final(self) -> str:
        """The key of the final metric in a row (final_accuracy)."""
        return workloads.row_key(self.workload)


def diloco(period: int, compression: str, extra: str) -> str:
    return (f"sync {{ kind: DILOCO averaging_period: {period} "
            f"diloco {{ outer_lr: 0.7 outer_momentum: 0.9 {extra} }} "
            f"{compression} }}")


def links_block(s: Setup, sites: tuple[tuple[str, str], ...]) -> str:
    """Every pair keeps its preset latency; bandwidth scaled down."""
    lines = ["wan {"]
    for i in range(len(sites)):
        for j in range(i + 1, len(sites)):
            lines.append(
                f'  link {{ a: "{sites[i][0]}" b: "{sites[j][0]}" '
                f'both {{ bandwidth: "{s.bandwidth}" }} }}')
    lines.append("}")
    return "\n".join(lines)


def job_text(s: Setup, name: str, budget: float, placement: str,
             policy: str, sync: str = "") -> str:
    """A variant's job: the shared header, model, data, optimizer, server
    and security, then its sites and links (`placement`), policy and
    sync."""
    w = s.workload
    server = w.server + " " if w.server else ""
    return "\n".join(part for part in [
        jobs.header(name, workloads.target_field(w), s.high, budget),
        workloads.training_blocks(w, s.workers), workloads.evaluator_block(w),
        f"server {{ {server}eval_period_s: {w.eval_period_s:g} }}", SECURITY,
        placement, policy, sync] if part) + "\n"


def variant_configs(s: Setup) -> dict[str, str]:
    """The job file of every variant, by name."""
    step = s.workload.step_time_s
    async_policy = ("policy { kind: ASYNC local_steps: "
                    f"{s.workload.local_steps or 4} }}")
    bsp_policy = "policy { kind: BSP local_steps: 1 }"
    program = workloads.command_field(s.workload.worker_command)
    lan = jobs.site("lan", None, s.workers, step, command=program)

    def wan(sites: tuple[tuple[str, str], ...], each: int,
            server_site: Optional[str] = None) -> str:
        return (jobs.sites(sites, each, step, server_site, program) + "\n" +
                links_block(s, sites))

    def geo(name: str, sync: str, placement: Optional[str] = None) -> str:
        return job_text(s, name, s.budget,
                        placement or wan(s.sites, s.per_site), async_policy,
                        sync)

    def gaia(compression: str, topology: str = "") -> str:
        return jobs.gaia_sync(s.theta, compression, s.skew, s.schedule,
                              topology)

    hierarchy = (wan(s.sites, 1), ELEVEN_GROUPS) if s.eleven else (
        wan(SIX_SITES, 2), SIX_GROUPS)
    return {
        "lan": job_text(s, "lan", s.budget, lan, async_policy),
        "lan-bsp": job_text(s, "lan-bsp", s.budget, lan, bsp_policy),
        "bsp-over-wan": job_text(s, "bsp-over-wan", s.bsp_budget,
                                 wan(s.sites, s.per_site, "us"), bsp_policy),
        "gaia": geo("gaia", gaia(jobs.FP32)),
        "gaia-compressed": geo("gaia-compressed", gaia(jobs.INT8)),
        "gaia-hierarchy": geo("gaia-hierarchy",
                              gaia(jobs.INT8, hierarchy[1]), hierarchy[0]),
        "gaia-mesh6": geo("gaia-mesh6", gaia(jobs.INT8), wan(SIX_SITES, 2)),
        "dense": geo("dense", jobs.dense_sync(s.skew)),
        "fedavg": geo("fedavg", jobs.model_averaging(50)),
        **{f"diloco-h{h}": geo(f"diloco-h{h}", diloco(h, jobs.INT8, ""))
           for h in DILOCO_PERIODS},
        "diloco-stream": geo("diloco-stream", diloco(
            40, jobs.INT4, "fragments: 4 overlap: true")),
        "sparseloco": geo("sparseloco", SPARSELOCO_SYNC),
    }


def wan_bytes_until(run_dir: str, t_s: Optional[float]) -> Optional[float]:
    """Cross-site bytes counted by wanem up to `t_s` of the run (linear
    interpolation between samples of traffic.csv; its clock starts when
    wanem starts, a second or so before training)."""
    path = os.path.join(run_dir, "traffic.csv")
    if t_s is None or not os.path.exists(path):
        return None
    samples: dict[float, dict[tuple[str, str], float]] = {}
    for row in reports.traffic(path):
        key = (row["link"], row["from_site"])
        samples.setdefault(float(row["t_s"]), {})[key] = float(row["bytes"])
    times = sorted(samples)
    totals = [sum(samples[t].values()) for t in times]
    if not times:
        return None
    for i, t in enumerate(times):
        if t >= t_s:
            if i == 0:
                return totals[0]
            t0, t1 = times[i - 1], t
            f = (t_s - t0) / (t1 - t0) if t1 > t0 else 1.0
            return totals[i - 1] + f * (totals[i] - totals[i - 1])
    return totals[-1]


def measure(s: Setup, name: str, run_dir: str, report: dict,
            wall: Optional[float]) -> dict:
    """The row of one run: final metric, WAN bytes, times and bytes to the
    targets, commits, WAN messages per clock."""
    sites = report.get("sites", [])
    row = {
        "name": name,
        s.final: workloads.final(s.workload, report),
        "wan_bytes": report.get("wan_bytes_total", 0.0),
        "wall_s": wall,
        "training_s": max((site.get("training_s", 0.0) for site in sites),
                          default=0.0),
        "extrapolated": False,
        "dense_equivalent_bytes": report.get("dense_equivalent_bytes", 0.0),
        # What the workers lose and what an exchange carries
        # (report.json; 0 from a binary that predates them).
        "compute_utilization": report.get("compute_utilization", 0.0),
        "round_density": report.get("round_density", 0.0),
        "bits_per_entry": report.get("bits_per_entry", 0.0),
        # The run's WAN bill at inter-region list prices (report.json
        # wan_cost_usd; None from a binary that predates it).
        "wan_cost_usd": report.get("wan_cost_usd"),
    }
    timelines = reports.timelines(report)
    for target in s.workload.targets:
        t = reports.time_to(timelines,
                            workloads.reached_at(s.workload, target))
        row[f"time_to_{target}_s"] = t
        row[f"wan_bytes_to_{target}"] = wan_bytes_until(run_dir, t)
    row["time_to_target_s"] = row[f"time_to_{s.high}_s"]
    row["commits"] = sum(w.get("commits", 0)
                         for w in report.get("workers", []))
    # What a worker's step took (computing, the emulated device, waiting
    # for the server): longer than the device step when the machine could
    # not keep the pace, or the sync held the workers.
    workers = report.get("workers", [])
    steps = sum(w.get("steps", 0) for w in workers)
    row["s_per_step"] = (sum(w.get("compute_s", 0) + w.get("device_wait_s", 0)
                             + w.get("blocked_s", 0) for w in workers) / steps
                         if steps else None)
    # The steps a worker had taken when the target was reached, at that
    # pace: what the algorithm needed, whatever the machine's pace.
    t = row["time_to_target_s"]
    row["steps_to_target"] = (t / row["s_per_step"]
                              if t is not None and row["s_per_step"] else None)
    # WAN messages (counted by wanem) per site clock, for the topology
    # comparison; the mean clock over sites that sync.
    clocks = [site.get("sync", {}).get("clock", 0) for site in sites]
    clocks = [c for c in clocks if c > 0]
    mean_clock = sum(clocks) / len(clocks) if clocks else None
    messages = sum(link.get("messages", 0)
                   for link in report.get("links", []))
    row["wan_messages"] = messages
    row["sites"] = len(sites)
    row["messages_per_clock"] = messages / mean_clock if clocks else None
    # The sites' own count of what the O(S²) claim is about: updates
    # (and index announcements) and clock announcements, without the
    # delivery's acknowledgements and heartbeats that wanem also sees.
    sync_messages = sum(
        int(m.get("count", 0)) for site in sites  # uint64: str
        for m in site.get("sync", {}).get("messages_sent", [])
        if m.get("type") in ("MIRROR_UPDATE", "MIRROR_INDICES",
                             "MIRROR_CLOCK"))
    row["sync_messages_per_clock"] = (sync_messages / mean_clock
                                      if clocks else None)
    return row


def bsp_steps_to(s: Setup, report: dict, target: float) -> Optional[float]:
    """BSP steps (clocks: one commit of every worker) until `target`."""
    workers = len(report.get("workers", [])) or s.workers
    best = None
    for site in report.get("sites", []):
        point = reports.first(site.get("timeline", []),
                              workloads.reached_at(s.workload, target))
        if point is None:
            return None
        steps = point.get("commits", 0) / workers
        best = steps if best is None else max(best, steps)
    return best


def extrapolate_bsp(s: Setup, rows: dict[str, dict],
                    lan_bsp_report: Optional[dict]) -> None:
    """BSP over WAN (one round's rows): time and bytes to each target from
    lan-bsp's step count and bsp-over-wan's measured step rate and bytes per
    step."""
    if "bsp-over-wan" not in rows or lan_bsp_report is None:
        return
    wan_row = rows["bsp-over-wan"]
    steps_run = wan_row["commits"] / s.workers
    rate = steps_run / wan_row["training_s"] if wan_row["training_s"] else 0
    bytes_per_step = wan_row["wan_bytes"] / steps_run if steps_run else 0
    wan_row["measured_steps"] = steps_run
    wan_row["measured_step_rate"] = rate
    wan_row["bytes_per_step"] = bytes_per_step
    for target in s.workload.targets:
        steps = bsp_steps_to(s, lan_bsp_report, target)
        measured = wan_row[f"time_to_{target}_s"]
        if measured is None and steps is not None and rate > 0:
            wan_row[f"time_to_{target}_s"] = steps / rate
            wan_row[f"wan_bytes_to_{target}"] = steps * bytes_per_step
            wan_row["extrapolated"] = True
        wan_row[f"lan_bsp_steps_to_{target}"] = steps
    wan_row["time_to_target_s"] = wan_row[f"time_to_{s.high}_s"]
    if wan_row["extrapolated"]:
        # Accuracy it would reach is lan-bsp's at that step count.
        wan_row[s.final] = rows["lan-bsp"][s.final]


def evaluate_goals(s: Setup, rows: dict[str, dict]) -> list[Goal]:
    """The issue's goals from one row per variant (the medians of its runs:
    every ratio is a ratio of medians)."""
    goals = []
    high, final = s.high, s.final
    lan = rows.get("lan")
    bsp = rows.get("bsp-over-wan")
    for name in ("gaia", "gaia-compressed", "gaia-hierarchy"):
        g = rows.get(name)
        if not g or not lan:
            continue
        t_g, t_l = g[f"time_to_{high}_s"], lan[f"time_to_{high}_s"]
        time_goal = s.workload.lan_time_goal
        if t_g is not None and t_l:
            ratio = t_g / t_l
            goals.append(Goal(f"{name}: time to {high} vs LAN",
                              f"≤ {time_goal:.2f}×", f"{ratio:.2f}×",
                              ratio <= time_goal))
        lan_bsp = rows.get("lan-bsp")
        t_lb = lan_bsp[f"time_to_{high}_s"] if lan_bsp else None
        if t_g is not None and t_lb and (not t_l or t_lb < t_l):
            ratio = t_g / t_lb
            goals.append(Goal(f"{name}: time to {high} vs LAN-BSP (the "
                              "faster LAN)", f"≤ {time_goal:.2f}×",
                              f"{ratio:.2f}×", ratio <= time_goal))
        if bsp and t_g and bsp[f"time_to_{high}_s"]:
            speedup = bsp[f"time_to_{high}_s"] / t_g
            goals.append(Goal(f"{name}: faster to {high} than BSP over WAN",
                              f"≥ {s.bsp_speedup_goal}×", f"{speedup:.1f}×",
                              speedup >= s.bsp_speedup_goal))
        b_g = g[f"wan_bytes_to_{high}"]
        b_b = bsp[f"wan_bytes_to_{high}"] if bsp else None
        if b_g and b_b:
            fewer, goal = b_b / b_g, s.workload.bsp_bytes_goal
            goals.append(Goal(f"{name}: fewer WAN bytes to {high} than BSP "
                              f"over WAN", f"≥ {goal}×", f"{fewer:.0f}×",
                              fewer >= goal))
        metric = s.workload.metric_name
        if s.workload.higher_is_better:
            diff = (lan[final] - g[final]) * 100
            goals.append(Goal(f"{name}: final {metric} vs LAN",
                              "within 0.5 points", f"{-diff:+.2f} points",
                              abs(diff) <= 0.5 or diff < 0))
        else:
            # Lower is better (RMSE): no more than 1% above LAN's.
            rel = (g[final] / lan[final] - 1) * 100 if lan[final] else 0.0
            goals.append(Goal(f"{name}: final {metric} vs LAN",
                              "within +1%", f"{rel:+.2f}%", rel <= 1.0))
    return goals + diloco_goals(s, rows)


def diloco_goals(s: Setup, rows: dict[str, dict]) -> list[Goal]:
    """gaia-compressed against DiLoCo at its best setting: of the DiLoCo
    variants that reached the higher target, the one with the fewest WAN
    bytes to it."""
    high = s.high
    g = rows.get("gaia-compressed")
    reached = [rows[n] for n in DILOCO_VARIANTS
               if n in rows and rows[n][f"wan_bytes_to_{high}"]]
    if not g or not reached:
        return []
    best = min(reached, key=lambda r: r[f"wan_bytes_to_{high}"])
    goals = []
    b_g, b_d = g[f"wan_bytes_to_{high}"], best[f"wan_bytes_to_{high}"]
    if b_g:
        goals.append(Goal(f"gaia-compressed: WAN bytes to {high} vs "
                          f"{best['name']} (DiLoCo's fewest)", "fewer",
                          f"{b_g / b_d:.2f}×", b_g < b_d))
    t_g, t_d = g[f"time_to_{high}_s"], best[f"time_to_{high}_s"]
    if t_g is not None:
        goals.append(Goal(f"gaia-compressed: time to {high} vs "
                          f"{best['name']}", "no later", f"{t_g / t_d:.2f}×",
                          t_g <= t_d))
    return goals


def f0(v: float) -> str:
    return f"{v:.0f}"


def extrapolation_note(s: Setup, n: int, row: dict,
                       extrapolated: dict) -> str:
    """The note of bsp-over-wan's row: from which lan-bsp steps and
    measured rate its time to target was extrapolated."""
    steps = row.get(f"lan_bsp_steps_to_{s.high}")
    to = ""
    if steps is None:  # lan-bsp missed the target: the easier one
        steps = row.get(f"lan_bsp_steps_to_{s.low}") or 0
        to = f" to {s.low}"
    which = ""
    if n > 1:
        which = (f" in {extrapolated['true']} of {n} runs"
                 if extrapolated["true"] < n else "")
        which += " (medians)"
    return (f"extrapolated{to}{which}: {steps:.0f} "
            f"BSP steps (lan-bsp) at the measured "
            f"{row['measured_step_rate']:.2f} steps/s, "
            f"{tables.data_size(row['bytes_per_step'])}/step")


def variants_table(s: Setup, n: int, order: list[str], summary: dict,
                   medians: dict) -> list[str]:
    """Per variant: times to the targets, final metric, WAN bytes, wall."""
    def cell(name, key, fmt, counted="runs"):
        return repeats.fmt_cell(summary[name].get(key), fmt, counted)

    def time(v):
        return tables.number(v)

    low, high = s.low, s.high
    rows = []
    for name in order:
        extrapolated = summary[name].get("extrapolated") or {}
        note = (extrapolation_note(s, n, medians[name], extrapolated)
                if extrapolated.get("true") else "")
        rows.append([
            name, cell(name, f"time_to_{low}_s", time, "reached"),
            cell(name, f"time_to_{high}_s", time, "reached"),
            cell(name, s.final, lambda v: f"{v:.4f}"),
            cell(name, "wan_bytes", tables.data_size),
            cell(name, f"wan_bytes_to_{high}", tables.data_size, "reached"),
            cell(name, "s_per_step", lambda v: f"{v:.3f}"),
            cell(name, "steps_to_target", f0, "reached"),
            cell(name, "wall_s", f0), note])
    return tables.table(
        ["variant", f"time to {low} (s)", f"time to {high} (s)",
         f"final {s.workload.metric_name}", "WAN bytes (run)",
         f"WAN bytes to {high}", "s per step", f"steps to {high}",
         "wall (s)", "note"], rows)


def topology_table(s: Setup, runs: dict, summary: dict,
                   medians: dict) -> list[str]:
    """WAN messages per clock of the mesh and of the hierarchy, against
    their predicted counts; none when neither ran."""
    mesh = "gaia-compressed" if s.eleven else "gaia-mesh6"
    sites, hubs = (11, 3) if s.eleven else (6, 2)
    topo = [name for name in (mesh, "gaia-hierarchy") if name in runs]
    if not topo:
        return []

    def cell(name, key, fmt):
        return repeats.fmt_cell(summary[name].get(key), fmt)

    def f1(v):
        return f"{v:.1f}"

    rows = []
    for name in topo:
        clock = repeats.median_range(
            (row["wan_messages"] / row["messages_per_clock"]
             if row["messages_per_clock"] else 0) for row in runs[name])
        rows.append([name, f0(medians[name]["sites"]),
                     cell(name, "wan_messages", f0),
                     repeats.fmt_cell(clock, f0),
                     cell(name, "messages_per_clock", f1),
                     cell(name, "sync_messages_per_clock", f1),
                     cell(name, "wan_bytes", tables.data_size)])
    return ["", f"WAN messages per clock, {sites} sites (update + clock "
            "per exchange; predicted: mesh 2·S(S−1) = "
            f"{2 * sites * (sites - 1)}, {hubs} groups with hubs "
            f"4(S−H) + 2H(H−1) = "
            f"{4 * (sites - hubs) + 2 * hubs * (hubs - 1)}); wanem's "
            "count includes acknowledgements and heartbeats, the "
            "sites' count does not:", ""] + tables.table(
        ["variant", "sites", "WAN messages", "mean clock",
         "messages per clock", "updates + clocks per clock (sites' count)",
         "WAN bytes"], rows)


def results_text(s: Setup, n: int, order: list[str], runs: dict,
                 summary: dict, medians: dict, goals: list[Goal]) -> str:
    """results.md. `runs`: name -> every run's row; `summary`: name ->
    {quantity: median_range}; `medians`: name -> the row of medians. One
    run: the table as before (a cell is the value)."""
    w = s.workload
    lines = ["# Geo-distributed vs LAN training (bench/scenarios/geo_vs_lan)",
             "",
             f"{w.description} on {w.dataset}, {s.workers} "
             f"workers ({len(s.sites)} sites × {s.per_site} in the "
             "geo-distributed variants), device step "
             f"{w.step_time_s * 1000:.0f} ms, links {s.bandwidth} with "
             "preset latencies, time budget "
             f"{s.budget:.0f} s (BSP over WAN: {s.bsp_budget:.0f} s), "
             f"theta {s.theta} ({s.schedule}), DS {s.skew}." +
             (f" Median of {n} runs (range) per cell, the runs in "
              "round-robin order." if n > 1 else ""),
             ""]
    lines += variants_table(s, n, order, summary, medians)
    lines += [""] + goal_rows.table(goals)
    lines += topology_table(s, runs, summary, medians)
    if n > 1:
        lines += ["", repeats.note(n)]
    return "\n".join(lines) + "\n"


def results_json(n: int, order: list[str], runs: dict, summary: dict,
                 medians: dict, goals: list[Goal]) -> dict:
    """results.json: every run's numbers, each variant's summary and
    medians (one run: "variants" are its rows, as before), the goals."""
    variants = [dict(runs[name][0]) if n == 1 else medians[name]
                for name in order]
    return {"repeat": n,
            "variants": variants,
            "summary": {name: summary[name] for name in order},
            "runs": [{"variant": name, "run": r + 1, **runs[name][r]}
                     for r in range(n) for name in order],
            "goals": goal_rows.to_json(goals)}


def parse_args():
    parser = cli.parser(__doc__)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    cli.add_summarize_only(parser)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per run (default 1.5x the workload's: "
                             "90 for the MLP, 180 for a CNN, 150 for MF)")
    parser.add_argument("--bsp-budget", type=float, default=60.0)
    parser.add_argument("--theta", type=float, default=0.05)
    parser.add_argument("--skew", type=int, default=8)
    parser.add_argument("--schedule", default="THRESHOLD_CONSTANT",
                        choices=["THRESHOLD_CONSTANT",
                                 "THRESHOLD_INVERSE_SQRT",
                                 "THRESHOLD_LR_COUPLED"])
    cli.add_binary(parser)
    cli.add_dry_run(parser)
    repeats.add_argument(parser, "variant")
    workloads.add_argument(parser)
    parser.add_argument("--regions", type=int, choices=[3, 11], default=3,
                        help="sites of the geo-distributed variants: 3 "
                             "(4 workers each) or Gaia's 11 (1 each)")
    parser.add_argument("--step-time", type=float, default=None,
                        metavar="SECONDS",
                        help="every worker's emulated device step (default "
                             "the workload's): longer when the machine cannot "
                             "keep the workload's pace with every variant's "
                             "site servers beside the workers")
    parser.add_argument("--bandwidth", default=DEFAULT_LINK_BANDWIDTH,
                        help="every inter-site link's bandwidth, as wanem "
                             "reads it (default %(default)s)")
    cli.add_publishing(parser, "--only")
    return cli.parse(parser)


def main() -> int:
    args = parse_args()
    runner.prepare_outdir(args.outdir)
    w = pytorch.prepare_workload(workloads.get(args.workload), args.outdir,
                                 TAG, install=not args.summarize_only)
    if args.step_time is not None:
        w = w._replace(step_time_s=args.step_time)
    s = Setup(workload=w, regions=args.regions, bandwidth=args.bandwidth,
              budget=(args.budget if args.budget is not None
                      else w.budget_s * 1.5),
              bsp_budget=args.bsp_budget, theta=args.theta, skew=args.skew,
              schedule=args.schedule)
    configs = variant_configs(s)
    order = list(VARIANTS)
    if s.eleven:
        order.remove("gaia-mesh6")  # gaia-compressed is the 11-site mesh
    if args.quick:
        order = list(QUICK_VARIANTS)
    if args.only:
        order = [n for n in order if n in args.only.split(",")]

    if args.dry_run:
        binary = runner.require_binary(args.binary, TAG, build=False)
        return runner.dry_run(binary, TAG, args.outdir,
                              {name: configs[name] for name in order},
                              args.repeat)
    if not args.summarize_only:
        args.binary = runner.require_binary(args.binary, TAG)

    # rounds[r][name]: the row of run r (1-based) of variant `name`.
    rounds: dict[int, dict[str, dict]] = {
        r: {} for r in range(1, args.repeat + 1)}
    lan_bsp = {}  # r -> lan-bsp's report of round r
    for r, name in repeats.order(order, args.repeat):
        label = repeats.label(name, r, args.repeat)
        run_dir = os.path.join(args.outdir, "runs", label)
        if args.summarize_only:
            report = reports.read(run_dir, TAG)
            wall = report.get("wall_s")
        else:
            config = runner.write_config(args.outdir, label, jobs.set_field(
                configs[name], "name", f'"{label}"'))
            timeout = runner.timeout_for(max(s.budget, s.bsp_budget))
            done = runner.run_job(args.binary, TAG, label, config, run_dir,
                                  timeout)
            report, wall = done.report, done.wall_s
        if name == "lan-bsp":
            lan_bsp[r] = report
        row = rounds[r][name] = measure(s, name, run_dir, report, wall)
        runner.log(TAG, f"{label}: to {s.high} "
                   f"{tables.number(row[f'time_to_{s.high}_s'])} s, final "
                   f"{row[s.final]:.4f}, WAN "
                   f"{tables.data_size(row['wan_bytes'])}")
    for r, rows in rounds.items():
        extrapolate_bsp(s, rows, lan_bsp.get(r))

    # Per variant: every run's row, the median and range of each quantity,
    # and the row of medians the goals are computed from.
    runs = {name: [rounds[r][name] for r in sorted(rounds)] for name in order}
    summary = {name: repeats.summarize(runs[name], [
        key for key in runs[name][0] if key.startswith(TO_TARGET)])
        for name in order}
    medians = {name: {"name": name, **repeats.median_row(summary[name])}
               for name in order}
    goals = evaluate_goals(s, medians)
    text = results_text(s, args.repeat, order, runs, summary, medians, goals)
    results.write(args.outdir, text, results_json(
        args.repeat, order, runs, summary, medians, goals))
    return results.publish_if_wanted(
        dataclasses.replace(SCENARIO, file=w.results_file), args, text, restricted=bool(args.only) or
        args.summarize_only)


if __name__ == "__main__":
    sys.exit(main())
