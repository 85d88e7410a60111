#!/usr/bin/python3
"""meridian.Session, the PyTorch worker API.

Against a live `meridian site` (a built-in MLP job, SUM rule, ASYNC): the
session joins from the MERIDIAN_* environment, commits exactly the change
its optimizer steps made since the model last loaded, loads the site's
answer into the model's own parameters, follows the plan's local_steps,
keeps the optimizer's momentum across loads, and says BYE with its
statistics when the loop ends (the site then finishes).

Against FakeSite, a test double of the server (for what a real server
cannot be made to do on cue, and for F16/BF16/F64 tensors, which the
server side does not serve yet): float32 changes of other dtypes and their
conversion back, the interval plan, a refused commit dropped and the model
pulled, a commit sent again after the server lost the connection, a stop,
SIGTERM, the device step time, and the model checked against the layout
before anything connects. Quick tier.
"""

import json
import os
import signal
import time
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import meridian  # noqa: E402
from fake_site import FakeSite  # noqa: E402
from meridian import job_pb2  # noqa: E402
from meridian import wire_pb2 as wire  # noqa: E402
from meridian.binding import model_layout  # noqa: E402

SITE = "solo"
ROWS = COLS = 8


class Mlp(torch.nn.Module):
    """fc0 [6, 64], fc1 [10, 6]: the job's MLP with hidden 6."""

    def __init__(self, hidden=6):
        super().__init__()
        self.fc0 = torch.nn.Linear(ROWS * COLS, hidden)
        self.fc1 = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc1(torch.relu(self.fc0(x.flatten(1))))


def flat(model):
    return torch.cat([p.detach().reshape(-1).float()
                      for p in model.parameters()]).numpy().copy()


