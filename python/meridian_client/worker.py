"""A worker's client of a Meridian site server (docs/worker-protocol.md).

WorkerClient speaks the worker protocol over one ZeroMQ DEALER socket:
it joins (HELLO, then WELCOME once the site trains), commits the
accumulated change (COMMIT, answered with MODEL), pulls (PULL, MODEL),
leaves (BYE), and keeps the rules a C++ worker keeps (src/runtime/worker.cc):

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

Not thread-safe: one thread uses a client. Errors are exceptions:
ServerError (an ERROR reply: its code name and message), ServerGone,
Cancelled, LayoutMismatch, ProtocolError.
"""

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from ._proto import report_pb2, wire_pb2
from .layout import Layout, tensor_slice
from .protocol import (ProtocolError, as_float32_le, check_model_slices,
                       decode, describe, encode, error_name, make_header)

_LOG = logging.getLogger("meridian_client")

# Backoff of probes and rejoin HELLOs (kFirstProbeWait, kMaxProbeWait).
_FIRST_PROBE_WAIT_S = 1.0
_MAX_PROBE_WAIT_S = 30.0
# Longest single wait on the socket: how promptly heartbeats go out and a
# stop request is noticed.
_POLL_SLICE_S = 0.05


class ServerError(Exception):
    """The server refused a request with an ERROR reply; the model is
    untouched by it. `code` is the pb.ErrorCode number, `code_name` its
    name ("ERROR_STALE"), `message` the server's reason, `commit_id` the
    refused COMMIT's id (None for other requests)."""

    def __init__(self, request: str, code: int, message: str,
                 rejected_sequence: int, commit_id: Optional[int] = None):
        self.request = request
        self.code = code
        self.code_name = error_name(code)
        self.message = message
        self.rejected_sequence = rejected_sequence
        self.commit_id = commit_id
        super().__init__("%s refused: %s: %s" % (request, self.code_name,
                                                 message))


class ServerGone(Exception):
    """Nothing came from the server for the silence timeout (or, from a
    rejoin, for give_up_s): no reply and no HEARTBEAT."""


class Cancelled(Exception):
    """stop_requested() became true while waiting. The request may still
    be answered; call bye() (a BYE is accepted with a request pending)."""


class LayoutMismatch(Exception):
    """The site server's model (WELCOME.layout) differs from this
    worker's."""


@dataclass
class Reply:
    """A WELCOME or MODEL. `params`: the whole model, flat float32 in
    layout order (None for a partial PULL or a stop); `slices`: the
    received (pb.TensorSlice, values) pairs in order."""
    type: int
    header: wire_pb2.Header
    version: int
    plan: wire_pb2.CommitPlan
    stop: bool = False
    stop_reason: str = ""
    params: Optional[np.ndarray] = None
    slices: List[Tuple[wire_pb2.TensorSlice, np.ndarray]] = field(
        default_factory=list)
    # WELCOME only.
    site_workers: int = 0
    last_commit_id: int = 0
    # The answer came from a WELCOME after this client joined again.
    rejoined: bool = False

    @property
    def is_welcome(self) -> bool:
        return self.type == wire_pb2.WELCOME


def random_incarnation() -> int:
    """A random non-zero 64-bit number (HELLO.incarnation): one per process."""
    value = 0
    while value == 0:
        value = secrets.randbits(64)
    return value


