"""Helpers of the Python tests (tests/python): generated data sets, job
files and live `meridian site` / `meridian worker` processes. Real
processes and sockets only.

Every test script takes the same arguments (tests/CMakeLists.txt):
  --meridian PATH        the meridian binary
  --python-path DIRS     ':'-separated: <build>/python (generated *_pb2)
                         and <source>/python (the package meridian)
  --source DIR           the source tree (examples/, python/)
  --build DIR            the build tree (optional; where a test may keep
                         what it makes, e.g. a venv)
and passes the rest to unittest.
"""

import argparse
import gzip
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ARGS = None  # set by parse_args()


def parse_args():
    """Parses the common arguments, puts --python-path on sys.path, and
    returns what unittest should see."""
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--meridian", required=True)
    parser.add_argument("--python-path", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--build", default="")
    ARGS, rest = parser.parse_known_args()
    for entry in reversed(ARGS.python_path.split(":")):
        sys.path.insert(0, entry)
    return [sys.argv[0]] + rest


def child_env():
    """The environment of Python children: the same module path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ARGS.python_path + (
        ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def make_temp_dir(prefix):
    """A fresh directory under $TEST_TMPDIR (or /tmp)."""
    root = os.environ.get("TEST_TMPDIR", tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=prefix + "-", dir=root)


def _write_idx(path, magic, dims, body):
    header = np.array([magic] + list(dims), dtype=">u4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + body.tobytes())


def write_synthetic_idx(directory, train_samples=4000, test_samples=1000,
                        rows=28, cols=28, noise=60.0, seed=7):
    """Fashion-MNIST-shaped gzip IDX files in `directory`, as
    tests/testing/test_data.cc writes them: 10 classes, each a random
    prototype image plus Gaussian pixel noise (label = sample % 10)."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    dim = rows * cols
    prototypes = rng.uniform(0.0, 255.0, size=(10, dim))

    def generate(count):
        labels = (np.arange(count) % 10).astype(np.uint8)
        pixels = prototypes[labels] + rng.normal(0.0, noise,
                                                 size=(count, dim))
        return (np.clip(pixels, 0, 255).astype(np.uint8).reshape(
            count, rows, cols), labels)

    for prefix, count in (("train", train_samples), ("t10k", test_samples)):
        images, labels = generate(count)
        _write_idx(os.path.join(directory, prefix + "-images-idx3-ubyte.gz"),
                   0x803, images.shape, images)
        _write_idx(os.path.join(directory, prefix + "-labels-idx1-ubyte.gz"),
                   0x801, labels.shape, labels)


def write_job(job, path):
    """Writes pb.JobConfig `job` as text format."""
    from google.protobuf import text_format
    with open(path, "w") as f:
        f.write(text_format.MessageToString(job))


class Processes:
    """Child processes of one test, each in its own process group with its
    output in a log file; stop_all() kills whatever is still running."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.children = []  # (name, Popen, log path)

    def start(self, name, argv, env=None, pass_fds=()):
        log_path = os.path.join(self.log_dir, name + ".log")
        log = open(log_path, "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                env=env, pass_fds=pass_fds,
                                start_new_session=True)
        log.close()
        self.children.append((name, proc, log_path))
        return proc

    def start_site(self, job_path, site, out_dir, timeout_s=60.0,
                   extra_args=(), name=None):
        """`meridian site` on the job's (port 0) address; returns (Popen,
        worker endpoint) once it wrote its ready line. `extra_args` follow
        the command (--resume); `name` names its log (default site-SITE)."""
        read_fd, write_fd = os.pipe()
        name = name or "site-" + site
        proc = self.start(name,
                          [ARGS.meridian, "site", "--config", job_path,
                           "--site", site, "--out", out_dir, "--ready-fd",
                           str(write_fd)] + list(extra_args),
                          pass_fds=(write_fd,))
        os.close(write_fd)
        line = b""
        deadline = time.monotonic() + timeout_s
        try:
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                ready, _, _ = select.select([read_fd], [], [], max(0, left))
                if not ready:
                    raise RuntimeError("site %s wrote no ready line within "
                                       "%.0f s:\n%s" % (site, timeout_s,
                                                        self.log(name)))
                chunk = os.read(read_fd, 256)
                if not chunk:
                    raise RuntimeError("site %s exited before it was "
                                       "ready:\n%s" % (site, self.log(name)))
                line += chunk
        finally:
            os.close(read_fd)
        words = line.decode().split()
        assert words[0] == "ready", line
        return proc, words[1]

    def log(self, name):
        for child, _, path in self.children:
            if child == name:
                with open(path, "rb") as f:
                    return f.read().decode(errors="replace")
        return ""

    def wait_all(self, timeout_s):
        """{name: exit status} once every child ended; raises
        TimeoutError naming those still running after timeout_s."""
        deadline = time.monotonic() + timeout_s
        codes = {}
        for name, proc, _ in self.children:
            try:
                codes[name] = proc.wait(max(0.0, deadline -
                                            time.monotonic()))
            except subprocess.TimeoutExpired:
                running = [n for n, p, _ in self.children if p.poll() is None]
                raise TimeoutError("still running after %.0f s: %s" %
                                   (timeout_s, ", ".join(running)))
        return codes

    def stop_all(self):
        for _, proc, _ in self.children:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()

    def dump_logs(self, stream=sys.stderr):
        for name, _, path in self.children:
            with open(path, "rb") as f:
                text = f.read().decode(errors="replace")
            stream.write("===== %s (%s) =====\n%s\n" % (name, path,
                                                         text[-20000:]))


def remove_dir(path):
    shutil.rmtree(path, ignore_errors=True)
