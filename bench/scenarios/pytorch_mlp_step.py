"""One PyTorch worker's step of examples/mlp/train.py in this process alone
(no session, no server): what bench/scenarios/pytorch_mlp sets against
`meridian local` (the C++ worker's step of the same model and batch).

    python3 pytorch_mlp_step.py JOB --site NAME [--worker I] [--seconds S]

JOB is the external-model job (its optimizer, batch size and data); the
worker's shard comes from meridian.data as in train.py. Measured for at
least S seconds each after a warm-up, one thread:
  loader_ms  a batch from the worker's DataLoader (shuffled TensorDataset)
  step_ms    forward, cross-entropy, backward, optimizer.step() and the
             schedule's step on a batch already in memory
  loop_ms    both, as train.py's loop does them (without session.step)
Prints one JSON object. Needs torch and the package meridian.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import meridian

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))), "examples", "mlp"))
from train import Mlp, lr_factor  # noqa: E402

WARMUP_S = 0.5


def timed(function, seconds):
    """Milliseconds per call of `function`, called for at least `seconds`
    after WARMUP_S of warm-up."""
    until = time.perf_counter() + WARMUP_S
    while time.perf_counter() < until:
        function()
    calls = 0
    start = time.perf_counter()
    while True:
        function()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls * 1e3


def forever(loader):
    while True:
        yield from loader


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("job")
    parser.add_argument("--site", required=True)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--hidden", type=int, nargs="*", default=[256])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = meridian.load_job(args.job)
    shard = meridian.data.fashion_mnist_shard(job, args.site, args.worker)
    model = Mlp([shard[0][0].numel(), *args.hidden, 10])
    config = job.optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate,
                                momentum=config.momentum,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step))
    loader = DataLoader(shard, batch_size=min(config.batch_size, len(shard)),
                        shuffle=True, drop_last=True)
    batches = forever(loader)
    x, y = next(batches)

    def step(x=x, y=y):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()

    def loop():
        step(*next(batches))

    result = {"loader_ms": timed(lambda: next(batches), args.seconds),
              "step_ms": timed(step, args.seconds),
              "loop_ms": timed(loop, args.seconds),
              "batch": x.shape[0], "samples": len(shard),
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
