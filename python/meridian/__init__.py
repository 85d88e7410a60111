"""Meridian for PyTorch: train a model with a Meridian site.

    import meridian

    with meridian.Session(model, optimizer) as session:   # joins the site
        for x, y in session.batches(loader):               # until the job ends
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            session.step(loss)                             # commits as planned

The public API (docs/python.md):

- Session: a model and its optimizer as one worker of a site;
- Evaluator: a model that evaluates a site's snapshots;
- save_initial_weights / load_weights: safetensors files of a model
  (initial weights of a job, final per-site models);
- environment(): the MERIDIAN_* variables `meridian run` sets;
- meridian.data: Fashion-MNIST shards of a job as TensorDatasets;
- errors: MeridianError and its kinds.

Underneath, for authors of clients in other languages and for tools:
meridian.client (WorkerClient, EvaluatorClient), meridian.protocol
(framing), meridian.layout, and the generated Protobuf modules
meridian.wire_pb2, job_pb2, report_pb2, wan_control_pb2, checkpoint_pb2.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._proto import extend_package_path

extend_package_path(__path__)

from . import job_pb2, report_pb2, wire_pb2  # noqa: E402
from .environment import Environment, environment, load_job  # noqa: E402
from .errors import (Cancelled, LayoutMismatch, MeridianError,  # noqa: E402
                     ProtocolError, ServerError, ServerGone)

if TYPE_CHECKING:  # imported on first use: the protocol layer needs no torch
    from .evaluator import Evaluator
    from .session import Plan, Session, SessionStats
    from .tensors import load_weights, save_initial_weights

_LAZY = {"Evaluator": "evaluator", "Plan": "session", "Session": "session",
         "SessionStats": "session", "load_weights": "tensors",
         "save_initial_weights": "tensors"}
_SUBMODULES = ("binding", "client", "data", "environment", "errors",
               "evaluator", "layout", "protocol", "session", "tensors")

__version__ = "0.35.0"

__all__ = [
    "Cancelled", "Environment", "Evaluator", "LayoutMismatch",
    "MeridianError", "Plan", "ProtocolError", "ServerError", "ServerGone",
    "Session", "SessionStats", "environment", "job_pb2", "load_job",
    "load_weights", "report_pb2", "save_initial_weights", "wire_pb2",
]


def __getattr__(name: str) -> Any:
    """The PyTorch API (Session, Evaluator, ...), imported with torch on
    first use, so that `import meridian.client` works without torch."""
    if name in _LAZY:
        value = getattr(importlib.import_module("." + _LAZY[name], __name__),
                        name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:  # meridian.data etc. without importing them
        return importlib.import_module("." + name, __name__)
    raise AttributeError("module 'meridian' has no attribute %r" % name)


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))