class LiveSiteSessionTest(unittest.TestCase):
    """One session against a real site server."""

    def setUp(self):
        self.dir = live_site.make_temp_dir("python-session")
        self.procs = live_site.Processes(self.dir)
        data_dir = os.path.join(self.dir, "data")
        live_site.write_synthetic_idx(data_dir, train_samples=200,
                                      test_samples=50, rows=ROWS, cols=COLS)
        self.job = job = job_pb2.JobConfig(name="python-session", seed=5,
                                           time_budget_s=300)
        site = job.site.add(name=SITE, address="tcp://127.0.0.1:0")
        site.workers.add(count=1)
        job.model.kind = job_pb2.MLP
        job.model.hidden.append(6)
        job.data.dir = data_dir
        job.server.apply_rule = job_pb2.SUM
        job.server.learning_rate = 1.0
        job.server.eval_period_s = 60
        job.policy.kind = job_pb2.ASYNC
        job.policy.local_steps = 3
        job.fault.checkpoint_period_s = 0
        self.job_path = os.path.join(self.dir, "job.pbtxt")
        live_site.write_job(job, self.job_path)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)

    def tearDown(self):
        self.procs.stop_all()
        if self.dir:
            live_site.remove_dir(self.dir)

    def test_commits_the_change_and_loads_the_sites_model(self):
        try:
            self._run()
        except BaseException:
            self.procs.dump_logs()
            self.dir = None
            raise

    def keygen(self, out):
        """`meridian keygen --site SITE --out OUT`: the public key."""
        import subprocess
        subprocess.run([live_site.ARGS.meridian, "keygen", "--site", SITE,
                        "--out", out], check=True, capture_output=True)
        with open(os.path.join(out, SITE + ".pub")) as f:
            return [line.strip() for line in f
                    if line.strip() and not line.startswith("#")][0]

    def test_a_curve_worker_endpoint(self):
        # site.worker_curve_public_key: the endpoint admits only the
        # workers' key; the session finds its secret key in
        # <key_dir>/workers/<site>.key and the server's in the job file.
        key_dir = os.path.join(self.dir, "keys")
        self.job.site[0].curve_public_key = self.keygen(key_dir)
        self.job.site[0].worker_curve_public_key = self.keygen(
            os.path.join(key_dir, "workers"))
        self.job.security.key_dir = key_dir
        live_site.write_job(self.job, self.job_path)
        try:
            site, endpoint = self.procs.start_site(self.job_path, SITE,
                                                   self.out)
            torch.manual_seed(2)
            model = Mlp()
            session = meridian.Session(
                model, torch.optim.SGD(model.parameters(), lr=0.1),
                job=self.job_path, worker=0, connect=endpoint, environ={})
            self.assertIsNotNone(session.placement.curve)
            with session:
                for p in model.parameters():
                    p.grad = torch.ones_like(p)
                for _ in range(3):
                    session.step()
                self.assertEqual(session.stats.commits, 1)
            self.assertEqual(site.wait(60), 0)
        except BaseException:
            self.procs.dump_logs()
            self.dir = None
            raise

    def _run(self):
        site, endpoint = self.procs.start_site(self.job_path, SITE, self.out)
        environ = {"MERIDIAN_ROLE": "worker", "MERIDIAN_JOB": self.job_path,
                   "MERIDIAN_SITE": SITE, "MERIDIAN_SITE_INDEX": "0",
                   "MERIDIAN_WORKER_INDEX": "0", "MERIDIAN_CONNECT": endpoint}
        torch.manual_seed(1)
        model = Mlp()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        shard = meridian.data.fashion_mnist_shard(self.job_path, SITE, 0)
        loader = torch.utils.data.DataLoader(shard, batch_size=16,
                                             shuffle=True)
        steps = 0
        with meridian.Session(model, optimizer, environ=environ) as session:
            self.assertTrue(session.running)
            self.assertEqual(session.plan, meridian.Plan(3, 0.0))
            self.assertEqual(session.model_version, 0)
            base = flat(model)  # the site's initial model, loaded
            self.assertTrue(np.all(base[6 * 64:6 * 64 + 6] == 0),
                            "the site's zero biases replaced torch's")
            for x, y in session.batches(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                version = session.model_version
                # What step() will commit: after optimizer.step().
                optimizer.step()
                local = flat(model)
                session.optimizer = None  # stepped already, just above
                session.step(loss)
                session.optimizer = optimizer
                steps += 1
                if steps % 3:
                    self.assertEqual(session.model_version, version)
                    np.testing.assert_array_equal(flat(model), local)
                    continue
                # Committed after 3 steps: SUM with rate 1 and one worker
                # is W += U in float32, U = local - base.
                self.assertEqual(session.model_version, version + 1)
                np.testing.assert_array_equal(
                    flat(model), base + (local - base))
                base = flat(model)
                if steps == 12:
                    break
            self.assertEqual(session.stats.commits, 4)
            self.assertEqual(session.stats.steps, 12)
            self.assertTrue(any(s["momentum_buffer"] is not None
                                for s in optimizer.state.values()))
        self.assertFalse(session.running)
        self.assertEqual(session.stop_reason, "the training loop ended")
        # The BYE: the site's only worker left, so it finished.
        self.assertEqual(site.wait(60), 0)
        with open(os.path.join(self.out, "site-%s.json" % SITE)) as f:
            summary = json.load(f)
        self.assertEqual(summary["stop_reason"], "every worker left")
        self.assertEqual(summary["commits"], 4)
        self.assertEqual(summary["rejected"], 0)
        worker = summary["workers"][0]
        self.assertEqual((worker["steps"], worker["commits"]), (12, 4))


def plan(local_steps, interval_s=0.0):
    return wire.CommitPlan(local_steps=local_steps, interval_s=interval_s)


class Mixed(torch.nn.Module):
    """Tensors of every type a site holds, and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(3, dtype=torch.float32))
        self.b = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
        self.c = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
        self.d = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))


class FakeSiteSessionTest(unittest.TestCase):
    """The session's rules against a scripted test double."""

    def setUp(self):
        self.model = Mixed()
        self.layout = model_layout(self.model)
        self.version = 10

    def model_frames(self, msg_type, value, plan_=None, **extra):
        arrays = [np.full(t.size, value, np.float32)
                  for t in self.layout.tensors]
        if msg_type == wire.WELCOME:
            body = wire.Welcome(model_version=self.version,
                                plan=plan_ or plan(1), site_workers=1,
                                **extra)
            self.layout.to_specs(body.layout)
            header = FakeSite.header(wire.WELCOME, welcome=body)
        else:
            header = FakeSite.header(wire.MODEL, model=wire.Model(
                version=self.version, plan=plan_ or plan(1), **extra))
        return FakeSite.with_model(header, self.layout, arrays)

    def stop(self):
        return FakeSite.header(wire.MODEL, model=wire.Model(
            stop=True, stop_reason="target accuracy reached")), []

    def session(self, site, **kwargs):
        kwargs.setdefault("environ", {})
        return meridian.Session(self.model, torch.optim.SGD(
            self.model.parameters(), lr=1.0), site="fake", worker=0,
            connect=site.endpoint, **kwargs)

    def grad(self, value):
        for p in self.model.parameters():
            p.grad = torch.full_like(p, value)

    def test_other_dtypes_commit_float32_changes_and_load_converted(self):
        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                return [self.model_frames(wire.WELCOME, 0.5, plan(2))]
            if kind == wire.COMMIT:
                self.version += 1
                if self.version == 12:
                    return [self.stop()]
                return [self.model_frames(wire.MODEL, 0.25, plan(2))]
            if kind == wire.BYE:
                return [(FakeSite.header(wire.BYE), [])]
            return []

        with FakeSite(script) as site:
            with self.session(site) as session:
                hello = site.of_type(wire.HELLO)[0].header.hello
                self.assertEqual([(s.name, s.type) for s in hello.layout],
                                 [("a", wire.TENSOR_TYPE_F32),
                                  ("b", wire.TENSOR_TYPE_F64),
                                  ("c", wire.TENSOR_TYPE_F16),
                                  ("d", wire.TENSOR_TYPE_BF16)])
                self.assertEqual(self.model.b.dtype, torch.float64)
                self.assertTrue(torch.all(self.model.b == 0.5))
                while session.running:
                    self.grad(0.125)  # p -= 1.0 * 0.125 per step
                    session.step(torch.tensor(2.0))
            self.assertEqual(session.stop_reason, "target accuracy reached")
            commits = site.of_type(wire.COMMIT)
            self.assertEqual(len(commits), 2)
            first = commits[0]
            self.assertEqual(first.header.commit.base_version, 10)
            self.assertEqual(first.header.commit.local_steps, 2)
            self.assertEqual(first.header.commit.commit_id, 1)
            # Two steps of -0.125 in every dtype: exact in all four.
            for values in first.payload:
                np.testing.assert_array_equal(values, -0.25)
            # The second commit starts from the MODEL's 0.25.
            self.assertEqual(commits[1].header.commit.base_version, 11)
            self.assertTrue(torch.all(self.model.c ==
                                      torch.tensor(0.0, dtype=torch.float16)))
            bye = site.of_type(wire.BYE)[0].header.bye
            self.assertEqual((bye.stats.steps, bye.stats.commits), (4, 2))
            self.assertEqual(bye.stats.last_loss, 2.0)
            self.assertEqual(site.errors, [])

    def test_a_busy_server_gets_the_hello_again_after_a_pause(self):
        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                if len(site.of_type(wire.HELLO)) <= 2:
                    return [FakeSite.error(received, wire.ERROR_BUSY,
                                           "busy")]
                return [self.model_frames(wire.WELCOME, 1.0)]
            if kind == wire.COMMIT:
                return [self.stop()]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            with self.session(site) as session:
                self.grad(1.0)
                session.step()
            hellos = site.of_type(wire.HELLO)
            self.assertEqual(len(hellos), 3)
            # Each HELLO again is a new request: a higher sequence number.
            self.assertLess(hellos[0].header.sequence,
                            hellos[1].header.sequence)
            self.assertEqual([r.type_name for r in site.received],
                             ["HELLO", "HELLO", "HELLO", "COMMIT", "BYE"])
            self.assertEqual(site.errors, [])

    def test_a_refused_commit_is_dropped_and_the_model_pulled(self):
        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                return [self.model_frames(wire.WELCOME, 1.0)]
            if kind == wire.COMMIT:
                if len(site.of_type(wire.COMMIT)) == 1:
                    return [FakeSite.error(received, wire.ERROR_STALE,
                                           "stale")]
                return [self.stop()]
            if kind == wire.PULL:
                self.version = 20
                return [self.model_frames(wire.MODEL, 3.0)]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            with self.session(site) as session:
                self.grad(1.0)
                session.step()
                self.assertTrue(session.running)
                self.assertEqual(session.model_version, 20)
                self.assertTrue(torch.all(self.model.a == 3.0))
                self.assertEqual(session.stats.refused_commits, 1)
                self.grad(1.0)
                session.step()
            self.assertFalse(session.running)
            self.assertEqual([r.type_name for r in site.received],
                             ["HELLO", "COMMIT", "PULL", "COMMIT", "BYE"])
            self.assertEqual(
                site.of_type(wire.COMMIT)[1].header.commit.base_version, 20)

    def test_a_commit_the_server_did_not_apply_is_sent_again(self):
        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                if len(site.of_type(wire.HELLO)) == 2:
                    self.version = 3  # a restarted server, behind
                return [self.model_frames(wire.WELCOME, 1.0,
                                          last_commit_id=0)]
            if kind == wire.COMMIT:
                if len(site.of_type(wire.COMMIT)) == 1:
                    return [FakeSite.error(received,
                                           wire.ERROR_UNKNOWN_SENDER,
                                           "restarted")]
                return [self.stop()]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            with self.session(site) as session:
                self.grad(0.5)
                session.step()
            self.assertEqual(session.stats.rejoins, 1)
            hellos = site.of_type(wire.HELLO)
            self.assertEqual(hellos[0].header.hello.incarnation,
                             hellos[1].header.hello.incarnation)
            first, again = site.of_type(wire.COMMIT)
            self.assertEqual(first.header.commit.commit_id,
                             again.header.commit.commit_id)
            self.assertEqual(again.header.commit.base_version, 3)
            for a, b in zip(first.payload, again.payload):
                np.testing.assert_array_equal(a, b)

    def test_interval_plan_and_device_step_time(self):
        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                return [self.model_frames(wire.WELCOME, 0.0, plan(0, 0.3))]
            if kind == wire.COMMIT:
                return [self.stop()]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            with self.session(site, step_time_s=0.05) as session:
                started = time.monotonic()
                steps = 0
                while session.running:
                    self.grad(0.0)
                    session.step()
                    steps += 1
                elapsed = time.monotonic() - started
            # Committed once 0.3 s had passed: at 0.05 s a step, the 6th.
            self.assertGreaterEqual(elapsed, 0.3)
            self.assertIn(steps, (6, 7))
            self.assertEqual(
                site.of_type(wire.COMMIT)[0].header.commit.local_steps, steps)
            self.assertGreater(session.stats.device_wait_s, 0.2)

    def test_sigterm_leaves_after_the_current_step(self):
        def script(site, received):
            if received.header.type == wire.HELLO:
                return [self.model_frames(wire.WELCOME, 0.0, plan(100))]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            with self.session(site) as session:
                batches = 0
                for _ in session.batches([1, 2, 3]):
                    batches += 1
                    if batches == 2:
                        os.kill(os.getpid(), signal.SIGTERM)
                    session.step()
            self.assertEqual(batches, 2)
            self.assertEqual(session.stop_reason, "stopped by SIGTERM")
            self.assertEqual([r.type_name for r in site.received],
                             ["HELLO", "BYE"])
            self.assertEqual(
                site.of_type(wire.BYE)[0].header.bye.stats.steps, 2)
        # The handler is gone with the session.
        self.assertIs(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)

    def test_the_model_is_checked_before_connecting(self):
        job = job_pb2.JobConfig()
        job.site.add(name="fake")
        job.model.kind = job_pb2.MLP
        job.model.hidden.append(6)
        directory = live_site.make_temp_dir("session-layout")
        self.addCleanup(live_site.remove_dir, directory)
        live_site.write_synthetic_idx(directory, train_samples=20,
                                      test_samples=10, rows=ROWS, cols=COLS)
        job.data.dir = directory
        # Nothing listens at the endpoint: the check comes first.
        with self.assertRaisesRegex(
                meridian.LayoutMismatch,
                r"tensor 'fc0.weight': the model's is shape \[7, 64\] F32, "
                r"the site's layout has shape \[6, 64\] F32"):
            meridian.Session(Mlp(hidden=7), job=job, worker=0,
                             connect="tcp://127.0.0.1:1", environ={})
        with self.assertRaisesRegex(meridian.LayoutMismatch,
                                    "model has no floating-point tensor "
                                    "'fc0.weight'"):
            meridian.Session(torch.nn.Sequential(torch.nn.Linear(64, 6)),
                             job=job, worker=0, connect="tcp://127.0.0.1:1",
                             environ={})
        extra = Mlp()
        extra.register_buffer("temperature", torch.ones(1))
        with self.assertRaisesRegex(meridian.LayoutMismatch,
                                    "'temperature' shape \\[1\\] F32 is not "
                                    "in the site's layout"):
            meridian.Session(extra, job=job, worker=0,
                             connect="tcp://127.0.0.1:1", environ={})
        with self.assertRaisesRegex(ValueError, "MERIDIAN_WORKER_INDEX"):
            meridian.Session(Mlp(), job=job, connect="tcp://127.0.0.1:1",
                             environ={})


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