class WorkerClient:
    """Worker `index` of site `site` against the site server at `endpoint`
    ("tcp://host:port"), for a model of `layout`.

    heartbeat_interval_s, server_timeout_s and give_up_s are the job's
    fault { heartbeat_interval_s server_timeout_s worker_give_up_s }
    (from_job reads them). `incarnation` 0 picks a random one; keep it for
    the life of the process. `stop_requested`, when given, is polled while
    waiting: once true the wait ends with Cancelled.
    """

    def __init__(self, endpoint: str, site: str, index: int, layout: Layout,
                 heartbeat_interval_s: float = 1.0,
                 server_timeout_s: float = 10.0, give_up_s: float = 600.0,
                 incarnation: int = 0,
                 stop_requested: Optional[Callable[[], bool]] = None,
                 context: Optional[zmq.Context] = None):
        self.endpoint = endpoint
        self.layout = layout
        self.heartbeat_interval_s = heartbeat_interval_s
        self.server_timeout_s = server_timeout_s
        self.give_up_s = give_up_s
        self.incarnation = incarnation or random_incarnation()
        self.stop_requested = stop_requested or (lambda: False)
        self._self = wire_pb2.Endpoint(site=site, role=wire_pb2.ROLE_WORKER,
                                       id=index)
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._socket: Optional[zmq.Socket] = None
        self._sequence = 0         # of the last request sent
        self._last_send = None     # monotonic time of the last send
        self._joined = False       # holds a slot (heartbeats make sense)
        self._must_rejoin = ""     # why, when the server told us so
        self.last_commit_id = 0    # of the last COMMIT sent (1, 2, 3 ...)
        self.rejoins = 0

    @classmethod
    def from_job(cls, job, site: str, index: int, layout: Layout,
                 endpoint: str, **kwargs) -> "WorkerClient":
        """A client with the liveness settings of pb.JobConfig `job`'s
        fault { } (invalid values keep the defaults, as WorkerTimeouts
        does)."""
        fault = job.fault

        def positive(value, default):
            return value if value > 0 and value == value else default

        kwargs.setdefault("heartbeat_interval_s",
                          positive(fault.heartbeat_interval_s, 1.0))
        kwargs.setdefault("server_timeout_s",
                          positive(fault.server_timeout_s, 10.0))
        give_up = fault.worker_give_up_s
        kwargs.setdefault("give_up_s", give_up if give_up >= 0 else 600.0)
        return cls(endpoint, site, index, layout, **kwargs)

    # ---- connection ------------------------------------------------------
    def _connect(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # A request the socket cannot queue within the silence timeout
        # fails instead of blocking forever.
        sock.setsockopt(zmq.SNDTIMEO, int(self.server_timeout_s * 1000))
        sock.connect(self.endpoint)
        self._socket = sock

    def reconnect(self) -> None:
        """Drops the connection and whatever it still owes; the next
        request opens a new one (a new peer to the server: it must join
        again before COMMIT or PULL)."""
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

    def __exit__(self, *exc):
        self.close()

    # ---- sending -----------------------------------------------------------
    def _send(self, header: wire_pb2.Header,
              payloads: Sequence[np.ndarray] = ()) -> None:
        if self._socket is None:
            self._connect()
        frames = encode(header, payloads)
        try:
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
        answer a later request; Cancelled on a stop request."""
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
                self._joined = True  # a HELLO waiting for WELCOME holds it
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

    # ---- requests ----------------------------------------------------------
    def status(self, timeout_s: float = 5.0) -> report_pb2.SiteStatus:
        """STATUS_REQUEST: the site's progress (answered to anyone).
        ServerGone when no answer comes within timeout_s."""
        header = wire_pb2.Header(type=wire_pb2.STATUS_REQUEST)
        reply, _ = self._call(header, silence_timeout_s=timeout_s)
        if reply.type == wire_pb2.ERROR:
            raise ServerError(describe(header), reply.error.code,
                              reply.error.message,
                              reply.error.rejected_sequence)
        if reply.type != wire_pb2.STATUS_REPLY:
            raise ProtocolError("expected STATUS_REPLY, got " +
                                describe(reply))
        return reply.status

    def wait_for_server(self) -> report_pb2.SiteStatus:
        """Probes with STATUS_REQUEST until the server answers, waiting 1,
        2, 4 ... 30 s for each answer (it may start after the worker)."""
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

    def _hello(self, silence_timeout_s: Optional[float] = None) -> Reply:
        header = wire_pb2.Header(type=wire_pb2.HELLO)
        header.hello.worker_index = self._self.id
        header.hello.incarnation = self.incarnation
        self.layout.to_specs(header.hello.layout)
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
            raise ServerError(describe(header), reply.error.code,
                              reply.error.message,
                              reply.error.rejected_sequence)
        if reply.type == wire_pb2.MODEL and reply.model.stop:
            return Reply(wire_pb2.MODEL, reply, reply.model.version,
                         reply.model.plan, True, reply.model.stop_reason)
        if reply.type != wire_pb2.WELCOME:
            raise ProtocolError("expected WELCOME, got " + describe(reply))
        welcome = reply.welcome
        theirs = Layout.from_specs(welcome.layout)
        if theirs != self.layout:
            self._joined = False
            raise LayoutMismatch("site server's model [%s] differs from this "
                                 "worker's [%s]" % (theirs, self.layout))
        arrays = check_model_slices(reply, payload, self.layout,
                                    whole_model=True)
        self._must_rejoin = ""
        return Reply(wire_pb2.WELCOME, reply, welcome.model_version,
                     welcome.plan, welcome.stop,
                     "the job is over" if welcome.stop else "",
                     np.concatenate(arrays) if arrays else None,
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
            return self._hello()
        except ServerGone as gone:
            return self.rejoin(str(gone), time.monotonic() -
                               self.server_timeout_s)

    def rejoin(self, why: str, absent_since: Optional[float] = None) -> Reply:
        """Joins again as the same process over a new connection, with
        backoff, until a WELCOME (returned, checked). ServerGone once the
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
                welcome = self._hello(silence_timeout_s=wait)
                _LOG.info("rejoined after %.1f s (attempt %d); the site "
                          "applied this process's commits up to id %d",
                          absent, attempt, welcome.last_commit_id)
                welcome.rejoined = True
                return welcome
            except ServerGone as gone:
                _LOG.warning("no WELCOME from %s (attempt %d): %s",
                             self.endpoint, attempt, gone)
            left = wait - (time.monotonic() - started)
            if left > 0:
                time.sleep(left)
            wait = min(wait * 2, max_wait)
            attempt += 1

    @staticmethod
    def _rejoin_reason(reply) -> str:
        header, _ = reply
        if (header.type == wire_pb2.ERROR and
                header.error.code == wire_pb2.ERROR_UNKNOWN_SENDER):
            return ("it does not know this connection: " +
                    header.error.message)
        return ""

    def _model_reply(self, reply, payload, ranges=None) -> Reply:
        if reply.type != wire_pb2.MODEL:
            raise ProtocolError("expected MODEL, got " + describe(reply))
        model = reply.model
        if model.stop:
            return Reply(wire_pb2.MODEL, reply, model.version, model.plan,
                         True, model.stop_reason)
        whole = not ranges
        arrays = check_model_slices(reply, payload, self.layout, whole)
        if not whole:
            got = [(s.tensor, s.offset, s.length) for s in reply.slices]
            want = [(r.tensor, r.offset, r.length) for r in ranges]
            if got != want:
                raise ProtocolError("MODEL carries slices %s, the PULL asked "
                                    "for %s" % (got, want))
        return Reply(wire_pb2.MODEL, reply, model.version, model.plan,
                     params=np.concatenate(arrays) if whole else None,
                     slices=list(zip(reply.slices, arrays)))

    def commit(self, delta, base_version: int, local_steps: int,
               stats: Optional[wire_pb2.WorkerStats] = None,
               clock: int = 0, commit_id: Optional[int] = None) -> Reply:
        """COMMIT: the accumulated local change since the last model this
        worker loaded (W_local - W_loaded), computed from model version
        `base_version`, over `local_steps` local steps. `delta` is the
        whole model's change: a flat array of num_elements floats in
        layout order, or {tensor name: array}. Values must be finite.

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
        for t, values in zip(self.layout.tensors, payloads):
            if not np.all(np.isfinite(values)):
                raise ValueError("NaN or Inf in the change of tensor '%s'" %
                                 t.name)
        if commit_id is None:
            self.last_commit_id += 1
            commit_id = self.last_commit_id
        else:
            self.last_commit_id = max(self.last_commit_id, commit_id)

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
                return welcome
            _LOG.info("commit %d was not applied (the site applied up to "
                      "%d): sending it again on model version %d", commit_id,
                      welcome.last_commit_id, welcome.version)
            base_version = welcome.version
        reply, payload = reply
        if reply.type == wire_pb2.ERROR:
            raise ServerError(describe(header), reply.error.code,
                              reply.error.message,
                              reply.error.rejected_sequence, commit_id)
        return self._model_reply(reply, payload)

    def pull(self, ranges: Optional[Sequence] = None) -> Reply:
        """PULL: the current model (no ranges: whole, Reply.params), or the
        given ranges, each a (tensor, offset, length) tuple in elements or
        a pb.TensorSlice (Reply.slices, in the order asked; their floats
        together at most server.limits.max_reply_floats, default one
        model, else ERROR_LIMIT). Answered at once under most policies;
        under sync a read may wait for the DS bound or a selective barrier.
        After a rejoin the WELCOME (whole model) is the answer.
        ServerError on an ERROR reply."""
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
            raise ServerError(describe(header), reply.error.code,
                              reply.error.message,
                              reply.error.rejected_sequence)
        return self._model_reply(reply, payload, wanted)

    def bye(self, stats: Optional[wire_pb2.WorkerStats] = None,
            timeout_s: float = 5.0) -> bool:
        """BYE with the final statistics; waits up to timeout_s for the
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

    def _tensor_payloads(self, delta) -> List[np.ndarray]:
        if isinstance(delta, dict):
            out = []
            for t in self.layout.tensors:
                if t.name not in delta:
                    raise ValueError("the change has no tensor '%s'" % t.name)
                values = as_float32_le(delta[t.name])
                if values.size != t.size:
                    raise ValueError("tensor '%s' has %d values, the layout "
                                     "%d" % (t.name, values.size, t.size))
                out.append(values)
            return out
        flat = as_float32_le(delta)
        if flat.size != self.layout.num_elements:
            raise ValueError("the change has %d values, the model %d" %
                             (flat.size, self.layout.num_elements))
        return [flat[t.offset:t.offset + t.size] for t in self.layout.tensors]
