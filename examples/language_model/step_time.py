"""Measures a training step (forward, backward, AdamW) of candidate model
sizes on this machine, on one thread, with random tokens:

    OMP_NUM_THREADS=1 /usr/bin/python3 step_time.py [--batch 16,32] \
        [--models width=128 width=192 width=256,layers=4] [--steps 20]

Prints one line per model and batch: parameters, the median step time and
its range over --steps steps (after 3 warm-up steps), tokens per second,
and the machine's load average before and after (other processes on the
machine slow every number down: measure when it is quiet).
"""

import argparse
import os
import statistics
import time

import torch

from model import GPT, Config, optimizer


def measure(config, batch, steps):
    torch.manual_seed(0)
    model = GPT(config)
    opt = optimizer(model)
    tokens = torch.randint(config.vocab_size, (batch, config.context + 1))
    times = []
    for step in range(steps + 3):
        start = time.perf_counter()
        loss = model.loss(tokens)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= 3:
            times.append(time.perf_counter() - start)
    return sum(p.numel() for p in model.parameters()), times


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+",
                        default=["width=128", "width=192", "width=256"])
    parser.add_argument("--batch", default="16,32")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("load average before: %.2f %.2f %.2f (%d cores)" %
          (os.getloadavg() + (os.cpu_count(),)))
    for text in args.models:
        config = Config.parse(text)
        for batch in map(int, args.batch.split(",")):
            params, times = measure(config, batch, args.steps)
            median = statistics.median(times)
            print("%-28s batch %3d  %5.2f M params  step %6.1f ms "
                  "[%.1f-%.1f]  %6.0f tokens/s" %
                  (text, batch, params / 1e6, median * 1e3, min(times) * 1e3,
                   max(times) * 1e3, batch * config.context / median),
                  flush=True)
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
