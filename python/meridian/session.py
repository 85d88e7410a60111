"""meridian.Session: a PyTorch model and its optimizer as one worker of a
Meridian site.

    with meridian.Session(model, optimizer) as session:
        for x, y in session.batches(loader):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            session.step(loss)

Entering the session joins the site server (from the MERIDIAN_*
environment `meridian run` gives the program, or explicit arguments) and
loads the site's model into the model's own tensors. Each step() runs
optimizer.step(), waits out the emulated device's step time, and, when the
site's plan says (every `local_steps` steps or `interval_s` seconds),
commits the change since the model last loaded and loads the site's model
that answers it. The optimizer's state (momentum) is kept across loads, as
the C++ worker keeps its velocity. The session ends when the site says the
job is over (batches() then stops), on SIGTERM (after the current step),
or when the `with` block is left; it then says BYE.
"""

import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional, TypeVar, Union

import torch

from . import wire_pb2
from ._placement import JobArg, Placement, expected_layout, resolve
from .binding import ModelBinding
from .client import Reply, WorkerClient
from .errors import Cancelled, ServerError
from .layout import Layout

_LOG = logging.getLogger("meridian")

# Refused commits in a row after which the session gives up
# (kMaxConsecutiveRejections of the C++ worker).
MAX_CONSECUTIVE_REFUSALS = 5
# Smoothing of the reported loss and commit round trip (kEmaWeight).
_EMA_WEIGHT = 0.1

Batch = TypeVar("Batch")


@dataclass(frozen=True)
class Plan:
    """What the site asks of its worker between commits: commit after
    `local_steps` steps or `interval_s` seconds since the last model
    loaded, whichever comes first (0 disables a trigger; neither: every
    step)."""
    local_steps: int
    interval_s: float


@dataclass(frozen=True)
class SessionStats:
    """A session's counters so far (what it reports to the site).
    Times in seconds; `blocked_s` is the time from the start of each
    commit (computing the change) to its answer, and `commit_overhead_s`
    its moving average."""
    steps: int
    commits: int
    compute_s: float
    device_wait_s: float
    blocked_s: float
    last_loss: float
    commit_overhead_s: float
    commit_bytes: int
    refused_commits: int
    rejoins: int


def _ema(old: float, new: float, first: bool) -> float:
    return new if first else (1 - _EMA_WEIGHT) * old + _EMA_WEIGHT * new


