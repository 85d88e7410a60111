#!/usr/bin/env python3
"""Multi-site training under label skew: each skew against each algorithm.

    bench/scenarios/noniid OUTDIR [--quick] [--repeat N] [--only NAME,...]
                           [--skews NAME,...] [--budget SECONDS] [--ds N]
                           [--checkpoints on|off] [--workload NAME]
                           [--binary PATH] [--summarize-only]

Runs the three-region job (3 sites x 4 workers, Fashion-MNIST, the MLP or
another --workload of bench/scenarios/workloads.py: cnn, cnn-bn, cnn-gn for
the LeNet-style CNN plain, with BatchNorm or with GroupNorm (not mf: its
ratings can only be split at random, a label skew would split them by
rating value, and `meridian validate` refuses it); a fixed device
step time (20 ms for the MLP) so that the machine is not what limits the sites,
`wan.emulate: false` so that links are not either) once per skew and
algorithm through `meridian run`, and writes OUTDIR/results.md and
OUTDIR/results.json: final accuracy of the flushed model, replica accuracy
(the mean test accuracy of the sites' replicas over the last third of the
budget: what a site serves while training), both against one parameter
server under the same skew, WAN bytes, time to 0.85, the age of remote
changes and the change each site holds back (README, "Non-IID data"),
and for SkewScout how far its estimates move between travels to the same
peer against the sampling error of one estimate.
With --repeat N every cell runs N times (OUTDIR/runs/SKEW-ALGO-r1, -r2, ...;
round-robin: run 1 of every cell, then run 2 of every cell, ..., so slow
drift of the machine hits every cell alike) and the tables show the median
of the N runs with the range, median (min–max); for the time to 0.85 a
run that did not reach it counts as later than any that did (— when the
median run did not), the range is that of the runs that did, "2 of 3
reached" when not all did; the loss against one parameter server and the
goals are computed from the medians of each side. results.json has every
run's numbers and each cell's median, min and max
(bench/scenarios/repeats.py). Every run has seed 1: repeats differ by
timing, as runs on a shared machine do. --summarize-only runs nothing and
rebuilds the tables from the runs already in OUTDIR (the same --skews,
--only, --repeat, --budget and --workload as the invocation that ran them).

Skews (how the training set is split across the three sites):
  iid         an equal random share each
  dirichlet1  DIRICHLET alpha = 1
  dirichlet01 DIRICHLET alpha = 0.1
  disjoint    LABEL_SUBSET {0,1,2} {3,4,5} {6,7,8,9} (no class in two sites)

Algorithms (ALGORITHM@SECONDS in --only: a GAIA or DENSE one that also
sends its changes every SECONDS between clocks, sync.send_period_s):
  one-ps      one parameter server (at us) for all 12 workers: the reference
  dense       every change to every site every clock (fp32)
  gaia-0      Gaia with theta 0 (every change, sparse, fp32)
  gaia-0.01, gaia-0.05, gaia-0.2
              Gaia's significance filter (int8 + zstd, as shipped)
  fedavg-10, fedavg-50
              models averaged every 10 / 50 clocks (FedAvg)
  topk-0.01   the 1% largest changes each clock, the rest kept (DGC-like)
  skewscout   Gaia (int8) whose threshold SkewScout's controller moves,
              from 0.05, on models travelled every 25 clocks
  topk-skewscout
              topk whose density SkewScout moves, from 0.01
  fedavg-skewscout
              FedAvg whose averaging period SkewScout moves, from 50
              clocks, within [2, 200] (the sites agree on each round's
              period: the shortest any of them proposes)
--quick: skews iid and disjoint, algorithms one-ps, dense, gaia-0.05 and
skewscout, two thirds of the workload's budget (40 s for the MLP; 60 s
otherwise, 80 s for a CNN). Only the standard library is used.
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

from scenariolib import ROOT, repeats, workloads

# Set from --workload in main().
WORKLOAD = workloads.get("mlp")
STEP_TIME_S = WORKLOAD.step_time_s
TARGET = WORKLOAD.targets[0]

SITES = [("us", "us-east-1"), ("eu", "eu-central-1"), ("ap", "ap-southeast-1")]

SKEWS = {
    "iid": "site_partition { kind: IID }",
    "dirichlet1": "site_partition { kind: DIRICHLET alpha: 1 }",
    "dirichlet01": "site_partition { kind: DIRICHLET alpha: 0.1 }",
    "disjoint": ("site_partition { kind: LABEL_SUBSET "
                 "classes { label: [0, 1, 2] } classes { label: [3, 4, 5] } "
                 "classes { label: [6, 7, 8, 9] } }"),
}

INT8 = ("compression { value_coding: VALUE_INT8 block_size: 256 "
        "zstd_level: 1 }")
FP32 = "compression { value_coding: VALUE_FP32 }"


def gaia(theta, compression, ds, extra=""):
    return (f"sync {{ kind: GAIA threshold: {theta} threshold_mode: RELATIVE "
            f"max_clock_skew: {ds} {compression} {extra} }}")


# SkewScout: a travel every 25 clocks (about 2 s here; up to 8x that while
# the estimate stays low), int8-coded, scored on 2000 held-out samples, a
# one-point target. On Gaia it starts at theta 0.05, on top-k at density
# 0.01.
SKEWSCOUT = "skewscout { enabled: true travel_period: 25 target_loss: 0.01 }"


def topk(ds, extra=""):
    return (f"sync {{ kind: GAIA threshold: 0 max_clock_skew: {ds} "
            "compression { selection: TOP_K top_k_fraction: 0.01 "
            f"value_coding: VALUE_FP32 }} {extra} }}")


def algorithms(ds):
    return {
        "one-ps": None,  # no sync: eu and ap use us's server
        "dense": f"sync {{ kind: DENSE max_clock_skew: {ds} {FP32} }}",
        "gaia-0": gaia(0, FP32, ds),
        "gaia-0.01": gaia(0.01, INT8, ds),
        "gaia-0.05": gaia(0.05, INT8, ds),
        "gaia-0.2": gaia(0.2, INT8, ds),
        "fedavg-10": "sync { kind: MODEL_AVERAGING averaging_period: 10 }",
        "fedavg-50": "sync { kind: MODEL_AVERAGING averaging_period: 50 }",
        "topk-0.01": topk(ds),
        "skewscout": gaia(0.05, INT8, ds, SKEWSCOUT),
        "topk-skewscout": topk(ds, SKEWSCOUT),
        "fedavg-skewscout": (
            "sync { kind: MODEL_AVERAGING averaging_period: 50 "
            + SKEWSCOUT.replace(
                "}", "min_averaging_period: 2 max_averaging_period: 200 }")
            + " }"),
    }


def streamed(algos, name):
    """The sync block of NAME = ALGORITHM@SECONDS: ALGORITHM (a GAIA or
    DENSE one) that also sends its significant changes every SECONDS
    between clocks (sync.send_period_s); None for any other name."""
    base, at, period = name.partition("@")
    sync = algos.get(base)
    if not at or not sync or "MODEL_AVERAGING" in sync:
        return None
    try:
        seconds = float(period)
    except ValueError:
        return None
    return sync.replace("sync { ", f"sync {{ send_period_s: {seconds} ", 1)


def job_text(name, skew, sync, budget, checkpoints):
    sites = []
    for site, region in SITES:
        server = ' server_site: "us"' if sync is None and site != "us" else ""
        sites.append(f'site {{ name: "{site}" region: "{region}"{server} '
                     f"workers {{ count: 4 step_time_s: {STEP_TIME_S} }} }}")
    fault = "" if checkpoints else "fault { checkpoint_period_s: 0 }"
    return f"""name: "{name}"
