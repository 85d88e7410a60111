"""The built-in MLP of deploy/configs/three-regions.pbtxt (784-256-10) as a
PyTorch model trained with Meridian: a worker program of a job whose model
is `kind: EXTERNAL` with the initial weights `meridian export-weights`
wrote from the built-in model, so both start from the same values.

    workers { command: ["python3", "train.py", "--hidden", "256"] }

Everything but the model's code comes from the job file ($MERIDIAN_JOB), as
the C++ worker takes it: the optimizer (learning rate, momentum, weight
decay, schedule), the batch size and this worker's shard of the data
(meridian.data: the same samples and normalisation as the C++ worker of
this slot). The tensors are named as the C++ model's (fc0.weight [256,
784], fc0.bias, fc1.weight, fc1.bias). bench/scenarios/pytorch_mlp runs it
against the built-in model.
"""
import argparse
import math

import meridian
import torch
import torch.nn.functional as F
from meridian import job_pb2
from torch.utils.data import DataLoader


class Mlp(torch.nn.Module):
    """Linear layers fc0, fc1, ... with ReLU between them (src/train/mlp.cc)."""

    def __init__(self, widths):
        super().__init__()
        self.depth = len(widths) - 1
        for i in range(self.depth):
            setattr(self, f"fc{i}", torch.nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        x = x.flatten(1)
        for i in range(self.depth):
            x = getattr(self, f"fc{i}")(x)
            x = torch.relu(x) if i + 1 < self.depth else x
        return x


def lr_factor(config, step):
    """The job's learning-rate schedule (LearningRateAt, src/train/optimizer.cc)."""
    if config.schedule == job_pb2.STEP:
        return config.gamma ** (step // (config.step_size or 1))
    if config.schedule == job_pb2.INVERSE_SQRT:
        return 1.0 / math.sqrt(1.0 + step / (config.step_size or 1))
    return 1.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, nargs="*", default=[256])
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core, as a C++ worker
    env = meridian.environment()
    job = meridian.load_job(env.job)
    shard = meridian.data.fashion_mnist_shard(job)
    model = Mlp([shard[0][0].numel(), *args.hidden, 10])
    config = job.optimizer
    optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate,
                                momentum=config.momentum,
                                weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(config, step))
    generator = torch.Generator().manual_seed(job.seed * 1000003 +
                                              (env.worker_index or 0))
    loader = DataLoader(shard, batch_size=min(config.batch_size, len(shard)),
                        shuffle=True, drop_last=True, generator=generator)
    with meridian.Session(model, optimizer, job=job) as session:
        for x, y in session.batches(loader):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            session.step(loss)  # optimizer.step(), then commit and pull as planned
            schedule.step()


if __name__ == "__main__":
    main()
