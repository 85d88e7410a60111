"""meridian.Evaluator: a PyTorch model evaluating a site's model snapshots.

    def validate(model):                       # model.eval(), no_grad already
        ...
        return {"accuracy": correct / n, "loss": total / n}, n

    meridian.Evaluator(model).serve(validation=validate)

A site whose model the server does not implement (model.kind EXTERNAL)
asks its evaluator for every number: the curve and the target
(VALIDATION tasks) and the intra-site policy's loss evaluations and
SkewScout's scores (TRAINING_SAMPLE tasks). serve() joins the site server
as its evaluator, loads each snapshot it is sent into the model, calls the
function for the task's split and reports the metrics it returns, until
the site says the job is over.
"""

import logging
import math
import signal
import threading
import traceback
from typing import Callable, Dict, Mapping, Optional, Tuple, Union

import torch

from . import wire_pb2
from ._placement import JobArg, Placement, expected_layout, resolve
from .binding import ModelBinding
from .client import EvalTask, EvaluatorClient
from .errors import Cancelled, ServerError
from .layout import Layout

_LOG = logging.getLogger("meridian")

Metrics = Mapping[str, Union[float, torch.Tensor]]
#: What an evaluation function returns: metrics, or (metrics, samples).
EvalResult = Union[Metrics, Tuple[Metrics, int]]
EvalFunction = Callable[[torch.nn.Module], EvalResult]


def _parse_result(result: EvalResult) -> Tuple[Dict[str, float], int]:
    """(metrics, samples) of a function's return value. ValueError for
    anything else, a non-string name or a non-finite value."""
    samples = 0
    if isinstance(result, tuple):
        if len(result) != 2:
            raise ValueError("an evaluation returns metrics or (metrics, "
                             "samples), got a tuple of %d" % len(result))
        result, samples = result
        samples = int(samples)
        if samples < 0:
            raise ValueError("samples must be >= 0, got %d" % samples)
    if not isinstance(result, Mapping):
        raise ValueError("an evaluation returns a mapping of metric names to "
                         "numbers, got %s" % type(result).__name__)
    metrics = {}
    for name, value in result.items():
        if not isinstance(name, str) or not name:
            raise ValueError("metric names are non-empty strings, got %r" %
                             (name,))
        value = float(value.detach()) if isinstance(value, torch.Tensor) \
            else float(value)
        if not math.isfinite(value):
            raise ValueError("metric '%s' is %r, not a finite number" %
                             (name, value))
        metrics[name] = value
    return metrics, samples


class Evaluator:
    """`model` as the evaluator of site `site`.

    Args:
        model: the nn.Module the snapshots are loaded into (its
            floating-point state_dict tensors, checked against the site's
            layout as Session checks them: LayoutMismatch).
        site, connect, job, weights, secret_key, environ: as Session's
            ($MERIDIAN_SITE, $MERIDIAN_CONNECT, $MERIDIAN_JOB,
            $MERIDIAN_WEIGHTS, $MERIDIAN_SECRET_KEY).
        handle_sigterm: on SIGTERM, stop after the current evaluation.
    """

    def __init__(self, model: torch.nn.Module, *, site: Optional[str] = None,
                 connect: Optional[str] = None, job: JobArg = None,
                 weights: Optional[str] = None,
                 secret_key: Optional[str] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 handle_sigterm: bool = True):
        self.model = model
        self.placement: Placement = resolve(
            "evaluator", job=job, site=site, connect=connect,
            weights=weights, secret_key=secret_key, environ=environ)
        self.layout: Layout = expected_layout(model, self.placement)
        self._binding = ModelBinding(model, self.layout, keep_base=False)
        self._handle_sigterm = handle_sigterm
        self._signalled = False
        self.tasks_done = 0
        self.stop_reason = ""

    def evaluate(self, task: EvalTask, validation: EvalFunction,
                 training_sample: Optional[EvalFunction] = None
                 ) -> Tuple[Dict[str, float], int, str]:
        """Loads the task's snapshot into the model and runs the function
        of its split with the model in eval mode under torch.no_grad()
        (the model's mode is restored after). Returns (metrics, samples,
        error): error is "" or the text of what the function raised (then
        no metrics)."""
        function = validation if task.split == wire_pb2.VALIDATION \
            else training_sample
        if function is None:
            return {}, 0, ("this evaluator has no function for %s tasks "
                           "(pass training_sample= to serve())" %
                           task.split_name)
        self._binding.load(task.arrays, check_finite=False)  # checked
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                metrics, samples = _parse_result(function(self.model))
            return metrics, samples, ""
        except Exception as error:  # the user's code: reported, not fatal
            _LOG.error("evaluation of model version %d (%s) failed:\n%s",
                       task.model_version, task.split_name,
                       traceback.format_exc())
            return {}, 0, "%s: %s" % (type(error).__name__, error)
        finally:
            self.model.train(was_training)

    def serve(self, validation: EvalFunction,
              training_sample: Optional[EvalFunction] = None) -> int:
        """Evaluates the site's snapshots until the job is over (or
        SIGTERM); returns the number of tasks done.

        `validation(model)` scores the model on the user's held-out data
        for VALIDATION tasks, `training_sample(model)` on a fixed sample of
        the site's training data for TRAINING_SAMPLE tasks. Each returns
        {metric name: value} or ({metric name: value}, samples); the names
        are the job's model.metrics (e.g. "accuracy", "loss"). An
        exception is reported to the site as the task's error, and serving
        goes on."""
        p = self.placement
        previous = self._install_sigterm()
        client = EvaluatorClient(
            p.endpoint, p.site, self.layout,
            **p.client_kwargs(stop_requested=lambda: self._signalled))
        try:
            client.wait_for_server()
            task = client.join()
            while not task.stop:
                metrics, samples, error = self.evaluate(task, validation,
                                                        training_sample)
                self.tasks_done += 1
                _LOG.info("task %d: model version %d, %s: %s", task.task_id,
                          task.model_version, task.split_name,
                          error or " ".join("%s=%.4g" % kv
                                            for kv in metrics.items()))
                if self._signalled:
                    raise Cancelled("stopped by SIGTERM")
                try:
                    task = client.report(task.task_id, metrics, samples,
                                         error)
                except ServerError as refused:
                    # A result the site cannot take (a metric the job does
                    # not name, a NaN): that task is lost, the next one
                    # comes with an empty report.
                    _LOG.error("the site refused the result of task %d: %s",
                               task.task_id, refused)
                    task = client.report(0)
            self.stop_reason = task.stop_reason
        except Cancelled:
            self.stop_reason = "stopped by SIGTERM"
            client.bye()
        finally:
            client.close()
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        _LOG.info("evaluator done (%s) after %d tasks", self.stop_reason,
                  self.tasks_done)
        return self.tasks_done

    def _install_sigterm(self):
        if not self._handle_sigterm or \
                threading.current_thread() is not threading.main_thread():
            return None

        def on_sigterm(signum, frame):
            self._signalled = True

        return signal.signal(signal.SIGTERM, on_sigterm)
