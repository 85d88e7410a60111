#!/usr/bin/python3
"""A Meridian worker in PyTorch: joins a live site server as worker N next
to C++ workers (`meridian worker`), trains the job's model on its shard of
the site's data, commits its accumulated change and pulls as the server's
plan says, and exits when the server says stop.

    examples/pytorch_worker.py --config JOB.pbtxt --site NAME --index N \
        [--connect tcp://HOST:PORT]

It does what src/runtime/worker.cc does, over the protocol of
docs/worker-protocol.md (python/meridian_client):
  - the job file (text format) is read into the generated pb.JobConfig;
  - the model is the job's MLP (or softmax regression) with the tensor
    names and shapes of the C++ model ("fc<l>.weight" [out, in],
    "fc<l>.bias" [out]), checked against the layout the site sends in
    WELCOME;
  - the data are this worker's shard, selected and normalised exactly as
    the C++ worker does (meridian_client.data);
  - SGD with the job's learning rate, schedule, momentum, weight decay and
    batch size (torch.optim.SGD computes the same heavy-ball update);
  - an emulated device's step time (site.workers.step_time_s) is waited
    out after each step;
  - a commit when the plan says (local_steps steps or interval_s seconds,
    whichever first, counted from the last reply), carrying the change
    since the model last loaded; the reply's model replaces the local one
    (the optimizer's momentum buffers are kept, as the C++ worker keeps
    its velocity);
  - a refused commit is dropped and the model pulled again; five refusals
    in a row end the worker with an error;
  - SIGINT/SIGTERM: BYE after the current step.

Exit status: 0 when the server ended the job, 1 on an error, 2 for bad
input, 130 when interrupted. Run it with the system Python, which has the
Debian packages python3-torch, python3-zmq, python3-protobuf and
python3-numpy; PYTHONPATH must reach python/ (meridian_client) and
<build>/python (the generated modules; see python/meridian_client/_proto.py).
"""

import argparse
import logging
import math
import os
import signal
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from google.protobuf import text_format  # noqa: E402

import meridian_client as mc  # noqa: E402
from meridian_client import data as mdata  # noqa: E402

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# Refused commits in a row after which the worker gives up
# (kMaxConsecutiveRejections).
MAX_CONSECUTIVE_REJECTIONS = 5
# Smoothing of the reported loss and commit round trip (kEmaWeight).
EMA_WEIGHT = 0.1
NUM_CLASSES = 10

LOG = logging.getLogger("pytorch_worker")


class Mlp(torch.nn.Module):
    """The C++ model (src/train/mlp.cc) in PyTorch: Linear layers fc0, fc1
    ... with ReLU between them and none after the last. named_parameters()
    yields fc0.weight [out, in], fc0.bias [out], fc1.weight ... — the
    layout's names, shapes and order."""

    def __init__(self, widths):
        super().__init__()
        self.depth = len(widths) - 1
        for layer in range(self.depth):
            setattr(self, "fc%d" % layer,
                    torch.nn.Linear(widths[layer], widths[layer + 1]))

    def forward(self, x):
        for layer in range(self.depth):
            x = getattr(self, "fc%d" % layer)(x)
            if layer + 1 < self.depth:
                x = torch.relu(x)
        return x


