"""The workloads the end-to-end scenarios run (`--workload NAME`).

Each carries everything a scenario needs to run it fairly on one 2-core
machine: the job file's model block, its data, optimizer and server pieces
(or None: the scenario's own Fashion-MNIST defaults), the local steps of an
asynchronous commit (None: the scenario's own), the emulated device step
time (longer than the step really takes when every worker of the job shares
the machine, so the machine is not the bottleneck), the metric (its name in
the report and tables, and whether higher is better), the targets (low: the
easier one, high: "the target"), and a default budget.

  mlp      MLP 784-256-10 (the scenarios' original workload)
  mlp-small
           MLP 784-64-10 on 50 ms device steps: the eleven-region job's
           model (deploy/configs/eleven-regions.pbtxt), light enough that
           eleven site servers, their workers and wanem leave two cores
           headroom (geo_vs_lan --regions 11 saturates them with mlp)
  cnn      LeNet-5-style CNN (model.preset "lenet5")
  cnn-bn   the same with BatchNorm after each convolution
  cnn-gn   the same with GroupNorm after each convolution
  mf       matrix factorisation, rank 16, on a generated 50,000 x 5,000
           rating matrix (deploy/configs/three-regions-mf.pbtxt); metric
           test RMSE, lower is better
  lm       the language model of examples/language_model (a 4-layer GPT,
           0.94 M parameters, on the Brown corpus, docs/language-model.md):
           the user's own PyTorch model (model { kind: EXTERNAL }), its
           train.py workers (AdamW) and evaluate.py evaluators; metric
           validation perplexity, lower is better; one worker per site
           (three in the single-site variants) on 0.4 s device steps,
           as the example's jobs are sized

A LeNet step at batch 64 takes ~5 ms of one core (8 ms with a norm layer;
bench/scenarios/workload_speed), so twelve workers and three evaluating site
servers need ~70 ms per emulated step to leave the machine headroom. An MF
step of 256 ratings takes ~0.1 ms; what costs is the commit (its reply
carries the whole 3.7 MB model), hence 32 local steps per commit.
"""

import argparse
import collections
import os
import subprocess
from typing import Callable, Optional, Sequence

from scenariolib import ROOT

Workload = collections.namedtuple(
    "Workload",
    "name model description step_time_s targets budget_s "
    # The rest have classifier defaults (see below).
    "dataset data optimizer_per_worker optimizer_max_lr optimizer server "
    "local_steps metric metric_name metric_key higher_is_better "
    "partition_by_label workers_per_site eval_period_s worker_command "
    "evaluator_command weights_command lan_time_goal bsp_bytes_goal splits "
    "results_file",
    # workers_per_site: None, the scenario's own; eval_period_s: the site's
    # (or its evaluator's); worker_command, evaluator_command: the words of
    # the program the workers / every site's evaluator run (None: built-in
    # ones); weights_command: writes initial.safetensors in the directory
    # it runs in; the geo_vs_lan goals: Gaia's time to the target at most
    # lan_time_goal x LAN's, its WAN bytes bsp_bytes_goal x fewer than BSP's;
    # splits: the values of the programs' `--split` (how they share the
    # data between sites; None: the job's data block splits it);
    # results_file: the docs/results/ file its runs publish into (None: the
    # scenario's own).
    defaults=(None, 2.0, None, None, None, 1.10, 500, None, None))

# The scenarios' classifier optimizer (unchanged).
CLASSIFIER_OPTIMIZER = """optimizer {
  learning_rate: 0.01 momentum: 0.9 weight_decay: 0.0001 batch_size: 64
  schedule: INVERSE_SQRT step_size: 2000
}"""

CLASSIFIER_DEFAULTS = dict(
    dataset="Fashion-MNIST",
    data=None,                  # the scenario's own data block
    optimizer_per_worker=None,  # fixed optimizer block below
    optimizer_max_lr=None,
    optimizer=CLASSIFIER_OPTIMIZER,
    server="",                  # extra server fields
    local_steps=None,           # the scenario's own
    metric="accuracy",          # report's "metric"
    metric_name="accuracy",     # in tables
    metric_key="accuracy",      # timeline point / "final_<key>" in report
    higher_is_better=True,
    partition_by_label=True)


