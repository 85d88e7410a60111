#!/usr/bin/python3
"""A Meridian worker in PyTorch for a job's built-in model (model.kind
MLP or SOFTMAX): joins a live site server as worker N next to C++ workers
(`meridian worker`), trains the same model on the same shard of the data
with the job's optimizer settings, and exits when the server says stop.

    examples/pytorch_worker.py --config JOB.pbtxt --site NAME --index N \\
        [--connect tcp://HOST:PORT]

Everything protocol-related is meridian.Session's (commits, pulls, the
site's plan, heartbeats, rejoining, the emulated step time, BYE); this file
is only the model, the data and the loop. For a model of your own, see
examples/fashion_mnist/train.py (docs/python.md).

Exit status: 0 when the server ended the job, 1 on an error, 2 for bad
input, 130 when stopped by SIGTERM. Needs the package `meridian` (installed,
or PYTHONPATH=<build>/python:python in a source tree).
"""

import argparse
import logging
import math
import sys

import torch
from google.protobuf import text_format
from torch.utils.data import DataLoader

import meridian
from meridian import data as mdata
from meridian import job_pb2

LOG = logging.getLogger("pytorch_worker")
NUM_CLASSES = 10


class Mlp(torch.nn.Module):
    """The C++ model (src/train/mlp.cc) in PyTorch: Linear layers fc0, fc1
    ... with ReLU between them: named_parameters() yields fc0.weight
    [out, in], fc0.bias [out], fc1.weight ... — the layout's names, shapes
    and order."""

    def __init__(self, widths):
        super().__init__()
        self.depth = len(widths) - 1
        for layer in range(self.depth):
            setattr(self, "fc%d" % layer,
                    torch.nn.Linear(widths[layer], widths[layer + 1]))

    def forward(self, x):
        x = x.flatten(1)
        for layer in range(self.depth):
            x = getattr(self, "fc%d" % layer)(x)
            if layer + 1 < self.depth:
                x = torch.relu(x)
        return x


def lr_factor(config, step: int) -> float:
    """LearningRateAt (src/train/optimizer.cc) over the base rate; `step`
    is the 0-based local step."""
    step_size = config.step_size or 1
    if config.schedule == job_pb2.STEP:
        return config.gamma ** (step // step_size)
    if config.schedule == job_pb2.INVERSE_SQRT:
        return 1.0 / math.sqrt(1.0 + step / step_size)
    return 1.0


def train(job, site: str, index: int, connect: str) -> int:
    shard = mdata.fashion_mnist_shard(job, site, index)
    image, _ = shard[0]
    widths = [image.numel()] + list(job.model.hidden) + [NUM_CLASSES]
    model = Mlp(widths)
    config = job.optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate,
                                momentum=config.momentum,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step))
    batch = min(config.batch_size, len(shard))
    loader = DataLoader(shard, batch_size=batch, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(
                            job.seed * 1000003 + index))
    LOG.info("%d samples, model %s", len(shard), widths)
    with meridian.Session(model, optimizer, job=job, site=site, worker=index,
                          connect=connect or None) as session:
        for x, y in session.batches(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            session.step(loss)
            schedule.step()
    LOG.info("done: %s", session.stop_reason)
    return 130 if "SIGTERM" in session.stop_reason else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one Meridian worker in PyTorch (as `meridian "
        "worker`) for a job's built-in MLP or softmax model.")
    parser.add_argument("--config", required=True, help="job file")
    parser.add_argument("--site", required=True, help="site name in the job")
    parser.add_argument("--index", required=True, type=int,
                        help="worker index inside the site")
    parser.add_argument("--connect", "--endpoint", dest="connect", default="",
                        help="site server endpoint (default: "
                        "$MERIDIAN_CONNECT, else the site's address)")
    parser.add_argument("--threads", type=int, default=1,
                        help="PyTorch intra-op threads (default 1: one core, "
                        "as a C++ worker)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%%(asctime)s %s/w%d(py) %%(levelname)s %%(message)s" %
        (args.site, args.index))
    torch.set_num_threads(max(1, args.threads))
    try:
        job = meridian.load_job(args.config)
        names = [s.name for s in job.site]
        if args.site not in names:
            raise ValueError("no site '%s' in the job (sites: %s)" %
                             (args.site, ", ".join(names)))
        count = mdata.site_worker_count(job.site[names.index(args.site)])
        if not 0 <= args.index < count:
            raise ValueError("site '%s' has %d workers; there is no worker "
                             "%d" % (args.site, count, args.index))
    except (OSError, ValueError, text_format.ParseError) as error:
        LOG.error("%s", error)
        return 2
    try:
        return train(job, args.site, args.index, args.connect)
    except (meridian.MeridianError, OSError, ValueError) as error:
        LOG.error("%s", error)
        return 1


if __name__ == "__main__":
    sys.exit(main())
