#!/usr/bin/env python3
"""Intra-site commit scheduling under device heterogeneity (ADSP, AAAI 2020).

    bench/scenarios/heterogeneity OUTDIR [--quick] [--repeat N]
                                  [--only POLICY,...]
                                  [--h 1.45,2.0,...] [--budget SECONDS]
                                  [--workload mlp|cnn|cnn-bn|cnn-gn|mf]
                                  [--dry-run]
                                  [--network NAME,...] [--delays MS,...]
                                  [--binary PATH]

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

--workload cnn, cnn-bn or cnn-gn (bench/scenarios/workloads.py): the
LeNet-5-style CNN (without a norm, with BatchNorm, with GroupNorm) on the
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
(bench/scenarios/repeats.py).

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

Writes OUTDIR/results.md and OUTDIR/results.json; only the standard library
is used.
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
FAST_STEP_S = 0.03
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
CONVERGED_EVALUATIONS = 10  # the paper's rule: the 10th evaluation below
# Workers' access networks (workers.link.preset): name -> (down Mbit/s,
# up Mbit/s, one-way latency ms), read from `meridian presets --json` in
# main() (load_access_presets).
ACCESS_PRESETS = {}
# The networks besides the presets' own names.
MIXED_NETWORKS = ("none", "edge")
# edge: the presets of the fast devices and of the slow ones (first half,
# rest), fastest first.
EDGE_TIERS = {"fast": ("campus", "home-broadband"), "slow": ("5g", "4g")}


def slow_factor(h, fast, slow):
    """k such that mean(v) / min(v) = h with `fast` workers at v and `slow`
    at v / k: h = (fast k + slow) / (fast + slow)."""
    return (h * (fast + slow) - slow) / fast


def policy_block(policy):
    # Steps per commit of the step-synchronous policies: 1, or the
    # workload's (MF: 32; every commit's reply is the whole model).
    steps = WORKLOAD.local_steps or 1
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


def worker_groups(workers, network):
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


def ms(value):
    return f"{round(value, 6):g}ms"


def link_block(preset, delay):
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
            f'"{ms(ACCESS_PRESETS[preset][2] + delay)}" }} }}')


def job_text(name, policy, h, workers, budget, accuracy_target,
             network="none", delay=0.0):
    slow = round(workers * 7 / 18)
    fast = workers - slow
    k = slow_factor(h, fast, slow)
    step = {"fast": f"{FAST_STEP_S}", "slow": f"{FAST_STEP_S * k:.4f}"}
    groups = "\n".join(
        f"  workers {{ count: {n} step_time_s: {step[tier]}"
        f"{link_block(preset, delay)} }}"
        for n, tier, preset in worker_groups(workers, network))
    return f"""name: "{name}"
seed: 1
{workloads.target_field(WORKLOAD)}: {accuracy_target}
stop_at_target: false
time_budget_s: {budget}
site {{
  name: "edge"
{groups}
}}
{model_data_optimizer(workers)}
server {{ apply_rule: MEAN eval_period_s: 1 }}
{policy_block(policy)}
"""


def model_data_optimizer(workers):
    # The MLP's block is the classifiers' (workloads.CLASSIFIER_OPTIMIZER)
    # on Fashion-MNIST, as before.
    return "\n".join([WORKLOAD.model, WORKLOAD.data or FASHION_MNIST,
                      workloads.optimizer_block(WORKLOAD, workers)])


def below_target(point, loss_target):
    """Whether an evaluation counts towards convergence: test loss below
    the target (for a lower-is-better metric such as MF's RMSE: the metric
    at or below it)."""
    if WORKLOAD.higher_is_better:
        return point.get("loss", 1e9) < loss_target
    return workloads.reached(WORKLOAD, workloads.value(WORKLOAD, point),
                             loss_target)


def convergence_time(timeline, loss_target):
    """The paper's rule: the 10th evaluation below the target."""
    below = 0
    for point in timeline:
        if below_target(point, loss_target):
            below += 1
            if below == CONVERGED_EVALUATIONS:
                return point["t_s"]
    return None


