"""Clients of a Meridian site server's worker endpoint
(docs/worker-protocol.md): the low-level protocol, for authors of
clients and for the PyTorch layer of this package (meridian.Session,
meridian.Evaluator) built on it.

WorkerClient speaks the worker protocol over one ZeroMQ DEALER socket:
it joins (HELLO, then WELCOME once the site trains), commits the
accumulated change (COMMIT, answered with MODEL), pulls (PULL, MODEL),
leaves (BYE), and keeps the rules a C++ worker keeps (src/worker/):

- one request in flight; sequence numbers 1, 2, 3 ... per client, HELLO
  included (HEARTBEATs carry 0: they are outside the request numbering);
- a HEARTBEAT whenever nothing was sent for heartbeat_interval_s, also
  while waiting for a reply (the server declares a silent worker dead);
  the server's HEARTBEATs while it holds a reply are skipped, never taken
  for the reply;
- the server is taken for gone after server_timeout_s without any
  message from it (no reply, no HEARTBEAT);
- when it is gone, or answers ERROR_UNKNOWN_SENDER (it restarted, or
  declared this worker dead, or the connection changed underneath), the
  client joins again over a new connection with the same incarnation,
  with backoff, giving up after give_up_s of absence; an unanswered
  COMMIT is then sent again with its commit_id unless WELCOME's
  last_commit_id says it was applied.

EvaluatorClient is a site's evaluator (sender role ROLE_EVALUATOR, id 0)
over the same connection rules: HELLO with its layout is answered with an
EVAL_TASK (a snapshot of the site's model to evaluate, held until there is
one), each EVAL_RESULT with the next EVAL_TASK, until a task says stop.

Payload frames go out without a copy (the arrays given are sent with
copy=False: leave them alone until the reply came) and replies come back
as read-only views of the received frames.

Not thread-safe: one thread uses a client. Errors are exceptions:
ServerError (an ERROR reply: its code name and message), ServerGone,
Cancelled, LayoutMismatch, ProtocolError.
"""

