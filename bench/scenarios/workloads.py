"""The workloads the end-to-end scenarios run (`--workload NAME`).

Each is the job file's model block plus what a scenario needs to run it
fairly on one 2-core machine: the emulated device step time (longer than the
step really takes when every worker of the job shares the machine, so the
machine is not the bottleneck), the accuracy targets, and a default budget.

  mlp      MLP 784-256-10 (the scenarios' original workload)
  cnn      LeNet-5-style CNN (model.preset "lenet5")
  cnn-bn   the same with BatchNorm after each convolution
  cnn-gn   the same with GroupNorm after each convolution

A LeNet step at batch 64 takes ~5 ms of one core (8 ms with a norm layer;
bench/scenarios/workload_speed), so twelve workers and three evaluating site
servers need ~70 ms per emulated step to leave the machine headroom.
"""

import collections

Workload = collections.namedtuple(
    "Workload", "name model description step_time_s targets budget_s")

WORKLOADS = collections.OrderedDict((w.name, w) for w in [
    Workload("mlp", "model { kind: MLP hidden: 256 }",
             "MLP 784-256-10", 0.02, (0.85, 0.87), 60.0),
    Workload("cnn", 'model { kind: CNN preset: "lenet5" }',
             "LeNet-5-style CNN", 0.07, (0.85, 0.88), 120.0),
    Workload("cnn-bn", 'model { kind: CNN preset: "lenet5-bn" }',
             "LeNet-5-style CNN with BatchNorm", 0.07, (0.85, 0.88), 120.0),
    Workload("cnn-gn", 'model { kind: CNN preset: "lenet5-gn" }',
             "LeNet-5-style CNN with GroupNorm", 0.07, (0.85, 0.88), 120.0),
])


def add_argument(parser):
    parser.add_argument(
        "--workload", default="mlp", choices=list(WORKLOADS),
        help="the model every run trains (bench/scenarios/workloads.py)")


def get(name):
    return WORKLOADS[name]