def steps_to_first_below(timeline, loss_target, workers):
    """Steps (commits / workers) at the first evaluation below the
    convergence target; None if none was."""
    for point in timeline:
        if below_target(point, loss_target):
            return point.get("commits", 0) / workers
    return None


def bound_unconverged_bsp(rows):
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


def time_to_accuracy(timeline, target):
    for point in timeline:
        if workloads.reached(WORKLOAD, workloads.value(WORKLOAD, point),
                             target):
            return point["t_s"]
    return None


def run(binary, outdir, name, text):
    config = os.path.join(outdir, "configs", name + ".pbtxt")
    with open(config, "w") as f:
        f.write(text)
    run_dir = os.path.join(outdir, "runs", name)
    print(f"[heterogeneity] {name}: running", flush=True)
    start = time.time()
    proc = subprocess.run([binary, "run", config, "--out", run_dir],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    wall = time.time() - start
    with open(os.path.join(outdir, "runs", name + ".out"), "w") as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-3000:])
        raise SystemExit(f"[heterogeneity] {name} failed (exit "
                         f"{proc.returncode}); output in {run_dir}")
    return read_report(outdir, name), wall


def read_report(outdir, name):
    """The report.json of the run in OUTDIR/runs/NAME (just run, or already
    there for --summarize-only); exits naming a missing or broken one."""
    return repeats.read_report(os.path.join(outdir, "runs", name),
                               "heterogeneity")


def fmt(t):
    return "—" if t is None else f"{t:.1f}"