def _classifier(name, model, description, step_time_s, targets, budget_s):
    return Workload(name, model, description, step_time_s, targets, budget_s,
                    **CLASSIFIER_DEFAULTS)


# The EXTERNAL models' weights file, in their model block: the scenario
# writes it (weights_command, run in its OUTDIR) and puts its path here.
WEIGHTS = "@WEIGHTS@"
LM_DIR = os.path.join(ROOT, "examples", "language_model")


def _lm_program(program: str, split: str = "iid") -> tuple[str, ...]:
    """The command of one of the language model's programs: one PyTorch
    thread, the `python3` on PATH (a scenario puts one with the package
    first: pytorch.use_venv)."""
    return ("env", "OMP_NUM_THREADS=1", "python3",
            os.path.join(LM_DIR, program), "--split", split)


MF_DATA = """data { ratings {
  users: 50000 items: 5000 rank: 8 ratings: 2000000
  zipf_exponent: 1.0 noise_stddev: 0.5 test_fraction: 0.1
} }"""

WORKLOADS = collections.OrderedDict((w.name, w) for w in [
    _classifier("mlp", "model { kind: MLP hidden: 256 }",
                "MLP 784-256-10", 0.02, (0.85, 0.87), 60.0),
    _classifier("mlp-small", "model { kind: MLP hidden: 64 }",
                "MLP 784-64-10", 0.05, (0.83, 0.85), 80.0),
    _classifier("cnn", 'model { kind: CNN preset: "lenet5" }',
                "LeNet-5-style CNN", 0.07, (0.85, 0.88), 120.0),
    _classifier("cnn-bn", 'model { kind: CNN preset: "lenet5-bn" }',
                "LeNet-5-style CNN with BatchNorm", 0.07, (0.85, 0.88), 120.0),
    _classifier("cnn-gn", 'model { kind: CNN preset: "lenet5-gn" }',
                "LeNet-5-style CNN with GroupNorm", 0.07, (0.85, 0.88), 120.0),
    # Plain SGD; the learning rate is 0.03 per worker whose changes the
    # site averages (apply rule MEAN), at most 0.15 (at 0.3 a worker's own
    # steps diverge; docs/guide.md, "Workloads").
    Workload("mf", "model { kind: MATRIX_FACTORIZATION rank: 16 l2: 0.05 }",
             "Matrix factorisation (rank 16)", 0.005, (0.75, 0.70), 100.0,
             dataset="a generated 50,000 x 5,000 rating matrix (2 M ratings)",
             data=MF_DATA, optimizer_per_worker=0.03, optimizer_max_lr=0.15,
             optimizer=None, server="apply_rule: MEAN", local_steps=32,
             metric="rmse", metric_name="RMSE", metric_key="metric",
             higher_is_better=False, partition_by_label=False),
    # The job's sizing is the example's (docs/language-model.md, "Sizing
    # the jobs"): three workers' 0.17 s of compute per 0.4 s device step
    # leave the second core to the evaluators (about a second each per
    # evaluation), site servers and wanem. Targets: the perplexity one
    # site with the three workers reaches in 300 s
    # (docs/results/language_model.md: 54.9) and an easier 80. The goals
    # are issue 36's: the time of Gaia's default within 1.2x LAN's, 100x
    # fewer WAN bytes than BSP over the WAN.
    Workload("lm", "model {\n  kind: EXTERNAL\n  weights: \"" + WEIGHTS +
             '"\n  metrics { name: "perplexity" higher_is_better: false }\n'
             '  metrics { name: "loss" higher_is_better: false }\n}',
             "A 4-layer GPT (0.94 M parameters, AdamW in each worker)", 0.4,
             (80.0, 55.0), 300.0,
             dataset="the Brown corpus (validation perplexity)",
             data=None, optimizer_per_worker=None, optimizer_max_lr=None,
             optimizer="", server="apply_rule: MEAN join_timeout_s: 120",
             local_steps=8, metric="perplexity", metric_name="perplexity",
             metric_key="metric", higher_is_better=False,
             partition_by_label=False, workers_per_site=1,
             eval_period_s=10.0,
             worker_command=_lm_program("train.py"),
             evaluator_command=_lm_program("evaluate.py"),
             weights_command=("python3", os.path.join(
                 LM_DIR, "train.py"), "--write-weights"),
             lan_time_goal=1.2, bsp_bytes_goal=100,
             splits=("iid", "genre"), results_file="language_model"),
])