import logging
import os
import secrets
import stat
import time
from dataclasses import dataclass, field
from typing import (Callable, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import numpy as np
import zmq

from . import report_pb2, wire_pb2
from .errors import (Cancelled, LayoutMismatch, ProtocolError, ServerError,
                     ServerGone)
from ._undurable import UndurableCommits, durable_point
from .layout import Layout, tensor_slice
from .protocol import (all_finite, as_float32_le, check_model_slices, decode,
                       describe, encode, error_name, make_header)

_LOG = logging.getLogger("meridian")

# Backoff of probes and rejoin HELLOs (kFirstProbeWait, kMaxProbeWait).
_FIRST_PROBE_WAIT_S = 1.0
_MAX_PROBE_WAIT_S = 30.0
# Pauses before sending again a request the server answered with
# ERROR_BUSY (as the C++ RpcClient).
_FIRST_BUSY_PAUSE_S = 0.05
_MAX_BUSY_PAUSE_S = 1.0
# Longest single wait on the socket: how promptly heartbeats go out and a
# stop request is noticed.
_POLL_SLICE_S = 0.05
# ZMQ_LINGER of a closed connection (kSocketCloseLingerMs).
_CLOSE_LINGER_MS = 100


@dataclass
class Reply:
    """A WELCOME or MODEL. `arrays`: the whole model, one read-only
    float32 view per tensor in layout order (empty for a partial PULL or a
    stop); `slices`: the received (pb.TensorSlice, values) pairs in order;
    `params`: the whole model as one flat float32 array (a copy made on
    access; None for a partial PULL or a stop)."""
    type: int
    header: wire_pb2.Header
    version: int
    plan: wire_pb2.CommitPlan
    stop: bool = False
    stop_reason: str = ""
    arrays: List[np.ndarray] = field(default_factory=list)
    slices: List[Tuple[wire_pb2.TensorSlice, np.ndarray]] = field(
        default_factory=list)
    # WELCOME only.
    site_workers: int = 0
    last_commit_id: int = 0
    # The answer came from a WELCOME after this client joined again.
    rejoined: bool = False

    @property
    def is_welcome(self) -> bool:
        """Whether this is a WELCOME (a join's answer) rather than a MODEL."""
        return self.type == wire_pb2.WELCOME

    @property
    def params(self) -> Optional[np.ndarray]:
        """The whole model, flat float32 in layout order (a new array), or
        None when the reply does not carry the whole model."""
        if not self.arrays:
            return None
        return np.concatenate(self.arrays).astype(np.float32)


@dataclass
class EvalTask:
    """An EVAL_TASK: evaluate the site's model of version `model_version`
    (`arrays`: one read-only float32 view per tensor, layout order) on
    `split` (wire_pb2.VALIDATION or TRAINING_SAMPLE). With `stop` the job
    is over: no model, the evaluator exits."""
    task_id: int
    split: int
    model_version: int
    stop: bool = False
    stop_reason: str = ""
    arrays: List[np.ndarray] = field(default_factory=list)
    header: Optional[wire_pb2.Header] = None
    # The task came as the answer to a HELLO after this client joined again.
    rejoined: bool = False

    @property
    def split_name(self) -> str:
        """"validation" or "training_sample"."""
        return {wire_pb2.VALIDATION: "validation",
                wire_pb2.TRAINING_SAMPLE: "training_sample"}.get(
                    self.split, "split %d" % self.split)


@dataclass(frozen=True)
class CurveKeys:
    """CURVE keys of a client of an encrypted worker endpoint, each 40
    characters of Z85: the client's own pair and the server's public key
    (the site's curve_public_key)."""
    secret_key: str
    public_key: str
    server_key: str

    @staticmethod
    def from_files(secret_key_file: str, server_key: str) -> "CurveKeys":
        """The pair whose secret half is in `secret_key_file` (what
        `meridian keygen` writes: '#' comment lines and one key line; mode
        0600, as the C++ roles require) and the server's key."""
        secret = read_key_file(secret_key_file)
        public = zmq.curve_public(secret.encode()).decode()
        return CurveKeys(secret, public, server_key)


def read_key_file(path: str) -> str:
    """The one key line of a CURVE key file. ValueError when the file is
    readable by group or others, or does not hold exactly one Z85 key."""
    info = os.stat(path)
    if info.st_mode & 0o077:
        raise ValueError("secret key file '%s' has mode %o: a secret key must "
                         "not be accessible to group or others (fix: chmod "
                         "600 '%s')" % (path, stat.S_IMODE(info.st_mode),
                                        path))
    keys = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    if len(keys) != 1 or len(keys[0]) != 40:
        raise ValueError("secret key file '%s' must hold exactly one CURVE "
                         "key line (40 Z85 characters) besides '#' comments"
                         % path)
    return keys[0]


def random_incarnation() -> int:
    """A random non-zero 64-bit number (HELLO.incarnation): one per process."""
    value = 0
    while value == 0:
        value = secrets.randbits(64)
    return value


class _Channel:
    """One client of a site server's worker endpoint: its DEALER socket,
    request numbering, heartbeats and the liveness rules of waiting for a
    reply. WorkerClient and EvaluatorClient add their requests."""

    def __init__(self, endpoint: str, sender: wire_pb2.Endpoint,
                 heartbeat_interval_s: float = 1.0,
                 server_timeout_s: float = 10.0, give_up_s: float = 600.0,
                 incarnation: int = 0,
                 stop_requested: Optional[Callable[[], bool]] = None,
                 context: Optional[zmq.Context] = None,
                 curve: Optional[CurveKeys] = None):
        self.endpoint = endpoint
        self.heartbeat_interval_s = heartbeat_interval_s
        self.server_timeout_s = server_timeout_s
        self.give_up_s = give_up_s
        self.incarnation = incarnation or random_incarnation()
        self.stop_requested = stop_requested or (lambda: False)
        self.curve = curve
        self._self = sender
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket: Optional[zmq.Socket] = None
        self._sequence = 0         # of the last request sent
        self._last_send: Optional[float] = None  # monotonic, last send
        self._joined = False       # holds a slot (heartbeats make sense)
        self._must_rejoin = ""     # why, when the server told us so
        self.rejoins = 0

    @staticmethod
    def _timeouts_of(job, kwargs: Dict) -> Dict:
        """kwargs with the liveness settings of pb.JobConfig `job`'s
        fault { } filled in (invalid values keep the defaults, as
        WorkerTimeouts does)."""
        fault = job.fault

        def positive(value, default):
            return value if value > 0 and value == value else default

        kwargs.setdefault("heartbeat_interval_s",
                          positive(fault.heartbeat_interval_s, 1.0))
        kwargs.setdefault("server_timeout_s",
                          positive(fault.server_timeout_s, 10.0))
        give_up = fault.worker_give_up_s
        kwargs.setdefault("give_up_s", give_up if give_up >= 0 else 600.0)
        return kwargs

    # ---- connection ------------------------------------------------------
    def _connect(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        # Not 0: libzmq 4.3 aborts the process when a socket closed with
        # linger 0 is mid-way through a multipart message and its connection
        # fails at that moment (zeromq/libzmq#3442). A short linger may
        # deliver a queued request on the old connection too; the site
        # applies a commit once per commit id (include/meridian/core/
        # socket_close.h).
        sock.setsockopt(zmq.LINGER, _CLOSE_LINGER_MS)
        # A request the socket cannot queue within the silence timeout
        # fails instead of blocking forever.
        sock.setsockopt(zmq.SNDTIMEO, int(self.server_timeout_s * 1000))
        if self.curve is not None:
            sock.curve_secretkey = self.curve.secret_key.encode()
            sock.curve_publickey = self.curve.public_key.encode()
            sock.curve_serverkey = self.curve.server_key.encode()
        sock.connect(self.endpoint)
        self._socket = sock

    def reconnect(self) -> None:
        """Drops the connection and whatever it still owes; the next
        request opens a new one (a new peer to the server: it must join
        again before anything but STATUS_REQUEST)."""
        if self._socket is not None:
            self._socket.close(0)
        self._socket = None

    def close(self) -> None:
        """Closes the socket (and the context, when the client made it)."""
        self.reconnect()
        if self._own_context:
            self._context.term()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- sending -----------------------------------------------------------
    def _send(self, header: wire_pb2.Header,
              payloads: Sequence[np.ndarray] = ()) -> None:
        if self._socket is None:
            self._connect()
        frames = encode(header, payloads)
        try:
            # Payload arrays go out without a copy (pyzmq copies small
            # frames anyway); the caller keeps them until the reply.
            self._socket.send_multipart(frames, copy=False)
        except zmq.Again:
            self.reconnect()
            raise ServerGone("cannot send %s to %s within %.1f s" %
                             (describe(header), self.endpoint,
                              self.server_timeout_s)) from None
        self._last_send = time.monotonic()

    def _stamp(self, header: wire_pb2.Header) -> wire_pb2.Header:
        self._sequence += 1
        header.protocol_version = wire_pb2.PROTOCOL_VERSION_CURRENT
        header.sender.CopyFrom(self._self)
        header.sequence = self._sequence
        return header

    def heartbeat_if_idle(self) -> None:
        """Sends a HEARTBEAT when this client has sent nothing for
        heartbeat_interval_s and holds a slot. Never blocks: a heartbeat
        the socket cannot take now is dropped. Call it between training
        steps (waits inside the client heartbeat on their own)."""
        if not self._joined or self._socket is None:
            return
        now = time.monotonic()
        if (self._last_send is not None and
                now - self._last_send < self.heartbeat_interval_s):
            return
        # Sequence 0: heartbeats are outside the request numbering.
        heartbeat = make_header(wire_pb2.HEARTBEAT, self._self, 0)
        heartbeat.heartbeat.SetInParent()
        try:
            self._socket.send(heartbeat.SerializeToString(), zmq.NOBLOCK)
            self._last_send = now
        except zmq.Again:
            pass

    # ---- receiving ---------------------------------------------------------
    def _receive(self, timeout_s: float):
        """One decoded message within `timeout_s`, or None."""
        if not self._socket.poll(int(timeout_s * 1000), zmq.POLLIN):
            return None
        frames = self._socket.recv_multipart(copy=False)
        return decode(frames)

    def _drain_stray(self) -> None:
        """Reads what arrived while no request was in flight: HEARTBEATs
        (ignored) and an ERROR_UNKNOWN_SENDER answering one of our
        heartbeats (the server does not know this connection: join again
        before the next request)."""
        if self._socket is None:
            return
        while True:
            try:
                received = self._receive(0)
            except ProtocolError as error:
                _LOG.warning("malformed message from the server ignored: %s",
                             error)
                continue
            if received is None:
                return
            header, _ = received
            if (header.type == wire_pb2.ERROR and
                    header.error.code == wire_pb2.ERROR_UNKNOWN_SENDER):
                self._must_rejoin = header.error.message
            elif header.type != wire_pb2.HEARTBEAT:
                _LOG.debug("dropped a late %s", describe(header))

    def _call(self, header: wire_pb2.Header,
              payloads: Sequence[np.ndarray] = (),
              silence_timeout_s: Optional[float] = None):
        """Sends a request and waits for its reply while the server shows
        it is alive (see the module comment). Returns (header, payload).
        ServerGone after `silence_timeout_s` (default server_timeout_s) of
        silence, with the connection dropped so that a late reply cannot
        answer a later request; Cancelled on a stop request. A request
        without payloads that the server answers with ERROR_BUSY (nothing
        was done) is sent again after a pause (50 ms, doubling up to 1 s)
        as long as the server keeps answering so."""
        pause = _FIRST_BUSY_PAUSE_S
        while True:
            reply, payload = self._call_once(header, payloads,
                                             silence_timeout_s)
            if (payloads or reply.type != wire_pb2.ERROR or
                    reply.error.code != wire_pb2.ERROR_BUSY):
                return reply, payload
            until = time.monotonic() + pause
            while time.monotonic() < until:
                if self.stop_requested():
                    raise Cancelled("stopped while the server was busy "
                                    "with " + describe(header))
                time.sleep(0.02)
            pause = min(pause * 2, _MAX_BUSY_PAUSE_S)

    def _call_once(self, header: wire_pb2.Header,
                   payloads: Sequence[np.ndarray],
                   silence_timeout_s: Optional[float]):
        """One request and its reply (_call without the retries after
        ERROR_BUSY)."""
        silence = silence_timeout_s or self.server_timeout_s
        self._drain_stray()
        self._stamp(header)
        self._send(header, payloads)
        request = describe(header)
        heard = looked = time.monotonic()
        while True:
            if self.stop_requested():
                raise Cancelled("stopped while waiting for the reply to " +
                                request)
            now = time.monotonic()
            # A stall of this process (stopped, starved) is not the
            # server's silence: the wait starts afresh.
            if now - looked > silence / 4:
                heard = now
            looked = now
            if now - heard > silence:
                self.reconnect()
                raise ServerGone("nothing from %s for %.1f s while waiting "
                                 "for the reply to %s" %
                                 (self.endpoint, now - heard, request))
            if self._joined or header.type == wire_pb2.HELLO:
                self._joined = True  # a HELLO waiting for its answer holds it
                self.heartbeat_if_idle()
            try:
                received = self._receive(_POLL_SLICE_S)
            except ProtocolError as error:
                raise ProtocolError("reply to %s: %s" % (request, error))
            if received is None:
                continue
            heard = time.monotonic()
            reply, payload = received
            if reply.type == wire_pb2.HEARTBEAT:
                continue  # alive, still holding our reply
            if reply.type == wire_pb2.ERROR:
                rejected = reply.error.rejected_sequence
                if rejected not in (0, header.sequence):
                    _LOG.debug("dropped a late ERROR for sequence %d",
                               rejected)
                    continue
            return reply, payload

    @staticmethod
    def _rejoin_reason(reply) -> str:
        header, _ = reply
        if (header.type == wire_pb2.ERROR and
                header.error.code == wire_pb2.ERROR_UNKNOWN_SENDER):
            return ("it does not know this connection: " +
                    header.error.message)
        return ""

    def _refused(self, request: wire_pb2.Header, reply: wire_pb2.Header,
                 commit_id: Optional[int] = None) -> ServerError:
        return ServerError(describe(request), reply.error.code,
                           reply.error.message, reply.error.rejected_sequence,
                           commit_id)

    # ---- requests ----------------------------------------------------------
    def status(self, timeout_s: float = 5.0) -> report_pb2.SiteStatus:
        """STATUS_REQUEST: the site's progress (answered to anyone).
        ServerGone when no answer comes within timeout_s."""
        header = wire_pb2.Header(type=wire_pb2.STATUS_REQUEST)
        reply, _ = self._call(header, silence_timeout_s=timeout_s)
        if reply.type == wire_pb2.ERROR:
            raise self._refused(header, reply)
        if reply.type != wire_pb2.STATUS_REPLY:
            raise ProtocolError("expected STATUS_REPLY, got " +
                                describe(reply))
        return reply.status

    def wait_for_server(self) -> report_pb2.SiteStatus:
        """Probes with STATUS_REQUEST until the server answers, waiting 1,
        2, 4 ... 30 s for each answer (it may start after the client).
        Cancelled on a stop request."""
        wait = _FIRST_PROBE_WAIT_S
        attempt = 1
        while True:
            try:
                return self.status(timeout_s=wait)
            except ServerGone:
                pass
            _LOG.warning("waiting for the site server at %s: no answer "
                         "within %.0f s (attempt %d)", self.endpoint, wait,
                         attempt)
            wait = min(wait * 2, _MAX_PROBE_WAIT_S)
            attempt += 1

    def _hello(self, layout: Layout, index: int,
               silence_timeout_s: Optional[float]):
        """Sends HELLO and returns its answer (header, payload), or raises
        ServerError for a refusal, ServerGone for silence or a heartbeat's
        ERROR_UNKNOWN_SENDER that overtook the HELLO on a new connection."""
        header = wire_pb2.Header(type=wire_pb2.HELLO)
        header.hello.worker_index = index
        header.hello.incarnation = self.incarnation
        layout.to_specs(header.hello.layout)
        reply, payload = self._call(header,
                                    silence_timeout_s=silence_timeout_s)
        if reply.type == wire_pb2.ERROR:
            if (reply.error.code == wire_pb2.ERROR_UNKNOWN_SENDER and
                    reply.error.rejected_sequence == 0):
                # It answers a heartbeat that overtook the HELLO on a new
                # connection: not a refusal of the HELLO.
                self.reconnect()
                raise ServerGone("the connection changed while joining: " +
                                 reply.error.message)
            self._joined = False
            raise self._refused(header, reply)
        self._must_rejoin = ""
        return reply, payload

    def _join_with_backoff(self, hello: Callable[[Optional[float]], object],
                           why: str, absent_since: Optional[float]):
        """Calls hello(silence_timeout_s) over a new connection each time,
        with backoff, until it answers (returned). ServerGone once the
        server has been absent for give_up_s since `absent_since`
        (monotonic; default now); ServerError when the HELLO is refused."""
        self.rejoins += 1
        absent_since = time.monotonic() if absent_since is None else \
            absent_since
        _LOG.warning("site server gone: %s; joining again as the same "
                     "process", why)
        wait = min(_FIRST_PROBE_WAIT_S, self.server_timeout_s)
        max_wait = max(_MAX_PROBE_WAIT_S, self.server_timeout_s)
        attempt = 1
        while True:
            if self.stop_requested():
                raise Cancelled("stopped while rejoining the site server")
            absent = time.monotonic() - absent_since
            if self.give_up_s > 0 and absent > self.give_up_s:
                raise ServerGone("site server at %s gone for %.1f s; giving "
                                 "up (fault.worker_give_up_s = %.1f)" %
                                 (self.endpoint, absent, self.give_up_s))
            self.reconnect()
            started = time.monotonic()
            try:
                answer = hello(wait)
                _LOG.info("rejoined after %.1f s (attempt %d)", absent,
                          attempt)
                return answer
            except ServerGone as gone:
                _LOG.warning("no answer to HELLO from %s (attempt %d): %s",
                             self.endpoint, attempt, gone)
            left = wait - (time.monotonic() - started)
            if left > 0:
                time.sleep(left)
            wait = min(wait * 2, max_wait)
            attempt += 1

    def bye(self, stats: Optional[wire_pb2.WorkerStats] = None,
            timeout_s: float = 5.0) -> bool:
        """BYE (with the final statistics); waits up to timeout_s for the
        server's BYE (skipping anything else still owed, e.g. the reply
        of a cancelled request). Best effort, not cancellable; True when
        acknowledged."""
        header = wire_pb2.Header(type=wire_pb2.BYE)
        header.bye.SetInParent()
        if stats is not None:
            header.bye.stats.CopyFrom(stats)
        try:
            self._stamp(header)
            self._send(header)
        except ServerGone:
            return False
        self._joined = False
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                received = self._receive(min(_POLL_SLICE_S, max(
                    0.0, deadline - time.monotonic())))
            except ProtocolError:
                continue
            if received is None:
                continue
            reply, _ = received
            if reply.type == wire_pb2.BYE:
                return True
            if (reply.type == wire_pb2.ERROR and
                    reply.error.rejected_sequence == header.sequence):
                _LOG.warning("BYE refused: %s: %s",
                             error_name(reply.error.code),
                             reply.error.message)
                return False
        _LOG.warning("no BYE acknowledgement within %.1f s", timeout_s)
        return False


Change = Union[np.ndarray, Sequence[np.ndarray], Mapping[str, np.ndarray]]


class WorkerClient(_Channel):
    """Worker `index` of site `site` against the site server at `endpoint`
    ("tcp://host:port"), for a model of `layout`.

    heartbeat_interval_s, server_timeout_s and give_up_s are the job's
    fault { heartbeat_interval_s server_timeout_s worker_give_up_s }
    (from_job reads them). `incarnation` 0 picks a random one; keep it for
    the life of the process. `stop_requested`, when given, is polled while
    waiting: once true the wait ends with Cancelled. `curve`: the keys of
    a CURVE worker endpoint (None: plaintext).
    """

    def __init__(self, endpoint: str, site: str, index: int, layout: Layout,
                 **kwargs):
        super().__init__(endpoint, wire_pb2.Endpoint(
            site=site, role=wire_pb2.ROLE_WORKER, id=index), **kwargs)
        self.layout = layout
        self.last_commit_id = 0    # of the last COMMIT sent (1, 2, 3 ...)
        # Answered commits the site holds in no durable checkpoint yet,
        # replayed after a rejoin (docs/worker-protocol.md §14); kept only
        # while the site's replies carry durable points.
        self._undurable = UndurableCommits()
        self._keeps = False

    @classmethod
    def from_job(cls, job, site: str, index: int, layout: Layout,
                 endpoint: str, **kwargs) -> "WorkerClient":
        """A client with the liveness settings of pb.JobConfig `job`'s
        fault { }; other keyword arguments as the constructor's."""
        return cls(endpoint, site, index, layout,
                   **cls._timeouts_of(job, kwargs))

    def _welcome(self, silence_timeout_s: Optional[float] = None) -> Reply:
        reply, payload = self._hello(self.layout, self._self.id,
                                     silence_timeout_s)
        if reply.type == wire_pb2.MODEL and reply.model.stop:
            return Reply(wire_pb2.MODEL, reply, reply.model.version,
                         reply.model.plan, True, reply.model.stop_reason)
        if reply.type != wire_pb2.WELCOME:
            raise ProtocolError("expected WELCOME, got " + describe(reply))
        welcome = reply.welcome
        theirs = Layout.from_specs(welcome.layout)
        if theirs != self.layout:
            self._joined = False
            raise LayoutMismatch(
                "the site server's model differs from this worker's (%s): "
                "[%s] there, [%s] here" % (self.layout.first_difference(
                    theirs), theirs, self.layout))
        arrays = check_model_slices(reply, payload, self.layout,
                                    whole_model=True)
        return Reply(wire_pb2.WELCOME, reply, welcome.model_version,
                     welcome.plan, welcome.stop,
                     "the job is over" if welcome.stop else "", arrays,
                     list(zip(reply.slices, arrays)), welcome.site_workers,
                     welcome.last_commit_id)

    def join(self) -> Reply:
        """HELLO, and the WELCOME once the site trains: the server holds
        the HELLO until every worker it expects has joined (or
        server.join_timeout_s passed with fault.min_workers), and
        heartbeats meanwhile. Returns the WELCOME (model, version, plan,
        last_commit_id); a reply with stop=True means the job ended before
        this worker trained (say bye()). ServerError when refused (not a
        worker of the site, another process took the index, the job is
        over), LayoutMismatch, ServerGone after give_up_s."""
        _LOG.info("joining the site server at %s as %s/%d (incarnation %d)",
                  self.endpoint, self._self.site, self._self.id,
                  self.incarnation)
        try:
            welcome = self._welcome()
            self._note_point(welcome.header)
            return welcome
        except ServerGone as gone:
            return self.rejoin(str(gone), time.monotonic() -
                               self.server_timeout_s)

    def rejoin(self, why: str, absent_since: Optional[float] = None) -> Reply:
        """Joins again as the same process over a new connection, with
        backoff, until a WELCOME (returned, checked, rejoined=True).
        ServerGone once the server has been absent for give_up_s since
        `absent_since` (monotonic; default now); ServerError when the
        HELLO is refused."""
        while True:
            welcome = self._join_with_backoff(self._welcome, why,
                                              absent_since)
            _LOG.info("the site applied this process's commits up to id %d",
                      welcome.last_commit_id)
            why = self._replay(welcome)
            if not why:
                break
            absent_since = time.monotonic()
        welcome.rejoined = True
        self._note_point(welcome.header)
        return welcome

    def _note_point(self, header) -> None:
        point = durable_point(header)
        self._keeps = point is not None
        if point is None:
            self._undurable.clear()
        else:
            self._undurable.on_point(point)

    def _replay(self, welcome: Reply) -> str:
        """Replays the kept commits above the WELCOME's last_commit_id,
        each sum as one COMMIT with replay_first_id. Returns why to rejoin
        again ('' when done). A replay refused or impossible is logged and
        dropped: the site counts it lost."""
        point = durable_point(welcome.header)
        if point is None:
            self._undurable.clear()
            return ""
        applied = welcome.last_commit_id
        for kept in list(self._undurable.kept):
            if kept.last_id <= applied:
                continue
            span = "%d to %d" % (kept.first_id, kept.last_id)
            if kept.first_id <= applied or welcome.stop:
                _LOG.error("commits %s were answered but the site lost them "
                           "in a restart, and they cannot be replayed (%s)",
                           span, "the job is over" if welcome.stop else
                           "it holds commits up to %d" % applied)
                continue
            header = wire_pb2.Header(type=wire_pb2.COMMIT)
            for t in self.layout.tensors:
                header.slices.append(tensor_slice(t))
            header.commit.base_version = welcome.version
            header.commit.commit_id = kept.last_id
            header.commit.replay_first_id = kept.first_id
            payloads = [kept.sum[t.offset:t.offset + t.size]
                        for t in self.layout.tensors]
            try:
                reply = self._call(header, payloads)
            except ServerGone as gone:
                return str(gone)
            why = self._rejoin_reason(reply)
            if why:
                return why
            answer, _ = reply
            if answer.type == wire_pb2.ERROR:
                _LOG.error("the site refused the replay of commits %s, which "
                           "it had answered before a restart: %s", span,
                           answer.error.message)
                continue
            _LOG.info("replayed commits %s, answered before the site "
                      "restarted and missing from its checkpoint", span)
        return ""

    def _model_reply(self, reply, payload, ranges=None,
                     check_finite: bool = True) -> Reply:
        if reply.type != wire_pb2.MODEL:
            raise ProtocolError("expected MODEL, got " + describe(reply))
        model = reply.model
        if model.stop:
            return Reply(wire_pb2.MODEL, reply, model.version, model.plan,
                         True, model.stop_reason)
        whole = not ranges
        arrays = check_model_slices(reply, payload, self.layout, whole,
                                    check_finite)
        if not whole:
            got = [(s.tensor, s.offset, s.length) for s in reply.slices]
            want = [(r.tensor, r.offset, r.length) for r in ranges]
            if got != want:
                raise ProtocolError("MODEL carries slices %s, the PULL asked "
                                    "for %s" % (got, want))
        return Reply(wire_pb2.MODEL, reply, model.version, model.plan,
                     arrays=arrays if whole else [],
                     slices=list(zip(reply.slices, arrays)))

    def commit(self, delta: Change, base_version: int, local_steps: int,
               stats: Optional[wire_pb2.WorkerStats] = None,
               clock: int = 0, commit_id: Optional[int] = None,
               check_finite: bool = True) -> Reply:
        """COMMIT: the accumulated local change since the last model this
        worker loaded (W_local - W_loaded), computed from model version
        `base_version`, over `local_steps` local steps. `delta` is the
        whole model's change: a flat array of num_elements floats in
        layout order, a sequence of one array per tensor in layout order
        (sent without a copy when contiguous little-endian float32: keep
        them unchanged until this returns), or {tensor name: array}.
        With `check_finite` a NaN or Inf raises ValueError before anything
        is sent (without it the server refuses such a commit with
        ERROR_NON_FINITE); the reply's model is checked likewise.

        Returns the MODEL reply (the site's model after applying it, or
        stop=True: say bye()), or, when the commit's answer was lost with
        a connection and the site had applied it, the WELCOME of the
        rejoin (rejoined=True). A commit not applied is sent again after a
        rejoin with the same commit_id and base_version = WELCOME's
        model_version. ServerError on an ERROR reply (the update is
        dropped; e.commit_id is its id). `commit_id` None takes the next
        id (1, 2, 3 ...); pass e.commit_id to send a refused commit again
        (after ERROR_INTERNAL)."""
        payloads = self._tensor_payloads(delta)
        if check_finite:
            for t, values in zip(self.layout.tensors, payloads):
                if not all_finite(values):
                    raise ValueError("NaN or Inf in the change of tensor "
                                     "'%s'" % t.name)
        if commit_id is None:
            self.last_commit_id += 1
            commit_id = self.last_commit_id
        else:
            self.last_commit_id = max(self.last_commit_id, commit_id)
        change = (np.concatenate([np.asarray(p, dtype=np.float32).ravel()
                                  for p in payloads])
                  if self._keeps else None)

        def build(base):
            header = wire_pb2.Header(type=wire_pb2.COMMIT, clock=clock)
            for t in self.layout.tensors:
                header.slices.append(tensor_slice(t))
            body = header.commit
            body.base_version = base
            body.local_steps = local_steps
            body.commit_id = commit_id
            if stats is not None:
                body.stats.CopyFrom(stats)
            return header

        self._drain_stray()
        if self._must_rejoin:
            welcome = self.rejoin(self._must_rejoin)
            base_version = welcome.version
        while True:
            header = build(base_version)
            try:
                reply = self._call(header, payloads)
                why = self._rejoin_reason(reply)
                absent_since = time.monotonic()
            except ServerGone as gone:
                why = str(gone)
                absent_since = time.monotonic() - self.server_timeout_s
            if not why:
                break
            welcome = self.rejoin(why, absent_since)
            if commit_id <= welcome.last_commit_id:
                _LOG.info("commit %d was applied before the connection was "
                          "lost", commit_id)
                self._keep(commit_id, change, welcome.header)
                return welcome
            _LOG.info("commit %d was not applied (the site applied up to "
                      "%d): sending it again on model version %d", commit_id,
                      welcome.last_commit_id, welcome.version)
            base_version = welcome.version
        reply, payload = reply
        if reply.type == wire_pb2.ERROR:
            raise self._refused(header, reply, commit_id)
        answer = self._model_reply(reply, payload, check_finite=check_finite)
        self._keep(commit_id, change, reply)
        return answer

    def _keep(self, commit_id: int, change: Optional[np.ndarray],
              header) -> None:
        # Kept until a durable point covers it (replayed after a restart).
        point = durable_point(header)
        if change is None or point is None:
            return
        self._undurable.add(commit_id, change, point)

    def pull(self, ranges: Optional[Sequence] = None) -> Reply:
        """PULL: the current model (no ranges: whole, Reply.arrays and
        Reply.params), or the given ranges, each a (tensor, offset, length)
        tuple in elements or a pb.TensorSlice (Reply.slices, in the order
        asked; their floats together at most
        server.limits.max_reply_floats, default one model, else
        ERROR_LIMIT). Answered at once under most policies; under sync a
        read may wait for the DS bound or a selective barrier. After a
        rejoin the WELCOME (whole model) is the answer. ServerError on an
        ERROR reply."""
        wanted = []
        for r in ranges or ():
            if isinstance(r, wire_pb2.TensorSlice):
                wanted.append(wire_pb2.TensorSlice(tensor=r.tensor,
                                                   offset=r.offset,
                                                   length=r.length))
            else:
                tensor, offset, length = r
                wanted.append(wire_pb2.TensorSlice(tensor=tensor,
                                                   offset=int(offset),
                                                   length=int(length)))
        self._drain_stray()
        if self._must_rejoin:
            return self.rejoin(self._must_rejoin)
        header = wire_pb2.Header(type=wire_pb2.PULL)
        header.pull.SetInParent()
        header.pull.ranges.extend(wanted)
        try:
            reply = self._call(header)
        except ServerGone as gone:
            return self.rejoin(str(gone),
                               time.monotonic() - self.server_timeout_s)
        why = self._rejoin_reason(reply)
        if why:
            return self.rejoin(why)
        reply, payload = reply
        if reply.type == wire_pb2.ERROR:
            raise self._refused(header, reply)
        return self._model_reply(reply, payload, wanted)

    def _tensor_payloads(self, delta: Change) -> List[np.ndarray]:
        tensors = self.layout.tensors
        if isinstance(delta, Mapping):
            missing = [t.name for t in tensors if t.name not in delta]
            if missing:
                raise ValueError("the change has no tensor '%s'" % missing[0])
            arrays = [delta[t.name] for t in tensors]
        elif isinstance(delta, (list, tuple)):
            if len(delta) != len(tensors):
                raise ValueError("the change has %d tensors, the layout %d" %
                                 (len(delta), len(tensors)))
            arrays = list(delta)
        else:
            flat = as_float32_le(delta)
            if flat.size != self.layout.num_elements:
                raise ValueError("the change has %d values, the model %d" %
                                 (flat.size, self.layout.num_elements))
            return [flat[t.offset:t.offset + t.size] for t in tensors]
        out = []
        for t, values in zip(tensors, arrays):
            values = as_float32_le(values)
            if values.size != t.size:
                raise ValueError("tensor '%s' has %d values, the layout %d" %
                                 (t.name, values.size, t.size))
            out.append(values)
        return out


class EvaluatorClient(_Channel):
    """The evaluator of site `site` (sender role ROLE_EVALUATOR, id 0)
    against the site server at `endpoint`, for a model of `layout`.
    Keyword arguments as WorkerClient's."""

    def __init__(self, endpoint: str, site: str, layout: Layout, **kwargs):
        super().__init__(endpoint, wire_pb2.Endpoint(
            site=site, role=wire_pb2.ROLE_EVALUATOR, id=0), **kwargs)
        self.layout = layout

    @classmethod
    def from_job(cls, job, site: str, layout: Layout, endpoint: str,
                 **kwargs) -> "EvaluatorClient":
        """A client with the liveness settings of pb.JobConfig `job`'s
        fault { }; other keyword arguments as the constructor's."""
        return cls(endpoint, site, layout, **cls._timeouts_of(job, kwargs))

    def _task(self, reply: wire_pb2.Header, payload) -> EvalTask:
        if reply.type != wire_pb2.EVAL_TASK:
            raise ProtocolError("expected EVAL_TASK, got " + describe(reply))
        task = reply.eval_task
        if task.stop:
            return EvalTask(task.task_id, task.split, task.model_version,
                            True, task.stop_reason or "the job is over",
                            header=reply)
        if task.split not in (wire_pb2.VALIDATION, wire_pb2.TRAINING_SAMPLE):
            raise ProtocolError("EVAL_TASK %d names split %d" %
                                (task.task_id, task.split))
        arrays = check_model_slices(reply, payload, self.layout,
                                    whole_model=True)
        return EvalTask(task.task_id, task.split, task.model_version,
                        arrays=arrays, header=reply)

    def _first_task(self, silence_timeout_s: Optional[float] = None
                    ) -> EvalTask:
        reply, payload = self._hello(self.layout, 0, silence_timeout_s)
        return self._task(reply, payload)

    def join(self) -> EvalTask:
        """HELLO with this evaluator's layout, answered with the first
        EVAL_TASK (held, with HEARTBEATs, until the site has a snapshot to
        evaluate). ServerError or LayoutMismatch when refused, ServerGone
        after give_up_s."""
        _LOG.info("joining the site server at %s as the evaluator of %s "
                  "(incarnation %d)", self.endpoint, self._self.site,
                  self.incarnation)
        try:
            return self._first_task()
        except ServerGone as gone:
            return self.rejoin(str(gone), time.monotonic() -
                               self.server_timeout_s)

    def rejoin(self, why: str, absent_since: Optional[float] = None
               ) -> EvalTask:
        """Joins again as the same process over a new connection, with
        backoff; returns the task the HELLO is answered with
        (rejoined=True). An unanswered result is not sent again: the site
        hands out the work it still wants done."""
        task = self._join_with_backoff(self._first_task, why, absent_since)
        task.rejoined = True
        return task

    def report(self, task_id: int,
               metrics: Optional[Mapping[str, float]] = None,
               samples: int = 0, error: str = "") -> EvalTask:
        """EVAL_RESULT for task `task_id`: its metrics (name -> finite
        value) and the examples they were computed over, or `error` (why
        the evaluation failed; then no metrics). Returns the next task
        (held until there is one). After a lost connection the client
        joins again and returns the HELLO's task. ServerError when the
        result is refused."""
        header = wire_pb2.Header(type=wire_pb2.EVAL_RESULT)
        result = header.eval_result
        result.task_id = task_id
        if error:
            result.error = error
        else:
            for name, value in (metrics or {}).items():
                result.metrics.add(name=name, value=float(value))
            if samples:
                result.samples = int(samples)
        self._drain_stray()
        if self._must_rejoin:
            return self.rejoin(self._must_rejoin)
        try:
            reply = self._call(header)
        except ServerGone as gone:
            return self.rejoin(str(gone),
                               time.monotonic() - self.server_timeout_s)
        why = self._rejoin_reason(reply)
        if why:
            return self.rejoin(why)
        reply, payload = reply
        if reply.type == wire_pb2.ERROR:
            raise self._refused(header, reply)
        return self._task(reply, payload)
