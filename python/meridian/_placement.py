"""Where a Session or Evaluator runs: its site, index, endpoint, keys,
initial weights, device step time and timeouts, from explicit arguments
first, then the MERIDIAN_* environment, then the job file."""

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

import torch

from . import data as mdata
from . import job_pb2
from .binding import model_layout
from .client import CurveKeys
from .environment import (Environment, first_of, job_relative, load_job,
                          server_endpoint, serving_site_index, site_index)
from .layout import Layout, layout_for_model
from .tensors import weights_layout

_LOG = logging.getLogger("meridian")

JobArg = Union[None, str, "os.PathLike[str]", "job_pb2.JobConfig"]


@dataclass
class Placement:
    """The resolved settings of one worker or evaluator process."""
    site: str
    index: int                       # worker index; 0 for an evaluator
    endpoint: str
    env: Environment
    job: Optional["job_pb2.JobConfig"] = None
    job_path: Optional[str] = None
    site_index: Optional[int] = None
    weights: Optional[str] = None    # initial-weights file, when known
    curve: Optional[CurveKeys] = None
    step_time_s: float = 0.0
    timeouts: Dict[str, float] = field(default_factory=dict)

    def client_kwargs(self, **extra: Any) -> Dict[str, Any]:
        """Keyword arguments of WorkerClient/EvaluatorClient."""
        kwargs = dict(self.timeouts)
        kwargs.update(extra)
        if self.curve is not None:
            kwargs["curve"] = self.curve
        return kwargs


def _job_of(job: JobArg, env: Environment):
    if job is None:
        job = env.job
    if job is None:
        return None, None
    if isinstance(job, job_pb2.JobConfig):
        return job, None
    path = os.fspath(job)
    return load_job(path), path


def _timeouts(job) -> Dict[str, float]:
    if job is None:
        return {}
    fault = job.fault

    def positive(value, default):
        return value if value > 0 and value == value else default

    give_up = fault.worker_give_up_s
    return {"heartbeat_interval_s": positive(fault.heartbeat_interval_s, 1.0),
            "server_timeout_s": positive(fault.server_timeout_s, 10.0),
            "give_up_s": give_up if give_up >= 0 else 600.0}


def _curve(env: Environment, job, serving: Optional[int],
           secret_key: Optional[str]) -> Optional[CurveKeys]:
    """The CURVE keys when the worker endpoint is encrypted: a secret key
    file from the argument or $MERIDIAN_SECRET_KEY (or, with a job whose
    serving site lists worker_curve_public_key, <key_dir>/workers/
    <site>.key), and the server's key from $MERIDIAN_SERVER_PUBLIC_KEY or
    the serving site's curve_public_key."""
    served = None
    if job is not None and serving is not None:
        served = job.site[serving]
    path = first_of(secret_key, env.secret_key)
    if path is None and served is not None and job.security.curve and \
            served.worker_curve_public_key:
        if not job.security.key_dir:
            raise ValueError(
                "the workers of site '%s' need their CURVE secret key file "
                "(worker_curve_public_key is set): set MERIDIAN_SECRET_KEY "
                "or security { key_dir } in the job file" % served.name)
        path = os.path.join(job.security.key_dir, "workers",
                            served.name + ".key")
    if path is None:
        return None
    server_key = env.server_public_key
    if server_key is None and served is not None:
        server_key = served.curve_public_key or None
    if server_key is None:
        raise ValueError("a CURVE secret key is set but not the server's "
                         "public key: set MERIDIAN_SERVER_PUBLIC_KEY")
    return CurveKeys.from_files(path, server_key)


def resolve(role: str, *, job: JobArg = None, site: Optional[str] = None,
            worker: Optional[int] = None, connect: Optional[str] = None,
            weights: Optional[str] = None,
            step_time_s: Optional[float] = None,
            secret_key: Optional[str] = None,
            environ: Optional[Mapping[str, str]] = None) -> Placement:
    """The settings of a `role` ("worker" or "evaluator") process.
    ValueError naming what is missing."""
    env = Environment.from_environ(environ)
    job_config, job_path = _job_of(job, env)
    site = first_of(site, env.site)
    if site is None and job_config is not None and len(job_config.site) == 1:
        site = job_config.site[0].name
    if site is None:
        raise ValueError("which site? pass site= or set MERIDIAN_SITE")
    index_in_job = None
    serving = None
    if job_config is not None:
        index_in_job = site_index(job_config, site)
        serving = serving_site_index(job_config, index_in_job)
    if role == "worker":
        worker = first_of(worker, env.worker_index)
        if worker is None:
            raise ValueError("which worker of site '%s'? pass worker= or set "
                             "MERIDIAN_WORKER_INDEX" % site)
    else:
        worker = 0
    endpoint = first_of(connect, env.connect)
    if endpoint is None and job_config is not None:
        endpoint = server_endpoint(job_config, index_in_job)
    if endpoint is None:
        raise ValueError("where is the site server? pass connect= or set "
                         "MERIDIAN_CONNECT (or MERIDIAN_JOB)")
    weights = first_of(weights, env.weights)
    if weights is None and job_config is not None and \
            job_config.model.kind == job_pb2.EXTERNAL and \
            job_config.model.weights:
        weights = job_relative(job_path, job_config.model.weights)
    if step_time_s is None:
        step_time_s = env.step_time_s
    if step_time_s is None and role == "worker" and job_config is not None:
        site_config = job_config.site[index_in_job]
        if site_config.workers and worker < mdata.site_worker_count(
                site_config):
            step_time_s = mdata.worker_group(site_config, worker).step_time_s
    return Placement(site=site, index=worker, endpoint=endpoint, env=env,
                     job=job_config, job_path=job_path,
                     site_index=first_of(index_in_job, env.site_index),
                     weights=weights,
                     curve=_curve(env, job_config, serving, secret_key),
                     step_time_s=float(step_time_s or 0.0),
                     timeouts=_timeouts(job_config))


def expected_layout(model: torch.nn.Module, placement: Placement) -> Layout:
    """The layout the site serves, as far as it can be known before
    joining: the initial-weights file's floating-point tensors in the
    order of their data; a built-in SOFTMAX/MLP job's layout; else the
    model's own floating-point tensors in state_dict order (the site then
    compares them with its own on HELLO)."""
    if placement.weights is not None:
        return weights_layout(placement.weights)
    job = placement.job
    if job is not None and job.model.kind in (job_pb2.SOFTMAX, job_pb2.MLP):
        return layout_for_model(job.model, mdata.input_dim(job))
    return model_layout(model)
