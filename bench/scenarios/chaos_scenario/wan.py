"""Talking to the run's WAN emulator (`meridian wanem ctl`), and the
bandwidth of its links."""

import os
import re
import subprocess
import time
from typing import Optional

from chaos_scenario import log, processes
from scenariolib import reports

# wan/presets.cc, Gbit/s per direction: the fallback when neither
# `wanem ctl status` nor traffic.csv tells the link's bandwidth.
PRESET_GBPS = {("us", "eu"): 1.02, ("us", "ap"): 0.364, ("eu", "ap"): 0.535}
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def wanem_ctl(binary: str, run_dir: str, args: list[str], log_list: list[dict],
              attempts: int = 15) -> dict:
    """Runs `meridian wanem ctl --control EP ARGS`, re-reading the endpoint
    from endpoints.json before each attempt (wanem may have restarted);
    returns (and appends to `log_list`) the last attempt: args, control,
    unix_s, rc, output, attempt."""
    last = None
    for attempt in range(attempts):
        endpoint = processes.control_endpoint(run_dir)
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


def parse_rate(text: str) -> Optional[float]:
    """Bits/s of a rate as wanem prints it ("1.02gbit", "64mbit")."""
    m = re.match(r"^([0-9.]+)([a-z]+)$", text.strip().lower())
    if not m or m.group(2) not in RATE_UNITS:
        return None
    return float(m.group(1)) * RATE_UNITS[m.group(2)]


def link_bandwidth(status_text: Optional[str], run_dir: str, a: str,
                   b: str) -> tuple[float, str]:
    """Bits/s of link a-b, direction a->b, and where that came from: `wanem
    ctl status`, else the newest traffic.csv sample, else the preset
    table."""
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
            for row in reports.traffic(os.path.join(run_dir, name)):
                if row["link"] == link and row["from_site"] == a:
                    best = float(row["bandwidth_bps"])
        except (OSError, KeyError, ValueError):
            continue
    if best:
        return best, "traffic.csv bandwidth_bps"
    return PRESET_GBPS[(a, b)] * 1e9, "wan/presets.cc"
