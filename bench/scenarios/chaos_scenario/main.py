#!/usr/bin/env python3
"""Chaos: the three-region job with faults injected on a schedule.

    bench/scenarios/chaos OUTDIR [--quick] [--repeat N] [--binary PATH]
                          [--seed N] [--budget SECONDS] [--reanalyse]
                          [--dry-run]

Runs deploy/configs/three-regions.pbtxt (sites us, eu, ap, 4 workers each,
MLP on Fashion-MNIST, Gaia through `meridian wanem`, target 0.87) twice
with the same training budget, through `meridian run`: first fault-free,
then with faults injected on a schedule. Each run has its own directory
OUTDIR/fault-free and OUTDIR/chaos holding its job file (job.pbtxt), the
run's output (--out is that directory), launcher.out, the metrics the
script sampled once a second (samples.jsonl) and what it injected
(injections.json). The job file is the shipped one with: the time budget
set, stop_at_target false, sync { adaptive_threshold: true } (both runs:
the slowed link should move the threshold), security { curve: false }
(plaintext links on loopback, as the other scenarios; a restarted site
server then needs no key exchange) and fault { } at its defaults.

Schedule of the chaos run, in seconds after every site has committed
(full run; --quick in brackets):
  from 5, every 10-20 s  kill -9 of a random worker (seeded), restarted by
                         `meridian run`
  20  [12]   kill -9 of a random site server (restarted with --resume
             from its checkpoint)
  45  [25]   kill -9 of the emulator (`meridian wanem`; restarted, its
             routes added again)
  70  [38]   partition of ap from us and eu (`wanem ctl partition us-ap`,
             `eu-ap`) for 90 s [40 s], then heal both
  180 [88]   SIGSTOP of a random site server for 30 s [15 s], then SIGCONT
  235 [110]  link us-eu slowed 20x (its bandwidth / 20, both directions)
             for 60 s [30 s], then set back
The sites killed and stopped and the workers (and when) come from --seed
[1]; the partitioned site (ap) and the slowed link (us-eu) are fixed.
Training budget 330 s [155 s]; --budget stretches or shrinks the start
times in proportion (the durations stay). Both runs take about 12 minutes
[6 minutes] together. Timed faults end even if the script is interrupted
(SIGCONT, heal). build/bin/meridian is built with tools/build when it is
missing; a binary replaced while the scenario runs is reported.

Measured (OUTDIR/results.json, a table in OUTDIR/results.md): per fault
the detection time (injection to the first matching event of report.json),
the recovery time (end of the fault to the event that ends it), the
training time lost (commit deficit of every site against the fault-free
run over the same window, in seconds of that site's fault-free training);
final accuracy and time to 0.87 of both runs; updates lost (report.json
lost_commits and each site's recovery); the largest difference between the
final replicas (OUTDIR/<run>/model-<site>.f32); processes and listening
ports left behind; the commit rate of us and eu during the partition
against the fault-free run; the issue's goals, met or missed. Each run's
report.json is copied to OUTDIR/<run>-report.json. --reanalyse runs
nothing and writes the results again from the run directories in OUTDIR.
--dry-run prints the schedule and the order of the runs, writes the job
file to OUTDIR/job.pbtxt, checks it with `meridian validate` and runs
nothing (it builds nothing either).

--repeat N repeats the whole scenario: N rounds, each a fault-free run and
a chaos run back to back (round 1's two runs, then round 2's, ...: slow
drift of the machine hits both runs of a round, and every round, alike),
every round with the same fault schedule (--seed). One run already repeats
something, the worker kills (20-odd, their median and max in its table);
--repeat repeats the rounds. Round K has its own directory OUTDIR/rK
(OUTDIR/rK/fault-free, OUTDIR/rK/chaos, and its results.md, results.json
and <run>-report.json as a single round writes them in OUTDIR); OUTDIR/
results.md and results.json then aggregate the N rounds: every number of
the tables as the median of the rounds with the range, median (min–max)
(per fault its detection, recovery and training lost; the worker kills:
each round's median and max detection and recovery and its sum of training
lost; the partition's commit rates; the checks); for the time to 0.87 and
a fault's detection and recovery a round that did not reach (detect,
recover) counts as later than any that did (— when the median round did
not), the range is that of the rounds that did, "k of N reached" when not
all did. The goals compare medians of each side (final
accuracy against fault-free, time to 0.87 against fault-free + outage, the
partition's commit rate chaos / fault-free, against the quiet-time ratio
also from medians); a check of each run (updates lost, replica difference,
leftovers) is met when every round met it. results.json keeps every
round's results ("rounds") besides the medians ("summary"). With N = 1 the
layout and the output are as before. --reanalyse with --repeat N reads
OUTDIR/r1 ... OUTDIR/rN.
"""

import argparse
import array
import collections
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from scenariolib import ROOT, repeats

DEFAULT_BINARY = os.path.join(ROOT, "build", "bin", "meridian")
SHIPPED_JOB = os.path.join(ROOT, "deploy", "configs", "three-regions.pbtxt")
SITES = ("us", "eu", "ap")
WORKERS_PER_SITE = 4
TARGET = 0.87
PARTITIONED = "ap"          # cut off from both others
SLOW_LINK = ("us", "eu")    # the only link not touching the partitioned site
SLOW_FACTOR = 20
# wan/presets.cc, Gbit/s per direction: the fallback when neither
# `wanem ctl status` nor traffic.csv tells the link's bandwidth.
PRESET_GBPS = {("us", "eu"): 1.02, ("us", "ap"): 0.364, ("eu", "ap"): 0.535}
# Replicas apply the same updates in different orders; float32 rounding
# then random-walks: about sqrt(N) * eps * |w| after N updates. Allowed:
# REPLICA_ROUNDING_FACTOR times that, N the most updates a site applied.
FLOAT32_EPS = 2.0 ** -23
REPLICA_ROUNDING_FACTOR = 4.0

# name -> (start offset s, duration s), full and --quick.
SCHEDULES = {
    "full": {"budget": 330.0, "site_crash": (20, 0), "wanem_crash": (45, 0),
             "partition": (70, 90), "sigstop": (180, 30),
             "slow_link": (235, 60)},
    "quick": {"budget": 155.0, "site_crash": (12, 0), "wanem_crash": (25, 0),
              "partition": (38, 40), "sigstop": (88, 15),
              "slow_link": (110, 30)},
}
WORKER_KILL_FIRST_S = 5.0
WORKER_KILL_GAP_S = (10.0, 20.0)
SETTLE_S = 10.0             # quiet time wanted after the last fault
START_TIMEOUT_S = 240.0     # launch to every site committing

RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


LOG_TAG = ""  # " r2/3" while round 2 of 3 runs (--repeat)


def log(msg):
    print(f"[chaos{LOG_TAG}] {msg}", flush=True)


# ---------------------------------------------------------------------------
# Job file
# ---------------------------------------------------------------------------

def job_text(name, budget):
    """The shipped three-region job with the scenario's changes."""
    with open(SHIPPED_JOB) as f:
        text = f.read()
    text = re.sub(r'^name:\s*"[^"]*"', f'name: "{name}"', text, count=1,
                  flags=re.M)
    if re.search(r"^time_budget_s:", text, flags=re.M):
        text = re.sub(r"^time_budget_s:\s*\S+", f"time_budget_s: {budget:g}",
                      text, count=1, flags=re.M)
    else:
        text += f"time_budget_s: {budget:g}\n"
    if re.search(r"^stop_at_target:", text, flags=re.M):
        text = re.sub(r"^stop_at_target:\s*\S+", "stop_at_target: false", text,
                      count=1, flags=re.M)
    else:
        text += "stop_at_target: false\n"
    if not re.search(r"^sync\s*\{", text, flags=re.M):
        raise SystemExit(f"[chaos] {SHIPPED_JOB} has no sync {{ }} block")
    text = re.sub(r"^(sync\s*\{)", r"\1\n  adaptive_threshold: true", text,
                  count=1, flags=re.M)
    shipped = os.path.relpath(SHIPPED_JOB, ROOT)
    header = (f"# Written by bench/scenarios/chaos from {shipped}:\n"
              f"# time_budget_s {budget:g}, stop_at_target false, "
              "sync.adaptive_threshold true,\n# security { curve: false } "
              "(plaintext on loopback), fault { } at its defaults.\n")
    return (header + text + "\n# chaos scenario\nsecurity { curve: false }\n"
            "fault { }\n")


# ---------------------------------------------------------------------------
# Processes of a run
# ---------------------------------------------------------------------------

