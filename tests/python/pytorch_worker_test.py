#!/usr/bin/python3
"""A PyTorch worker (examples/pytorch_worker.py, a meridian.Session
around the job's MLP) trains next to C++ workers: a real `meridian site`
process, two `meridian worker` processes
(indices 0 and 1) and the Python worker as index 2, on generated data,
ASYNC, until the target accuracy. Asserts that the job reached its target,
that the Python worker's slot had its commits applied at a rate
comparable to a C++ worker's (all three emulate the same device step
time, so each can commit at most once per step_time_s), that the site
refused nothing, and that every process exited 0. A second job has the
Python worker alone reach the target: its own updates are right. Slow tier.
"""

import json
import os
import sys
import time
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

from meridian import job_pb2  # noqa: E402

SITE = "site-a"
TARGET = 0.9
# Each step takes at least this long on every worker (an emulated
# device): the C++ workers' pace is then not the CPU's, and a Python
# worker on a loaded 2-core machine keeps up with them.
STEP_TIME_S = 0.01
# What every process gets to finish: the job itself takes seconds.
JOB_TIMEOUT_S = 300


def make_job(data_dir, workers, learning_rate):
    job = job_pb2.JobConfig()
    job.name = "pytorch-worker"
    job.seed = 3
    job.target_accuracy = TARGET
    job.time_budget_s = 120
    site = job.site.add()
    site.name = SITE
    site.address = "tcp://127.0.0.1:0"
    group = site.workers.add()
    group.count = workers
    group.step_time_s = STEP_TIME_S
    job.model.kind = job_pb2.MLP
    job.model.hidden.append(32)
    job.data.dir = data_dir
    job.optimizer.learning_rate = learning_rate
    job.optimizer.momentum = 0.9
    job.optimizer.batch_size = 32
    job.server.eval_period_s = 0.5
    # Importing PyTorch takes seconds on a loaded machine; the site waits.
    job.server.join_timeout_s = 120
    job.policy.kind = job_pb2.ASYNC
    job.fault.checkpoint_period_s = 0
    return job


class PyTorchWorkerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.data_dir = live_site.make_temp_dir("pytorch-worker-data")
        # Overlapping classes (noise 400): chance is 0.1, the model ends
        # near 0.96.
        live_site.write_synthetic_idx(cls.data_dir, train_samples=6000,
                                      test_samples=1000, noise=400.0)

    @classmethod
    def tearDownClass(cls):
        live_site.remove_dir(cls.data_dir)

    def setUp(self):
        self.dir = live_site.make_temp_dir("pytorch-worker")
        self.procs = live_site.Processes(self.dir)

    def tearDown(self):
        self.procs.stop_all()
        if self.dir:  # None: kept for a look at a failure
            live_site.remove_dir(self.dir)

    def run_job(self, job, cpp_workers, python_index):
        """Runs `job` with `meridian site`, C++ workers `cpp_workers` and
        the PyTorch worker as `python_index`; asserts that every process
        exited 0 and the job reached its target without a refusal; returns
        the site summary's workers by index. On a failure the logs are
        printed and the directory kept."""
        try:
            return self._run_job(job, cpp_workers, python_index)
        except BaseException:
            self.procs.dump_logs()
            sys.stderr.write("kept %s\n" % self.dir)
            self.dir = None
            raise

    def _run_job(self, job, cpp_workers, python_index):
        job_path = os.path.join(self.dir, "job.pbtxt")
        live_site.write_job(job, job_path)
        out = os.path.join(self.dir, "out")
        os.makedirs(out)
        started = time.monotonic()
        _, endpoint = self.procs.start_site(job_path, SITE, out)
        expected = {"site-" + SITE: 0}
        for index in cpp_workers:
            name = "worker-%d" % index
            expected[name] = 0
            self.procs.start(name,
                             [live_site.ARGS.meridian, "worker", "--config",
                              job_path, "--site", SITE, "--index", str(index),
                              "--connect", endpoint])
        python_name = "worker-%d-pytorch" % python_index
        expected[python_name] = 0
        self.procs.start(
            python_name,
            [sys.executable,
             os.path.join(live_site.ARGS.source, "examples",
                          "pytorch_worker.py"),
             "--config", job_path, "--site", SITE, "--index",
             str(python_index), "--connect", endpoint],
            env=live_site.child_env())
        codes = self.procs.wait_all(JOB_TIMEOUT_S)
        elapsed = time.monotonic() - started
        self.assertEqual(codes, expected)

        with open(os.path.join(out, "site-%s.json" % SITE)) as f:
            summary = json.load(f)
        sys.stderr.write(
            "job: %.1f s wall, %.1f s training, final accuracy %.4f, "
            "commits %d, per worker (steps/commits applied): %s\n" %
            (elapsed, summary["training_s"], summary["final_accuracy"],
             summary["commits"],
             ", ".join("%d: %d/%d" % (w["index"], w["steps"],
                                      w["commits_applied"])
                       for w in summary["workers"])))
        self.assertTrue(summary["reached_target"], summary["stop_reason"])
        self.assertEqual(summary["stop_reason"], "target accuracy reached")
        self.assertGreaterEqual(summary["final_accuracy"], TARGET)
        # It learned: the first evaluation (the initial model) was near
        # chance.
        self.assertLess(summary["timeline"][0]["accuracy"], 0.3)
        # Nothing refused: every message of every worker, the Python one
        # included, was valid.
        self.assertEqual(summary["rejected"], 0)
        self.assertEqual(summary["duplicate_commits"], 0)
        workers = {w["index"]: w for w in summary["workers"]}
        self.assertEqual(sorted(workers),
                         sorted(list(cpp_workers) + [python_index]))
        python = workers[python_index]
        self.assertEqual(python["incarnations"], 1)
        self.assertGreater(python["steps"], 0)
        self.assertGreater(python["commits_applied"], 0)
        # The worker's own count (the statistics of its BYE) is the site's.
        self.assertEqual(python["commits"], python["commits_applied"])
        log = self.procs.log(python_name)
        self.assertIn("as worker %d; model [fc0.weight[32,784] fc0.bias[32] "
                      "fc1.weight[10,32] fc1.bias[10]]" % python_index, log)
        self.assertNotIn(" ERROR ", log)
        return workers

    def test_trains_next_to_cpp_workers(self):
        # At this learning rate the three workers pass 0.9 after some 1,400
        # steps together (about 5 s unloaded).
        workers = self.run_job(make_job(self.data_dir, 3, 0.002),
                               cpp_workers=(0, 1), python_index=2)
        # Every worker could commit at most once per step time: the Python
        # one kept up with the C++ ones.
        cpp = max(workers[0]["commits_applied"], workers[1]["commits_applied"])
        self.assertGreaterEqual(
            workers[2]["commits_applied"], 0.25 * cpp,
            "the PyTorch worker committed %d times, a C++ worker %d" %
            (workers[2]["commits_applied"], cpp))

    def test_trains_alone_to_the_target(self):
        # Its updates are what the model learns from: the sign, the scale
        # and the bookkeeping of every commit are right.
        self.run_job(make_job(self.data_dir, 1, 0.01), cpp_workers=(),
                     python_index=0)


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