def learning_rate_at(optimizer_config, step: int) -> float:
    """LearningRateAt (src/train/optimizer.cc); `step` is 0-based."""
    lr = optimizer_config.learning_rate
    step_size = optimizer_config.step_size or 1
    if optimizer_config.schedule == mc.job_pb2.STEP:
        return lr * optimizer_config.gamma ** (step // step_size)
    if optimizer_config.schedule == mc.job_pb2.INVERSE_SQRT:
        return lr / math.sqrt(1.0 + step / step_size)
    return lr


def load_job(path: str):
    job = mc.job_pb2.JobConfig()
    with open(path) as f:
        text_format.Parse(f.read(), job)
    # The address overrides of `meridian worker` (ApplyAddressOverrides).
    for site in job.site:
        variable = "MERIDIAN_SITE_%s_ADDRESS" % "".join(
            c.upper() if c.isalnum() else "_" for c in site.name)
        if os.environ.get(variable):
            site.address = os.environ[variable]
    if os.environ.get("MERIDIAN_WANEM_HOST"):
        job.wan.wanem_host = os.environ["MERIDIAN_WANEM_HOST"]
    return job


def server_endpoint(job, site_index: int) -> str:
    """WorkerServerEndpoint (src/sync/addresses.cc): the site's own server,
    or the server_site's (through a standalone wanem when wanem_host is
    set)."""
    site = job.site[site_index]
    if not site.server_site:
        return site.address
    names = [s.name for s in job.site]
    serving = names.index(site.server_site)
    if not job.wan.wanem_host:
        return job.site[serving].address
    s = len(job.site)
    port = job.wan.route_base_port + s * s + site_index * s + serving
    return "tcp://%s:%d" % (job.wan.wanem_host, port)


class Trainer:
    """The training loop of one worker (Worker::Impl::Run)."""

    def __init__(self, job, site_index: int, index: int, endpoint: str,
                 stop_requested):
        self.job = job
        self.site = job.site[site_index]
        self.index = index
        self.stop_requested = stop_requested
        self.step_time_s = mdata.worker_group(self.site, index).step_time_s

        started = time.monotonic()
        features, labels = mdata.load_worker_data(job, site_index, index)
        if labels.size == 0:
            raise ValueError("worker %d of site '%s' has no training samples "
                             "(partition too small)" % (index,
                                                        self.site.name))
        self.features = torch.from_numpy(features)
        self.labels = torch.from_numpy(labels.astype(np.int64))
        LOG.info("loaded %d samples of dimension %d in %.1f s", labels.size,
                 features.shape[1], time.monotonic() - started)

        self.layout = mc.layout_for_model(job.model, features.shape[1],
                                          NUM_CLASSES)
        widths = [features.shape[1]] + list(job.model.hidden) + [NUM_CLASSES]
        self.model = Mlp(widths)
        ours = mc.Layout.from_shapes(
            [(name, tuple(p.shape)) for name, p in
             self.model.named_parameters()])
        if ours != self.layout:  # a bug here, not in the job
            raise AssertionError("PyTorch model [%s] differs from the "
                                 "layout [%s]" % (ours, self.layout))
        config = job.optimizer
        self.optimizer_config = config
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=config.learning_rate,
            momentum=config.momentum, weight_decay=config.weight_decay)
        self.batch = min(config.batch_size, labels.size)
        # Epoch permutations of the local samples (the C++ worker seeds its
        # generator the same way; its std::shuffle is not reproducible).
        self.rng = np.random.default_rng(
            job.seed * 1000003 + site_index * 1009 + index)
        self.order = np.arange(labels.size)
        self.cursor = labels.size  # shuffle before the first batch

        self.stats = mc.wire_pb2.WorkerStats()
        self.client = mc.WorkerClient.from_job(
            job, self.site.name, index, self.layout, endpoint,
            stop_requested=stop_requested)
        self.base = None           # the model last loaded (flat float32)
        self.base_version = 0
        self.plan = mc.wire_pb2.CommitPlan()
        self.steps_since_commit = 0
        self.last_reply_time = time.monotonic()
        self.consecutive_rejections = 0

    # ---- the model as a flat vector in layout order -------------------------
    def load(self, reply: "mc.Reply") -> None:
        """The reply's model becomes the local model and the base of the
        next commit; the plan and its counters restart (CommitTrigger)."""
        flat = torch.from_numpy(reply.params.copy())
        torch.nn.utils.vector_to_parameters(flat, self.model.parameters())
        self.base = reply.params.copy()
        self.base_version = reply.version
        self.plan = reply.plan
        self.steps_since_commit = 0
        self.last_reply_time = time.monotonic()

    def local(self) -> np.ndarray:
        return torch.nn.utils.parameters_to_vector(
            self.model.parameters()).detach().numpy()

    # ---- training ----------------------------------------------------------
    def next_batch(self):
        picked = np.empty(self.batch, dtype=np.int64)
        for j in range(self.batch):
            if self.cursor >= self.order.size:
                self.rng.shuffle(self.order)
                self.cursor = 0
            picked[j] = self.order[self.cursor]
            self.cursor += 1
        index = torch.from_numpy(picked)
        return self.features[index], self.labels[index]

    def train_one_step(self) -> bool:
        """One minibatch step; True when the plan says to commit now."""
        start = time.monotonic()
        x, y = self.next_batch()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at(self.optimizer_config,
                                           self.stats.steps)
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        computed = time.monotonic()
        self.stats.compute_s += computed - start
        if self.step_time_s > 0:  # an emulated, slower device
            end = start + self.step_time_s
            if end > computed:
                time.sleep(end - computed)
                self.stats.device_wait_s += end - computed
        value = float(loss.detach())
        self.stats.last_loss = value if self.stats.steps == 0 else (
            (1 - EMA_WEIGHT) * self.stats.last_loss + EMA_WEIGHT * value)
        self.stats.steps += 1
        self.steps_since_commit += 1
        # CommitTrigger::OnStep: steps or time, whichever first; a plan
        # with neither commits every step.
        by_steps = (self.plan.local_steps > 0 and
                    self.steps_since_commit >= self.plan.local_steps)
        by_time = (self.plan.interval_s > 0 and time.monotonic() -
                   self.last_reply_time >= self.plan.interval_s)
        no_trigger = self.plan.local_steps == 0 and self.plan.interval_s <= 0
        return by_steps or by_time or no_trigger

    def commit(self) -> bool:
        """Sends the change since the last load; False when the job is
        over (BYE said)."""
        sent = time.monotonic()
        delta = self.local() - self.base
        try:
            reply = self.client.commit(delta, self.base_version,
                                       self.steps_since_commit, self.stats,
                                       clock=self.stats.commits)
        except mc.ServerError as error:
            # The update is dropped; resynchronise and go on, unless the
            # server keeps refusing.
            LOG.error("commit of %d steps dropped by the site server: %s: %s",
                      self.steps_since_commit, error.code_name, error.message)
            self.consecutive_rejections += 1
            if self.consecutive_rejections >= MAX_CONSECUTIVE_REJECTIONS:
                raise
            pulled = self.client.pull()
            if not pulled.stop:
                self.load(pulled)
            return True
        round_trip = time.monotonic() - sent
        self.stats.blocked_s += round_trip
        self.stats.commit_overhead_s = round_trip if self.stats.commits == 0 \
            else ((1 - EMA_WEIGHT) * self.stats.commit_overhead_s +
                  EMA_WEIGHT * round_trip)
        self.stats.commits += 1
        self.consecutive_rejections = 0
        if reply.stop:
            self.leave(reply.stop_reason or "the job is over")
            return False
        self.load(reply)
        return True

    def leave(self, reason: str) -> None:
        LOG.info("leaving (%s) after %d steps and %d commits", reason,
                 self.stats.steps, self.stats.commits)
        self.client.bye(self.stats)

    def run(self) -> int:
        self.client.wait_for_server()
        try:
            welcome = self.client.join()
        except mc.Cancelled:
            self.leave("stop requested")
            return EXIT_INTERRUPTED
        if welcome.stop:
            self.leave("the job is over")
            return EXIT_OK
        self.load(welcome)
        LOG.info("joined; model [%s], version %d; plan: commit every %d "
                 "steps / %.2f s", self.layout, welcome.version,
                 self.plan.local_steps, self.plan.interval_s)
        while True:
            if self.stop_requested():
                self.leave("stop requested")
                return EXIT_INTERRUPTED
            commit_now = self.train_one_step()
            self.client.heartbeat_if_idle()
            if not commit_now:
                continue
            try:
                if not self.commit():
                    return EXIT_OK
            except mc.Cancelled:
                self.leave("stop requested")
                return EXIT_INTERRUPTED


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Run one Meridian worker in PyTorch (as `meridian "
        "worker`).")
    parser.add_argument("--config", required=True, help="job file")
    parser.add_argument("--site", required=True, help="site name in the job")
    parser.add_argument("--index", required=True, type=int,
                        help="worker index inside the site")
    parser.add_argument("--connect", "--endpoint", dest="connect",
                        default=os.environ.get("MERIDIAN_CONNECT", ""),
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
        job = load_job(args.config)
    except (OSError, text_format.ParseError) as error:
        LOG.error("cannot read the job file: %s", error)
        return EXIT_BAD_INPUT
    names = [site.name for site in job.site]
    if args.site not in names:
        LOG.error("no site '%s' in the job (sites: %s)", args.site,
                  ", ".join(names))
        return EXIT_BAD_INPUT
    site_index = names.index(args.site)
    count = mdata.site_worker_count(job.site[site_index])
    if not 0 <= args.index < count:
        LOG.error("site '%s' has %d workers; there is no worker %d",
                  args.site, count, args.index)
        return EXIT_BAD_INPUT
    endpoint = args.connect or server_endpoint(job, site_index)

    stop = {"requested": False}

    def on_signal(signum, _frame):
        stop["requested"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        trainer = Trainer(job, site_index, args.index, endpoint,
                          lambda: stop["requested"])
        return trainer.run()
    except (mc.ServerError, mc.ServerGone, mc.LayoutMismatch,
            mc.ProtocolError, OSError, ValueError) as error:
        LOG.error("%s", error)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
