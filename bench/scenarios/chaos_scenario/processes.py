"""The processes of a run, found in /proc by the run directory their
command lines name (or, for worker and evaluator programs, their
MERIDIAN_OUT), their roles and the ports they listen on; the run's
endpoints.json."""

import json
import os
import re
from typing import Optional


def proc_table() -> dict[int, list[str]]:
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


def program_env(pid: int) -> dict[str, str]:
    """The MERIDIAN_* variables of process `pid` ({} when unreadable): a
    worker or evaluator program's place in its job (docs/python.md)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    env = {}
    for entry in raw.split(b"\0"):
        if entry.startswith(b"MERIDIAN_") and b"=" in entry:
            name, value = entry.decode(errors="replace").split("=", 1)
            env[name] = value
    return env


def run_processes(run_dir: str, table: Optional[dict[int, list[str]]] = None
                  ) -> dict[int, list[str]]:
    """pid -> argv of every process whose command line names run_dir, or
    whose MERIDIAN_OUT is run_dir (a program `meridian run` started)."""
    table = proc_table() if table is None else table
    me = os.getpid()
    return {pid: argv for pid, argv in table.items()
            if pid != me and (any(run_dir in a for a in argv) or
                              program_env(pid).get("MERIDIAN_OUT") ==
                              run_dir)}


def arg_after(argv: list[str], flag: str) -> Optional[str]:
    """The argument after `flag`, None without one."""
    try:
        return argv[argv.index(flag) + 1]
    except (ValueError, IndexError):
        return None


def role_of(argv: list[str]) -> Optional[tuple]:
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


def program_role(pid: int) -> Optional[tuple]:
    """('worker', site, index) / ('evaluator', site) of a program from its
    environment; None for anything else."""
    env = program_env(pid)
    index = env.get("MERIDIAN_WORKER_INDEX", "")
    if env.get("MERIDIAN_ROLE") == "worker":
        return ("worker", env.get("MERIDIAN_SITE"),
                int(index) if index.isdigit() else None)
    if env.get("MERIDIAN_ROLE") == "evaluator":
        return ("evaluator", env.get("MERIDIAN_SITE"))
    return None


def find_pids(run_dir: str, role: tuple) -> list[int]:
    """The pids of the run's processes in `role` (role_of, or
    program_role for the programs of an external model)."""
    return sorted(pid for pid, argv in run_processes(run_dir).items()
                  if (role_of(argv) or program_role(pid)) == role)


def listening_ports() -> dict[int, str]:
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


def socket_owner(inode: str) -> tuple[Optional[int], Optional[str]]:
    """(pid, command line) of the process holding socket `inode`."""
    target = f"socket:[{inode}]"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                if os.readlink(f"/proc/{entry}/fd/{fd}") == target:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ")
                    return int(entry), cmdline.decode(
                        errors="replace").strip()
        except OSError:
            continue
    return None, None


# A port in an address or a command line (tcp://127.0.0.1:7101).
PORT_RE = re.compile(r"(?:127\.0\.0\.1|localhost|\*|0\.0\.0\.0):(\d+)")


def read_endpoints(run_dir: str) -> list[dict]:
    """The processes RUN_DIR/endpoints.json lists (role, site, addresses);
    [] while there is none."""
    try:
        with open(os.path.join(run_dir, "endpoints.json")) as f:
            return json.load(f).get("process", [])
    except (OSError, ValueError):
        return []


def control_endpoint(run_dir: str) -> Optional[str]:
    """The emulator's control address (it changes when wanem restarts)."""
    for p in read_endpoints(run_dir):
        if p.get("role") == "wanem" and p.get("control_address"):
            return p["control_address"]
    return None


def endpoint_ports(run_dir: str) -> set[int]:
    """The ports of the metrics and control addresses endpoints.json
    lists."""
    return {int(port) for p in read_endpoints(run_dir)
            for key in ("metrics_address", "control_address")
            for port in PORT_RE.findall(p.get(key, "") or "")}
