"""The exceptions of the package. Every one is a MeridianError."""

from typing import Optional

from . import wire_pb2


def error_name(code: int) -> str:
    """"ERROR_STALE" for 8; "ERROR_CODE_<n>" for a code this build does not
    know (a newer server)."""
    try:
        return wire_pb2.ErrorCode.Name(code)
    except ValueError:
        return "ERROR_CODE_%d" % code


class MeridianError(Exception):
    """Base class of the errors this package raises about the site server
    or the model (not about arguments: those are ValueError/TypeError)."""


class ProtocolError(MeridianError):
    """A message from the server that breaks the protocol (malformed
    header, frames that disagree with it, values outside the layout, NaN).
    Nothing of it was used."""


class ServerError(MeridianError):
    """The server refused a request with an ERROR reply; the model is
    untouched by it. `code` is the pb.ErrorCode number, `code_name` its
    name ("ERROR_STALE"), `message` the server's reason,
    `rejected_sequence` the refused request's sequence number, `commit_id`
    the refused COMMIT's id (None for other requests)."""

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


class ServerGone(MeridianError):
    """Nothing came from the server for the silence timeout (or, from a
    rejoin, for give_up_s): no reply and no HEARTBEAT."""


class Cancelled(MeridianError):
    """The client's stop_requested() became true while it waited. The
    request may still be answered; a worker says bye() (a BYE is accepted
    with a request pending)."""


class LayoutMismatch(MeridianError, ValueError):
    """The model's tensors differ from the site's layout; the message
    names the first tensor that differs (name, shape, type)."""
