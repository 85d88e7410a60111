"""What `meridian run` tells a worker or evaluator program, and the job
file it runs.

The launcher starts every program of `workers { command: [...] }` and
`evaluator { command: [...] }` in the job file's directory with these
environment variables (docs/python.md, "Environment variables"); every one
is optional when the program passes the value explicitly:

    MERIDIAN_ROLE              worker | evaluator
    MERIDIAN_JOB               absolute path of the job file
    MERIDIAN_SITE              the site's name
    MERIDIAN_SITE_INDEX        the site's index in the job file (0-based)
    MERIDIAN_SITE_COUNT        sites in the job
    MERIDIAN_WORKER_INDEX      the worker's index inside its site
    MERIDIAN_WORKER_COUNT      workers of the site
    MERIDIAN_CONNECT           the site server's worker endpoint
    MERIDIAN_WEIGHTS           absolute path of the initial weights
                               (safetensors; EXTERNAL models)
    MERIDIAN_SECRET_KEY        the workers' CURVE secret key file, when the
                               site's worker endpoint is encrypted
    MERIDIAN_SERVER_PUBLIC_KEY the site server's CURVE public key (Z85)
    MERIDIAN_STEP_TIME_S       emulated device: a step takes at least this
    MERIDIAN_SEED              a seed for the program's own randomness
    MERIDIAN_OUT               the run directory
"""

import os
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Optional, TypeVar, Union

from google.protobuf import text_format

from . import job_pb2

ROLES = ("worker", "evaluator")

T = TypeVar("T")


@dataclass(frozen=True)
class Environment:
    """The MERIDIAN_* variables of one process, parsed (None: unset or
    empty). Environment.from_environ() reads them."""
    role: Optional[str] = None
    job: Optional[str] = None
    site: Optional[str] = None
    site_index: Optional[int] = None
    site_count: Optional[int] = None
    worker_index: Optional[int] = None
    worker_count: Optional[int] = None
    connect: Optional[str] = None
    weights: Optional[str] = None
    secret_key: Optional[str] = None
    server_public_key: Optional[str] = None
    step_time_s: Optional[float] = None
    seed: Optional[int] = None
    out: Optional[str] = None

    @staticmethod
    def from_environ(environ: Optional[Mapping[str, str]] = None
                     ) -> "Environment":
        """Parses MERIDIAN_<FIELD> of `environ` (default os.environ).
        ValueError naming the variable for a value of the wrong kind (a
        negative index, a role other than worker/evaluator, ...)."""
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(Environment):
            variable = "MERIDIAN_" + f.name.upper()
            text = environ.get(variable, "").strip()
            if not text:
                continue
            parse = _PARSERS.get(f.name, str)
            try:
                values[f.name] = parse(text)
            except ValueError as error:
                raise ValueError("%s=%r: %s" % (variable, text, error)) \
                    from None
        return Environment(**values)


def _index(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be a whole number >= 0")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number of seconds >= 0")
    return value


def _role(text: str) -> str:
    if text not in ROLES:
        raise ValueError("must be one of %s" % ", ".join(ROLES))
    return text


_PARSERS: Mapping[str, Callable[[str], object]] = {
    "role": _role, "site_index": _index, "site_count": _index,
    "worker_index": _index, "worker_count": _index, "step_time_s": _seconds,
    "seed": _index,
}


def environment(environ: Optional[Mapping[str, str]] = None) -> Environment:
    """This process's MERIDIAN_* variables (see Environment)."""
    return Environment.from_environ(environ)


# ---- the job file ----------------------------------------------------------
def load_job(path: Union[str, os.PathLike]) -> "job_pb2.JobConfig":
    """The job file (text-format pb.JobConfig) at `path`, with the address
    overrides `meridian worker` applies (MERIDIAN_SITE_<NAME>_ADDRESS,
    MERIDIAN_WANEM_HOST). OSError when unreadable,
    google.protobuf.text_format.ParseError (line and column) when
    malformed."""
    job = job_pb2.JobConfig()
    with open(os.fspath(path)) as f:
        text_format.Parse(f.read(), job)
    for site in job.site:
        variable = "MERIDIAN_SITE_%s_ADDRESS" % "".join(
            c.upper() if c.isalnum() else "_" for c in site.name)
        if os.environ.get(variable):
            site.address = os.environ[variable]
    if os.environ.get("MERIDIAN_WANEM_HOST"):
        job.wan.wanem_host = os.environ["MERIDIAN_WANEM_HOST"]
    return job


def site_index(job: "job_pb2.JobConfig", site: str) -> int:
    """The index of the site called `site`. ValueError naming the sites
    when there is none."""
    names = [s.name for s in job.site]
    if site not in names:
        raise ValueError("no site '%s' in the job (sites: %s)" %
                         (site, ", ".join(names)))
    return names.index(site)


def serving_site_index(job: "job_pb2.JobConfig", index: int) -> int:
    """The site whose server the workers of site `index` talk to (its own,
    or the one its server_site names)."""
    site = job.site[index]
    return site_index(job, site.server_site) if site.server_site else index


def server_endpoint(job: "job_pb2.JobConfig", index: int) -> str:
    """WorkerServerEndpoint (src/sync/addresses.cc): where the workers of
    site `index` reach their server: the site's own address, or the
    server_site's (through a standalone wanem when wan.wanem_host is set).
    `meridian run` passes the real one as MERIDIAN_CONNECT."""
    site = job.site[index]
    if not site.server_site:
        return site.address
    serving = serving_site_index(job, index)
    if not job.wan.wanem_host:
        return job.site[serving].address
    s = len(job.site)
    port = job.wan.route_base_port + s * s + index * s + serving
    return "tcp://%s:%d" % (job.wan.wanem_host, port)


def job_relative(job_path: Optional[str], path: str) -> str:
    """`path` from the job file, relative to the job file's directory (as
    the launcher resolves model.weights)."""
    if os.path.isabs(path) or not job_path:
        return path
    return os.path.join(os.path.dirname(os.path.abspath(job_path)), path)


def first_of(*values: Optional[T]) -> Optional[T]:
    """The first value that is not None."""
    for value in values:
        if value is not None:
            return value
    return None
