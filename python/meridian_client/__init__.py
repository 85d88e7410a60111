"""meridian_client: a Python client of the Meridian worker protocol.

A worker joins a live site server as worker N next to C++ workers, commits
its accumulated change and pulls the model; docs/worker-protocol.md is the
protocol this package implements, examples/pytorch_worker.py a complete
PyTorch worker built on it.

Needs the Debian packages python3-zmq, python3-protobuf and python3-numpy,
and the Python modules generated from include/meridian/*.proto by the CMake
target `meridian_python` (into <build>/python; see _proto.py for where they
are looked for). Usage:

    from meridian_client import WorkerClient, layout_for_model
    layout = layout_for_model(job.model, input_dim=784)
    client = WorkerClient.from_job(job, "site-a", 2, layout,
                                   endpoint="tcp://127.0.0.1:7100")
    welcome = client.join()            # blocks until the site trains
    model, version = welcome.params, welcome.version
    ...                                # local steps on a copy of model
    reply = client.commit(local - model, version, local_steps=1)
    if reply.stop:
        client.bye()
"""

from ._proto import job_pb2, report_pb2, wire_pb2
from .layout import Layout, TensorInfo, layout_for_model, tensor_slice
from .protocol import ProtocolError, decode, encode, error_name
from .worker import (Cancelled, LayoutMismatch, Reply, ServerError,
                     ServerGone, WorkerClient, random_incarnation)

__all__ = [
    "Cancelled", "Layout", "LayoutMismatch", "ProtocolError", "Reply",
    "ServerError", "ServerGone", "TensorInfo", "WorkerClient", "decode",
    "encode", "error_name", "job_pb2", "layout_for_model",
    "random_incarnation", "report_pb2", "tensor_slice", "wire_pb2",
]
