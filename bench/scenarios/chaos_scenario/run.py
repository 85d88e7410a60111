"""One run of the chaos scenario's job: launched, sampled, waited for,
saved, loaded back for --reanalyse, and stopped on Ctrl-C."""

import json
import os
import shutil
import signal
import subprocess
import time
from typing import Optional

from chaos_scenario import log, processes, sampler, wan
from chaos_scenario.job import (PROGRAM_START_TIMEOUT_S, job_text,
                                write_weights)
from scenariolib import runner

START_TIMEOUT_S = 240.0     # launch to every site committing


class Run:
    """One run of the job (fault-free or chaos) in OUTDIR/NAME: the
    `meridian run` launcher, its Sampler, and what was injected into it.
    Driven by the script's main thread; the Sampler's threads only sample.
    wait() saves samples.jsonl and injections.json in the run directory,
    load() reads them back (--reanalyse)."""

    def __init__(self, binary: str, outdir: str, name: str, budget: float,
                 workload: str = "builtin"):
        self.binary = binary
        self.name = name
        self.workload = workload  # job.WORKLOADS
        self.dir = os.path.abspath(os.path.join(outdir, name))
        self.budget = budget
        self.job = os.path.join(self.dir, "job.pbtxt")
        self.proc = None
        self.sampler = None
        self.t0 = None            # Unix time every site committed
        self.started = 0.0        # Unix time of the launch
        self.out = None           # launcher.out, while running
        self.injections = []      # what inject.Injector did (dicts)
        self.ctl_log = []         # every `wanem ctl` (wan.wanem_ctl)
        self.stopped_pids = set() # SIGSTOPped, to SIGCONT on abort
        self.exit_code = None
        self.wall_s = None
        self.binary_at_start = self.binary_at_end = None

    def prepare(self) -> None:
        """An empty run directory with the job file (and for pytorch-mlp
        the initial weights next to it), validated."""
        if os.path.isdir(self.dir):
            left = processes.run_processes(self.dir)
            if left:
                raise SystemExit(f"[chaos] processes of an earlier run still "
                                 f"use {self.dir}: {sorted(left)}")
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        name = f"three-regions-{self.name}"
        if self.workload == "pytorch-mlp":
            write_weights(self.binary, self.dir, name, self.budget)
        with open(self.job, "w") as f:
            f.write(job_text(name, self.budget, self.workload))
        ok, output = runner.validate(self.binary, self.job)
        if not ok:
            raise SystemExit(f"[chaos] {self.job} is not valid:\n{output}")

    def binary_stamp(self) -> Optional[list[float]]:
        """[mtime, size] of the binary: a rebuild during the run shows."""
        try:
            st = os.stat(self.binary)
            return [st.st_mtime, st.st_size]
        except OSError:
            return None

    def launch(self) -> None:
        """Starts `meridian run` and the sampler."""
        self.binary_at_start = self.binary_stamp()
        self.out = open(os.path.join(self.dir, "launcher.out"), "w")
        self.started = time.time()
        # The job file's absolute path is in every child's command line, or
        # (worker and evaluator programs) in its MERIDIAN_JOB, which is how
        # the processes of this run are found in /proc.
        self.proc = subprocess.Popen([self.binary, "run", self.job, "--out",
                                      self.dir], stdout=self.out,
                                     stderr=subprocess.STDOUT)
        self.sampler = sampler.Sampler(self.dir)
        self.sampler.start()
        log(f"{self.name}: started `meridian run {self.job} --out {self.dir}`"
            f" (pid {self.proc.pid})")

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_training(self) -> bool:
        """Waits until every site commits (t0); False when that does not
        happen within START_TIMEOUT_S (PROGRAM_START_TIMEOUT_S for
        pytorch-mlp) or the run ends first."""
        deadline = time.time() + (PROGRAM_START_TIMEOUT_S
                                  if self.workload == "pytorch-mlp"
                                  else START_TIMEOUT_S)
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

    def sleep_until(self, offset: float) -> bool:
        """Sleeps until t0 + offset; False if the run ended first."""
        while self.running():
            left = self.t0 + offset - time.time()
            if left <= 0:
                return True
            time.sleep(min(left, 0.5))
        return False

    def wait(self) -> None:
        """Waits for the run's end; saves what was sampled and injected."""
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

    def load(self) -> None:
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
        self.sampler = sampler.Sampler(self.dir)
        self.sampler.ports = set(saved.get("ports", []))
        with open(os.path.join(self.dir, "samples.jsonl")) as f:
            self.sampler.samples = [json.loads(line) for line in f
                                    if line.strip()]

    def abort(self) -> None:
        """Ctrl-C or an error of the script: leave nothing stopped or
        running."""
        for pid in list(self.stopped_pids):
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        if self.proc:
            runner.stop(self.proc)
        if self.sampler:
            self.sampler.finish()

    def note_route_ports(self) -> None:
        """The emulator's route ports and the sites' mirror ports (from
        `wanem ctl status`), to check afterwards that none still listens."""
        if not self.running():
            return
        status = wan.wanem_ctl(self.binary, self.dir, ["status"],
                               self.ctl_log, attempts=3)
        if status and status.get("rc") == 0:
            ports = processes.PORT_RE.findall(status["output"])
            with self.sampler.lock:
                self.sampler.ports.update(int(p) for p in ports)
