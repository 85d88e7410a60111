"""The Python client keeps the commits its site holds in no durable
checkpoint and replays them when the site restarts (docs/worker-protocol.md
§14): a real `meridian site` with checkpoints is killed after answering
commits its only checkpoint (taken when training started) lacks, restarted
with --resume on the same port, and the model it then serves holds every
answered commit once, the commit in flight at the crash too.

Run: python3 tests/python/client_replay_test.py --meridian BUILD/bin/meridian
  --python-path BUILD/python:python --source .
"""

import os
import signal
import socket
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

import numpy as np  # noqa: E402

import meridian  # noqa: E402
from meridian import job_pb2  # noqa: E402
from meridian.client import WorkerClient  # noqa: E402
from meridian.layout import layout_for_model  # noqa: E402

SITE = "solo"
ROWS = COLS = 8
SERVER_LR = 0.5  # SUM, no momentum: W += 0.5 * U


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_job(data_dir, port):
    job = job_pb2.JobConfig()
    job.name = "python-replay"
    job.seed = 5
    job.time_budget_s = 300
    site = job.site.add()
    site.name = SITE
    site.address = "tcp://127.0.0.1:%d" % port
    site.workers.add().count = 1
    job.model.kind = job_pb2.MLP
    job.model.hidden.append(6)
    job.data.dir = data_dir
    job.server.apply_rule = job_pb2.SUM
    job.server.learning_rate = SERVER_LR
    job.server.eval_period_s = 5
    job.server.join_timeout_s = 60
    job.policy.kind = job_pb2.ASYNC
    # One checkpoint when training starts, the next long after the test.
    job.fault.checkpoint_period_s = 600
    job.fault.heartbeat_interval_s = 0.5
    job.fault.server_timeout_s = 2
    return job


class ClientReplayTest(unittest.TestCase):
    def setUp(self):
        self.dir = live_site.make_temp_dir("python-replay")
        data_dir = os.path.join(self.dir, "data")
        live_site.write_synthetic_idx(data_dir, train_samples=300,
                                      test_samples=100, rows=ROWS, cols=COLS)
        self.job = make_job(data_dir, free_port())
        self.job_path = os.path.join(self.dir, "job.pbtxt")
        live_site.write_job(self.job, self.job_path)
        self.out = os.path.join(self.dir, "out")
        os.makedirs(self.out)
        self.procs = live_site.Processes(self.dir)
        self.addCleanup(self.procs.stop_all)

    def test_answered_commits_survive_a_site_crash(self):
        site, endpoint = self.procs.start_site(self.job_path, SITE, self.out)
        layout = layout_for_model(self.job.model, ROWS * COLS)
        client = WorkerClient.from_job(self.job, SITE, 0, layout, endpoint)
        self.addCleanup(client.close)
        welcome = client.join()
        self.assertTrue(welcome.header.welcome.HasField("durable"))
        start = welcome.params
        version = welcome.version
        n = layout.num_elements
        total = np.zeros(n, dtype=np.float32)
        for k in range(1, 6):
            delta = (np.arange(n) % 7 - 3).astype(np.float32) * 0.25 * k
            reply = client.commit(delta, version, local_steps=1)
            self.assertFalse(reply.stop)
            version = reply.version
            total += delta
        self.assertEqual(client._undurable.commits(), 5)
        os.killpg(site.pid, signal.SIGKILL)
        site.wait()
        self.procs.start_site(self.job_path, SITE, self.out,
                              extra_args=["--resume"], name="site-resumed")
        # The next commit finds the server gone, rejoins, replays 1..5,
        # then sends itself again.
        delta = np.full(n, 0.5, dtype=np.float32)
        client.commit(delta, version, local_steps=1)
        total += delta
        after = client.pull()
        # Up to float rounding (the replay adds the sum of 1..5 at once);
        # a lost commit would move some weight by at least 0.125.
        np.testing.assert_allclose(
            after.params, start + np.float32(SERVER_LR) * total, rtol=0,
            atol=1e-5)
        log = self.procs.log("site-resumed")
        self.assertIn("replayed its commits 1 to 5", log)
        client.bye()


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV)
