#!/usr/bin/env python3
"""Geo-distributed training against LAN and BSP-over-WAN, on equal terms.

    bench/scenarios/geo_vs_lan OUTDIR [--quick] [--repeat N] [--only NAME,...]
                               [--budget SECONDS] [--workload NAME]
                               [--regions 3|11] [--bandwidth RATE]
                               [--binary PATH] [--dry-run]
                               [--summarize-only]

Runs every variant of the same job (MLP on Fashion-MNIST, or another
--workload of bench/scenarios/workloads.py: mlp-small (784-64-10, 50 ms
device steps, targets 0.83 and 0.85: the eleven-region job's model),
cnn, cnn-bn, cnn-gn, or mf, matrix factorisation on a generated rating
matrix; 12 workers
with a fixed device step time, 20 ms for the MLP; preset inter-region
latencies, links scaled to 64 Mbit/s so that one dense MLP transfer (0.8 MB)
takes five worker steps) through `meridian run`, and writes
OUTDIR/results.md and OUTDIR/results.json. Targets: 0.85 and 0.87 for the
MLP, 0.85 and 0.88 for the CNNs (the higher one is "the target"); for mf
the metric is the test RMSE, lower is better, targets 0.75 and 0.70 (0.70
is the target), with 32 local steps per asynchronous commit, apply rule
MEAN and a 5 ms device step; a time to target is the first time the metric
is at or below it.

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
README's eleven-region run).
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
(bench/scenarios/repeats.py). The goals' ratios (time vs LAN,
speed-up and bytes vs BSP over WAN) and differences are computed from the
medians of each side. When lan-bsp reaches the target sooner than lan (the
asynchronous site's twelve workers commit on models up to eleven commits
stale, which slows a CNN), a Gaia variant's time is also held against
lan-bsp: the faster LAN is the one to match. results.json keeps every run's numbers ("runs"),
each variant's median, min and max of every quantity ("summary") and the
medians ("variants"; with N = 1 the run's own numbers, as before); with
N = 1 the tables are as before. Every run has the same seed: repeats differ
by timing, as runs on a shared machine do.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from scenariolib import ROOT, repeats, workloads

# Set from --workload in main().
WORKLOAD = workloads.get("mlp")
TARGETS = WORKLOAD.targets
LOW, HIGH = TARGETS
STEP_TIME_S = WORKLOAD.step_time_s
FINAL = workloads.row_key(WORKLOAD)  # "final_accuracy" (classifiers)
DEFAULT_LINK_BANDWIDTH = "64mbit"
LINK_BANDWIDTH = DEFAULT_LINK_BANDWIDTH  # set from --bandwidth in main()
WORKERS = 12
# Set from --regions in main(): the sites of the geo-distributed variants,
# their workers each, and the speed-up over BSP the goals ask for.
SITES = None
PER_SITE = 4
BSP_SPEEDUP_GOAL = 20

COMMON = """
seed: 1
{target_field}: {target}
stop_at_target: false
time_budget_s: {budget}
{model}
{data}{optimizer}
server {{ {server}eval_period_s: 2 }}
# Plaintext links: the scenario measures what each technique saves, and
# wanem counts ZMTP messages (under CURVE it sees only encrypted frames).
# CURVE's own cost is measured by meridian_bench (README, "Security").
security {{ curve: false }}
"""

THREE_SITES = [("us", "us-east-1"), ("eu", "eu-central-1"),
               ("ap", "ap-southeast-1")]
# Gaia's eleven EC2 regions (Hsieh et al., NSDI'17, section 6), one site
# each; every pair has a preset (wan/presets.cc).
ELEVEN_SITES = [("us", "us-east-1"), ("ca", "us-west-1"), ("or", "us-west-2"),
                ("sa", "sa-east-1"), ("ie", "eu-west-1"),
                ("eu", "eu-central-1"), ("in", "ap-south-1"),
                ("sg", "ap-southeast-1"), ("jp", "ap-northeast-1"),
                ("kr", "ap-northeast-2"), ("au", "ap-southeast-2")]
ELEVEN_GROUPS = ('topology: GROUPS '
                 'group { hub: "us" site: "ca" site: "or" site: "sa" } '
                 'group { hub: "eu" site: "ie" site: "in" } '
                 'group { hub: "sg" site: "jp" site: "kr" site: "au" }')
# Two groups of three; hubs eu and ap. Every hub-member and hub-hub pair
# has a measured preset.
SIX_SITES = [("eu", "eu-central-1"), ("ie", "eu-west-1"), ("us", "us-east-1"),
             ("ap", "ap-southeast-1"), ("jp", "ap-northeast-1"),
             ("or", "us-west-2")]

GAIA_SYNC = """sync {{
  kind: GAIA
  threshold: {theta}
  threshold_mode: RELATIVE
  threshold_schedule: {schedule}
  max_clock_skew: {skew}
  {compression}
  {topology}
}}"""
FP32 = "compression { value_coding: VALUE_FP32 }"
INT8 = ("compression { value_coding: VALUE_INT8 block_size: 256 "
        "zstd_level: 1 }")


INT4 = ("compression { value_coding: VALUE_INT4 block_size: 256 "
        "zstd_level: 1 }")
DILOCO_PERIODS = (10, 40, 160)
DILOCO_VARIANTS = [f"diloco-h{h}" for h in DILOCO_PERIODS] + ["diloco-stream"]


def diloco(period, compression, extra):
    return (f"sync {{ kind: DILOCO averaging_period: {period} "
            f"diloco {{ outer_lr: 0.7 outer_momentum: 0.9 {extra} }} "
            f"{compression} }}\n")


def sites_block(sites, workers_each, server_site=None):
    lines = []
    for i, (name, region) in enumerate(sites):
        extra = ""
        if server_site and name != server_site:
            extra = f' server_site: "{server_site}"'
        lines.append(
            f'site {{ name: "{name}" region: "{region}"{extra} '
            f"workers {{ count: {workers_each} step_time_s: {STEP_TIME_S} }} }}")
    return "\n".join(lines)


def links_block(sites):
    """Every pair keeps its preset latency; bandwidth scaled down."""
    lines = ["wan {"]
    for i in range(len(sites)):
        for j in range(i + 1, len(sites)):
            lines.append(
                f'  link {{ a: "{sites[i][0]}" b: "{sites[j][0]}" '
                f'both {{ bandwidth: "{LINK_BANDWIDTH}" }} }}')
    lines.append("}")
    return "\n".join(lines)


def common_text(budget):
    return COMMON.format(
        budget=budget, target=HIGH, model=WORKLOAD.model,
        target_field=workloads.target_field(WORKLOAD),
        data=WORKLOAD.data + "\n" if WORKLOAD.data else "",
        optimizer=workloads.optimizer_block(WORKLOAD, WORKERS),
        server=WORKLOAD.server + " " if WORKLOAD.server else "")


def variant_configs(budget, bsp_budget, theta, skew, schedule):
    common = common_text(budget)
    bounded = common_text(bsp_budget)
    async_policy = ("policy { kind: ASYNC local_steps: "
                    f"{WORKLOAD.local_steps or 4} }}")
    bsp_policy = "policy { kind: BSP local_steps: 1 }"

    def gaia(compression, topology):
        return GAIA_SYNC.format(theta=theta, skew=skew, schedule=schedule,
                                compression=compression, topology=topology)

    groups = ('topology: GROUPS group { hub: "eu" site: "ie" site: "us" } '
              'group { hub: "ap" site: "jp" site: "or" }')
    hierarchy_sites, hierarchy_each = SIX_SITES, 2
    if SITES is ELEVEN_SITES:
        groups, hierarchy_sites, hierarchy_each = ELEVEN_GROUPS, SITES, 1
    return {
        "lan": f'name: "lan"\n{common}\n'
               f'site {{ name: "lan" workers {{ count: {WORKERS} '
               f'step_time_s: {STEP_TIME_S} }} }}\n{async_policy}\n',
        "lan-bsp": f'name: "lan-bsp"\n{common}\n'
                   f'site {{ name: "lan" workers {{ count: {WORKERS} '
                   f'step_time_s: {STEP_TIME_S} }} }}\n{bsp_policy}\n',
        "bsp-over-wan": f'name: "bsp-over-wan"\n{bounded}\n'
                        f'{sites_block(SITES, PER_SITE, "us")}\n'
                        f'{links_block(SITES)}\n{bsp_policy}\n',
        "gaia": f'name: "gaia"\n{common}\n{sites_block(SITES, PER_SITE)}\n'
                f'{links_block(SITES)}\n{async_policy}\n' +
                gaia(FP32, ""),
        "gaia-compressed": f'name: "gaia-compressed"\n{common}\n'
                           f'{sites_block(SITES, PER_SITE)}\n'
                           f'{links_block(SITES)}\n{async_policy}\n' +
                           gaia(INT8, ""),
        "gaia-hierarchy": f'name: "gaia-hierarchy"\n{common}\n'
                          f'{sites_block(hierarchy_sites, hierarchy_each)}\n'
                          f'{links_block(hierarchy_sites)}\n{async_policy}\n' +
                          gaia(INT8, groups),
        "gaia-mesh6": f'name: "gaia-mesh6"\n{common}\n'
                      f'{sites_block(SIX_SITES, 2)}\n'
                      f'{links_block(SIX_SITES)}\n{async_policy}\n' +
                      gaia(INT8, ""),
        "dense": f'name: "dense"\n{common}\n{sites_block(SITES, PER_SITE)}\n'
                 f'{links_block(SITES)}\n{async_policy}\n'
                 f"sync {{ kind: DENSE max_clock_skew: {skew} {FP32} }}\n",
        "fedavg": f'name: "fedavg"\n{common}\n{sites_block(SITES, PER_SITE)}\n'
                  f'{links_block(SITES)}\n{async_policy}\n'
                  "sync { kind: MODEL_AVERAGING averaging_period: 50 }\n",
        **{f"diloco-h{h}": f'name: "diloco-h{h}"\n{common}\n'
                           f'{sites_block(SITES, PER_SITE)}\n'
                           f'{links_block(SITES)}\n{async_policy}\n' +
                           diloco(h, INT8, "")
           for h in DILOCO_PERIODS},
        "diloco-stream": f'name: "diloco-stream"\n{common}\n'
                         f'{sites_block(SITES, PER_SITE)}\n'
                         f'{links_block(SITES)}\n{async_policy}\n' +
                         diloco(40, INT4, "fragments: 4 overlap: true"),
    }


def time_to(timelines, target):
    """Seconds until every site has reached `target` (None if one did not)."""
    latest = 0.0
    for points in timelines.values():
        reached = next((p for p in points if workloads.reached(
            WORKLOAD, workloads.value(WORKLOAD, p), target)), None)
        if reached is None:
            return None
        latest = max(latest, reached["t_s"])
    return latest


def read_timelines(report):
    return {s["name"]: s.get("timeline", []) for s in report.get("sites", [])}


def wan_bytes_until(run_dir, t_s):
    """Cross-site bytes counted by wanem up to `t_s` of the run (linear
    interpolation between samples of traffic.csv; its clock starts when
    wanem starts, a second or so before training)."""
    path = os.path.join(run_dir, "traffic.csv")
    if t_s is None or not os.path.exists(path):
        return None
    samples = {}
    with open(path) as f:
        header = f.readline().strip().split(",")
        col = {name: i for i, name in enumerate(header)}
        for line in f:
            row = line.strip().split(",")
            if len(row) != len(header):
                continue
            t = float(row[col["t_s"]])
            key = (row[col["link"]], row[col["from_site"]])
            samples.setdefault(t, {})[key] = float(row[col["bytes"]])
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


def run_variant(binary, name, config_text, out_dir):
    config_path = os.path.join(out_dir, "configs", name + ".pbtxt")
    with open(config_path, "w") as f:
        f.write(config_text)
    run_dir = os.path.join(out_dir, "runs", name)
    print(f"[geo_vs_lan] {name}: running ({config_path})", flush=True)
    start = time.time()
    proc = subprocess.run([binary, "run", config_path, "--out", run_dir],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    wall = time.time() - start
    with open(os.path.join(out_dir, "runs", name + ".out"), "w") as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-3000:])
        raise SystemExit(f"[geo_vs_lan] {name} failed (exit "
                         f"{proc.returncode}); output in {run_dir}")
    return run_dir, repeats.read_report(run_dir, "geo_vs_lan"), wall


def summarize(name, run_dir, report, wall):
    timelines = read_timelines(report)
    row = {
        "name": name,
        FINAL: workloads.final(WORKLOAD, report),
        "wan_bytes": report.get("wan_bytes_total", 0.0),
        "wall_s": wall,
        "training_s": max((s.get("training_s", 0.0)
                           for s in report.get("sites", [])), default=0.0),
        "extrapolated": False,
        "dense_equivalent_bytes": report.get("dense_equivalent_bytes", 0.0),
    }
    for target in TARGETS:
        t = time_to(timelines, target)
        row[f"time_to_{target}_s"] = t
        row[f"wan_bytes_to_{target}"] = wan_bytes_until(run_dir, t)
    row["time_to_target_s"] = row[f"time_to_{HIGH}_s"]
    commits = sum(w.get("commits", 0) for w in report.get("workers", []))
    row["commits"] = commits
    # WAN messages (counted by wanem) per site clock, for the topology
    # comparison; the mean clock over sites that sync.
    clocks = [s.get("sync", {}).get("clock", 0) for s in report.get("sites", [])]
    clocks = [c for c in clocks if c > 0]
    messages = sum(l.get("messages", 0) for l in report.get("links", []))
    row["wan_messages"] = messages
    row["sites"] = len(report.get("sites", []))
    row["messages_per_clock"] = (messages / (sum(clocks) / len(clocks))
                                 if clocks else None)
    # The sites' own count of what the O(S²) claim is about: updates
    # (and index announcements) and clock announcements, without the
    # delivery's acknowledgements and heartbeats that wanem also sees.
    sync_messages = sum(
        int(m.get("count", 0)) for s in report.get("sites", [])  # uint64: str
        for m in s.get("sync", {}).get("messages_sent", [])
        if m.get("type") in ("MIRROR_UPDATE", "MIRROR_INDICES", "MIRROR_CLOCK"))
    row["sync_messages_per_clock"] = (
        sync_messages / (sum(clocks) / len(clocks)) if clocks else None)
    return row


def bsp_steps_to(report, target):
    """BSP steps (clocks: one commit of every worker) until `target`."""
    workers = len(report.get("workers", [])) or WORKERS
    best = None
    for site in report.get("sites", []):
        reached = next((p for p in site.get("timeline", [])
                        if workloads.reached(
                            WORKLOAD, workloads.value(WORKLOAD, p), target)),
                       None)
        if reached is None:
            return None
        steps = reached.get("commits", 0) / workers
        best = steps if best is None else max(best, steps)
    return best


def dry_run(binary, out_dir, order, configs, repeat=1):
    """Writes and validates the configs; exit status 1 if one is refused."""
    failed = 0
    if repeat > 1:
        print("[geo_vs_lan] runs, in this order: " + ", ".join(
            repeats.label(name, r, repeat)
            for r, name in repeats.order(order, repeat)), flush=True)
    for name in order:
        path = os.path.join(out_dir, "configs", name + ".pbtxt")
        with open(path, "w") as f:
            f.write(configs[name])
        proc = subprocess.run([binary, "validate", path],
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        print(f"[geo_vs_lan] {name}: {proc.stdout.strip()}", flush=True)
        failed += proc.returncode != 0
    return 1 if failed else 0


def fmt_time(t):
    return "—" if t is None else f"{t:.1f}"


def fmt_bytes(b):
    if b is None:
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--summarize-only", action="store_true",
                        help="run nothing: rebuild results.md and "
                             "results.json from the runs already in OUTDIR")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds per run (default 1.5x the workload's: "
                             "90 for the MLP, 180 for a CNN, 150 for MF)")
    parser.add_argument("--bsp-budget", type=float, default=60.0)
    parser.add_argument("--theta", type=float, default=0.05)
    parser.add_argument("--skew", type=int, default=8)
    parser.add_argument("--schedule", default="THRESHOLD_CONSTANT",
                        choices=["THRESHOLD_CONSTANT", "THRESHOLD_INVERSE_SQRT",
                                 "THRESHOLD_LR_COUPLED"])
    parser.add_argument("--binary",
                        default=os.path.join(ROOT, "build", "bin", "meridian"))
    parser.add_argument("--dry-run", action="store_true",
                        help="write and validate the configs, run nothing")
    repeats.add_argument(parser, "variant")
    workloads.add_argument(parser)
    parser.add_argument("--regions", type=int, choices=[3, 11], default=3,
                        help="sites of the geo-distributed variants: 3 "
                             "(4 workers each) or Gaia's 11 (1 each)")
    parser.add_argument("--bandwidth", default=DEFAULT_LINK_BANDWIDTH,
                        help="every inter-site link's bandwidth, as wanem "
                             "reads it (default %(default)s)")
    args = parser.parse_args()
    global WORKLOAD, LINK_BANDWIDTH, TARGETS, LOW, HIGH, STEP_TIME_S, FINAL
    global SITES, PER_SITE, WORKERS, BSP_SPEEDUP_GOAL
    if args.regions == 11:
        SITES, PER_SITE, BSP_SPEEDUP_GOAL = ELEVEN_SITES, 1, 53.5
    else:
        SITES, PER_SITE, BSP_SPEEDUP_GOAL = THREE_SITES, 4, 20
    WORKERS = len(SITES) * PER_SITE
    LINK_BANDWIDTH = args.bandwidth
    WORKLOAD = workloads.get(args.workload)
    FINAL = workloads.row_key(WORKLOAD)
    TARGETS = WORKLOAD.targets
    LOW, HIGH = TARGETS
    STEP_TIME_S = WORKLOAD.step_time_s
    if args.budget is None:
        args.budget = WORKLOAD.budget_s * 1.5

    os.makedirs(os.path.join(args.outdir, "configs"), exist_ok=True)
    os.makedirs(os.path.join(args.outdir, "runs"), exist_ok=True)
    configs = variant_configs(args.budget, args.bsp_budget, args.theta,
                              args.skew, args.schedule)
    order = ["lan", "lan-bsp", "bsp-over-wan", "gaia", "gaia-compressed",
             "gaia-hierarchy", "gaia-mesh6", "dense", "fedavg",
             *DILOCO_VARIANTS]
    if args.regions == 11:
        order.remove("gaia-mesh6")  # gaia-compressed is the 11-site mesh
    if args.quick:
        order = ["lan", "lan-bsp", "bsp-over-wan", "gaia-compressed"]
    if args.only:
        order = [n for n in order if n in args.only.split(",")]

    if args.dry_run:
        return dry_run(args.binary, args.outdir, order, configs, args.repeat)

    # rounds[r][name]: the row of run r (1-based) of variant `name`.
    rounds = {r: {} for r in range(1, args.repeat + 1)}
    lan_bsp = {}  # r -> lan-bsp's report of round r
    for r, name in repeats.order(order, args.repeat):
        label = repeats.label(name, r, args.repeat)
        config = configs[name].replace(f'name: "{name}"',
                                       f'name: "{label}"', 1)
        if args.summarize_only:
            run_dir = os.path.join(args.outdir, "runs", label)
            report = repeats.read_report(run_dir, "geo_vs_lan")
            wall = report.get("wall_s")
        else:
            run_dir, report, wall = run_variant(args.binary, label, config,
                                                args.outdir)
        if name == "lan-bsp":
            lan_bsp[r] = report
        rows = rounds[r]
        rows[name] = summarize(name, run_dir, report, wall)
        row = rows[name]
        reached = row[f"time_to_{HIGH}_s"]
        print(f"[geo_vs_lan] {label}: to {HIGH} {fmt_time(reached)} s"
              f", final {row[FINAL]:.4f}, WAN "
              f"{fmt_bytes(row['wan_bytes'])}", flush=True)
    for r, rows in rounds.items():
        extrapolate_bsp(rows, lan_bsp.get(r))

    # Per variant: every run's row, the median and range of each quantity,
    # and the row of medians the goals are computed from.
    runs = {name: [rounds[r][name] for r in sorted(rounds)] for name in order}
    summary = {name: repeats.summarize(runs[name], [
        key for key in runs[name][0] if key.startswith(
            ("time_to_", "wan_bytes_to_", "lan_bsp_steps_to_"))])
        for name in order}
    medians = {name: {"name": name, **repeats.median_row(summary[name])}
               for name in order}
    goals = evaluate_goals(medians)
    write_results(args, order, runs, summary, medians, goals)


def extrapolate_bsp(rows, lan_bsp_report):
    """BSP over WAN (one round's rows): time and bytes to each target from
    lan-bsp's step count and bsp-over-wan's measured step rate and bytes per
    step."""
    if "bsp-over-wan" in rows and lan_bsp_report is not None:
        wan_row = rows["bsp-over-wan"]
        steps_run = wan_row["commits"] / WORKERS
        rate = steps_run / wan_row["training_s"] if wan_row["training_s"] else 0
        bytes_per_step = wan_row["wan_bytes"] / steps_run if steps_run else 0
        wan_row["measured_steps"] = steps_run
        wan_row["measured_step_rate"] = rate
        wan_row["bytes_per_step"] = bytes_per_step
        for target in TARGETS:
            steps = bsp_steps_to(lan_bsp_report, target)
            measured = wan_row[f"time_to_{target}_s"]
            if measured is None and steps is not None and rate > 0:
                wan_row[f"time_to_{target}_s"] = steps / rate
                wan_row[f"wan_bytes_to_{target}"] = steps * bytes_per_step
                wan_row["extrapolated"] = True
            wan_row[f"lan_bsp_steps_to_{target}"] = steps
        wan_row["time_to_target_s"] = wan_row[f"time_to_{HIGH}_s"]
        if wan_row["extrapolated"]:
            # Accuracy it would reach is lan-bsp's at that step count.
            wan_row[FINAL] = rows["lan-bsp"][FINAL]


def evaluate_goals(rows):
    """The issue's goals from one row per variant (the medians of its runs:
    every ratio is a ratio of medians)."""
    goals = []
    lan = rows.get("lan")
    bsp = rows.get("bsp-over-wan")
    for name in ("gaia", "gaia-compressed", "gaia-hierarchy"):
        g = rows.get(name)
        if not g or not lan:
            continue
        t_g, t_l = g[f"time_to_{HIGH}_s"], lan[f"time_to_{HIGH}_s"]
        if t_g is not None and t_l:
            ratio = t_g / t_l
            goals.append((f"{name}: time to {HIGH} vs LAN", "≤ 1.10×",
                          f"{ratio:.2f}×", ratio <= 1.10))
        lan_bsp = rows.get("lan-bsp")
        t_lb = lan_bsp[f"time_to_{HIGH}_s"] if lan_bsp else None
        if t_g is not None and t_lb and (not t_l or t_lb < t_l):
            ratio = t_g / t_lb
            goals.append((f"{name}: time to {HIGH} vs LAN-BSP (the faster "
                          "LAN)", "≤ 1.10×", f"{ratio:.2f}×", ratio <= 1.10))
        if bsp and t_g and bsp[f"time_to_{HIGH}_s"]:
            speedup = bsp[f"time_to_{HIGH}_s"] / t_g
            goals.append((f"{name}: faster to {HIGH} than BSP over WAN",
                          f"≥ {BSP_SPEEDUP_GOAL}×", f"{speedup:.1f}×",
                          speedup >= BSP_SPEEDUP_GOAL))
        b_g = g[f"wan_bytes_to_{HIGH}"]
        b_b = bsp[f"wan_bytes_to_{HIGH}"] if bsp else None
        if b_g and b_b:
            fewer = b_b / b_g
            goals.append((f"{name}: fewer WAN bytes to {HIGH} than BSP over WAN",
                          "≥ 500×", f"{fewer:.0f}×", fewer >= 500))
        if WORKLOAD.higher_is_better:
            diff = (lan[FINAL] - g[FINAL]) * 100
            goals.append((f"{name}: final {WORKLOAD.metric_name} vs LAN",
                          "within 0.5 points", f"{-diff:+.2f} points",
                          abs(diff) <= 0.5 or diff < 0))
        else:
            # Lower is better (RMSE): no more than 1% above LAN's.
            rel = (g[FINAL] / lan[FINAL] - 1) * 100 if lan[FINAL] else 0.0
            goals.append((f"{name}: final {WORKLOAD.metric_name} vs LAN",
                          "within +1%", f"{rel:+.2f}%", rel <= 1.0))
    goals += diloco_goals(rows)
    return goals


def diloco_goals(rows):
    """gaia-compressed against DiLoCo at its best setting: of the DiLoCo
    variants that reached the higher target, the one with the fewest WAN
    bytes to it."""
    g = rows.get("gaia-compressed")
    reached = [rows[n] for n in DILOCO_VARIANTS
               if n in rows and rows[n][f"wan_bytes_to_{HIGH}"]]
    if not g or not reached:
        return []
    best = min(reached, key=lambda r: r[f"wan_bytes_to_{HIGH}"])
    goals = []
    b_g, b_d = g[f"wan_bytes_to_{HIGH}"], best[f"wan_bytes_to_{HIGH}"]
    if b_g:
        goals.append((f"gaia-compressed: WAN bytes to {HIGH} vs {best['name']}"
                      " (DiLoCo's fewest)", "fewer",
                      f"{b_g / b_d:.2f}×", b_g < b_d))
    t_g, t_d = g[f"time_to_{HIGH}_s"], best[f"time_to_{HIGH}_s"]
    if t_g is not None:
        goals.append((f"gaia-compressed: time to {HIGH} vs {best['name']}",
                      "no later", f"{t_g / t_d:.2f}×", t_g <= t_d))
    return goals


def write_results(args, order, runs, summary, medians, goals):
    """results.md and results.json. `runs`: name -> every run's row;
    `summary`: name -> {quantity: median_range}; `medians`: name -> the row
    of medians. One run: the table as before (a cell is the value)."""
    n = args.repeat

    def cell(name, key, fmt, counted="runs"):
        return repeats.fmt_cell(summary[name].get(key), fmt, counted)

    def f4(v):
        return f"{v:.4f}"

    def f0(v):
        return f"{v:.0f}"

    lines = ["# Geo-distributed vs LAN training (bench/scenarios/geo_vs_lan)",
             "",
             f"{WORKLOAD.description} on {WORKLOAD.dataset}, {WORKERS} "
             f"workers ({len(SITES)} sites × {PER_SITE} in the geo-distributed "
             "variants), "
             f"device "
             f"step {STEP_TIME_S * 1000:.0f} ms, links {LINK_BANDWIDTH} with "
             "preset latencies, time budget "
             f"{args.budget:.0f} s (BSP over WAN: {args.bsp_budget:.0f} s), "
             f"theta {args.theta} ({args.schedule}), DS {args.skew}." +
             (f" Median of {n} runs (range) per cell, the runs in "
              "round-robin order." if n > 1 else ""),
             "",
             f"| variant | time to {LOW} (s) | time to {HIGH} (s) | final "
             f"{WORKLOAD.metric_name} | WAN bytes (run) | WAN bytes to {HIGH} |"
             " wall (s) | "
             "note |",
             "|---|---|---|---|---|---|---|---|"]
    for name in order:
        r = medians[name]
        note = ""
        extrapolated = summary[name].get("extrapolated") or {}
        if extrapolated.get("true"):
            steps = r.get(f"lan_bsp_steps_to_{HIGH}")
            to = ""
            if steps is None:  # lan-bsp missed the target: the easier one
                steps = r.get(f"lan_bsp_steps_to_{LOW}") or 0
                to = f" to {LOW}"
            which = ""
            if n > 1:
                which = (f" in {extrapolated['true']} of {n} runs"
                         if extrapolated["true"] < n else "")
                which += " (medians)"
            note = (f"extrapolated{to}{which}: {steps:.0f} "
                    f"BSP steps (lan-bsp) at the measured "
                    f"{r['measured_step_rate']:.2f} steps/s, "
                    f"{fmt_bytes(r['bytes_per_step'])}/step")
        lines.append(
            f"| {name} | "
            f"{cell(name, f'time_to_{LOW}_s', fmt_time, 'reached')} | "
            f"{cell(name, f'time_to_{HIGH}_s', fmt_time, 'reached')} | "
            f"{cell(name, FINAL, f4)} | "
            f"{cell(name, 'wan_bytes', fmt_bytes)} | "
            f"{cell(name, f'wan_bytes_to_{HIGH}', fmt_bytes, 'reached')} | "
            f"{cell(name, 'wall_s', f0)} | "
            f"{note} |")
    lines += ["", "| goal | wanted | measured | met |", "|---|---|---|---|"]
    for goal, wanted, measured, met in goals:
        lines.append(f"| {goal} | {wanted} | {measured} | "
                     f"{'yes' if met else 'no'} |")
    mesh = "gaia-compressed" if SITES is ELEVEN_SITES else "gaia-mesh6"
    sites, hubs = (11, 3) if SITES is ELEVEN_SITES else (6, 2)
    topo = [name for name in (mesh, "gaia-hierarchy") if name in runs]
    if topo:
        lines += ["", f"WAN messages per clock, {sites} sites (update + clock "
                  "per exchange; predicted: mesh 2·S(S−1) = "
                  f"{2 * sites * (sites - 1)}, {hubs} groups with hubs "
                  f"4(S−H) + 2H(H−1) = "
                  f"{4 * (sites - hubs) + 2 * hubs * (hubs - 1)}); wanem's "
                  "count includes acknowledgements and heartbeats, the "
                  "sites' count does not:", "",
                  "| variant | sites | WAN messages | mean clock | "
                  "messages per clock | updates + clocks per clock (sites' "
                  "count) | WAN bytes |", "|---|---|---|---|---|---|---|"]
        for name in topo:
            clock = repeats.median_range(
                (row["wan_messages"] / row["messages_per_clock"]
                 if row["messages_per_clock"] else 0) for row in runs[name])
            lines.append(
                f"| {name} | {f0(medians[name]['sites'])} | "
                f"{cell(name, 'wan_messages', f0)} | "
                f"{repeats.fmt_cell(clock, f0)} | "
                f"{cell(name, 'messages_per_clock', lambda v: f'{v:.1f}')} | "
                f"{cell(name, 'sync_messages_per_clock', lambda v: f'{v:.1f}')} | "
                f"{cell(name, 'wan_bytes', fmt_bytes)} |")
    if n > 1:
        lines += ["", repeats.note(n)]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.outdir, "results.md"), "w") as f:
        f.write(text)
    # One run: "variants" are its rows as before; more: the medians.
    variants = [dict(runs[name][0]) if n == 1 else medians[name]
                for name in order]
    with open(os.path.join(args.outdir, "results.json"), "w") as f:
        json.dump({"repeat": n,
                   "variants": variants,
                   "summary": {name: summary[name] for name in order},
                   "runs": [{"variant": name, "run": r + 1, **runs[name][r]}
                            for r in range(n) for name in order],
                   "goals": [{"goal": g, "wanted": w, "measured": m,
                              "met": met} for g, w, m, met in goals]},
                  f, indent=1)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