def add_argument(parser: argparse.ArgumentParser) -> None:
    """--workload NAME (default mlp)."""
    parser.add_argument(
        "--workload", default="mlp", choices=list(WORKLOADS),
        help="the model every run trains "
             "(bench/scenarios/scenariolib/workloads.py)")


def get(name: str) -> Workload:
    """The workload called `name`."""
    return WORKLOADS[name]


def optimizer_block(w: Workload, workers: int) -> str:
    """The optimizer block for `workers` workers whose changes a site
    averages."""
    if w.optimizer is not None:
        return w.optimizer
    lr = min(w.optimizer_per_worker * workers, w.optimizer_max_lr)
    return (f"optimizer {{ learning_rate: {lr:g} momentum: 0 "
            "batch_size: 256 }")


def target_field(w: Workload) -> str:
    """The job file's target field."""
    return "target_accuracy" if w.metric == "accuracy" else "target_metric"


def value(w: Workload, point: dict) -> Optional[float]:
    """The metric of a timeline point."""
    return point.get(w.metric_key, point.get("metric"))


def final(w: Workload, report: dict) -> float:
    """The report's final metric."""
    return report.get("final_" + w.metric_key, 0.0)


def reached(w: Workload, v: Optional[float], target: float) -> bool:
    """Whether metric value `v` reaches `target` in the metric's direction."""
    if v is None:
        return False
    return v >= target if w.higher_is_better else v <= target


def row_key(w: Workload) -> str:
    """The key of the final metric in a scenario's rows (final_accuracy for
    the classifiers, as before; final_rmse for MF)."""
    return "final_" + (w.metric if w.metric != "accuracy" else "accuracy")


def training_blocks(w: Workload, workers: int,
                    default_data: Optional[str] = None) -> str:
    """The job's model, data and optimizer blocks, one after the other: the
    workload's data block, else `default_data` (else none: the default
    Fashion-MNIST directory), the optimizer for `workers` workers whose
    changes a site averages."""
    return "\n".join(block for block in (w.model, w.data or default_data,
                                          optimizer_block(w, workers))
                     if block)


def reached_at(w: Workload, target: float) -> Callable[[dict], bool]:
    """A predicate of timeline points: the point's metric reaches `target`
    (reports.first / reports.time_to)."""
    return lambda point: reached(w, value(w, point), target)


def command_field(words: Optional[Sequence[str]]) -> str:
    """`command: [...]` of a worker group or evaluator ("" for none)."""
    if not words:
        return ""
    return "command: [" + ", ".join(f'"{w}"' for w in words) + "]"


def with_split(w: Workload, split: str) -> Workload:
    """`w` whose programs split the data by `split` (one of w.splits)."""
    def with_flag(words):
        if words is None:
            return None
        i = list(words).index("--split")
        return tuple(words[:i + 1]) + (split,) + tuple(words[i + 2:])
    if split not in (w.splits or ()):
        raise ValueError(f"workload {w.name} has no split {split!r}")
    return w._replace(worker_command=with_flag(w.worker_command),
                      evaluator_command=with_flag(w.evaluator_command))


def evaluator_block(w: Workload) -> str:
    """The job's evaluator block ("" when the sites evaluate the model
    themselves)."""
    field = command_field(w.evaluator_command)
    return f"evaluator {{ {field} }}" if field else ""


def with_weights(w: Workload, outdir: str) -> Workload:
    """`w` with its model block naming the initial weights in OUTDIR,
    written there first (w.weights_command, run in OUTDIR) when missing;
    `w` itself when its model needs none. Exits naming the command when it
    fails."""
    if w.weights_command is None:
        return w
    path = os.path.abspath(os.path.join(outdir, "initial.safetensors"))
    if not os.path.exists(path):
        os.makedirs(outdir, exist_ok=True)
        proc = subprocess.run(list(w.weights_command), cwd=outdir,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not os.path.exists(path):
            raise SystemExit(
                f"workload {w.name}: {' '.join(w.weights_command)} did not "
                f"write {path} (exit {proc.returncode}): "
                f"{proc.stdout.strip()[-2000:]}")
    return w._replace(model=w.model.replace(WEIGHTS, path))
