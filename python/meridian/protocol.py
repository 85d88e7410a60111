"""Framing of Meridian wire messages (docs/worker-protocol.md, "Frames").

A message is one multipart ZeroMQ message:
  frame 0      a serialized pb.Header (at most 1 MiB; never tensor values)
  frames 1..N  one payload frame per Header.slices entry, in order; a
               FLOAT32/RAW slice's frame is `length` little-endian float32.
On the worker endpoint the client's socket is a DEALER connected to the
site server's ROUTER: no routing-id frame and no empty delimiter frame is
sent or received (ZeroMQ adds and strips the routing id on the server).

This module is socket-free: build frames, parse and validate them.
Payload frames are never copied here: encode() hands out the arrays
themselves (send them with copy=False) and decode() returns views of the
received frames.
"""

from typing import List, Sequence, Tuple, Union

import numpy as np

from . import wire_pb2
from .errors import ProtocolError, error_name
from .layout import Layout

__all__ = ["FLOAT32_LE", "MAX_HEADER_BYTES", "MAX_SLICES", "PROTOCOL_VERSION",
           "ProtocolError", "all_finite", "as_float32_le",
           "check_model_slices", "decode", "describe", "encode",
           "error_name", "make_header"]

PROTOCOL_VERSION = wire_pb2.PROTOCOL_VERSION_CURRENT  # 1
MAX_HEADER_BYTES = 1 << 20  # kMaxHeaderBytes (include/meridian/net/message.h)
MAX_SLICES = 4096           # kMaxSlices

# Little-endian IEEE-754 float32: the only dtype of the protocol.
FLOAT32_LE = np.dtype("<f4")


def make_header(msg_type: int, sender: wire_pb2.Endpoint,
                sequence: int) -> wire_pb2.Header:
    """A Header with version, type, sender and sequence set (MakeHeader)."""
    h = wire_pb2.Header()
    h.protocol_version = PROTOCOL_VERSION
    h.type = msg_type
    h.sender.CopyFrom(sender)
    h.sequence = sequence
    return h


def as_float32_le(values) -> np.ndarray:
    """`values` as a contiguous little-endian float32 array (a copy only
    when needed)."""
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32),
                                dtype=FLOAT32_LE).reshape(-1)


def all_finite(values: np.ndarray) -> bool:
    """Whether no value is NaN or +-Inf."""
    return bool(np.isfinite(values).all())


def encode(header: wire_pb2.Header,
           payloads: Sequence[np.ndarray] = ()
           ) -> List[Union[bytes, np.ndarray]]:
    """The frames of a message: the serialized header, then one payload
    frame per slice. `payloads` are float32 arrays, one per
    header.slices entry, passed on without a copy when they are already
    contiguous little-endian float32 (send the frames with copy=False and
    leave the arrays alone until the reply came). Each slice's
    payload_bytes must equal its frame (ValueError otherwise: the server
    would answer ERROR_SIZE_MISMATCH)."""
    if len(payloads) != len(header.slices):
        raise ValueError("%d payloads for %d slices" %
                         (len(payloads), len(header.slices)))
    frames = [header.SerializeToString()]
    if len(frames[0]) > MAX_HEADER_BYTES:
        raise ValueError("header of %d bytes exceeds %d" %
                         (len(frames[0]), MAX_HEADER_BYTES))
    for s, values in zip(header.slices, payloads):
        data = as_float32_le(values)
        if s.payload_bytes != data.nbytes or s.length != data.size:
            raise ValueError(
                "slice '%s' says %d elements / %d bytes, payload has %d / %d"
                % (s.tensor, s.length, s.payload_bytes, data.size,
                   data.nbytes))
        frames.append(data)
    return frames


