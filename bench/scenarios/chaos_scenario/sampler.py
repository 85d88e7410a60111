"""Sampling a run: once a second, every site server's metrics and the
run's processes; commit counts as series to compare two runs by."""

import re
import threading
import time
import urllib.request
from typing import Optional

from chaos_scenario import processes
from chaos_scenario.job import SITES

METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


def scrape(url: str, timeout: float) -> dict[str, list[tuple[dict, float]]]:
    """The Prometheus text at `url`: name -> [(labels, value)]."""
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


def one(metrics: dict, name: str, **labels: str) -> Optional[float]:
    """The value of metric `name` with `labels`, None without one."""
    for lab, value in metrics.get(name, []):
        if all(lab.get(k) == v for k, v in labels.items()):
            return value
    return None


def per_peer(metrics: dict, name: str) -> dict[str, float]:
    """peer -> value of a metric labelled by peer."""
    return {lab.get("peer"): value for lab, value in metrics.get(name, [])
            if "peer" in lab}


class Sampler:
    """Once a second: every site server's metrics (one thread per site, so
    a frozen one does not hold the others back) and the run's processes
    (one more thread). Owned by its Run; the threads add to `samples` and
    `ports` under `lock` until finish(): about one sample a site a
    second."""

    def __init__(self, run_dir: str, period: float = 1.0):
        self.run_dir = run_dir
        self.period = period
        self.samples = []         # dicts, see site_loop
        self.ports = set()        # every port the run's processes used
        self.max_processes = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.site_loop, args=(s,),
                                         daemon=True) for s in SITES]
        self.threads.append(threading.Thread(target=self.proc_loop,
                                             daemon=True))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)

    def site_loop(self, site: str) -> None:
        while not self.stop.is_set():
            begun = time.time()
            url = None
            for p in processes.read_endpoints(self.run_dir):
                if p.get("role") == "site" and p.get("site") == site:
                    url = p.get("metrics_url")
                    for port in processes.PORT_RE.findall(
                            p.get("metrics_address", "")):
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
                        "workers_joined": one(
                            m, "meridian_site_workers_joined"),
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

    def proc_loop(self) -> None:
        while not self.stop.is_set():
            procs = processes.run_processes(self.run_dir)
            ports = set()
            for argv in procs.values():
                for a in argv:
                    ports.update(int(p) for p in processes.PORT_RE.findall(a)
                                 if p != "0")
            ports |= processes.endpoint_ports(self.run_dir)
            with self.lock:
                self.ports |= ports
                self.max_processes = max(self.max_processes, len(procs))
            self.stop.wait(2.0)

    def site_samples(self, site: str) -> list[dict]:
        with self.lock:
            return [s for s in self.samples if s["site"] == site]

    def all_training_since(self) -> Optional[float]:
        """Unix time of the first sample by which every site has committed."""
        with self.lock:
            firsts = {}
            for s in self.samples:
                if (s["commits"] or 0) > 0 and s["site"] not in firsts:
                    firsts[s["site"]] = s["unix_s"]
        if len(firsts) < len(SITES):
            return None
        return max(firsts.values())


def cumulative_commits(samples: list[dict]) -> list[tuple[float, float]]:
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


def value_at(series: list[tuple[float, float]], t: float) -> Optional[float]:
    """Linear interpolation in [(t, v)], clamped at the ends."""
    if not series:
        return None
    if t <= series[0][0]:
        return series[0][1]
    for (t0, v0), (t1, v1) in zip(series, series[1:]):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return series[-1][1]


def commits_between(series: list[tuple[float, float]], a: float,
                    b: float) -> Optional[float]:
    """How much the series (any counter) grew from a to b; None when the
    window is not inside it."""
    if not series or b <= series[0][0] or a >= series[-1][0]:
        return None
    return value_at(series, b) - value_at(series, a)