def proc_table():
    """pid -> argv of every process (zombies left out)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                raw = f.read()
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if not raw:
            continue
        state = stat[stat.rfind(")") + 2:].split(" ", 1)[0]
        if state in ("Z", "X"):
            continue
        table[int(entry)] = [a.decode(errors="replace")
                             for a in raw.rstrip(b"\0").split(b"\0")]
    return table


def run_processes(run_dir, table=None):
    """pid -> argv of every process whose command line names run_dir."""
    table = proc_table() if table is None else table
    me = os.getpid()
    return {pid: argv for pid, argv in table.items()
            if pid != me and any(run_dir in a for a in argv)}


def arg_after(argv, flag):
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def role_of(argv):
    """('worker', site, index) / ('site', site) / ('wanem',) / None."""
    if len(argv) < 2:
        return None
    if argv[1] == "worker" and "--config" in argv:
        index = arg_after(argv, "--index")
        return ("worker", arg_after(argv, "--site"),
                int(index) if index and index.isdigit() else None)
    if argv[1] == "site" and "--config" in argv:
        return ("site", arg_after(argv, "--site"))
    if argv[1] == "wanem" and "--config" in argv and "ctl" not in argv:
        return ("wanem",)
    return None


def find_pids(run_dir, role):
    return sorted(pid for pid, argv in run_processes(run_dir).items()
                  if role_of(argv) == role)


def listening_ports():
    """port -> socket inode of every TCP socket in LISTEN state."""
    ports = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        ports[int(parts[1].rsplit(":", 1)[1], 16)] = parts[9]
        except OSError:
            pass
    return ports


def socket_owner(inode):
    target = f"socket:[{inode}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        return int(entry), f.read().replace(b"\0", b" ").decode(
                            errors="replace").strip()
        except OSError:
            continue
    return None, None


PORT_RE = re.compile(r"(?:127\.0\.0\.1|localhost|\*|0\.0\.0\.0):(\d+)")


# ---------------------------------------------------------------------------
# endpoints.json, metrics, wanem ctl
# ---------------------------------------------------------------------------

def read_endpoints(run_dir):
    try:
        with open(os.path.join(run_dir, "endpoints.json")) as f:
            return json.load(f).get("process", [])
    except (OSError, ValueError):
        return []


def control_endpoint(run_dir):
    for p in read_endpoints(run_dir):
        if p.get("role") == "wanem" and p.get("control_address"):
            return p["control_address"]
    return None


METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def scrape(url, timeout):
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        text = reply.read().decode(errors="replace")
    metrics = {}
    for line in text.splitlines():
        m = METRIC_RE.match(line)
        if not m or line.startswith("#"):
            continue
        labels = dict(LABEL_RE.findall(m.group(2) or ""))
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        metrics.setdefault(m.group(1), []).append((labels, value))
    return metrics


def one(metrics, name, **labels):
    for lab, value in metrics.get(name, []):
        if all(lab.get(k) == v for k, v in labels.items()):
            return value
    return None


def per_peer(metrics, name):
    return {lab.get("peer"): value for lab, value in metrics.get(name, [])
            if "peer" in lab}


def wanem_ctl(binary, run_dir, args, log_list, attempts=15):
    """Runs `meridian wanem ctl --control EP ARGS`, re-reading the endpoint
    from endpoints.json before each attempt (wanem may have restarted)."""
    last = None
    for attempt in range(attempts):
        endpoint = control_endpoint(run_dir)
        if endpoint:
            started = time.time()
            proc = subprocess.run([binary, "wanem", "ctl", "--control",
                                   endpoint] + args, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            last = {"args": args, "control": endpoint, "unix_s": started,
                    "rc": proc.returncode, "output": proc.stdout,
                    "attempt": attempt + 1}
            if proc.returncode == 0:
                log_list.append(last)
                return last
        else:
            last = {"args": args, "control": None, "unix_s": time.time(),
                    "rc": None, "output": "no control_address in "
                    "endpoints.json", "attempt": attempt + 1}
        time.sleep(1.0)
    log_list.append(last)
    log(f"wanem ctl {' '.join(args)} failed: {last['output'].strip()[:300]}")
    return last


def parse_rate(text):
    m = re.match(r"^([0-9.]+)([a-z]+)$", text.strip().lower())
    if not m or m.group(2) not in RATE_UNITS:
        return None
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def link_bandwidth(status_text, run_dir, a, b):
    """Bits/s of link a-b, direction a->b: from `wanem ctl status`, else
    the newest traffic.csv sample, else the preset table."""
    link = f"{a}-{b}"
    for line in (status_text or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == link and parts[1] == f"{a}->{b}":
            rate = parse_rate(parts[2])
            if rate:
                return rate, "wanem ctl status"
    best = None
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("traffic") and name.endswith(".csv")):
            continue
        try:
            with open(os.path.join(run_dir, name)) as f:
                header = f.readline().strip().split(",")
                col = {h: i for i, h in enumerate(header)}
                for line in f:
                    row = line.strip().split(",")
                    if (len(row) == len(header) and row[col["link"]] == link
                            and row[col["from_site"]] == a):
                        best = float(row[col["bandwidth_bps"]])
        except (OSError, KeyError, ValueError):
            continue
    if best:
        return best, "traffic.csv bandwidth_bps"
    return PRESET_GBPS[(a, b)] * 1e9, "wan/presets.cc"


# ---------------------------------------------------------------------------
# Sampling a run
# ---------------------------------------------------------------------------

class Sampler:
    """Once a second: every site server's metrics (one thread per site, so
    a frozen one does not hold the others back) and the run's processes."""

    def __init__(self, run_dir, period=1.0):
        self.run_dir = run_dir
        self.period = period
        self.samples = []         # dicts, see sample_site
        self.ports = set()        # every port the run's processes used
        self.max_processes = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.site_loop, args=(s,),
                                         daemon=True) for s in SITES]
        self.threads.append(threading.Thread(target=self.proc_loop,
                                             daemon=True))

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)

    def site_loop(self, site):
        while not self.stop.is_set():
            begun = time.time()
            url = None
            for p in read_endpoints(self.run_dir):
                if p.get("role") == "site" and p.get("site") == site:
                    url = p.get("metrics_url")
                    for port in PORT_RE.findall(p.get("metrics_address", "")):
                        with self.lock:
                            self.ports.add(int(port))
            if url:
                try:
                    m = scrape(url, timeout=0.9)
                    sample = {
                        "unix_s": begun, "site": site,
                        "commits": one(m, "meridian_site_commits_total"),
                        "training_s": one(m, "meridian_site_training_seconds"),
                        "training": one(m, "meridian_site_training"),
                        "finished": one(m, "meridian_site_finished"),
                        "accuracy": one(m, "meridian_site_accuracy"),
                        "clock": one(m, "meridian_site_clock"),
                        "theta": one(m, "meridian_sync_theta"),
                        "workers_joined": one(m, "meridian_site_workers_joined"),
                        "workers_dead": one(m, "meridian_site_workers_dead"),
                        "peers_unreachable": one(
                            m, "meridian_sync_peers_unreachable"),
                        "messages_received": per_peer(
                            m, "meridian_sync_messages_received_total"),
                        "bytes_sent": per_peer(
                            m, "meridian_sync_bytes_sent_total"),
                        "peer_connected": per_peer(
                            m, "meridian_sync_peer_connected"),
                    }
                    with self.lock:
                        self.samples.append(sample)
                except Exception:  # down, frozen or restarting: no sample
                    pass
            self.stop.wait(max(0.05, self.period - (time.time() - begun)))

    def proc_loop(self):
        while not self.stop.is_set():
            procs = run_processes(self.run_dir)
            ports = set()
            for argv in procs.values():
                for a in argv:
                    ports.update(int(p) for p in PORT_RE.findall(a)
                                 if p != "0")
            for p in read_endpoints(self.run_dir):
                for key in ("metrics_address", "control_address"):
                    ports.update(int(x) for x in
                                 PORT_RE.findall(p.get(key, "") or ""))
            with self.lock:
                self.ports |= ports
                self.max_processes = max(self.max_processes, len(procs))
            self.stop.wait(2.0)

    def site_samples(self, site):
        with self.lock:
            return [s for s in self.samples if s["site"] == site]

    def all_training_since(self):
        """Unix time of the first sample by which every site has committed."""
        with self.lock:
            firsts = {}
            for s in self.samples:
                if (s["commits"] or 0) > 0 and s["site"] not in firsts:
                    firsts[s["site"]] = s["unix_s"]
        if len(firsts) < len(SITES):
            return None
        return max(firsts.values())


def cumulative_commits(samples):
    """(unix_s, commits made so far) with a counter that went back (a site
    restarted from its checkpoint) continuing from where it was."""
    out, total, last = [], 0.0, None
    for s in sorted(samples, key=lambda s: s["unix_s"]):
        c = s.get("commits")
        if c is None:
            continue
        if last is not None and c >= last:
            total += c - last
        last = c
        out.append((s["unix_s"], total))
    return out