def network_list(text):
    """argparse type of --network: names, comma-separated, each once
    (checked against the presets in main())."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no network named")
    return list(dict.fromkeys(names))


def load_access_presets(binary):
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


def delay_list(text):
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


def network_label(network, delay, sweep):
    """A column's or goal's name: "edge", "edge +20 ms" (with --delays)."""
    return f"{network} +{delay:g} ms" if sweep else network


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
                        help="bench/scenarios/workloads.py")
    parser.add_argument("--summarize-only", action="store_true",
                        help="run nothing: rebuild results.md and "
                             "results.json from the runs already in OUTDIR "
                             "(the same other flags as when they ran)")
    parser.add_argument("--dry-run", action="store_true",
                        help="write and validate the configs, run nothing")
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
    parser.add_argument("--binary",
                        default=os.path.join(ROOT, "build", "bin", "meridian"))
    args = parser.parse_args()
    global WORKLOAD, FAST_STEP_S, ACCESS_PRESETS
    ACCESS_PRESETS = load_access_presets(args.binary)
    networks = MIXED_NETWORKS + tuple(ACCESS_PRESETS)
    unknown = [n for n in args.network if n not in networks]
    if unknown:
        parser.error(f"--network: unknown network {unknown[0]!r}; use "
                     f"{', '.join(networks)}")
    WORKLOAD = workloads.get(args.workload)
    FAST_STEP_S = FAST_STEPS[args.workload]
    if args.budget is None:
        args.budget = BUDGETS.get(args.workload, DEFAULT_BUDGET)
    if args.loss_target is None:
        args.loss_target = (0.40 if WORKLOAD.higher_is_better
                            else WORKLOAD.targets[0])
    if args.accuracy_target is None:
        args.accuracy_target = (0.86 if WORKLOAD.higher_is_better
                                else WORKLOAD.targets[1])
    final_key = workloads.row_key(WORKLOAD)
    to_key = f"time_to_{WORKLOAD.metric}_s"  # time_to_accuracy_s (mlp)

    # With --network or --delays the tables and results gain their columns
    # and fields; without, the output is as before.
    args.extended = args.network != ["none"] or args.delays is not None
    delays = args.delays if args.delays is not None else [0.0]
    # (network, delay) in column order.
    args.combos = [(n, d) for n in args.network for d in delays]

    plan = []  # (policy, H, workers, network, delay)
    h_values = [float(h) for h in args.h.split(",")] if args.h else H_VALUES
    policies = POLICIES
    if args.quick:
        h_values = [3.2]
        policies = ("ADSP", "FIXED_ADACOMM", "BSP")
    if args.only:
        policies = [p for p in policies if p in args.only.split(",")]
    for h in h_values:
        for network, delay in args.combos:
            for policy in policies:
                plan.append((policy, h, 18, network, delay))
    if not args.quick and not args.no_36:
        for network, delay in args.combos:
            for policy in ("ADSP", "FIXED_ADACOMM"):
                if policy in policies:
                    plan.append((policy, 3.2, 36, network, delay))
    plan = list(dict.fromkeys(plan))  # each cell once (--h 3.2,3.2)

    os.makedirs(os.path.join(args.outdir, "configs"), exist_ok=True)
    os.makedirs(os.path.join(args.outdir, "runs"), exist_ok=True)
    if args.dry_run:
        if args.repeat > 1:
            print("[heterogeneity] runs, in this order: " + ", ".join(
                repeats.label(cell_name(*cell), r, args.repeat)
                for r, cell in repeats.order(plan, args.repeat)))
        failed = 0
        for policy, h, workers, network, delay in plan:
            name = cell_name(policy, h, workers, network, delay)
            path = os.path.join(args.outdir, "configs", name + ".pbtxt")
            with open(path, "w") as f:
                f.write(job_text(name, policy, h, workers, args.budget,
                                 args.accuracy_target, network, delay))
            proc = subprocess.run([args.binary, "validate", path],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            print(f"[heterogeneity] {name}: {proc.stdout.strip()}")
            failed += proc.returncode != 0
        return 1 if failed else 0
    rows = []  # every run, in the order they ran
    for r, cell in repeats.order(plan, args.repeat):
        policy, h, workers, network, delay = cell
        name = repeats.label(cell_name(*cell), r, args.repeat)
        if args.summarize_only:
            # The wall time of a run read back is not known.
            report, wall = read_report(args.outdir, name), None
        else:
            report, wall = run(args.binary, args.outdir, name,
                               job_text(name, policy, h, workers,
                                        args.budget, args.accuracy_target,
                                        network, delay))
        row = measure(report, wall, name, cell, args, final_key, to_key)
        row["cell"] = cell_name(*cell)
        row["run"] = r
        rows.append(row)
        edge = ""
        if args.extended:
            edge = (", edge traffic " + fmt_mb(row["edge_bytes_total"]) +
                    (" MB" if row["edge_bytes_total"] is not None else ""))
        print(f"[heterogeneity] {name}: converged {fmt(row['convergence_time_s'])}"
              f" s, to {args.accuracy_target} {fmt(row[to_key])} s,"
              f" final {row[final_key]:.4f}, H measured "
              f"{row['H_measured']:.2f}{edge}", flush=True)

    bound_unconverged_bsp(rows)
    # Per cell: the median and range of each quantity over its runs.
    cells = {cell: repeats.summarize(
        [row for row in rows if row["cell"] == cell_name(*cell)],
        ("convergence_time_s", to_key)) for cell in plan}
    goals = evaluate_goals(cells, args.budget, args.repeat, args)
    write_results(args, plan, rows, cells, goals, final_key, to_key)


def cell_name(policy, h, workers, network="none", delay=0.0):
    """adsp-h3.2-w18; -NETWORK unless none, -dMSms unless 0 ms."""
    name = f"{policy.lower()}-h{h}-w{workers}"
    if network != "none":
        name += f"-{network}"
    if delay:
        name += f"-d{delay:g}ms"
    return name


def fmt_mb(value):
    return "loopback" if value is None else f"{value / 1e6:.1f}"


def edge_traffic(report, network, delay):
    """(total, up, down) bytes of the workers' access links (report
    edge_links: from "<site>/w<i>" is the uplink); None each for a loopback
    run (network none, no delay), which has none and counts nothing."""
    if network == "none" and not delay:
        return None, None, None
    links = report.get("edge_links") or []
    up = sum(l.get("bytes", 0.0) for l in links
             if "/" in l.get("from_site", ""))
    down = sum(l.get("bytes", 0.0) for l in links
               if "/" not in l.get("from_site", ""))
    return report.get("edge_bytes_total", up + down), up, down


def measure(report, wall, name, cell, args, final_key, to_key):
    """The row of one run."""
    policy, h, workers, network, delay = cell
    site = report["sites"][0]
    timeline = site.get("timeline", [])
    worker_rows = report.get("workers", [])
    commits = [w.get("commits", 0) for w in worker_rows]
    extra = {}
    links = []  # each worker's access network, by index
    if args.extended:
        total, up, down = edge_traffic(report, network, delay)
        extra = {"network": network, "delay_ms": delay,
                 "edge_bytes_total": total, "edge_up_bytes": up,
                 "edge_down_bytes": down}
        for n, _, preset in worker_groups(workers, network):
            links += [preset or "none"] * n
        blocked = {}
        for w in worker_rows:
            i = w.get("index", 0)
            link = links[i] if i < len(links) else "?"
            blocked.setdefault(link, []).append(w.get("blocked_s", 0.0))
        extra["blocked_s_mean_by_link"] = {
            link: sum(v) / len(v) for link, v in blocked.items()}
    row = {
        "name": name,
        "policy": policy,
        "H": h,
        "H_measured": report.get("heterogeneity", 0.0),
        "workers": workers,
        **extra,
        "convergence_time_s": convergence_time(timeline, args.loss_target),
        to_key: time_to_accuracy(timeline, args.accuracy_target),
        "search_time_s": report.get("search_time_s", 0.0),
        final_key: workloads.final(WORKLOAD, report),
        "final_loss": report.get("final_loss", 0.0),
        # BSP's extrapolation (bound_unconverged_bsp) reads these.
        "steps": sum(commits) / max(workers, 1),
        "training_s": site.get("training_s", 0.0),
        "first_below_steps": steps_to_first_below(
            timeline, args.loss_target, workers),
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
    if args.extended:
        for w in row["workers_detail"]:
            i = w.get("index") or 0
            w["link"] = links[i] if i < len(links) else None
    return row


def evaluate_goals(cells, budget, repeat, args):
    """ADSP against FIXED_ADACOMM and BSP at H = 3.2, from the medians of
    each side's convergence times; per network and delay (named with
    --network / --delays)."""
    goals = []

    def partial(who, cell):
        if cell is None or cell["runs"] >= cell["of"]:
            return ""
        return f"; {who} converged in {cell['runs']} of {cell['of']} runs"

    def missed(cell):  # " in k of N runs" (N > 1) that did not converge
        if repeat == 1:
            return ""
        return f" in {repeat - (cell['runs'] if cell else 0)} of {repeat} runs"

    for (network, delay), workers in [(c, w) for c in args.combos
                                      for w in (18, 36)]:
        adsp = cells.get(("ADSP", 3.2, workers, network, delay))
        for rival, wanted in (("FIXED_ADACOMM", 62.4), ("BSP", 90.0)):
            other = cells.get((rival, 3.2, workers, network, delay))
            if not adsp or not other:
                continue
            a_cell = adsp["convergence_time_s"]
            o_cell = other["convergence_time_s"]
            a, o = repeats.median(a_cell), repeats.median(o_cell)
            label = f"ADSP vs {rival}, H = 3.2, {workers} workers"
            if args.extended:
                label += ", network " + network_label(
                    network, delay, args.delays is not None)
            if a is None:
                goals.append((label, f"≥ {wanted}% faster", "ADSP did not "
                              f"converge{missed(a_cell)}", False))
            elif o is None:
                notes = partial("ADSP", a_cell)
                bound = rival_bound(other.get("convergence_estimate_s"),
                                    budget)
                how = (f"; extrapolated ≥ {bound:.0f} s"
                       if bound > budget else "")
                faster = (1 - a / bound) * 100
                goals.append((label, f"≥ {wanted}% faster",
                              f"{rival} did not converge in {budget:.0f} s"
                              f"{missed(o_cell)}{how} (ADSP {a:.1f} s): ≥ "
                              f"{faster:.1f}% faster{notes}",
                              faster >= wanted))
            else:
                notes = partial("ADSP", a_cell) + partial(rival, o_cell)
                faster = (1 - a / o) * 100
                goals.append((label, f"≥ {wanted}% faster",
                              f"{faster:.1f}%{notes}", faster >= wanted))
    return goals


def rival_bound(o_estimate, budget):
    """The least convergence time of a rival that did not converge within
    the budget: its extrapolated lower bound (BSP, the median over the
    runs; bound_unconverged_bsp) when that exceeds the budget, else the
    budget."""
    e = repeats.median(o_estimate)
    return e if e is not None and e > budget else budget


def lead(a_cell, o_cell, budget, o_estimate=None):
    """ADSP's lead over a rival: "% faster" from the medians of their
    convergence times; "≥ x%" when the rival did not converge (against
    rival_bound), — when ADSP did not."""
    a, o = repeats.median(a_cell), repeats.median(o_cell)
    if a is None:
        return "—"
    if o is None:
        return f"≥ {(1 - a / rival_bound(o_estimate, budget)) * 100:.1f}%"
    return f"{(1 - a / o) * 100:.1f}%"


def network_text(args):
    """The paragraph on the networks and delays (--network, --delays)."""
    sweep = args.delays is not None
    parts = []
    for network in args.network:
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
    used = [p for p in ACCESS_PRESETS
            if p in args.network or ("edge" in args.network)]
    text = "Networks: " + "; ".join(parts) + "."
    if used:
        text += (" Access presets (down / up Mbit/s, one-way latency): " +
                 ", ".join(f"{p} {d:g} / {u:g} / {l:g} ms" for p, (d, u, l)
                           in ACCESS_PRESETS.items() if p in used) + ".")
    if sweep:
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


def comparison_lines(args, plan, cells):
    """Each policy's convergence time per network and delay (columns), the
    rows grouped by H and workers, with ADSP's lead over FIXED_ADACOMM and
    BSP in each column."""
    sweep = args.delays is not None
    lines = ["Convergence time (s) per network" +
             (" and added delay" if sweep else "") +
             " (columns), and ADSP's lead: % faster than FIXED_ADACOMM and "
             "than BSP, from the medians (≥: the rival did not converge "
             f"within the {args.budget:.0f} s budget, the lead counted "
             "against the budget or, for BSP, against its extrapolated "
             "lower bound when that is later; —: ADSP did not converge). "
             "BSP's lower bound: the steps after which the loopback BSP "
             "run of the same round first had its loss below the target, "
             "at this run's measured step rate (BSP makes the same steps "
             "whatever the network).",
             "",
             "| H | workers | policy | " +
             " | ".join(network_label(n, d, sweep) for n, d in args.combos) +
             " |",
             "|---|---|---|" + "---|" * len(args.combos)]
    groups = list(dict.fromkeys((h, w) for _, h, w, _, _ in plan))
    for h, workers in groups:
        policies = list(dict.fromkeys(p for p, ph, pw, _, _ in plan
                                      if (ph, pw) == (h, workers)))

        def conv(policy, network, delay, key="convergence_time_s"):
            c = cells.get((policy, h, workers, network, delay))
            return None if c is None else c.get(key)

        for policy in policies:
            lines.append(f"| {h} | {workers} | {policy} | " + " | ".join(
                repeats.fmt_cell(conv(policy, n, d), fmt, "converged")
                if (policy, h, workers, n, d) in cells else ""
                for n, d in args.combos) + " |")
        if any(conv("BSP", n, d) is None and
               conv("BSP", n, d, "convergence_estimate_s")
               for n, d in args.combos):
            lines.append(
                f"| {h} | {workers} | BSP, extrapolated lower bound | " +
                " | ".join(
                    repeats.fmt_cell(conv("BSP", n, d,
                                          "convergence_estimate_s"), fmt)
                    if conv("BSP", n, d) is None else ""
                    for n, d in args.combos) + " |")
        for rival in ("FIXED_ADACOMM", "BSP"):
            if "ADSP" not in policies or rival not in policies:
                continue
            lines.append(
                f"| {h} | {workers} | ADSP lead over {rival} | " +
                " | ".join(lead(conv("ADSP", n, d), conv(rival, n, d),
                                args.budget,
                                conv(rival, n, d, "convergence_estimate_s"))
                           if ("ADSP", h, workers, n, d) in cells and
                           (rival, h, workers, n, d) in cells else ""
                           for n, d in args.combos) + " |")
    return lines


def write_results(args, plan, rows, cells, goals, final_key, to_key):
    n = args.repeat

    def cell(key_cell, key, fmt_value, counted="runs"):
        return repeats.fmt_cell(cells[key_cell].get(key), fmt_value, counted)

    def f1(v):
        return f"{v:.1f}"

    def f0(v):
        return f"{v:.0f}"

    lines = ["# Heterogeneous workers in one site (bench/scenarios/heterogeneity)",
             "",
             f"{WORKLOAD.description} on {WORKLOAD.dataset}, one site; fast "
             f"devices "
             f"{FAST_STEP_S * 1000:.0f} ms a step, 7 of 18 slowed to set H; "
             f"test evaluation every 1 s; convergence = the "
             f"{CONVERGED_EVALUATIONS}th evaluation with test "
             + (f"loss < {args.loss_target}" if WORKLOAD.higher_is_better
                else f"{WORKLOAD.metric_name} <= {args.loss_target}") +
             f"; budget {args.budget:.0f} s per run." +
             (f" Median of {n} runs (range) per cell, the runs in "
              "round-robin order." if n > 1 else ""),
             ""]
    sweep = args.delays is not None
    # --network / --delays: network (and delay) first, edge traffic last.
    head, rule, tail = "", "", ""
    if args.extended:
        lines[-1:] = ["", network_text(args), ""]
        head = "network | " + ("delay (ms) | " if sweep else "")
        rule = "---|" * (2 if sweep else 1)
        tail = " edge traffic (MB) |"
    lines += ["| " + head + "policy | H | H measured | workers | "
              "convergence (s) | "
              f"to {args.accuracy_target} {WORKLOAD.metric_name} (s) | "
              f"search (s) | final {WORKLOAD.metric_name} | commits min–max | "
              "mean blocked (s) |" + tail,
              "|" + rule + "---|---|---|---|---|---|---|---|---|---|" +
              ("---|" if args.extended else "")]
    def f2(v):
        return f"{v:.2f}"

    for key in plan:
        policy, h, workers, network, delay = key
        c = cells[key]
        first, last = "", ""
        if args.extended:
            first = f"{network} | " + (f"{delay:g} | " if sweep else "")
            last = " " + repeats.fmt_cell(c.get("edge_bytes_total"),
                                          fmt_mb, missing="loopback") + " |"
        lines.append(
            f"| {first}{policy} | {h} | {cell(key, 'H_measured', f2)} | "
            f"{workers} | "
            f"{cell(key, 'convergence_time_s', fmt, 'converged')} | "
            f"{cell(key, to_key, fmt, 'reached')} | "
            f"{cell(key, 'search_time_s', f1)} | "
            f"{cell(key, final_key, lambda v: f'{v:.4f}')} | "
            f"{f0(c['commits_min']['median'])}–"
            f"{f0(c['commits_max']['median'])}"
            f" | {cell(key, 'blocked_s_mean', f1)} |{last}")
    if n == 1:
        lines += ["", "— : not converged within the budget."]
    else:
        lines += ["", repeats.note(n, ("converged", "reached")) +
                  " commits min–max: the medians of the fewest and the most "
                  "commits of a worker in a run."]
    if args.extended:
        lines += [""] + comparison_lines(args, plan, cells)
    lines += ["", "| goal | wanted | measured | met |", "|---|---|---|---|"]
    for goal, wanted, measured, met in goals:
        lines.append(f"| {goal} | {wanted} | {measured} | "
                     f"{'yes' if met else 'no'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.outdir, "results.json"), "w") as f:
        extended = {}
        if args.extended:
            extended = {"networks": args.network,
                        "delays_ms": args.delays or [0.0]}

        def cell_keys(key):
            if not args.extended:
                return {}
            return {"network": key[3], "delay_ms": key[4]}

        json.dump({"repeat": n,
                   **extended,
                   "runs": rows,
                   "cells": [{"name": cell_name(*key), "policy": key[0],
                              "H": key[1], "workers": key[2],
                              **cell_keys(key),
                              "summary": cells[key]} for key in plan],
                   "goals": [{"goal": g, "wanted": w, "measured": m,
                              "met": met} for g, w, m, met in goals]},
                  f, indent=1)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
