"""From the runs to the faults: per injection its detection (injection to
the first matching event of report.json), recovery (end of the fault to the
event that ends it) and the training time lost (commit deficit of every
site against the fault-free run over the same window, in seconds of that
site's fault-free training); the commit rate of the sites not partitioned
during the partition, and the control: both runs' commits while no fault
was active.
"""

import dataclasses
import json
import os
import re
from typing import Callable, Optional

from chaos_scenario.job import SITES, WORKERS_PER_SITE
from chaos_scenario.run import Run
from chaos_scenario.sampler import commits_between, cumulative_commits
from chaos_scenario.schedule import SITE_CRASHES, SLOW_LINK, TIMED

Event = dict    # an event of report.json: kind, subject, site, unix_s, ...
Series = list[tuple[float, float]]  # (unix_s, value)
# sync.adaptive_step's default: the threshold's band is the fault-free
# run's range ± one step.
ADAPTIVE_STEP = 0.005 + 1e-9


def load_report(run: Run) -> Optional[dict]:
    """The run's report.json, None when it has none (it did not finish)."""
    try:
        with open(os.path.join(run.dir, "report.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def subject_site(subject: Optional[str]) -> Optional[str]:
    """The site an event's subject names: "site 'us'" -> us, "us/2" ->
    us."""
    m = re.search(r"'([^']*)'", subject or "")
    if m:
        return m.group(1)
    if subject and "/" in subject:
        return subject.split("/")[0]
    return subject


def events_of(report: Optional[dict]) -> list[Event]:
    """The report's events in time order."""
    return sorted(report.get("events", []) if report else [],
                  key=lambda e: e.get("unix_s", 0))


def first_event(events: list[Event], after: float, kinds: tuple[str, ...],
                pred: Callable[[Event], bool] = lambda e: True,
                before: Optional[float] = None) -> Optional[Event]:
    """The first event of one of `kinds` from `after` (less 0.2 s of clock
    skew) until `before` that satisfies `pred`."""
    for e in events:
        t = e.get("unix_s", 0)
        if t < after - 0.2 or (before is not None and t > before):
            continue
        if e.get("kind") in kinds and pred(e):
            return e
    return None


def describe(e: Optional[Event]) -> Optional[str]:
    """"KIND SUBJECT (SITE)" of an event ("launcher" for the launcher's)."""
    if e is None:
        return None
    where = e.get("site") or "launcher"
    return f"{e['kind']} {e.get('subject', '')} ({where})"


def theta_series(samples_by_site: dict[str, list[dict]],
                 site: str) -> Series:
    return [(s["unix_s"], s["theta"]) for s in samples_by_site.get(site, [])
            if s.get("theta") is not None]


@dataclasses.dataclass
class Runs:
    """What the analysis of every fault reads: both runs, the chaos run's
    events and recoveries, both runs' samples and commit series by site."""
    chaos: Run
    ff: Run
    report: Optional[dict]
    events: list[Event]
    samples: dict[str, list[dict]]
    ff_samples: dict[str, list[dict]]
    series: dict[str, Series]
    ff_series: dict[str, Series]
    recoveries: dict[str, dict]

    @classmethod
    def of(cls, chaos: Run, ff: Run, report: Optional[dict]) -> "Runs":
        samples = {s: chaos.sampler.site_samples(s) for s in SITES}
        ff_samples = {s: ff.sampler.site_samples(s) for s in SITES}
        return cls(chaos, ff, report, events_of(report), samples, ff_samples,
                   {s: cumulative_commits(samples[s]) for s in SITES},
                   {s: cumulative_commits(ff_samples[s]) for s in SITES},
                   {s["name"]: s.get("recovery") or {}
                    for s in (report or {}).get("sites", [])})

    def lost_seconds(self, start: float, end: float, sites: list[str],
                     lost_commits: Optional[dict[str, float]] = None
                     ) -> tuple[Optional[float], dict]:
        """Sum over `sites` of (fault-free commits - chaos commits) in the
        same window after t0, in seconds of that site's fault-free rate;
        `lost_commits`: commits made but lost by a crash, per site."""
        total, parts = 0.0, {}
        if end <= start:
            return None, {}
        chaos, ff = self.chaos, self.ff
        for site in sites:
            got = commits_between(self.series[site], start, end)
            ref = (commits_between(self.ff_series[site],
                                   ff.t0 + start - chaos.t0,
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


def _times(det: Optional[Event], rec: Optional[Event], t_in: float,
           t_end: float) -> dict:
    return {"detected_by": describe(det),
            "detection_s": det["unix_s"] - t_in if det else None,
            "recovered_by": describe(rec),
            "recovery_s": rec["unix_s"] - t_end if rec else None,
            "recovered_unix_s": rec["unix_s"] if rec else None}


def worker_kill(r: Runs, inj: dict, row: dict) -> list[str]:
    """A killed worker: detected by the launcher (PROCESS_FAILED) or its
    site (WORKER_DEAD), recovered when its site has it again. Returns the
    sites whose training it cost: its own."""
    events, t_in = r.events, inj["unix_s"]
    subj = inj["target"]
    site = subj.split("/")[0]
    det = first_event(events, t_in, ("PROCESS_FAILED", "WORKER_DEAD"),
                      lambda e: e.get("subject") == subj,
                      before=t_in + 60)
    rec = first_event(events, t_in, ("WORKER_RESTARTED", "WORKER_REJOINED"),
                      lambda e: e.get("subject") == subj
                      and e.get("site") == site, before=t_in + 120)
    row.update(_times(det, rec, t_in, t_in))
    site_det = first_event(events, t_in, ("WORKER_DEAD", "WORKER_RESTARTED"),
                           lambda e: e.get("subject") == subj
                           and e.get("site") == site, before=t_in + 120)
    row["site_detection_s"] = (site_det["unix_s"] - t_in
                               if site_det else None)
    until = rec["unix_s"] if rec else t_in + 60
    row["launcher"] = [
        f"{e['kind']}: {e.get('detail', '')}" for e in events
        if t_in - 0.2 <= e["unix_s"] <= until and not e.get("site")
        and e.get("subject") == subj][1:]
    row["site_detected_by"] = describe(site_det)
    return [site]


def workers_back(r: Runs, site: str, recovered: Event
                 ) -> tuple[Optional[float], Optional[list[str]]]:
    """When every worker of a recovered site was back, and by which events:
    the last of their rejoin events, else the first sample with all of them
    joined (no events named); None when neither."""
    back = [first_event(r.events, recovered["unix_s"],
                        ("WORKER_REJOINED", "WORKER_RESTARTED",
                         "WORKER_JOINED_LATE"),
                        lambda e, w=f"{site}/{i}":
                        e.get("subject") == w and e.get("site") == site,
                        before=recovered["unix_s"] + 120)
            for i in range(WORKERS_PER_SITE)]
    if all(back):
        return (max(e["unix_s"] for e in back),
                sorted({e["kind"] for e in back}))
    for s in r.samples[site]:
        if s["unix_s"] >= recovered["unix_s"]:
            if ((s.get("workers_joined") or 0) -
                    (s.get("workers_dead") or 0) >= WORKERS_PER_SITE):
                return s["unix_s"], None
    return None, None


def site_crash(r: Runs, inj: dict, row: dict) -> list[str]:
    """A killed site server: detected by the launcher, recovered when the
    site has recovered from its checkpoint (SITE_RECOVERED), every peer has
    it back and its workers are back. Returns every site."""
    events, t_in = r.events, inj["unix_s"]
    site = subject_site(inj["target"])
    det = first_event(events, t_in, ("PROCESS_FAILED",),
                      lambda e: subject_site(e.get("subject")) == site
                      and not e.get("site"), before=t_in + 60)
    peer_det = first_event(events, t_in, ("PEER_UNREACHABLE",
                                          "PEER_RESTARTED"),
                           lambda e: subject_site(e.get("subject")) == site,
                           before=t_in + 120)
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
        rejoin_t, by = workers_back(r, site, recovered)
        if by:
            row["workers_back_by"] = by
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
        row["recovered_by"] += f"; its {WORKERS_PER_SITE} workers back"
    if rec is None:
        row["notes"].append(
            "not recovered: " + ", ".join(
                str(describe(e)) for e in ends) if ends
            else "no SITE_RECOVERED event")
    row["peer_detected_by"] = describe(peer_det)
    row["peer_detection_s"] = (peer_det["unix_s"] - t_in
                               if peer_det else None)
    row["site_recovery"] = r.recoveries.get(site, {})
    row["site_training_s"] = next(
        (x.get("training_s") for x in (r.report or {}).get("sites", [])
         if x["name"] == site), None)
    return list(SITES)


def traffic_resumed(samples: dict[str, list[dict]],
                    after: float) -> Optional[float]:
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


def wanem_crash(r: Runs, inj: dict, row: dict,
                injections: list[dict]) -> list[str]:
    """A killed emulator: detected by the launcher, recovered when it was
    restarted and every site has heard every peer again; the links' events
    until the next fault are listed. Returns every site."""
    events, t_in = r.events, inj["unix_s"]
    det = first_event(events, t_in, ("PROCESS_FAILED",),
                      lambda e: e.get("subject") == "wanem",
                      before=t_in + 60)
    rec = first_event(events, t_in, ("PROCESS_RESTARTED",),
                      lambda e: e.get("subject") == "wanem",
                      before=t_in + 120)
    row.update(_times(det, rec, t_in, t_in))
    if rec:
        # traffic again: every site heard a new message from every peer
        flowing = traffic_resumed(r.samples, rec["unix_s"])
        row["traffic_resumed_s"] = (flowing - t_in) if flowing else None
        if flowing and flowing > rec["unix_s"]:
            row["recovery_s"] = flowing - t_in
            row["recovered_unix_s"] = flowing
            row["recovered_by"] += "; every site heard every peer again"
    nxt = min([i["unix_s"] for i in injections
               if i["unix_s"] > t_in and i["kind"] in MAIN_KINDS] +
              [t_in + 60])
    side = [e for e in events if t_in - 0.2 <= e["unix_s"] < nxt
            and e["kind"] in ("LINK_RESET", "MESSAGES_RESENT",
                              "PEER_UNREACHABLE", "PEER_REACHABLE")]
    row["side_events"] = [describe(e) for e in side]
    return list(SITES)


def site_cut_off(r: Runs, inj: dict, row: dict) -> list[str]:
    """A partition or a SIGSTOP of a site: detected when a peer finds it
    unreachable (PEER_UNREACHABLE), recovered when every pair that went
    unreachable is reachable again after the fault's end. Returns every
    site."""
    events, t_in = r.events, inj["unix_s"]
    t_end = inj.get("end_unix_s", t_in)
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
    row["unreachable_pairs"] = [f"{a} about {b}" for a, b in sorted(pairs)]
    if inj["kind"] == "sigstop":
        after = [describe(e) for e in events
                 if t_end - 0.2 <= e["unix_s"] <= t_end + 30 and
                 e.get("site") == site and
                 e["kind"] in ("WORKER_DEAD", "WORKER_REJOINED",
                               "PEER_UNREACHABLE", "SERVER_GONE")]
        row["stopped_site_events_after_sigcont"] = after
    return list(SITES)


def slow_link(r: Runs, inj: dict, row: dict) -> list[str]:
    """The slowed link: the threshold's reaction (theta_reaction). Returns
    every site."""
    row.update(theta_reaction(r, inj["unix_s"],
                              inj.get("end_unix_s", inj["unix_s"])))
    return list(SITES)


def theta_reaction(r: Runs, t_in: float, t_end: float) -> dict:
    """The threshold's reaction to the slowed link, from meridian_sync_theta
    sampled once a second at both ends of the link. Its band is what the
    fault-free run's θ did over the same window (± one adaptive step):
    detected when θ leaves the band during the slowdown, recovered when it
    is back in the band after it and stays there."""
    chaos, ff = r.chaos, r.ff
    out = {"theta": {}, "link_load": {}}
    det_t, rec_t, notes = None, None, []
    step = ADAPTIVE_STEP
    for site in SLOW_LINK:
        th = theta_series(r.samples, site)
        ff_th = theta_series(r.ff_samples, site)
        ff_window = [v for t, v in ff_th if ff.t0 and
                     t_in - chaos.t0 - 10 <= t - ff.t0 <=
                     t_end - chaos.t0 + 10]
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
               for s in r.samples.get(a, [])]
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
            res.update({"recovered_by": "meridian_sync_theta back in the "
                        "band", "recovery_s": rec_t - t_end,
                        "recovered_unix_s": rec_t})
        else:
            res.update({"recovered_by": None, "recovery_s": None,
                        "recovered_unix_s": None})
    return res


MAIN_KINDS = (*SITE_CRASHES, "wanem_crash", *TIMED)


def analyse_faults(chaos: Run, ff: Run, report: Optional[dict]) -> list[dict]:
    """One row per injection: detection, recovery, training time lost."""
    r = Runs.of(chaos, ff, report)
    injections = sorted(chaos.injections, key=lambda i: i["unix_s"])
    rows = []
    for inj in injections:
        kind, t_in = inj["kind"], inj["unix_s"]
        t_end = inj.get("end_unix_s", t_in)
        row = {"fault": kind, "target": inj["target"],
               "injected_unix_s": t_in, "offset_s": inj["offset_s"],
               "duration_s": (t_end - t_in) if kind in TIMED else 0.0,
               "detected_by": None, "detection_s": None,
               "recovered_by": None, "recovery_s": None,
               "recovered_unix_s": None, "notes": []}
        if inj.get("note"):
            row["notes"].append(inj["note"])
        if kind == "worker_kill":
            affected = worker_kill(r, inj, row)
        elif kind in SITE_CRASHES:
            affected = site_crash(r, inj, row)
        elif kind == "wanem_crash":
            affected = wanem_crash(r, inj, row, injections)
        elif kind in ("partition", "sigstop"):
            affected = site_cut_off(r, inj, row)
        elif kind == "slow_link":
            affected = slow_link(r, inj, row)
        window_end = row["recovered_unix_s"] or t_end
        if kind in TIMED:
            window_end = max(window_end, t_end)
        extra = None
        if kind == "site_crash":  # the site's lost commits, counted once
            site = subject_site(inj["target"])
            extra = {site: r.recoveries.get(site, {}).get("lost_commits", 0)}
        lost, parts = r.lost_seconds(t_in, window_end, affected, extra)
        row["lost_training_s"] = lost
        row["lost_by_site"] = parts
        row["lost_window_s"] = window_end - t_in
        rows.append(row)
    return rows


def quiet_ratio(chaos: Run, ff: Run, faults: list[dict],
                margin: float = 3.0) -> Optional[dict]:
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


def partition_rates(chaos: Run, ff: Run,
                    faults: list[dict]) -> Optional[dict]:
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