def decode(frames: Sequence) -> Tuple[wire_pb2.Header, List[memoryview]]:
    """Parses frame 0 and checks what DecodeMessage checks without the
    model: version, a known type, one payload frame per slice, each
    frame's size equal to payload_bytes and, for RAW slices, to length * 4.
    Returns (header, payload frames as bytes-like). ProtocolError otherwise.
    `frames` are bytes or zmq.Frame objects."""
    if not frames:
        raise ProtocolError("message has no header frame")
    views = [memoryview(f.buffer if hasattr(f, "buffer") else f)
             for f in frames]
    head = views[0]
    if len(head) == 0 or len(head) > MAX_HEADER_BYTES:
        raise ProtocolError("header frame of %d bytes" % len(head))
    header = wire_pb2.Header()
    try:
        header.ParseFromString(head.tobytes())
    except Exception as error:  # google.protobuf.message.DecodeError
        raise ProtocolError("header frame is not a meridian.pb.Header: %s" %
                            error) from None
    if header.protocol_version != PROTOCOL_VERSION:
        raise ProtocolError("protocol version %d, this client speaks %d" %
                            (header.protocol_version, PROTOCOL_VERSION))
    if header.type not in wire_pb2.MessageType.values() or header.type == 0:
        raise ProtocolError("message type %d is unknown" % header.type)
    payload = views[1:]
    if len(header.slices) > MAX_SLICES:
        raise ProtocolError("%d slices exceed %d" %
                            (len(header.slices), MAX_SLICES))
    if len(payload) != len(header.slices):
        raise ProtocolError("header announces %d payload frames, message "
                            "has %d" % (len(header.slices), len(payload)))
    for i, (s, frame) in enumerate(zip(header.slices, payload)):
        if s.dtype != wire_pb2.DTYPE_FLOAT32:
            raise ProtocolError("slice %d: unknown dtype %d" % (i, s.dtype))
        if s.payload_bytes != len(frame):
            raise ProtocolError("slice %d ('%s'): header says %d bytes, frame "
                                "has %d" % (i, s.tensor, s.payload_bytes,
                                            len(frame)))
        if s.codec == wire_pb2.CODEC_RAW and s.length * 4 != len(frame):
            raise ProtocolError("slice %d ('%s'): %d floats do not fill a "
                                "%d-byte frame" % (i, s.tensor, s.length,
                                                   len(frame)))
    return header, payload


def check_model_slices(header: wire_pb2.Header, payload: Sequence,
                       layout: Layout, whole_model: bool,
                       check_finite: bool = True) -> List[np.ndarray]:
    """Checks a MODEL/WELCOME/EVAL_TASK's slices against `layout` (each
    inside its tensor; with `whole_model` one per tensor, whole, in layout
    order), RAW codec and (with `check_finite`) finite values, and returns
    each slice's values: read-only little-endian float32 views of the
    frames. ProtocolError otherwise."""
    if whole_model and len(header.slices) != len(layout.tensors):
        raise ProtocolError("expected one slice per tensor (%d), got %d" %
                            (len(layout.tensors), len(header.slices)))
    arrays = []
    for i, (s, frame) in enumerate(zip(header.slices, payload)):
        tensor = layout.find(s.tensor)
        if tensor is None:
            raise ProtocolError("slice %d: unknown tensor '%s'" %
                                (i, s.tensor))
        if s.offset > tensor.size or s.length > tensor.size - s.offset:
            raise ProtocolError("slice %d: [%d, +%d) outside '%s' of %d" %
                                (i, s.offset, s.length, tensor.name,
                                 tensor.size))
        if whole_model and (tensor is not layout.tensors[i] or s.offset != 0
                            or s.length != tensor.size):
            raise ProtocolError("slice %d must cover the whole tensor '%s'" %
                                (i, layout.tensors[i].name))
        if s.codec != wire_pb2.CODEC_RAW:
            raise ProtocolError("slice %d ('%s') is not RAW" % (i, s.tensor))
        values = np.frombuffer(frame, dtype=FLOAT32_LE)
        if check_finite and not all_finite(values):
            raise ProtocolError("NaN or Inf in tensor '%s'" % s.tensor)
        arrays.append(values)
    return arrays


def describe(header: wire_pb2.Header) -> str:
    """"COMMIT from site-a/worker#3 seq 17 (2 slices)" (DescribeHeader)."""
    try:
        kind = wire_pb2.MessageType.Name(header.type)
    except ValueError:
        kind = "type %d" % header.type
    sender = header.sender
    role = {wire_pb2.ROLE_WORKER: "worker#%d" % sender.id,
            wire_pb2.ROLE_SITE_SERVER: "server",
            wire_pb2.ROLE_LAUNCHER: "launcher",
            wire_pb2.ROLE_CLIENT: "client",
            wire_pb2.ROLE_EVALUATOR: "evaluator"}.get(sender.role, "?")
    text = "%s from %s/%s seq %d" % (kind, sender.site or "?", role,
                                     header.sequence)
    if header.slices:
        text += " (%d slices)" % len(header.slices)
    return text