class Session:
    """A model and its optimizer as worker `worker` of site `site`.

    Args:
        model: the nn.Module whose floating-point state_dict tensors the
            site serves (parameters and float buffers; integer buffers
            stay local). It is checked against the site's layout before
            anything connects (LayoutMismatch names the first tensor that
            differs); the layout is the initial-weights file's when one is
            known (weights, $MERIDIAN_WEIGHTS, or the job's
            model.weights), a built-in job model's, else the model's own.
        optimizer: stepped by step(); None when the loop steps it.
        site, worker, connect, job, weights, step_time_s: override
            $MERIDIAN_SITE, $MERIDIAN_WORKER_INDEX, $MERIDIAN_CONNECT,
            $MERIDIAN_JOB (a path or a pb.JobConfig), $MERIDIAN_WEIGHTS and
            $MERIDIAN_STEP_TIME_S (default: the job's worker group's
            step_time_s, else 0).
        secret_key: a CURVE secret key file (default $MERIDIAN_SECRET_KEY);
            the server's key comes from $MERIDIAN_SERVER_PUBLIC_KEY or the
            job file.
        environ: the environment to read instead of os.environ.
        handle_sigterm: on SIGTERM, leave after the current step (the
            handler is installed only in the main thread, and removed when
            the session closes).

    Raises ValueError when a setting is missing or malformed.
    """

    def __init__(self, model: torch.nn.Module,
                 optimizer: Optional[torch.optim.Optimizer] = None, *,
                 site: Optional[str] = None, worker: Optional[int] = None,
                 connect: Optional[str] = None, job: JobArg = None,
                 weights: Optional[str] = None,
                 step_time_s: Optional[float] = None,
                 secret_key: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 handle_sigterm: bool = True):
        self.model = model
        self.optimizer = optimizer
        self.placement: Placement = resolve(
            "worker", job=job, site=site, worker=worker, connect=connect,
            weights=weights, step_time_s=step_time_s, secret_key=secret_key,
            environ=environ)
        self.layout: Layout = expected_layout(model, self.placement)
        self._binding = ModelBinding(model, self.layout)
        self._handle_sigterm = handle_sigterm
        self._previous_handler = None
        self._signalled = False
        self._client: Optional[WorkerClient] = None
        self._running = False
        self._left = False
        self._stop_reason = ""
        self._stats = wire_pb2.WorkerStats()
        self._plan = wire_pb2.CommitPlan()
        self._version = 0
        self._steps_since_commit = 0
        self._loaded_at = time.monotonic()
        self._step_started = time.monotonic()
        self._refusals_in_a_row = 0
        self._refused = 0
        self._rejoins = 0  # of clients closed

    # ---- lifecycle ----------------------------------------------------------
    def __enter__(self) -> "Session":
        self.join()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self._left:
            self._stop_reason = (self._stop_reason or
                                 "%s in the training loop" %
                                 exc_type.__name__)
        self.close()

    def join(self) -> None:
        """Connects to the site server and waits (heartbeating) until the
        site trains; then loads the site's model into the model. Called by
        `with`. A site whose job is already over leaves at once (running
        is then False)."""
        if self._client is not None:
            raise RuntimeError("the session has joined already")
        self._install_sigterm()
        p = self.placement
        self._client = WorkerClient(
            p.endpoint, p.site, p.index, self.layout,
            **p.client_kwargs(stop_requested=lambda: self._signalled))
        try:
            self._client.wait_for_server()
            welcome = self._client.join()
        except Cancelled:
            self._leave("stopped by SIGTERM")
            return
        self._running = True
        if welcome.stop:
            self._leave(welcome.stop_reason or "the job is over")
            return
        self._load(welcome)
        self._step_started = time.monotonic()
        _LOG.info("joined site '%s' as worker %d; model [%s], version %d; "
                  "plan: commit every %d steps / %.2f s", p.site, p.index,
                  self.layout, welcome.version, self._plan.local_steps,
                  self._plan.interval_s)

    def close(self) -> None:
        """Leaves the site (BYE with the statistics) unless it has already,
        and closes the connection. Idempotent; called by `with`."""
        if self._client is not None:
            if not self._left and self._running:
                self._leave(self._stop_reason or "the training loop ended")
            self._rejoins += self._client.rejoins
            self._client.close()
            self._client = None
        self._running = False
        self._restore_sigterm()

    # ---- the training loop's calls ------------------------------------------
    @property
    def running(self) -> bool:
        """True while the site trains this worker: False before joining,
        after the job ended, after SIGTERM, and after close()."""
        return self._running

    def batches(self, loader: Iterable[Batch]) -> Iterator[Batch]:
        """The loader's batches, epoch after epoch (iterating it again at
        the end of each), while the session runs: the loop ends when the
        job does. ValueError when the loader yields nothing."""
        while self._running:
            empty = True
            for batch in loader:
                empty = False
                if not self._running:
                    return
                yield batch
            if empty:
                raise ValueError("the loader yielded no batch")

    def step(self, loss: Union[None, float, torch.Tensor] = None) -> bool:
        """One training step: optimizer.step() (when the session has the
        optimizer), the step's bookkeeping (`loss`, if given, feeds the
        reported moving average), the emulated device's remaining step
        time, a heartbeat when due, and, when the plan says, a commit and
        the load of the site's model. Returns `running`."""
        if not self._running:
            return False
        if self.optimizer is not None:
            self.optimizer.step()
        now = time.monotonic()
        self._stats.compute_s += now - self._step_started
        step_time = self.placement.step_time_s
        if step_time > 0 and now < self._step_started + step_time:
            time.sleep(self._step_started + step_time - now)
            self._stats.device_wait_s += self._step_started + step_time - now
        if loss is not None:
            value = float(loss.detach()) if isinstance(loss, torch.Tensor) \
                else float(loss)
            if math.isfinite(value):
                self._stats.last_loss = _ema(self._stats.last_loss, value,
                                             self._stats.steps == 0)
        self._stats.steps += 1
        self._steps_since_commit += 1
        if self._signalled:
            self._leave("stopped by SIGTERM")
            return False
        self._client.heartbeat_if_idle()
        if self._commit_due():
            self._commit()
        self._step_started = time.monotonic()
        return self._running

    def commit(self) -> bool:
        """Commits the change since the last load now, whatever the plan,
        and loads the site's answer. Returns `running`."""
        if self._running:
            self._commit()
            self._step_started = time.monotonic()
        return self._running

    # ---- what the loop may read ---------------------------------------------
    @property
    def stop_reason(self) -> str:
        """Why the session ended ("" while running)."""
        return "" if self._running else self._stop_reason

    @property
    def model_version(self) -> int:
        """The version of the site's model last loaded (commits applied)."""
        return self._version

    @property
    def plan(self) -> Plan:
        """The site's current plan."""
        return Plan(self._plan.local_steps, self._plan.interval_s)

    @property
    def stats(self) -> SessionStats:
        """The counters so far."""
        s = self._stats
        return SessionStats(s.steps, s.commits, s.compute_s, s.device_wait_s,
                            s.blocked_s, s.last_loss, s.commit_overhead_s,
                            s.commit_bytes, self._refused,
                            self._rejoins + (self._client.rejoins
                                             if self._client else 0))

    @property
    def site(self) -> str:
        """The site's name."""
        return self.placement.site

    @property
    def worker_index(self) -> int:
        """This worker's index inside its site."""
        return self.placement.index

    # ---- internals ----------------------------------------------------------
    def _commit_due(self) -> bool:
        plan = self._plan
        if plan.local_steps == 0 and plan.interval_s <= 0:
            return True
        if plan.local_steps > 0 and \
                self._steps_since_commit >= plan.local_steps:
            return True
        return plan.interval_s > 0 and \
            time.monotonic() - self._loaded_at >= plan.interval_s

    def _load(self, reply: Reply) -> None:
        # The client checked the reply (frames, layout, finite values).
        self._binding.load(reply.arrays, check_finite=False)
        self._version = reply.version
        self._plan = reply.plan
        self._steps_since_commit = 0
        self._loaded_at = time.monotonic()

    def _record_round_trip(self, started: float) -> None:
        round_trip = time.monotonic() - started
        self._stats.blocked_s += round_trip
        self._stats.commit_overhead_s = _ema(self._stats.commit_overhead_s,
                                             round_trip,
                                             self._stats.commits == 0)

    def _commit(self) -> None:
        started = time.monotonic()
        delta = self._binding.delta()
        self._stats.commit_bytes += 4 * self.layout.num_elements
        try:
            # The server refuses a non-finite change (ERROR_NON_FINITE):
            # handled below as any refusal.
            reply = self._client.commit(delta, self._version,
                                        max(1, self._steps_since_commit),
                                        self._stats,
                                        clock=self._stats.commits,
                                        check_finite=False)
        except ServerError as error:
            self._record_round_trip(started)
            self._refused_commit(error)
            return
        except Cancelled:
            self._leave("stopped by SIGTERM")
            return
        self._record_round_trip(started)
        self._stats.commits += 1
        self._refusals_in_a_row = 0
        if reply.stop:
            self._leave(reply.stop_reason or "the job is over")
            return
        self._load(reply)

    def _refused_commit(self, error: ServerError) -> None:
        """The update is dropped; the model is pulled again, unless the
        site keeps refusing."""
        self._refused += 1
        self._refusals_in_a_row += 1
        _LOG.error("commit of %d steps dropped by the site server: %s: %s",
                   self._steps_since_commit, error.code_name, error.message)
        if self._refusals_in_a_row >= MAX_CONSECUTIVE_REFUSALS:
            self._leave("the site refused %d commits in a row" %
                        self._refusals_in_a_row)
            raise error
        try:
            pulled = self._client.pull()
        except Cancelled:
            self._leave("stopped by SIGTERM")
            return
        if pulled.stop:
            self._leave(pulled.stop_reason or "the job is over")
            return
        self._load(pulled)

    def _leave(self, reason: str) -> None:
        self._stop_reason = reason
        self._running = False
        if self._left or self._client is None:
            return
        self._left = True
        _LOG.info("leaving (%s) after %d steps and %d commits", reason,
                  self._stats.steps, self._stats.commits)
        self._client.bye(self._stats)

    def _install_sigterm(self) -> None:
        if not self._handle_sigterm or \
                threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum, frame):
            self._signalled = True

        self._previous_handler = signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
