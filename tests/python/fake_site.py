"""FakeSite: a TEST DOUBLE of a site server's worker endpoint, for the
parts of the Python package whose server side does not exist yet (the
evaluator role's EVAL_TASK / EVAL_RESULT, models with F16/BF16/F64
tensors) and for faults that are awkward to cause in a real server.

It is a ZeroMQ ROUTER in a thread that decodes what arrives, records it
and answers with what the test's script says. It frames messages as
docs/worker-protocol.md states and nothing more: it applies no policy and
keeps no model. A test passing against it shows that the client follows
the protocol as the test states it, not that the system works end to end
(tests/python/external_model_test.py is that test, pending the server).
"""

import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import zmq

from meridian import protocol, wire_pb2

Frames = Tuple[wire_pb2.Header, List[np.ndarray]]


class Received:
    """One message the fake site received: its routing id (the client's
    connection), header and payload arrays (copies)."""

    def __init__(self, routing_id: bytes, header: wire_pb2.Header,
                 payload: List[np.ndarray]):
        self.routing_id = routing_id
        self.header = header
        self.payload = payload

    @property
    def type_name(self) -> str:
        return wire_pb2.MessageType.Name(self.header.type)


class FakeSite:
    """Answers each request with `script(site, received)`, which returns
    a list of (header, payload arrays) to send back over the same
    connection (none: no answer), or calls site.hold(...) to answer later
    while heartbeating. HEARTBEATs are recorded in `heartbeats` and
    STATUS_REQUESTs (answered to anyone, as a site server does) in
    `probes`; neither goes to the script. Everything else is in
    `received`, in order."""

    SENDER = wire_pb2.Endpoint(site="fake", role=wire_pb2.ROLE_SITE_SERVER)

    def __init__(self, script: Callable[["FakeSite", Received],
                                        Optional[Sequence[Frames]]],
                 heartbeat_interval_s: float = 0.2):
        self.script = script
        self.heartbeat_interval_s = heartbeat_interval_s
        self.received: List[Received] = []
        self.heartbeats: List[Received] = []
        self.probes: List[Received] = []
        self.errors: List[str] = []
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._held: List[Tuple[bytes, float, Sequence[Frames]]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "FakeSite":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        self._socket.close(0)
        self._context.term()

    # ---- what a script may call --------------------------------------------
    def hold(self, received: Received, seconds: float,
             replies: Sequence[Frames]) -> None:
        """Answers `received` with `replies` after `seconds`, sending
        HEARTBEATs to its connection meanwhile (as a server holding a
        reply does)."""
        self._held.append((received.routing_id, time.monotonic() + seconds,
                           replies))

    @staticmethod
    def header(msg_type: int, **body) -> wire_pb2.Header:
        """A server header of `msg_type`; `body` names one field of the
        body oneof and its message, e.g. eval_task=wire_pb2.EvalTask(...)."""
        h = protocol.make_header(msg_type, FakeSite.SENDER, 0)
        for name, value in body.items():
            getattr(h, name).CopyFrom(value)
        return h

    @staticmethod
    def with_model(header: wire_pb2.Header, layout,
                   arrays: Sequence[np.ndarray]) -> Frames:
        """`header` carrying one whole RAW slice per tensor of `layout`."""
        from meridian.layout import tensor_slice
        for t in layout.tensors:
            header.slices.append(tensor_slice(t))
        return header, [np.asarray(a, "<f4").reshape(-1) for a in arrays]

    @staticmethod
    def error(received: Received, code: int, message: str) -> Frames:
        """An ERROR answering `received`."""
        h = FakeSite.header(wire_pb2.ERROR, error=wire_pb2.Error(
            code=code, message=message,
            rejected_sequence=received.header.sequence))
        return h, []

    def of_type(self, msg_type: int) -> List[Received]:
        """The requests received of `msg_type`, in order."""
        with self._lock:
            return [r for r in self.received if r.header.type == msg_type]

    # ---- the loop ----------------------------------------------------------
    def _send(self, routing_id: bytes, frames: Frames) -> None:
        header, payload = frames
        self._socket.send_multipart(
            [routing_id] + protocol.encode(header, payload))

    def _run(self) -> None:
        last_heartbeat = {}
        while not self._stop.is_set():
            if self._socket.poll(20):
                frames = self._socket.recv_multipart()
                routing_id, body = frames[0], frames[1:]
                try:
                    header, payload = protocol.decode(body)
                except protocol.ProtocolError as error:
                    self.errors.append(str(error))
                    continue
                received = Received(routing_id, header,
                                    [np.frombuffer(p, "<f4").copy()
                                     for p in payload])
                if header.type == wire_pb2.HEARTBEAT:
                    with self._lock:
                        self.heartbeats.append(received)
                    continue
                if header.type == wire_pb2.STATUS_REQUEST:
                    with self._lock:
                        self.probes.append(received)
                    reply = self.header(wire_pb2.STATUS_REPLY)
                    reply.status.site = "fake"
                    self._send(routing_id, (reply, []))
                    continue
                with self._lock:
                    self.received.append(received)
                try:
                    replies = self.script(self, received)
                except Exception as error:  # a bug in the test's script
                    self.errors.append("script: %r" % error)
                    continue
                for reply in replies or ():
                    self._send(routing_id, reply)
            now = time.monotonic()
            still = []
            for routing_id, due, replies in self._held:
                if now >= due:
                    for reply in replies:
                        self._send(routing_id, reply)
                    continue
                still.append((routing_id, due, replies))
                if now - last_heartbeat.get(routing_id, 0) >= \
                        self.heartbeat_interval_s:
                    beat = self.header(wire_pb2.HEARTBEAT)
                    beat.heartbeat.SetInParent()
                    self._send(routing_id, (beat, []))
                    last_heartbeat[routing_id] = now
            self._held = still