def value_at(series, t):
    """Linear interpolation in [(t, v)], clamped at the ends."""
    if not series:
        return None
    if t <= series[0][0]:
        return series[0][1]
    for (t0, v0), (t1, v1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return series[-1][1]


def commits_between(series, a, b):
    if not series or b <= series[0][0] or a >= series[-1][0]:
        return None
    return value_at(series, b) - value_at(series, a)


# ---------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------

class Run:
    def __init__(self, binary, outdir, name, budget):
        self.binary = binary
        self.name = name
        self.dir = os.path.abspath(os.path.join(outdir, name))
        self.budget = budget
        self.job = os.path.join(self.dir, "job.pbtxt")
        self.proc = None
        self.sampler = None
        self.t0 = None
        self.injections = []
        self.ctl_log = []
        self.stopped_pids = set()
        self.exit_code = None
        self.wall_s = None
        self.binary_at_start = self.binary_at_end = None

    def prepare(self):
        if os.path.isdir(self.dir):
            left = run_processes(self.dir)
            if left:
                raise SystemExit(f"[chaos] processes of an earlier run still "
                                 f"use {self.dir}: {sorted(left)}")
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        with open(self.job, "w") as f:
            f.write(job_text(f"three-regions-{self.name}", self.budget))
        check = subprocess.run([self.binary, "validate", self.job],
                               stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        if check.returncode != 0:
            raise SystemExit(f"[chaos] {self.job} is not valid:\n{check.stdout}")

    def binary_stamp(self):
        try:
            st = os.stat(self.binary)
            return [st.st_mtime, st.st_size]
        except OSError:
            return None

    def launch(self):
        self.binary_at_start = self.binary_stamp()
        self.out = open(os.path.join(self.dir, "launcher.out"), "w")
        self.started = time.time()
        # The job file's absolute path is in every child's command line,
        # which is how the processes of this run are found in /proc.
        self.proc = subprocess.Popen([self.binary, "run", self.job, "--out",
                                      self.dir], stdout=self.out,
                                     stderr=subprocess.STDOUT)
        self.sampler = Sampler(self.dir)
        self.sampler.start()
        log(f"{self.name}: started `meridian run {self.job} --out {self.dir}`"
            f" (pid {self.proc.pid})")

    def running(self):
        return self.proc.poll() is None

    def wait_training(self):
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline and self.running():
            t0 = self.sampler.all_training_since()
            if t0:
                self.t0 = t0
                log(f"{self.name}: every site commits "
                    f"({t0 - self.started:.1f} s after launch)")
                return True
            time.sleep(0.5)
        log(f"{self.name}: the sites did not all start training "
            f"(exit code {self.proc.poll()})")
        return False

    def sleep_until(self, offset):
        """Sleeps until t0 + offset; False if the run ended first."""
        while self.running():
            left = self.t0 + offset - time.time()
            if left <= 0:
                return True
            time.sleep(min(left, 0.5))
        return False

    def wait(self):
        self.exit_code = self.proc.wait()
        self.wall_s = time.time() - self.started
        self.binary_at_end = self.binary_stamp()
        self.out.close()
        self.sampler.finish()
        with open(os.path.join(self.dir, "samples.jsonl"), "w") as f:
            for s in self.sampler.samples:
                f.write(json.dumps(s) + "\n")
        with open(os.path.join(self.dir, "injections.json"), "w") as f:
            json.dump({"t0_unix_s": self.t0, "started_unix_s": self.started,
                       "exit_code": self.exit_code, "wall_s": self.wall_s,
                       "ports": sorted(self.sampler.ports),
                       "binary": self.binary,
                       "binary_at_start": self.binary_at_start,
                       "binary_at_end": self.binary_at_end,
                       "injections": self.injections,
                       "wanem_ctl": self.ctl_log}, f, indent=1)
        log(f"{self.name}: `meridian run` exited {self.exit_code} after "
            f"{self.wall_s:.0f} s")

    def load(self):
        """--reanalyse: what an earlier invocation recorded."""
        with open(os.path.join(self.dir, "injections.json")) as f:
            saved = json.load(f)
        self.t0 = saved["t0_unix_s"]
        self.started = saved.get("started_unix_s") or 0.0
        self.exit_code = saved.get("exit_code")
        self.wall_s = saved.get("wall_s")
        self.injections = saved.get("injections", [])
        self.binary_at_start = saved.get("binary_at_start")
        self.binary_at_end = saved.get("binary_at_end")
        self.ctl_log = saved.get("wanem_ctl", [])
        self.sampler = Sampler(self.dir)
        self.sampler.ports = set(saved.get("ports", []))
        with open(os.path.join(self.dir, "samples.jsonl")) as f:
            self.sampler.samples = [json.loads(line) for line in f
                                    if line.strip()]

    def abort(self):
        """Ctrl-C or an error of the script: leave nothing stopped or
        running."""
        for pid in list(self.stopped_pids):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.sampler:
            self.sampler.finish()

    def note_route_ports(self):
        """The emulator's route ports and the sites' mirror ports (from
        `wanem ctl status`), to check afterwards that none still listens."""
        if not self.running():
            return
        status = wanem_ctl(self.binary, self.dir, ["status"], self.ctl_log,
                           attempts=3)
        if status and status.get("rc") == 0:
            with self.sampler.lock:
                self.sampler.ports.update(
                    int(p) for p in PORT_RE.findall(status["output"]))

    # --- injections -------------------------------------------------------

    def record(self, kind, target, **extra):
        entry = {"kind": kind, "target": target, "unix_s": time.time(),
                 "offset_s": time.time() - self.t0}
        entry.update(extra)
        self.injections.append(entry)
        return entry

    def kill9(self, kind, role, target):
        pids = []
        for _ in range(6):  # restarting right now: try again shortly
            pids = find_pids(self.dir, role)
            if pids:
                break
            time.sleep(0.5)
        if not pids:
            log(f"{self.name}: {kind} {target}: no process found")
            return self.record(kind, target, pids=[], note="no process found")
        entry = self.record(kind, target, pids=pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as e:
                entry["note"] = str(e)
        log(f"{self.name}: t+{entry['offset_s']:.1f} s kill -9 {target} "
            f"(pid {', '.join(map(str, pids))})")
        return entry

    def partition_start(self, site, duration):
        others = [s for s in SITES if s != site]
        links = [f"{o}-{site}" for o in others]
        entry = self.record("partition", site, links=links,
                            duration_s=duration, ctl=[])
        for link in links:
            entry["ctl"].append(wanem_ctl(self.binary, self.dir,
                                          ["partition", link], self.ctl_log))
        log(f"{self.name}: t+{entry['offset_s']:.1f} s partition "
            f"{', '.join(links)} for {duration:g} s")
        return entry

    def partition_end(self, entry):
        entry["end_unix_s"] = time.time()
        for link in entry["links"]:
            entry["ctl"].append(wanem_ctl(self.binary, self.dir,
                                          ["heal", link], self.ctl_log))
        log(f"{self.name}: t+{time.time() - self.t0:.1f} s healed "
            f"{', '.join(entry['links'])}")

    def sigstop_start(self, site, duration):
        pids = find_pids(self.dir, ("site", site))
        entry = self.record("sigstop", site, pids=pids, duration_s=duration)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
            self.stopped_pids.add(pid)
        if not pids:
            entry["note"] = "no process found"
        log(f"{self.name}: t+{entry['offset_s']:.1f} s SIGSTOP site server "
            f"{site} (pid {', '.join(map(str, pids))}) for {duration:g} s")
        return entry

    def sigstop_end(self, entry):
        entry["end_unix_s"] = time.time()
        for pid in entry["pids"]:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError as e:
                entry["note"] = str(e)
            self.stopped_pids.discard(pid)
        log(f"{self.name}: t+{time.time() - self.t0:.1f} s SIGCONT "
            f"{entry['target']}")

    def slow_start(self, link, duration):
        a, b = link.split("-")
        status = wanem_ctl(self.binary, self.dir, ["status"], self.ctl_log)
        bps, source = link_bandwidth(status.get("output") if status else "",
                                     self.dir, a, b)
        slow = max(1000, int(bps / SLOW_FACTOR))
        entry = self.record("slow_link", link, duration_s=duration,
                            bandwidth_bps=bps, bandwidth_source=source,
                            slowed_bps=slow)
        entry["ctl"] = [wanem_ctl(self.binary, self.dir,
                                  ["set", link, "--bandwidth", f"{slow}bit"],
                                  self.ctl_log)]
        log(f"{self.name}: t+{entry['offset_s']:.1f} s link {link} "
            f"{bps / 1e6:g} -> {slow / 1e6:g} Mbit/s (from {source}) for "
            f"{duration:g} s")
        return entry

    def slow_end(self, entry):
        entry["end_unix_s"] = time.time()
        entry["ctl"].append(wanem_ctl(
            self.binary, self.dir, ["set", entry["target"], "--bandwidth",
                                    f"{int(entry['bandwidth_bps'])}bit"],
            self.ctl_log))
        log(f"{self.name}: t+{time.time() - self.t0:.1f} s link "
            f"{entry['target']} back to {entry['bandwidth_bps'] / 1e6:g} "
            "Mbit/s")

    def finish_open_faults(self, open_faults):
        """The run ended (or the script stops) with a timed fault on: end
        it, so nothing stays stopped."""
        for kind, entry in list(open_faults.items()):
            if kind == "sigstop":
                self.sigstop_end(entry)
            elif kind == "partition" and self.running():
                self.partition_end(entry)
            elif kind == "slow_link" and self.running():
                self.slow_end(entry)
            else:
                entry["end_unix_s"] = time.time()
            entry["note"] = "the run ended during the fault"
        open_faults.clear()


def build_schedule(rng, sched, budget):
    """[(offset_s, kind, target, duration_s)] of the chaos run."""
    scale = budget / sched["budget"]
    events = []
    crash_site = rng.choice(SITES)
    stop_site = rng.choice(SITES)
    for kind, target in (("site_crash", crash_site), ("wanem_crash", "wanem"),
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


def run_schedule(run, schedule):
    """Injects the faults in order. A timed fault is two actions, its start
    and its end, so the worker kills due meanwhile go on."""
    actions = []
    for offset, kind, target, duration in schedule:
        actions.append((offset, 0, kind, target, duration))
        if kind in ("partition", "sigstop", "slow_link"):
            actions.append((offset + duration, 1, kind, target, duration))
    actions.sort(key=lambda a: (a[0], -a[1]))  # ends before starts
    open_faults = {}
    try:
        for offset, is_end, kind, target, duration in actions:
            if not run.sleep_until(offset):
                log(f"{run.name}: the run ended before t+{offset:.0f} s "
                    f"({kind})")
                return
            if is_end:
                entry = open_faults.pop(kind)
                {"partition": run.partition_end, "sigstop": run.sigstop_end,
                 "slow_link": run.slow_end}[kind](entry)
            elif kind == "worker_kill":
                site, index = target
                run.kill9("worker_kill", ("worker", site, index),
                          f"{site}/{index}")
            elif kind == "site_crash":
                run.kill9("site_crash", ("site", target), f"site '{target}'")
            elif kind == "wanem_crash":
                run.kill9("wanem_crash", ("wanem",), "wanem")
            elif kind == "partition":
                open_faults[kind] = run.partition_start(target, duration)
            elif kind == "sigstop":
                open_faults[kind] = run.sigstop_start(target, duration)
            elif kind == "slow_link":
                open_faults[kind] = run.slow_start(target, duration)
    finally:
        run.finish_open_faults(open_faults)


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------

def load_report(run):
    try:
        with open(os.path.join(run.dir, "report.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def subject_site(subject):
    m = re.search(r"'([^']*)'", subject or "")
    if m:
        return m.group(1)
    if subject and "/" in subject:
        return subject.split("/")[0]
    return subject


def events_of(report):
    return sorted(report.get("events", []) if report else [],
                  key=lambda e: e.get("unix_s", 0))


def first_event(events, after, kinds, pred=lambda e: True, before=None):
    for e in events:
        t = e.get("unix_s", 0)
        if t < after - 0.2 or (before is not None and t > before):
            continue
        if e.get("kind") in kinds and pred(e):
            return e
    return None


def describe(e):
    if e is None:
        return None
    where = e.get("site") or "launcher"
    return f"{e['kind']} {e.get('subject', '')} ({where})"


def theta_series(samples_by_site, site):
    return [(s["unix_s"], s["theta"]) for s in samples_by_site.get(site, [])
            if s.get("theta") is not None]


def analyse_faults(chaos, ff, report):
    """One row per injection: detection, recovery, training time lost."""
    events = events_of(report)
    samples = {s: chaos.sampler.site_samples(s) for s in SITES}
    ff_samples = {s: ff.sampler.site_samples(s) for s in SITES}
    series = {s: cumulative_commits(samples[s]) for s in SITES}
    ff_series = {s: cumulative_commits(ff_samples[s]) for s in SITES}
    recoveries = {s["name"]: s.get("recovery") or {}
                  for s in (report or {}).get("sites", [])}
    injections = sorted(chaos.injections, key=lambda i: i["unix_s"])
    main_kinds = ("site_crash", "wanem_crash", "partition", "sigstop",
                  "slow_link")
    rows = []

    def lost_seconds(start, end, sites, lost_commits=None):
        """Sum over `sites` of (fault-free commits - chaos commits) in the
        same window after t0, in seconds of that site's fault-free rate;
        `lost_commits`: commits made but lost by a crash, per site."""
        total, parts = 0.0, {}
        if end <= start:
            return None, {}
        for site in sites:
            got = commits_between(series[site], start, end)
            ref = (commits_between(ff_series[site], ff.t0 + start - chaos.t0,
                                   ff.t0 + end - chaos.t0)
                   if ff.t0 else None)
            if got is None or not ref:
                return None, {}
            rate = ref / (end - start)
            got -= (lost_commits or {}).get(site, 0)
            lost = (ref - got) / rate
            parts[site] = {"commits": got, "fault_free_commits": ref,
                           "lost_s": lost}
            total += lost
        return total, parts

    for inj in injections:
        kind, t_in = inj["kind"], inj["unix_s"]
        t_end = inj.get("end_unix_s", t_in)
        row = {"fault": kind, "target": inj["target"],
               "injected_unix_s": t_in, "offset_s": inj["offset_s"],
               "duration_s": (t_end - t_in) if kind in main_kinds[2:] else 0.0,
               "detected_by": None, "detection_s": None,
               "recovered_by": None, "recovery_s": None,
               "recovered_unix_s": None, "notes": []}
        if inj.get("note"):
            row["notes"].append(inj["note"])
        if kind == "worker_kill":
            subj = inj["target"]
            site = subj.split("/")[0]
            det = first_event(events, t_in, ("PROCESS_FAILED", "WORKER_DEAD"),
                              lambda e: e.get("subject") == subj,
                              before=t_in + 60)
            rec = first_event(events, t_in, ("WORKER_RESTARTED",
                                             "WORKER_REJOINED"),
                              lambda e: e.get("subject") == subj
                              and e.get("site") == site, before=t_in + 120)
            row.update(_times(det, rec, t_in, t_in))
            site_det = first_event(events, t_in, ("WORKER_DEAD",
                                                  "WORKER_RESTARTED"),
                                   lambda e: e.get("subject") == subj
                                   and e.get("site") == site,
                                   before=t_in + 120)
            row["site_detection_s"] = (site_det["unix_s"] - t_in
                                       if site_det else None)
            until = rec["unix_s"] if rec else t_in + 60
            row["launcher"] = [
                f"{e['kind']}: {e.get('detail', '')}" for e in events
                if t_in - 0.2 <= e["unix_s"] <= until and not e.get("site")
                and e.get("subject") == subj][1:]
            row["site_detected_by"] = describe(site_det)
            affected = [site]
        elif kind == "site_crash":
            site = subject_site(inj["target"])
            det = first_event(events, t_in, ("PROCESS_FAILED",),
                              lambda e: subject_site(e.get("subject")) == site
                              and not e.get("site"), before=t_in + 60)
            peer_det = first_event(events, t_in, ("PEER_UNREACHABLE",
                                                  "PEER_RESTARTED"),
                                   lambda e: subject_site(e.get("subject"))
                                   == site, before=t_in + 120)
            recovered = first_event(events, t_in, ("SITE_RECOVERED",),
                                    lambda e: e.get("site") == site,
                                    before=t_in + 180)
            ends = [recovered] if recovered else []
            for peer in SITES:
                if peer == site:
                    continue
                ends.append(first_event(
                    events, t_in, ("PEER_RESTARTED", "PEER_REACHABLE"),
                    lambda e, p=peer: e.get("site") == p
                    and subject_site(e.get("subject")) == site,
                    before=t_in + 180))
            rejoin_t = None
            if recovered:
                # every worker of the site back: its events, else sampled
                back = [first_event(events, recovered["unix_s"],
                                    ("WORKER_REJOINED", "WORKER_RESTARTED",
                                     "WORKER_JOINED_LATE"),
                                    lambda e, w=f"{site}/{i}":
                                    e.get("subject") == w and
                                    e.get("site") == site,
                                    before=recovered["unix_s"] + 120)
                        for i in range(WORKERS_PER_SITE)]
                if all(back):
                    rejoin_t = max(e["unix_s"] for e in back)
                    row["workers_back_by"] = sorted({e["kind"] for e in back})
            for s in ([] if rejoin_t else samples[site]):
                if recovered and s["unix_s"] >= recovered["unix_s"]:
                    if ((s.get("workers_joined") or 0) -
                            (s.get("workers_dead") or 0) >= WORKERS_PER_SITE):
                        rejoin_t = s["unix_s"]
                        break
            rec = None
            if recovered and all(ends):
                rec = max(ends, key=lambda e: e["unix_s"])
            row.update(_times(det, rec, t_in, t_in))
            if recovered and rejoin_t:
                row["workers_back_after_recovered_s"] = (
                    rejoin_t - recovered["unix_s"])
            if rec and rejoin_t and rejoin_t > rec["unix_s"]:
                row["recovery_s"] = rejoin_t - t_in
                row["recovered_unix_s"] = rejoin_t
                row["recovered_by"] += (f"; its {WORKERS_PER_SITE} workers "
                                        "back")
            if rec is None:
                row["notes"].append(
                    "not recovered: " + ", ".join(
                        str(describe(e)) for e in ends) if ends
                    else "no SITE_RECOVERED event")
            row["peer_detected_by"] = describe(peer_det)
            row["peer_detection_s"] = (peer_det["unix_s"] - t_in
                                       if peer_det else None)
            row["site_recovery"] = recoveries.get(site, {})
            row["site_training_s"] = next(
                (x.get("training_s") for x in (report or {}).get("sites", [])
                 if x["name"] == site), None)
            affected = list(SITES)
        elif kind == "wanem_crash":
            det = first_event(events, t_in, ("PROCESS_FAILED",),
                              lambda e: e.get("subject") == "wanem",
                              before=t_in + 60)
            rec = first_event(events, t_in, ("PROCESS_RESTARTED",),
                              lambda e: e.get("subject") == "wanem",
                              before=t_in + 120)
            row.update(_times(det, rec, t_in, t_in))
            if rec:
                # traffic again: every site heard a new message from every peer
                flowing = _traffic_resumed(samples, rec["unix_s"])
                row["traffic_resumed_s"] = (flowing - t_in) if flowing else None
                if flowing and flowing > rec["unix_s"]:
                    row["recovery_s"] = flowing - t_in
                    row["recovered_unix_s"] = flowing
                    row["recovered_by"] += "; every site heard every peer again"
            nxt = min([i["unix_s"] for i in injections
                       if i["unix_s"] > t_in and i["kind"] in main_kinds] +
                      [t_in + 60])
            side = [e for e in events if t_in - 0.2 <= e["unix_s"] < nxt
                    and e["kind"] in ("LINK_RESET", "MESSAGES_RESENT",
                                      "PEER_UNREACHABLE", "PEER_REACHABLE")]
            row["side_events"] = [describe(e) for e in side]
            affected = list(SITES)
        elif kind in ("partition", "sigstop"):
            site = inj["target"]

            def involves(e, site=site):
                return (e.get("site") == site or
                        subject_site(e.get("subject")) == site)
            det = first_event(events, t_in, ("PEER_UNREACHABLE",),
                              lambda e: involves(e) and e.get("site"),
                              before=t_end + 30)
            # every peer pair that went unreachable must be reachable again
            pairs = {(e["site"], subject_site(e.get("subject")))
                     for e in events
                     if t_in - 0.2 <= e["unix_s"] <= t_end + 30 and
                     e["kind"] == "PEER_UNREACHABLE" and involves(e)}
            rec = None
            missing = []
            for pair in sorted(pairs):
                back = first_event(events, t_end, ("PEER_REACHABLE",
                                                   "PEER_RESTARTED"),
                                   lambda e, p=pair: e.get("site") == p[0] and
                                   subject_site(e.get("subject")) == p[1],
                                   before=t_end + 180)
                if back is None:
                    missing.append(f"{pair[0]} about {pair[1]}")
                elif rec is None or back["unix_s"] > rec["unix_s"]:
                    rec = back
            if missing:
                row["notes"].append("no PEER_REACHABLE after the end: " +
                                    ", ".join(missing))
                rec = None
            row.update(_times(det, rec, t_in, t_end))
            row["unreachable_pairs"] = [f"{a} about {b}" for a, b in
                                        sorted(pairs)]
            if kind == "sigstop":
                after = [describe(e) for e in events
                         if t_end - 0.2 <= e["unix_s"] <= t_end + 30 and
                         e.get("site") == site and
                         e["kind"] in ("WORKER_DEAD", "WORKER_REJOINED",
                                       "PEER_UNREACHABLE", "SERVER_GONE")]
                row["stopped_site_events_after_sigcont"] = after
            affected = list(SITES)
        elif kind == "slow_link":
            row.update(_theta_reaction(samples, ff_samples, chaos, ff, t_in,
                                       t_end))
            affected = list(SITES)
        window_end = row["recovered_unix_s"] or t_end
        if kind in ("partition", "sigstop", "slow_link"):
            window_end = max(window_end, t_end)
        extra = None
        if kind == "site_crash":
            site = subject_site(inj["target"])
            extra = {site: recoveries.get(site, {}).get("lost_commits", 0)}
        lost, parts = lost_seconds(t_in, window_end, affected, extra)
        row["lost_training_s"] = lost
        row["lost_by_site"] = parts
        row["lost_window_s"] = window_end - t_in
        rows.append(row)
    return rows


def _times(det, rec, t_in, t_end):
    return {"detected_by": describe(det),
            "detection_s": det["unix_s"] - t_in if det else None,
            "recovered_by": describe(rec),
            "recovery_s": rec["unix_s"] - t_end if rec else None,
            "recovered_unix_s": rec["unix_s"] if rec else None}


def _traffic_resumed(samples, after):
    """First time after `after` by which every site has received a message
    from every peer that it had not at `after`."""
    latest = after
    for site in SITES:
        ss = sorted(samples[site], key=lambda s: s["unix_s"])
        base = None
        for s in ss:
            if s["unix_s"] <= after:
                base = s.get("messages_received") or {}
        if base is None:
            return None
        done = None
        for s in ss:
            if s["unix_s"] <= after:
                continue
            got = s.get("messages_received") or {}
            if got and all(got.get(p, 0) > base.get(p, 0) for p in got):
                done = s["unix_s"]
                break
        if done is None:
            return None
        latest = max(latest, done)
    return latest


def _theta_reaction(samples, ff_samples, chaos, ff, t_in, t_end):
    """The threshold's reaction to the slowed link, from meridian_sync_theta
    sampled once a second at both ends of the link. Its band is what the
    fault-free run's θ did over the same window (± one adaptive step):
    detected when θ leaves the band during the slowdown, recovered when it
    is back in the band after it and stays there."""
    out = {"theta": {}, "link_load": {}}
    det_t, rec_t, notes = None, None, []
    step = 0.005 + 1e-9  # sync.adaptive_step's default
    for site in SLOW_LINK:
        th = theta_series(samples, site)
        ff_th = theta_series(ff_samples, site)
        ff_window = [v for t, v in ff_th if ff.t0 and
                     t_in - chaos.t0 - 10 <= t - ff.t0 <= t_end - chaos.t0 + 10]
        during = [(t, v) for t, v in th if t_in <= t <= t_end]
        after = [(t, v) for t, v in th if t > t_end]
        before = [v for t, v in th if t_in - 5 <= t < t_in]
        if not ff_window or not during:
            notes.append(f"{site}: no θ samples")
            continue
        lo, hi = min(ff_window) - step, max(ff_window) + step
        moved = next((t for t, v in during if not lo <= v <= hi), None)
        info = {"fault_free_min": min(ff_window),
                "fault_free_max": max(ff_window),
                "before": before[-1] if before else None,
                "during_min": min(v for _, v in during),
                "during_max": max(v for _, v in during),
                "final": th[-1][1] if th else None}
        if before and not lo <= before[-1] <= hi:
            notes.append(f"{site}: θ was {before[-1]:g} before the slowdown, "
                         "outside the fault-free band (an earlier fault)")
        if moved is not None:
            det_t = moved if det_t is None else min(det_t, moved)
            settled = None
            for i, (t, v) in enumerate(after):
                if all(lo <= w <= hi for _, w in after[i:]):
                    settled = t
                    break
            info["settled_unix_s"] = settled
            if settled is None:
                notes.append(f"{site}: θ not back in the band by the end")
                rec_t = float("inf")
            elif rec_t != float("inf"):
                rec_t = settled if rec_t is None else max(rec_t, settled)
        out["theta"][site] = info
    # What the link carried while slowed (the sites' own byte counters).
    for a, b in (SLOW_LINK, SLOW_LINK[::-1]):
        pts = [(s["unix_s"], (s.get("bytes_sent") or {}).get(b))
               for s in samples.get(a, [])]
        pts = [(t, v) for t, v in pts if v is not None]
        sent = commits_between(pts, t_in, t_end)  # works for any counter
        if sent is not None and t_end > t_in:
            out["link_load"][f"{a}->{b}"] = sent * 8 / (t_end - t_in)
    res = {"notes": notes, "theta": out["theta"],
           "link_load_bps": out["link_load"]}
    if det_t is None:
        res.update({"detected_by": "none: meridian_sync_theta stayed in the "
                    "fault-free band", "detection_s": None,
                    "recovered_by": None, "recovery_s": None,
                    "recovered_unix_s": None})
    else:
        res.update({"detected_by": "meridian_sync_theta left the fault-free "
                    "band", "detection_s": det_t - t_in})
        if rec_t is not None and rec_t != float("inf"):
            res.update({"recovered_by": "meridian_sync_theta back in the band",
                        "recovery_s": rec_t - t_end, "recovered_unix_s": rec_t})
        else:
            res.update({"recovered_by": None, "recovery_s": None,
                        "recovered_unix_s": None})
    return res


def replica_difference(run, report=None):
    models = {}
    for site in SITES:
        path = os.path.join(run.dir, f"model-{site}.f32")
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        values = array.array("f")
        values.frombytes(data[:len(data) - len(data) % 4])
        if sys.byteorder == "big":
            values.byteswap()
        models[site] = values
    result = {"sites": sorted(models), "pairs": {}, "max_abs_diff": None,
              "missing": [s for s in SITES if s not in models],
              "parameters": max((len(v) for v in models.values()), default=0),
              "max_abs_w": max((max((abs(x) for x in v), default=0.0)
                                for v in models.values()), default=0.0)}
    names = sorted(models)
    worst = 0.0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            va, vb = models[a], models[b]
            if len(va) != len(vb):
                result["pairs"][f"{a}-{b}"] = {"error": f"sizes {len(va)} and "
                                               f"{len(vb)}"}
                worst = float("inf")
                continue
            diff = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
            differing = sum(1 for x, y in zip(va, vb) if x != y)
            nonfinite = sum(1 for x in va if not math.isfinite(x))
            result["pairs"][f"{a}-{b}"] = {"max_abs_diff": diff,
                                           "differing": differing,
                                           "parameters": len(va),
                                           "non_finite": nonfinite}
            worst = max(worst, diff)
    if len(names) >= 2:
        result["max_abs_diff"] = worst
    applied = max((s.get("model_version", 0) for s in
                   (report or {}).get("sites", [])), default=0)
    result["updates_applied_max"] = applied
    result["rounding_bound"] = (REPLICA_ROUNDING_FACTOR * math.sqrt(
        max(applied, 1)) * FLOAT32_EPS * result["max_abs_w"])
    return result


def leftovers(run):
    """Processes naming the run directory, and ports the run used still
    listening (with their owner)."""
    time.sleep(2.0)
    procs = run_processes(run.dir)
    for p in read_endpoints(run.dir):
        for key in ("metrics_address", "control_address"):
            run.sampler.ports.update(int(x) for x in
                                     PORT_RE.findall(p.get(key, "") or ""))
    listening = listening_ports()
    ports = []
    for port in sorted(run.sampler.ports):
        if port in listening:
            pid, cmd = socket_owner(listening[port])
            ports.append({"port": port, "pid": pid, "cmdline": cmd,
                          "ours": cmd is None or run.dir in (cmd or "")})
    return {"processes": [{"pid": pid, "cmdline": " ".join(argv)}
                          for pid, argv in sorted(procs.items())],
            "ports_checked": len(run.sampler.ports),
            "ports_listening": ports,
            "ports_left": sum(1 for p in ports if p["ours"])}


def run_summary(run, report):
    s = {"name": run.name, "dir": run.dir, "exit_code": run.exit_code,
         "wall_s": run.wall_s, "t0_unix_s": run.t0,
         "start_to_training_s": (run.t0 - run.started) if run.t0 else None,
         "report": report is not None}
    if report is None:
        return s
    sites = report.get("sites", [])
    s.update({
        "final_accuracy": report.get("final_accuracy"),
        "time_to_target_s": report.get("time_to_target_s"),
        "reached_target": report.get("reached_target"),
        "outcome": report.get("outcome"),
        "lost_commits": report.get("lost_commits", 0),
        "wan_bytes_total": report.get("wan_bytes_total"),
        "wanem_processes": report.get("wanem_processes"),
        "wan_uncounted_s": report.get("wan_uncounted_s"),
        "events": len(report.get("events", [])),
        "event_kinds": {},
        "sites": {},
    })
    for e in report.get("events", []):
        s["event_kinds"][e["kind"]] = s["event_kinds"].get(e["kind"], 0) + 1
    sent = received = 0.0
    for site in sites:
        sync = site.get("sync", {})
        workers = site.get("workers", []) or [
            w for w in report.get("workers", []) if w.get("site") ==
            site["name"]]
        applied = sum(w.get("commits_applied", 0) for w in workers)
        s["sites"][site["name"]] = {
            "final_accuracy": site.get("final_accuracy"),
            "training_s": site.get("training_s"),
            "commits": site.get("commits"),
            "worker_commits_applied": applied,
            "worker_incarnations": sum(w.get("incarnations", 1)
                                       for w in workers),
            "duplicate_commits": site.get("duplicate_commits", 0),
            "stop_reason": site.get("stop_reason"),
            "clock": sync.get("clock"),
            "final_theta": sync.get("final_theta"),
            "flushed": sync.get("flushed"),
            "updates_sent": sync.get("updates_sent", 0),
            "updates_received": sync.get("updates_received", 0),
            "resent": sync.get("resent", 0),
            "duplicates_dropped": sync.get("duplicates_dropped", 0),
            "gaps": sync.get("gaps", 0),
            "rejected": sync.get("rejected", 0),
            "unreachable_s": sync.get("unreachable_s", 0),
            "recovery": site.get("recovery"),
        }
        sent += sync.get("updates_sent", 0)
        received += sync.get("updates_received", 0)
    s["updates_sent_total"] = sent
    s["updates_received_total"] = received
    total = 0.0
    for site in SITES:
        series = cumulative_commits(run.sampler.site_samples(site))
        if series:
            total += series[-1][1]
    s["sampled_commits_total"] = total
    return s


def quiet_ratio(chaos, ff, faults, margin=3.0):
    """Chaos / fault-free commits over the 1 s intervals after t0 in which
    no fault was active (injection to recovery or end, plus `margin`): how
    far apart the two runs are without faults, i.e. machine noise (other
    processes on the same CPUs)."""
    if not ff.t0 or not chaos.t0:
        return None
    windows = []  # (from, to, sites it touches)
    for r in faults:
        end = max(r.get("recovered_unix_s") or 0,
                  r["injected_unix_s"] + (r.get("duration_s") or 0))
        sites = ({r["target"].split("/")[0]} if r["fault"] == "worker_kill"
                 else set(SITES))
        windows.append((r["injected_unix_s"], end + margin, sites))
    got = ref = 0.0
    seconds = 0
    series = {s: cumulative_commits(chaos.sampler.site_samples(s))
              for s in SITES}
    ff_series = {s: cumulative_commits(ff.sampler.site_samples(s))
                 for s in SITES}
    last = min(x[-1][0] for x in series.values() if x) if all(
        series.values()) else chaos.t0
    t = chaos.t0
    while t + 1 <= last - 5:  # the final seconds: sites stop one by one
        for site in SITES:
            if any(a < t + 1 and t < b and site in touched
                   for a, b, touched in windows):
                continue
            g = commits_between(series[site], t, t + 1)
            f = commits_between(ff_series[site], ff.t0 + t - chaos.t0,
                                ff.t0 + t + 1 - chaos.t0)
            if g is not None and f is not None:
                got += g
                ref += f
                seconds += 1
        t += 1
    return {"seconds": seconds, "ratio": got / ref if ref else None,
            "commits": got, "fault_free_commits": ref}


def partition_rates(chaos, ff, faults):
    """Commit rate of the sites not partitioned during the partition against
    the fault-free run over the same window after t0; also split at the
    first PEER_UNREACHABLE (before it the clock-skew bound still waits for
    the partitioned site)."""
    inj = next((i for i in chaos.injections if i["kind"] == "partition"), None)
    if inj is None or not ff.t0:
        return None
    a, b = inj["unix_s"], inj.get("end_unix_s", inj["unix_s"])
    row = next((r for r in faults if r["fault"] == "partition"), {})
    det = (a + row["detection_s"]) if row.get("detection_s") is not None \
        else None
    windows = {"whole": (a, b)}
    if det is not None and a < det < b:
        windows["before detection"] = (a, det)
        windows["after detection"] = (det, b)
    result = {"window_s": b - a, "offset_s": inj["offset_s"],
              "detected_after_s": (det - a) if det else None, "windows": {}}
    for label, (x, y) in windows.items():
        rows, got_sum, ref_sum = {}, 0.0, 0.0
        for site in SITES:
            if site == inj["target"]:
                continue
            got = commits_between(cumulative_commits(
                chaos.sampler.site_samples(site)), x, y)
            ref = commits_between(cumulative_commits(
                ff.sampler.site_samples(site)), ff.t0 + x - chaos.t0,
                ff.t0 + y - chaos.t0)
            if got is None or not ref:
                rows = None
                break
            rows[site] = {"commits_per_s": got / (y - x),
                          "fault_free_commits_per_s": ref / (y - x),
                          "ratio": got / ref}
            got_sum += got
            ref_sum += ref
        if rows is None:
            result["windows"][label] = {"error": "no samples in the window"}
            continue
        result["windows"][label] = {"start_offset_s": x - chaos.t0,
                                    "length_s": y - x, "sites": rows,
                                    "ratio": got_sum / ref_sum}
    whole = result["windows"].get("whole", {})
    result["sites"] = whole.get("sites", {})
    result["ratio"] = whole.get("ratio")
    return result


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------

def fmt(v, digits=1, unit=""):
    if v is None:
        return "—"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f"{v:.{digits}f}{unit}"


FAULT_NAMES = {
    "worker_kill": "kill -9 worker",
    "site_crash": "kill -9 site server",
    "wanem_crash": "kill -9 emulator",
    "partition": "partition",
    "sigstop": "SIGSTOP site server",
    "slow_link": f"link slowed {SLOW_FACTOR}x",
}


def goals_of(ff_s, ch_s, faults, part, replicas, left, report):
    goals = []
    fa, ca = ff_s.get("final_accuracy"), ch_s.get("final_accuracy")
    if fa is not None and ca is not None:
        d = (ca - fa) * 100
        goals.append(("final accuracy vs fault-free", "within 0.5 points "
                      "(or better)", f"{ca:.4f} vs {fa:.4f} ({d:+.2f} points)",
                      d >= -0.5))
    outage = 0.0
    parts = []
    for r in faults:
        if r["fault"] in ("site_crash", "wanem_crash"):
            dur = r["recovery_s"]
            if dur is None:
                dur = 0.0
            outage += dur
            parts.append(f"{FAULT_NAMES[r['fault']]} {dur:.1f}")
        elif r["fault"] in ("partition", "sigstop"):
            outage += r["duration_s"]
            parts.append(f"{FAULT_NAMES[r['fault']]} {r['duration_s']:.1f}")
    ft, ct = ff_s.get("time_to_target_s"), ch_s.get("time_to_target_s")
    if ft is not None and ct is not None:
        if ft < 0:
            goals.append(("time to 0.87", "≤ fault-free + outage",
                          "the fault-free run did not reach 0.87", False))
        else:
            allowed = ft + outage
            goals.append(("time to 0.87", f"≤ fault-free + outage "
                          f"({ft:.1f} + {outage:.1f} = {allowed:.1f} s)",
                          "not reached" if ct < 0 else f"{ct:.1f} s",
                          0 <= ct <= allowed))
    if part and part.get("ratio") is not None:
        per = ", ".join(f"{s} {v['ratio'] * 100:.0f}%"
                        for s, v in part["sites"].items())
        q = (part.get("quiet_ratio") or {}).get("ratio")
        control = (f"; {part['ratio'] / q * 100:.0f}% against the quiet-time"
                   f" ratio {q * 100:.0f}%" if q else "")
        goals.append(("commit rate of us and eu during the partition",
                      "≥ 80% of fault-free", f"{part['ratio'] * 100:.0f}% "
                      f"({per}{control})", part["ratio"] >= 0.8))
    if report is not None:
        crashed = {subject_site(r["target"]) for r in faults
                   if r["fault"] == "site_crash"}
        window = sum(((s.get("recovery") or {}).get("lost_commits", 0))
                     for name, s in ch_s["sites"].items() if name in crashed)
        elsewhere = {name: (s.get("recovery") or {}).get("lost_commits", 0)
                     for name, s in ch_s["sites"].items()
                     if name not in crashed and
                     (s.get("recovery") or {}).get("lost_commits", 0)}
        lost = ch_s.get("lost_commits", 0)
        ok = lost == window and not elsewhere
        goals.append(("updates lost", "0 except the site crash window",
                      f"lost_commits {lost} (crash window of "
                      f"{', '.join(sorted(crashed)) or '—'}: {window}"
                      + (f"; elsewhere {elsewhere}" if elsewhere else "") + ")",
                      ok))
    for name, rep in replicas.items():
        d = rep.get("max_abs_diff")
        bound = rep.get("rounding_bound") or 0.0
        goals.append((f"replica difference ({name})",
                      f"≤ rounding: {REPLICA_ROUNDING_FACTOR:g}·√N·ε·max‖w‖"
                      f" = {bound:.3g} (N = "
                      f"{rep.get('updates_applied_max')} updates applied)",
                      "model files missing" if d is None else f"{d:.3g}",
                      d is not None and d <= bound))
    for name, l in left.items():
        goals.append((f"processes and ports left ({name})", "0",
                      f"{len(l['processes'])} processes, {l['ports_left']} "
                      f"ports (of {l['ports_checked']} checked)",
                      not l["processes"] and l["ports_left"] == 0))
    return goals, outage, parts


def write_results(args, outdir, schedule_desc, runs, faults, part, replicas,
                  left, goals, outage, outage_parts, chaos_injections):
    ff_s, ch_s = runs["fault-free"], runs["chaos"]
    L = ["# Chaos scenario (bench/scenarios/chaos)", "",
         f"{os.path.relpath(SHIPPED_JOB, ROOT)}: 3 sites × "
         f"{WORKERS_PER_SITE} workers, MLP on Fashion-MNIST, Gaia through "
         f"`meridian wanem`, adaptive θ, plaintext links, fault {{ }} "
         f"defaults; training budget {args.budget:g} s per run; "
         f"{'--quick; ' if args.quick else ''}seed {args.seed}." +
         (f" **{args.binary} was replaced during the "
          f"{' and '.join(args.binary_changed)} run**: processes restarted "
          "after that ran the new binary." if args.binary_changed else ""),
         "",
         "Schedule (s after t0, when every site commits): " + ", ".join(
             f"{d['offset_s']:.0f} {FAULT_NAMES[d['fault']]} {d['target']}"
             + (f" for {d['duration_s']:g} s" if d["duration_s"] else "")
             for d in schedule_desc) + ".", ""]
    L += ["| run | exit | final accuracy | time to 0.87 (s) | lost_commits |"
          " events | wall (s) |", "|---|---|---|---|---|---|---|"]
    for s in (ff_s, ch_s):
        L.append(f"| {s['name']} | {s['exit_code']} | "
                 f"{fmt(s.get('final_accuracy'), 4)} | "
                 f"{fmt(s.get('time_to_target_s'))} | "
                 f"{s.get('lost_commits', '—')} | {s.get('events', '—')} | "
                 f"{fmt(s.get('wall_s'), 0)} |")
    L += ["", "Per fault (seconds; injected at t0 + offset, t0 = every site "
          "committing; detection from the injection, recovery from the end of"
          " the fault; training lost: Σ over sites of (fault-free − chaos "
          "commits) in the same window after t0, in seconds of that site's "
          "fault-free rate — negative when the others ran faster on the two "
          "CPUs the faulted processes left free):", "",
          "| fault | target | at | lasted | detection | detected by | "
          "recovery | recovered by | training lost (site·s) | notes |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    main = [r for r in faults if r["fault"] != "worker_kill"]
    kills = [r for r in faults if r["fault"] == "worker_kill"]
    for r in main:
        notes = "; ".join(r.get("notes", []))
        if r["fault"] == "site_crash" and r.get("site_recovery"):
            rec = r["site_recovery"]
            back = fmt(r.get("workers_back_after_recovered_s"))
            notes = (f"its workers back {back} s after SITE_RECOVERED; it "
                     "trained "
                     f"{fmt(r.get('site_training_s'))} s of the "
                     f"{args.budget:g} s budget; "
                     f"recovery: lost clocks ({rec.get('lost_clock_from')}, "
                     f"{rec.get('lost_clock_to')}], lost commits "
                     f"{rec.get('lost_commits', 0)}, retracted "
                     f"{rec.get('retracted_updates', 0)}; peers: "
                     f"{r.get('peer_detected_by')} after "
                     f"{fmt(r.get('peer_detection_s'))} s" +
                     (f"; {notes}" if notes else ""))
        if r["fault"] == "slow_link":
            th = r.get("theta", {})
            inj = next(i for i in chaos_injections
                       if i["kind"] == "slow_link")
            notes = (f"{inj['bandwidth_bps'] / 1e6:g} → "
                     f"{inj['slowed_bps'] / 1e6:g} Mbit/s (from "
                     f"{inj['bandwidth_source']}); the sites sent " +
                     (", ".join(f"{k} {v / 1e6:.2f} Mbit/s" for k, v in
                                r.get("link_load_bps", {}).items()) or "—") +
                     " meanwhile; " +
                     "; ".join(
                         f"θ {s}: {v['during_min']:g}–{v['during_max']:g} "
                         f"while slowed, fault-free "
                         f"{v['fault_free_min']:g}–{v['fault_free_max']:g}"
                         for s, v in th.items()) +
                     (f"; {notes}" if notes else ""))
        if r["fault"] == "wanem_crash" and r.get("side_events"):
            notes = "events: " + ", ".join(r["side_events"][:8]) + \
                (f"; {notes}" if notes else "")
        if r["fault"] == "sigstop" and r.get("stopped_site_events_after_sigcont"):
            notes = ("the stopped site after SIGCONT: " +
                     ", ".join(r["stopped_site_events_after_sigcont"][:6]) +
                     (f"; {notes}" if notes else ""))
        L.append(f"| {FAULT_NAMES[r['fault']]} | {r['target']} | "
                 f"{r['offset_s']:.0f} | {fmt(r['duration_s'])} | "
                 f"{fmt(r['detection_s'])} | {r['detected_by'] or '—'} | "
                 f"{fmt(r['recovery_s'])} | {r['recovered_by'] or '—'} | "
                 f"{fmt(r['lost_training_s'])} | {notes} |")
    if kills:
        det = [r["detection_s"] for r in kills if r["detection_s"] is not None]
        rec = [r["recovery_s"] for r in kills if r["recovery_s"] is not None]
        lost = [r["lost_training_s"] for r in kills
                if r["lost_training_s"] is not None]
        undetected = [r["target"] for r in kills if r["detection_s"] is None]
        unrecovered = [r["target"] for r in kills if r["recovery_s"] is None]
        note = f"{len(kills)} kills: {', '.join(r['target'] for r in kills)}"
        if undetected:
            note += f"; not detected: {', '.join(undetected)}"
        if unrecovered:
            note += f"; not recovered: {', '.join(unrecovered)}"
        L.append(f"| {FAULT_NAMES['worker_kill']} (every 10–20 s) | random | "
                 f"{kills[0]['offset_s']:.0f}… | 0 | "
                 f"median {fmt(statistics.median(det) if det else None)}, "
                 f"max {fmt(max(det) if det else None)} | PROCESS_FAILED "
                 f"(launcher) | median "
                 f"{fmt(statistics.median(rec) if rec else None)}, max "
                 f"{fmt(max(rec) if rec else None)} | WORKER_RESTARTED at "
                 f"the site | {fmt(sum(lost) if lost else None)} (sum, own "
                 f"site only) | {note} |")
    if kills:
        L += ["", "Worker kills one by one (training lost: the worker's own "
              "site, injection to WORKER_RESTARTED):", "",
              "| at | worker | detection | recovery | training lost (site·s) |"
              " site saw it as | launcher |", "|---|---|---|---|---|---|---|"]
        for r in kills:
            L.append(f"| {r['offset_s']:.0f} | {r['target']} | "
                     f"{fmt(r['detection_s'])} | {fmt(r['recovery_s'])} | "
                     f"{fmt(r['lost_training_s'])} | "
                     f"{r.get('site_detected_by') or '—'} | "
                     f"{'; '.join(r.get('launcher', [])) or '—'} |")
    if part:
        L += ["", f"Commit rate of the sites not partitioned during the "
              f"partition ({fmt(part.get('window_s'))} s; the same window "
              "after t0 in the fault-free run; split at the first "
              "PEER_UNREACHABLE, "
              f"{fmt(part.get('detected_after_s'))} s in):", "",
              "| window | site | chaos (commits/s) | fault-free (commits/s) |"
              " ratio |", "|---|---|---|---|---|"]
        for label, w in part.get("windows", {}).items():
            if "error" in w:
                L.append(f"| {label} | — | — | — | {w['error']} |")
                continue
            span = (f"{label} (t0+{w['start_offset_s']:.0f} s, "
                    f"{w['length_s']:.1f} s)")
            for site, v in w["sites"].items():
                L.append(f"| {span} | {site} | {v['commits_per_s']:.1f} | "
                         f"{v['fault_free_commits_per_s']:.1f} | "
                         f"{v['ratio'] * 100:.0f}% |")
            L.append(f"| {span} | together | | | {w['ratio'] * 100:.0f}% |")
        q = part.get("quiet_ratio") or {}
        if q.get("ratio") is not None:
            L += ["", f"Control: over {q['seconds']} site·seconds with no "
                  "fault active at the site (each fault's window plus 3 s "
                  "left out; a worker kill only at its own site) the chaos "
                  f"run made {q['ratio'] * 100:.0f}% of the "
                  "fault-free run's commits: the difference between the two"
                  " runs that is not due to faults (other processes on the "
                  "same CPUs, a rebuilt cache, ...)." +
                  (" **More than 15% apart: rates and times compared between"
                   " the two runs are unreliable (machine load); run again "
                   "on a quieter machine.**"
                   if abs(q["ratio"] - 1) > 0.15 else "")]
    L += ["", "Conservation and cleanup:", "",
          "| check | fault-free | chaos |", "|---|---|---|"]

    def both(fn):
        return " | ".join(fn(n) for n in ("fault-free", "chaos"))
    L.append("| report lost_commits | " + both(
        lambda n: str(runs[n].get("lost_commits", "—"))) + " |")
    L.append("| site recoveries (lost clocks, lost commits, retracted) | " +
             both(lambda n: ", ".join(
                 f"{s}: ({(v['recovery'] or {}).get('lost_clock_from')}, "
                 f"{(v['recovery'] or {}).get('lost_clock_to')}], "
                 f"{(v['recovery'] or {}).get('lost_commits', 0)}, "
                 f"{(v['recovery'] or {}).get('retracted_updates', 0)}"
                 for s, v in runs[n].get("sites", {}).items()
                 if v.get("recovery")) or "none") + " |")
    def updates(n):
        r = runs[n]
        retracted = sum(((v.get("recovery") or {}).get("retracted_updates", 0))
                        for v in r.get("sites", {}).values())
        sent, got = r.get("updates_sent_total", 0), r.get(
            "updates_received_total", 0)
        text = f"{sent:.0f} / {got:.0f}"
        if retracted:
            text += (f" (received − sent = {got - sent:.0f}; retracted by "
                     f"the crashed site: {retracted})")
        return text
    L.append("| Σ updates sent / Σ received (MIRROR_UPDATE, sites' counts) | "
             + both(updates) + " |")
    L.append("| every peer's final flush arrived | " + both(
        lambda n: ", ".join(f"{s} {'yes' if v.get('flushed') else 'NO'}"
                            for s, v in runs[n].get("sites", {}).items())) +
             " |")
    L.append("| site commits = Σ workers' commits_applied | " + both(
        lambda n: ", ".join(f"{s} {v.get('commits')}/"
                            f"{v.get('worker_commits_applied')}"
                            for s, v in runs[n].get("sites", {}).items())) +
             " |")
    L.append("| resent / duplicates dropped / gaps / rejected | " + both(
        lambda n: ", ".join(f"{s} {v['resent']:.0f}/{v['duplicates_dropped']:.0f}"
                            f"/{v['gaps']:.0f}/{v['rejected']:.0f}"
                            for s, v in runs[n].get("sites", {}).items())) +
             " |")
    L.append("| duplicate commits (answered, not applied) | " + both(
        lambda n: ", ".join(f"{s} {v['duplicate_commits']}"
                            for s, v in runs[n].get("sites", {}).items())) +
             " |")
    def replica_text(n):
        rep = replicas[n]
        if rep.get("max_abs_diff") is None:
            return "missing " + ",".join(rep["missing"])
        differing = max((p.get("differing", 0) for p in rep["pairs"].values()),
                        default=0)
        return (f"{rep['max_abs_diff']:.3g} (max ‖w‖ "
                f"{rep.get('max_abs_w', 0):.3g}; ≤ {differing} of "
                f"{rep.get('parameters', 0)} parameters differ in a pair)")
    L.append("| max abs replica difference (every pair of model-*.f32) | " +
             both(replica_text) + " |")
    L.append("| processes left / ports left listening | " + both(
        lambda n: f"{len(left[n]['processes'])} / {left[n]['ports_left']} "
        f"(of {left[n]['ports_checked']})") + " |")
    L.append("| WAN: emulator processes counted / seconds maybe uncounted /"
             " bytes | " + both(
                 lambda n: f"{runs[n].get('wanem_processes', '—')} / "
                 f"{fmt(runs[n].get('wan_uncounted_s'))} / "
                 f"{fmt((runs[n].get('wan_bytes_total') or 0) / 1e6, 2)} MB")
             + " |")
    L.append("| events by kind | " + both(
        lambda n: ", ".join(f"{k} {v}" for k, v in
                            sorted(runs[n].get("event_kinds", {}).items()))
        or "none") + " |")
    L += ["", f"Total outage (time to 0.87 goal): {outage:.1f} s = "
          f"{' + '.join(outage_parts) or '0'} (site crash and emulator: "
          "injection to recovery; partition and SIGSTOP: their length; "
          "single-worker kills and the slowed link are not outages).", "",
          "| goal | wanted | measured | met |", "|---|---|---|---|"]
    for goal, wanted, measured, met in goals:
        L.append(f"| {goal} | {wanted} | {measured} | "
                 f"{'yes' if met else 'no'} |")
    text = "\n".join(L) + "\n"
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump({"config": {"quick": args.quick, "seed": args.seed,
                              "budget_s": args.budget,
                              "binary": args.binary,
                              "schedule": schedule_desc},
                   "runs": runs, "faults": faults,
                   "partition_commit_rate": part, "replicas": replicas,
                   "leftovers": left, "total_outage_s": outage,
                   "goals": [{"goal": g, "wanted": w, "measured": m,
                              "met": met} for g, w, m, met in goals]},
                  f, indent=1, default=str)
    print(text)


def round_met(rnd, goal):
    """Whether the round met `goal` (None: the round has no such goal)."""
    return next((met for g, _, _, met in rnd["goals"] if g == goal), None)


def write_summary(args, outdir, schedule_desc, rounds):
    """OUTDIR/results.md and results.json of --repeat N: the median of the
    rounds with the range of every number of the rounds' tables; goals from
    the medians of each side."""
    n = len(rounds)
    mr = repeats.median_range
    med = repeats.median

    def cell(c, digits=1, counted="rounds", unit=""):
        return repeats.fmt_cell(c, lambda v: fmt(v, digits, unit), counted)

    def percent(v):
        return f"{v * 100:.0f}%"

    def reached(t):  # the report's time to target: negative = not reached
        return None if t is None or t < 0 else t

    def common(texts):
        """The most common text, '(k of n)' when not every round had it."""
        texts = [t for t in texts if t]
        if not texts:
            return "—"
        top, k = collections.Counter(texts).most_common(1)[0]
        return top if k == n else f"{top} ({k} of {n} rounds)"

    # Each run of every round.
    run_names = ("fault-free", "chaos")
    runs = {}
    for name in run_names:
        ss = [r["summaries"][name] for r in rounds]
        reps = [r["replicas"][name] for r in rounds]
        lefts = [r["left"][name] for r in rounds]
        runs[name] = {
            "exit_codes": [s["exit_code"] for s in ss],
            "final_accuracy": mr(s.get("final_accuracy") for s in ss),
            "time_to_target_s": mr((reached(s.get("time_to_target_s"))
                                    for s in ss), True),
            "lost_commits": mr(s.get("lost_commits") for s in ss),
            "events": mr(s.get("events") for s in ss),
            "wall_s": mr(s.get("wall_s") for s in ss),
            "wan_bytes_total": mr(s.get("wan_bytes_total") for s in ss),
            "updates_sent_total": mr(s.get("updates_sent_total") for s in ss),
            "updates_received_total": mr(s.get("updates_received_total")
                                         for s in ss),
            "replica_max_abs_diff": mr(rep.get("max_abs_diff")
                                       for rep in reps),
            "replica_rounding_bound": mr(rep.get("rounding_bound")
                                         for rep in reps),
            "flushed_rounds": sum(
                1 for s in ss if s.get("sites") and
                all(v.get("flushed") for v in s["sites"].values())),
            "processes_left": sum(len(l["processes"]) for l in lefts),
            "ports_left": sum(l["ports_left"] for l in lefts),
            "ports_checked": sum(l["ports_checked"] for l in lefts),
        }

    # The faults of the schedule (each round has the same), worker kills
    # as each round's median, max and sum.
    faults = {}
    for d in schedule_desc:
        kind = d["fault"]
        if kind == "worker_kill" or kind in faults:
            continue
        rows = [next((x for x in r["faults"] if x["fault"] == kind), None)
                for r in rounds]
        got = [x for x in rows if x]
        faults[kind] = {
            "target": got[0]["target"] if got else d["target"],
            "rounds": len(got),
            "offset_s": mr(x["offset_s"] for x in got),
            "duration_s": mr(x["duration_s"] for x in got),
            "detection_s": mr((x["detection_s"] if x else None
                               for x in rows), True),
            "recovery_s": mr((x["recovery_s"] if x else None
                              for x in rows), True),
            "lost_training_s": mr(x["lost_training_s"] if x else None
                                  for x in rows),
            "detected_by": common(x["detected_by"] for x in got),
            "recovered_by": common(x["recovered_by"] for x in got),
        }
    kill_rounds = []
    for r in rounds:
        kills = [x for x in r["faults"] if x["fault"] == "worker_kill"]
        det = [x["detection_s"] for x in kills if x["detection_s"] is not None]
        rec = [x["recovery_s"] for x in kills if x["recovery_s"] is not None]
        lost = [x["lost_training_s"] for x in kills
                if x["lost_training_s"] is not None]
        kill_rounds.append({
            "kills": len(kills),
            "detection_median_s": statistics.median(det) if det else None,
            "detection_max_s": max(det) if det else None,
            "recovery_median_s": statistics.median(rec) if rec else None,
            "recovery_max_s": max(rec) if rec else None,
            "lost_training_s_sum": sum(lost) if lost else None,
            "undetected": len(kills) - len(det),
            "unrecovered": len(kills) - len(rec)})
    kills = {"rounds": kill_rounds, **repeats.summarize(kill_rounds)}

    # The partition: commit rates of the sites not partitioned; the ratio
    # of the medians of each side.
    parts = [r["part"] for r in rounds if r["part"]]
    part = None
    if parts:
        sites = sorted({s for p in parts for s in p.get("sites", {})})
        part = {"window_s": mr(p.get("window_s") for p in parts),
                "detected_after_s": mr(p.get("detected_after_s")
                                       for p in parts),
                "round_ratios": mr(p.get("ratio") for p in parts),
                "sites": {}}
        for site in sites + ["together"]:
            def side(key, p, site=site):
                ss = p.get("sites", {})
                if not ss or (site != "together" and site not in ss):
                    return None
                if site == "together":
                    return sum(v[key] for v in ss.values())
                return ss[site][key]
            ch = mr(side("commits_per_s", p) for p in parts)
            ff = mr(side("fault_free_commits_per_s", p) for p in parts)
            part["sites"][site] = {
                "commits_per_s": ch, "fault_free_commits_per_s": ff,
                "ratio": (med(ch) / med(ff) if ch and ff and med(ff)
                          else None)}
        part["ratio"] = part["sites"]["together"]["ratio"]
        quiet = [p.get("quiet_ratio") or {} for p in parts]
        got = mr(q.get("commits") for q in quiet)
        ref = mr(q.get("fault_free_commits") for q in quiet)
        part["quiet"] = {
            "commits": got, "fault_free_commits": ref,
            "seconds": mr(q.get("seconds") for q in quiet),
            "round_ratios": mr(q.get("ratio") for q in quiet),
            "ratio": med(got) / med(ref) if got and ref and med(ref) else None}
    outage = mr(r["outage"] for r in rounds)

    # Goals: medians of each side; the checks of each run in every round.
    goals = []
    fa = med(runs["fault-free"]["final_accuracy"])
    ca = med(runs["chaos"]["final_accuracy"])
    if fa is not None and ca is not None:
        d = (ca - fa) * 100
        goals.append(("final accuracy vs fault-free", "within 0.5 points "
                      "(or better)", f"{ca:.4f} vs {fa:.4f} ({d:+.2f} "
                      "points; medians)", d >= -0.5))
    ft_cell = runs["fault-free"]["time_to_target_s"]
    ct_cell = runs["chaos"]["time_to_target_s"]
    if any(r["summaries"]["chaos"].get("report") and
           r["summaries"]["fault-free"].get("report") for r in rounds):
        def missed(c):
            return f"{n - (c['runs'] if c else 0)} of {n} rounds"
        ft, ct = med(ft_cell), med(ct_cell)
        if ft is None:
            goals.append((f"time to {TARGET}", "≤ fault-free + outage",
                          f"the fault-free run did not reach {TARGET} in "
                          f"{missed(ft_cell)}", False))
        else:
            allowed = ft + (med(outage) or 0.0)
            goals.append((f"time to {TARGET}", f"≤ fault-free + outage "
                          f"({ft:.1f} + {med(outage) or 0.0:.1f} = "
                          f"{allowed:.1f} s; medians"
                          f"{repeats.partial(ft_cell, 'reached')})",
                          f"not reached in {missed(ct_cell)}" if ct is None
                          else
                          f"{ct:.1f} s{repeats.partial(ct_cell, 'reached')}",
                          ct is not None and ct <= allowed))
    if part and part.get("ratio") is not None:
        per = ", ".join(f"{s} {v['ratio'] * 100:.0f}%"
                        for s, v in part["sites"].items()
                        if s != "together" and v["ratio"] is not None)
        q = part["quiet"]["ratio"]
        control = (f"; {part['ratio'] / q * 100:.0f}% against the quiet-time"
                   f" ratio {q * 100:.0f}%" if q else "")
        goals.append(("commit rate of us and eu during the partition",
                      "≥ 80% of fault-free", f"{part['ratio'] * 100:.0f}% "
                      f"of the medians ({per}{control})",
                      part["ratio"] >= 0.8))
    met = [round_met(r, "updates lost") for r in rounds]
    if any(m is not None for m in met):
        goals.append(("updates lost", "0 except the site crash window",
                      f"lost_commits {cell(runs['chaos']['lost_commits'], 0)};"
                      f" within the crash window in {met.count(True)} of "
                      f"{n} rounds", met.count(True) == n))
    for name in run_names:
        met = [round_met(r, f"replica difference ({name})") for r in rounds]
        bound = med(runs[name]["replica_rounding_bound"]) or 0.0
        diff = runs[name]["replica_max_abs_diff"]
        goals.append((f"replica difference ({name})",
                      f"≤ rounding: {REPLICA_ROUNDING_FACTOR:g}·√N·ε·max‖w‖"
                      f" (median bound {bound:.3g})",
                      ("model files missing" if diff is None else
                       repeats.fmt_cell(diff, lambda v: f"{v:.3g}")) +
                      f"; within the bound in {met.count(True)} of {n} rounds",
                      met.count(True) == n))
    for name in run_names:
        met = [round_met(r, f"processes and ports left ({name})")
               for r in rounds]
        rr = runs[name]
        goals.append((f"processes and ports left ({name})", "0",
                      f"{rr['processes_left']} processes, {rr['ports_left']} "
                      f"ports (of {rr['ports_checked']} checked) over {n} "
                      "rounds", met.count(True) == n))

    changed = [f"r{i + 1} {c}" for i, r in enumerate(rounds)
               for c in r["binary_changed"]]
    L = [f"# Chaos scenario (bench/scenarios/chaos), {n} rounds", "",
         f"{os.path.relpath(SHIPPED_JOB, ROOT)}: 3 sites × "
         f"{WORKERS_PER_SITE} workers, MLP on Fashion-MNIST, Gaia through "
         f"`meridian wanem`, adaptive θ, plaintext links, fault {{ }} "
         f"defaults; training budget {args.budget:g} s per run; "
         f"{'--quick; ' if args.quick else ''}seed {args.seed}. "
         f"Median of {n} rounds (range), each round a fault-free run and "
         "a chaos run back to back with the same schedule; each round's own"
         " tables: " + ", ".join(f"{os.path.relpath(r['dir'], outdir)}/"
                                 "results.md" for r in rounds) + "." +
         (f" **{args.binary} was replaced during the "
          f"{', '.join(changed)} run**: processes restarted after that ran "
          "the new binary." if changed else ""),
         "",
         "Schedule (s after t0, when every site commits): " + ", ".join(
             f"{d['offset_s']:.0f} {FAULT_NAMES[d['fault']]} {d['target']}"
             + (f" for {d['duration_s']:g} s" if d["duration_s"] else "")
             for d in schedule_desc) + ".", ""]
    L += [f"| run | exit | final accuracy | time to {TARGET} (s) | "
          "lost_commits | events | wall (s) |", "|---|---|---|---|---|---|---|"]
    for name in run_names:
        rr = runs[name]
        L.append(f"| {name} | {', '.join(str(c) for c in rr['exit_codes'])} | "
                 f"{cell(rr['final_accuracy'], 4)} | "
                 f"{cell(rr['time_to_target_s'], 1, 'reached')} | "
                 f"{cell(rr['lost_commits'], 0)} | {cell(rr['events'], 0)} | "
                 f"{cell(rr['wall_s'], 0)} |")
    L += ["", "Per fault (seconds, as in a round's table; the median of the "
          f"{n} rounds with the range, \"k of {n} detected\" when not every "
          "round's was):", "",
          "| fault | target | at | lasted | detection | detected by | "
          "recovery | recovered by | training lost (site·s) | rounds |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for kind, fr in faults.items():
        L.append(f"| {FAULT_NAMES[kind]} | {fr['target']} | "
                 f"{cell(fr['offset_s'], 0)} | {cell(fr['duration_s'])} | "
                 f"{cell(fr['detection_s'], 1, 'detected')} | "
                 f"{fr['detected_by']} | "
                 f"{cell(fr['recovery_s'], 1, 'recovered')} | "
                 f"{fr['recovered_by']} | {cell(fr['lost_training_s'])} | "
                 f"{fr['rounds']} of {n} |")
    if any(k["kills"] for k in kill_rounds):
        undetected = sum(k["undetected"] for k in kill_rounds)
        unrecovered = sum(k["unrecovered"] for k in kill_rounds)
        L.append(f"| {FAULT_NAMES['worker_kill']} (every 10–20 s; "
                 f"{cell(kills['kills'], 0)} a round) | random | 5… | 0 | "
                 f"median {cell(kills['detection_median_s'])}, max "
                 f"{cell(kills['detection_max_s'])} | PROCESS_FAILED "
                 f"(launcher) | median {cell(kills['recovery_median_s'])}, "
                 f"max {cell(kills['recovery_max_s'])} | WORKER_RESTARTED at "
                 f"the site | {cell(kills['lost_training_s_sum'])} (a round's "
                 f"sum, own site only) | {n} of {n}"
                 + (f"; not detected: {undetected}" if undetected else "")
                 + (f"; not recovered: {unrecovered}" if unrecovered else "")
                 + " |")
        L += ["", "Worker kills: median and max are each round's over its "
              "kills; the cell is the median of the rounds with the range."]
    if part:
        L += ["", "Commit rate of the sites not partitioned during the "
              f"partition ({cell(part['window_s'])} s; the same window after "
              "t0 in the fault-free run; first PEER_UNREACHABLE "
              f"{cell(part['detected_after_s'])} s in), the whole window; the"
              " ratio is that of the medians:", "",
              "| site | chaos (commits/s) | fault-free (commits/s) | ratio |",
              "|---|---|---|---|"]
        for site, v in part["sites"].items():
            L.append(f"| {site} | {cell(v['commits_per_s'])} | "
                     f"{cell(v['fault_free_commits_per_s'])} | "
                     f"{fmt(v['ratio'] and v['ratio'] * 100, 0, '%')} |")
        L += ["", "The rounds' own ratios (together): "
              f"{repeats.fmt_cell(part['round_ratios'], percent)}."]
        q = part["quiet"]
        if q["ratio"] is not None:
            L += ["", f"Control: over {cell(q['seconds'], 0)} site·seconds a "
                  "round with no fault active at the site, the chaos runs "
                  f"made {q['ratio'] * 100:.0f}% of the fault-free runs' "
                  "commits (ratio of the medians; the rounds' own: "
                  f"{repeats.fmt_cell(q['round_ratios'], percent)})"
                  ": the difference between the two runs that is not due to "
                  "faults." +
                  (" **More than 15% apart: rates and times compared between"
                   " the two runs are unreliable (machine load); run again "
                   "on a quieter machine.**"
                   if abs(q["ratio"] - 1) > 0.15 else "")]
    L += ["", "Conservation and cleanup (median of the rounds, range):", "",
          "| check | fault-free | chaos |", "|---|---|---|"]

    def both(fn):
        return " | ".join(fn(runs[name]) for name in run_names)
    L.append("| report lost_commits | " + both(
        lambda rr: cell(rr["lost_commits"], 0)) + " |")
    L.append("| Σ updates sent / Σ received (sites' counts) | " + both(
        lambda rr: f"{cell(rr['updates_sent_total'], 0)} / "
        f"{cell(rr['updates_received_total'], 0)}") + " |")
    L.append("| every peer's final flush arrived | " + both(
        lambda rr: f"{rr['flushed_rounds']} of {n} rounds") + " |")
    L.append("| max abs replica difference (rounding bound) | " + both(
        lambda rr: repeats.fmt_cell(rr["replica_max_abs_diff"],
                                    lambda v: f"{v:.3g}") +
        f" ({med(rr['replica_rounding_bound']) or 0:.3g})") + " |")
    L.append("| processes left / ports left (all rounds) | " + both(
        lambda rr: f"{rr['processes_left']} / {rr['ports_left']} (of "
        f"{rr['ports_checked']})") + " |")
    L.append("| WAN bytes (MB) | " + both(
        lambda rr: repeats.fmt_cell(rr["wan_bytes_total"],
                                    lambda v: f"{v / 1e6:.2f}")) + " |")
    L += ["", f"Total outage (time to {TARGET} goal): {cell(outage)} s (site "
          "crash and emulator: injection to recovery; partition and "
          "SIGSTOP: their length).", "",
          "| goal | wanted | measured | met |", "|---|---|---|---|"]
    for goal, wanted, measured, ok in goals:
        L.append(f"| {goal} | {wanted} | {measured} | "
                 f"{'yes' if ok else 'no'} |")
    L += ["", repeats.note(n, ("reached", "detected", "recovered"), "rounds",
                           "the fault-free and the chaos runs") +
          " A check of each run is met when every round met it."]
    text = "\n".join(L) + "\n"
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump({"config": {"quick": args.quick, "seed": args.seed,
                              "budget_s": args.budget,
                              "binary": args.binary, "repeat": n,
                              "schedule": schedule_desc},
                   "summary": {"runs": runs, "faults": faults,
                               "worker_kills": kills,
                               "partition_commit_rate": part,
                               "total_outage_s": outage},
                   "goals": [{"goal": g, "wanted": w, "measured": m,
                              "met": ok} for g, w, m, ok in goals],
                   "rounds": [{"dir": r["dir"], "runs": r["summaries"],
                               "faults": r["faults"],
                               "partition_commit_rate": r["part"],
                               "replicas": r["replicas"],
                               "leftovers": r["left"],
                               "total_outage_s": r["outage"],
                               "goals": [{"goal": g, "wanted": w,
                                          "measured": m, "met": ok}
                                         for g, w, m, ok in r["goals"]]}
                              for r in rounds]},
                  f, indent=1, default=str)
    print(text)


# ---------------------------------------------------------------------------

def run_round(args, runs, schedule):
    """Runs a round's fault-free and chaos runs (or, --reanalyse, loads
    them); 130 when interrupted."""
    current = None
    try:
        for name in (() if args.reanalyse else ("fault-free", "chaos")):
            run = current = runs[name]
            run.prepare()
            run.launch()
            if run.wait_training():
                run.note_route_ports()
                if name == "chaos":
                    run_schedule(run, schedule)
                    run.note_route_ports()
            run.wait()
            current = None
    except KeyboardInterrupt:
        if current:
            current.abort()
        log("interrupted")
        return 130
    except BaseException:
        if current:
            current.abort()
        raise
    if args.reanalyse:
        for run in runs.values():
            run.load()
    return None


def analyse_round(args, outdir, schedule_desc, runs):
    """A round's analysis, written to outdir/results.md and results.json."""
    args.binary_changed = [n for n, r in runs.items()
                           if r.binary_at_start != r.binary_at_end]
    if args.binary_changed:
        log(f"warning: {args.binary} was replaced during the "
            f"{' and '.join(args.binary_changed)} run (processes restarted "
            "after that ran the new binary)")
    ff, chaos = runs["fault-free"], runs["chaos"]
    reports = {n: load_report(r) for n, r in runs.items()}
    for n, r in runs.items():
        src = os.path.join(r.dir, "report.json")
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(outdir, f"{n}-report.json"))
    summaries = {n: run_summary(r, reports[n]) for n, r in runs.items()}
    replicas = {n: replica_difference(r, reports[n]) for n, r in runs.items()}
    left = {n: leftovers(r) for n, r in runs.items()}
    faults = analyse_faults(chaos, ff, reports["chaos"]) if chaos.t0 else []
    part = partition_rates(chaos, ff, faults) if chaos.t0 else None
    if part is not None:
        part["quiet_ratio"] = quiet_ratio(chaos, ff, faults)
    goals, outage, outage_parts = goals_of(summaries["fault-free"],
                                           summaries["chaos"], faults, part,
                                           replicas, left, reports["chaos"])
    write_results(args, outdir, schedule_desc, summaries, faults, part,
                  replicas, left, goals, outage, outage_parts,
                  chaos.injections)
    return {"dir": outdir, "summaries": summaries, "faults": faults,
            "part": part, "replicas": replicas, "left": left, "goals": goals,
            "outage": outage, "binary_changed": list(args.binary_changed),
            "exit_codes": [r.exit_code for r in runs.values()]}


def dry_run(args, outdir):
    """--dry-run: the order of the runs, the job file validated."""
    log("runs, in this order: " + ", ".join(
        (f"r{k}/{name}" if args.repeat > 1 else name)
        for k in range(1, args.repeat + 1)
        for name in ("fault-free", "chaos")))
    path = os.path.join(outdir, "job.pbtxt")
    with open(path, "w") as f:
        f.write(job_text("three-regions-chaos", args.budget))
    check = subprocess.run([args.binary, "validate", path],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    log(f"{path}: {check.stdout.strip()}")
    return 0 if check.returncode == 0 else 1


def main():
    global LOG_TAG
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir")
    parser.add_argument("--quick", action="store_true",
                        help="budget 155 s, partition 40 s, SIGSTOP 15 s, "
                        "slowed link 30 s")
    parser.add_argument("--repeat", type=repeats.repeat_count, default=1,
                        metavar="N",
                        help="repeat the whole scenario N times (rounds of a "
                        "fault-free and a chaos run, in OUTDIR/r1 ... rN, the "
                        "same schedule) and report the median of the rounds "
                        "with their range [1]")
    parser.add_argument("--binary", default=DEFAULT_BINARY,
                        help="the meridian binary (default build/bin/meridian;"
                        " built with tools/build when it is missing)")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the fault schedule (which workers and "
                        "sites, when) [1]")
    parser.add_argument("--budget", type=float, default=None,
                        help="training seconds per run [330, --quick 155]")
    parser.add_argument("--reanalyse", action="store_true",
                        help="run nothing: write the results again from the "
                        "run directories an earlier invocation left in OUTDIR"
                        " (give it the same --quick/--budget/--seed/--repeat)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the schedule and the order of the runs, "
                        "validate the job file (OUTDIR/job.pbtxt); run and "
                        "build nothing")
    args = parser.parse_args()

    sched = SCHEDULES["quick" if args.quick else "full"]
    if args.budget is None:
        args.budget = sched["budget"]
    args.binary = os.path.abspath(args.binary)
    if not os.access(args.binary, os.X_OK):
        if args.binary != DEFAULT_BINARY or args.dry_run:
            parser.error(f"{args.binary} is not an executable")
        log("build/bin/meridian is missing: tools/build --target meridian")
        subprocess.run([os.path.join(ROOT, "tools", "build"), "--target",
                        "meridian"], check=True)
    rng = random.Random(args.seed)
    schedule = build_schedule(rng, sched, args.budget)
    schedule_desc = [{"offset_s": round(o, 1), "fault": k,
                      "target": t if isinstance(t, str) else f"{t[0]}/{t[1]}",
                      "duration_s": d} for o, k, t, d in schedule]
    os.makedirs(args.outdir, exist_ok=True)
    outdir = os.path.abspath(args.outdir)
    log("schedule: " + ", ".join(
        f"{d['offset_s']:.0f} s {d['fault']} {d['target']}"
        + (f" {d['duration_s']:g} s" if d["duration_s"] else "")
        for d in schedule_desc))
    if args.dry_run:
        return dry_run(args, outdir)

    rounds = []
    for k in range(1, args.repeat + 1):
        # One round: OUTDIR itself, or OUTDIR/rK (--repeat N).
        LOG_TAG = f" r{k}/{args.repeat}" if args.repeat > 1 else ""
        round_dir = (outdir if args.repeat == 1
                     else os.path.join(outdir, f"r{k}"))
        os.makedirs(round_dir, exist_ok=True)
        runs = {"fault-free": Run(args.binary, round_dir, "fault-free",
                                  args.budget),
                "chaos": Run(args.binary, round_dir, "chaos", args.budget)}
        stopped = run_round(args, runs, schedule)
        if stopped:
            return stopped
        rounds.append(analyse_round(args, round_dir, schedule_desc, runs))
    LOG_TAG = ""
    if args.repeat > 1:
        write_summary(args, outdir, schedule_desc, rounds)
    return 0 if all(code == 0 for r in rounds for code in r["exit_codes"]) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