seed: 1
target_accuracy: {TARGET}
stop_at_target: false
time_budget_s: {budget}
{chr(10).join(sites)}
wan {{ emulate: false }}
{WORKLOAD.model}
data {{ normalization: STANDARDIZE {SKEWS[skew]} }}
optimizer {{
  learning_rate: 0.01 momentum: 0.9 weight_decay: 0.0001 batch_size: 64
  schedule: INVERSE_SQRT step_size: 2000
}}
server {{ eval_period_s: 2 }}
policy {{ kind: ASYNC local_steps: 4 }}
security {{ curve: false }}
{fault}
{sync or ""}
"""


def run(binary, out_dir, name, text):
    config = os.path.join(out_dir, "configs", name + ".pbtxt")
    with open(config, "w") as f:
        f.write(text)
    run_dir = os.path.join(out_dir, "runs", name)
    print(f"[noniid] {name}: running", flush=True)
    start = time.time()
    proc = subprocess.run([binary, "run", config, "--out", run_dir],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    with open(run_dir + ".out", "w") as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-3000:])
        raise SystemExit(f"[noniid] {name} failed (exit {proc.returncode}); "
                         f"output in {run_dir}")
    return repeats.read_report(run_dir, "noniid"), time.time() - start


def estimate_noise(scouts, budget):
    """How much SkewScout's estimates move between travels, against the
    sampling error the controller's noise band assumes: over the estimates
    after the first third of the budget (past the start-up transient), per
    (site, peer) pair the mean and the standard deviation of own -
    travelled, and each estimate's sampling standard error
    sqrt((d/n - est^2)/n); medians over the pairs and estimates."""
    pairs, errors = {}, []
    for i, sc in enumerate(scouts):
        for d in sc.get("decisions", []):
            n = d.get("samples", 0)
            if d.get("t_s", 0) < budget / 3 or not n:
                continue
            est = d.get("estimate", 0.0)
            pairs.setdefault((i, d.get("peer")), []).append(est)
            errors.append(math.sqrt(max(
                0.0, d.get("discordant", 0) / n - est * est) / n))
    spread = [statistics.stdev(v) for v in pairs.values() if len(v) >= 3]
    return {
        "estimate_mean": (statistics.median(statistics.mean(v)
                                            for v in pairs.values())
                          if pairs else None),
        "estimate_spread": statistics.median(spread) if spread else None,
        "estimate_error": statistics.median(errors) if errors else None,
    }


def measure(report, budget):
    """The numbers of one run."""
    sites = report.get("sites", [])
    late = [p["accuracy"] for s in sites for p in s.get("timeline", [])
            if p.get("t_s", 0) >= budget * 2 / 3]
    reached = []
    for s in sites:
        first = next((p["t_s"] for p in s.get("timeline", [])
                      if p["accuracy"] >= TARGET), None)
        reached.append(first)
    ages = [a for s in sites
            for a in s.get("sync", {}).get("remote_update_age", [])]
    unsent = [u["mean_relative_norm"] for s in sites
              for u in s.get("sync", {}).get("unsent_change", [])]
    scouts = [s["sync"]["skewscout"] for s in sites
              if "skewscout" in s.get("sync", {})]
    thetas = [sc["final_theta"] for sc in scouts if "final_theta" in sc]
    # An averaging period is agreed: the sites' last agreed one.
    periods = [s["sync"]["diloco"]["period"] for s in sites
               if s.get("sync", {}).get("diloco", {}).get("adaptive_period")]
    if periods:
        thetas = periods
    travel = sum(sc.get("travel_bytes", 0.0) for sc in scouts)
    return {
        "final_accuracy": report.get("final_accuracy", 0.0),
        "replica_accuracy": statistics.mean(late) if late else None,
        "time_to_target_s": (None if not reached or None in reached
                             else max(reached)),
        "wan_bytes": report.get("wan_bytes_total", 0.0),
        "steps": sum(w.get("steps", 0) for w in report.get("workers", [])),
        "age_p90_s": (statistics.median(a["p90_s"] for a in ages)
                      if ages else None),
        "unsent": statistics.mean(unsent) if unsent else None,
        "final_theta": statistics.mean(thetas) if thetas else None,
        "travel_bytes": travel if scouts else None,
        "decisions": (sum(len(sc.get("decisions", [])) for sc in scouts)
                      if scouts else None),
        **estimate_noise(scouts, budget),
    }


def goals(results, skews, names):
    """The issue's goals per skew, from the medians: SkewScout within a
    point of one parameter server, at >= 10x fewer bytes than DENSE and
    fewer than the cheapest fixed Gaia threshold that reaches its accuracy;
    under IID, its time to target against Gaia theta 0.05."""
    def med(skew, name, key):
        cell = results.get((skew, name))
        return cell[key]["median"] if cell and cell[key] else None

    lines = ["", "Goals (medians):", ""]
    for skew in skews:
        for scout in ("skewscout", "topk-skewscout", "fedavg-skewscout"):
            # The fixed settings of the knob it moves.
            family = {"skewscout": "gaia-", "fedavg-skewscout": "fedavg-"}
            fixed = [n for n in names if scout in family and
                     n.startswith(family[scout]) and n != scout]
            acc = med(skew, scout, "final_accuracy")
            if acc is None:
                continue
            parts = []
            ref = med(skew, "one-ps", "final_accuracy")
            if ref is not None:
                loss = (ref - acc) * 100
                # The replicas' accuracy over the last third swings far
                # less than one final evaluation under skew: shown beside.
                replica = med(skew, scout, "replica_accuracy")
                replica_ref = med(skew, "one-ps", "replica_accuracy")
                steadier = ("" if replica is None or replica_ref is None else
                            f"; replicas {(replica_ref - replica) * 100:+.1f}")
                parts.append(f"{loss:+.1f} points against one PS "
                             f"({'met' if loss <= 1.0 else 'missed'}: <= 1"
                             f"{steadier})")
            mine = med(skew, scout, "wan_bytes")
            dense = med(skew, "dense", "wan_bytes")
            if mine and dense:
                ratio = dense / mine
                parts.append(f"DENSE sends {ratio:.1f}x its bytes "
                             f"({'met' if ratio >= 10 else 'missed'}: >= 10x)")
            reaching = [(med(skew, n, "wan_bytes"), n) for n in fixed
                        if (med(skew, n, "final_accuracy") or 0) >= acc]
            knob = "theta" if scout == "skewscout" else "period"
            if fixed and mine:
                if reaching:
                    cheapest = min(reaching)
                    parts.append(
                        f"cheapest fixed {knob} as accurate: {cheapest[1]} "
                        f"at {cheapest[0] / 1e6:.1f} MB "
                        f"({'met' if mine < cheapest[0] else 'missed'}: "
                        "fewer bytes)")
                else:
                    parts.append(f"no fixed {knob} of the sweep is as "
                                 "accurate")
            if skew == "iid":
                mine_t = med(skew, scout, "time_to_target_s")
                base = {"skewscout": "gaia-0.05", "topk-skewscout": "topk-0.01",
                        "fedavg-skewscout": "fedavg-50"}[scout]
                base_t = med(skew, base, "time_to_target_s")
                if mine_t and base_t:
                    parts.append(f"time to {TARGET} {mine_t:.1f} s against "
                                 f"{base}'s {base_t:.1f} s")
            lines.append(f"- {skew}, {scout}: " + "; ".join(parts))
    return lines


def noise_table(results, skews, names):
    """SkewScout's estimates after the start-up transient: their level,
    how far they move between travels to the same peer, and the sampling
    error of one estimate (points)."""
    rows = [(skew, name) for skew in skews for name in names
            if results[(skew, name)].get("estimate_spread")]
    if not rows:
        return []
    lines = ["", "SkewScout's estimates (own - travelled) after the first "
             "third of each run, in points: the median over (site, peer) "
             "pairs of their mean and of their standard deviation between "
             "travels, against one estimate's sampling error:", "",
             "| skew | algorithm | mean estimate | spread between travels "
             "(sd) | sampling error (se) | sd / se |", "|---|---|---|---|---|---|"]
    for skew, name in rows:
        cell = results[(skew, name)]
        sd, se = cell["estimate_spread"], cell["estimate_error"]
        ratio = (f"{sd['median'] / se['median']:.0f}"
                 if sd and se and se["median"] else "—")
        lines.append(f"| {skew} | {name} | "
                     f"{fmt(cell['estimate_mean'], 100, 1)} | "
                     f"{fmt(sd, 100, 1)} | {fmt(se, 100, 2)} | {ratio} |")
    return lines


def fmt(cell, scale=1.0, digits=3, counted="runs"):
    return repeats.fmt_cell(cell, lambda v: f"{v * scale:.{digits}f}",
                            counted)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true")
    repeats.add_argument(parser, "cell")
    parser.add_argument("--only", default="", help="algorithms")
    parser.add_argument("--skews", default="")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--ds", type=int, default=1,
                        help="sync.max_clock_skew of the multi-site runs")
    parser.add_argument("--checkpoints", choices=["on", "off"], default="on")
    workloads.add_argument(parser)
    parser.add_argument("--binary",
                        default=os.path.join(ROOT, "build", "bin", "meridian"))
    parser.add_argument("--summarize-only", action="store_true",
                        help="run nothing: rebuild results.md and "
                        "results.json from the runs already in OUTDIR")
    args = parser.parse_args()
    global WORKLOAD, STEP_TIME_S, TARGET
    WORKLOAD = workloads.get(args.workload)
    if not WORKLOAD.partition_by_label:
        parser.error(
            f"--workload {args.workload}: this scenario skews the sites by "
            "label (Dirichlet, disjoint classes); the ratings of matrix "
            "factorisation have no class labels (a label skew would split "
            "them by rating value), so they are only split at random (IID) "
            "and there is nothing to skew. Use geo_vs_lan or heterogeneity "
            "for mf.")
    STEP_TIME_S = WORKLOAD.step_time_s
    TARGET = WORKLOAD.targets[0]
    budget = args.budget or (WORKLOAD.budget_s * 2 / 3 if args.quick
                             else WORKLOAD.budget_s)
    skews = list(SKEWS)
    algos = algorithms(args.ds)
    names = list(algos)
    if args.quick:
        skews = ["iid", "disjoint"]
        names = ["one-ps", "dense", "gaia-0.05", "skewscout"]
    if args.skews:
        skews = [s for s in args.skews.split(",") if s in SKEWS]
    if args.only:
        wanted = args.only.split(",")
        for name in wanted:
            variant = streamed(algos, name)
            if variant:
                algos[name] = variant
                names.append(name)
        names = [n for n in names if n in wanted]
    os.makedirs(os.path.join(args.outdir, "configs"), exist_ok=True)
    os.makedirs(os.path.join(args.outdir, "runs"), exist_ok=True)

    cells = [(skew, name) for skew in skews for name in names]
    runs = {cell: [] for cell in cells}
    for r, (skew, name) in repeats.order(cells, args.repeat):
        label = repeats.label(f"{skew}-{name}", r, args.repeat)
        if args.summarize_only:
            report = repeats.read_report(
                os.path.join(args.outdir, "runs", label), "noniid")
        else:
            report, _ = run(args.binary, args.outdir, label,
                            job_text(label, skew, algos[name], budget,
                                     args.checkpoints == "on"))
        m = measure(report, budget)
        runs[(skew, name)].append(m)
        print(f"[noniid] {label}: final {m['final_accuracy']:.4f}, "
              f"replicas {m['replica_accuracy'] or 0:.4f}, WAN "
              f"{m['wan_bytes'] / 1e6:.1f} MB", flush=True)
    results = {}
    for cell in cells:
        results[cell] = {key: repeats.median_range(
            [m[key] for m in runs[cell]], key == "time_to_target_s")
            for key in runs[cell][0]}

    lines = ["# Label skew across sites (bench/scenarios/noniid)", "",
             f"{WORKLOAD.description} on Fashion-MNIST, 3 sites x 4 workers, "
             f"device "
             f"step {STEP_TIME_S * 1000:.0f} ms, no WAN emulation, ASYNC with "
             f"4 local steps, DS {args.ds}, checkpoints {args.checkpoints}, "
             f"{budget:.0f} s per run, "
             + ("1 run per cell" if args.repeat == 1 else
                f"median of {args.repeat} runs per cell (range)") +
             ". Loss: points below one parameter server "
             "under the same skew (medians).", "",
             "| skew | algorithm | final accuracy | loss (points) | replica "
             f"accuracy | replica loss (points) | time to {TARGET} (s) | WAN MB | "
             "of it travels | age p90 (s) | held back ‖acc‖/‖w‖ | "
             "final knob (θ, density or period) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for skew in skews:
        ref = results.get((skew, "one-ps"))
        for name in names:
            cell = results[(skew, name)]

            def loss(key):
                if not ref or not ref[key] or not cell[key]:
                    return "—"
                return f"{(ref[key]['median'] - cell[key]['median']) * 100:+.1f}"

            lines.append(
                f"| {skew} | {name} | {fmt(cell['final_accuracy'])} | "
                f"{loss('final_accuracy')} | {fmt(cell['replica_accuracy'])} | "
                f"{loss('replica_accuracy')} | "
                f"{fmt(cell['time_to_target_s'], 1.0, 1, 'reached')} | "
                f"{fmt(cell['wan_bytes'], 1e-6, 1)} | "
                f"{fmt(cell['travel_bytes'], 1e-6, 1)} | "
                f"{fmt(cell['age_p90_s'])} | {fmt(cell['unsent'], digits=4)} | "
                f"{fmt(cell['final_theta'], digits=3)} |")
    if args.repeat > 1:
        lines += ["", repeats.note(args.repeat)]
    lines += noise_table(results, skews, names)
    lines += goals(results, skews, names)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.outdir, "results.json"), "w") as f:
        json.dump({"budget_s": budget, "ds": args.ds,
                   "checkpoints": args.checkpoints, "repeat": args.repeat,
                   "results": [{"skew": s, "algorithm": n, **results[(s, n)],
                                "runs": runs[(s, n)]}
                               for s, n in cells]}, f, indent=2)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
