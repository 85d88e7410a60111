#!/usr/bin/python3
"""`meridian export-weights JOB --out FILE`: the built-in model's initial
weights as a safetensors file are exactly the model a live `meridian site`
of the job hands its first worker in WELCOME (tensor names, shapes, order
and every float32 value), for an MLP and a CNN; a PyTorch module loaded from
the file holds those values; an EXTERNAL job and a missing job file are
refused (exit 2) without writing. Quick tier: small generated images.
"""

import os
import subprocess
import sys
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

import numpy as np  # noqa: E402

import meridian  # noqa: E402
from meridian import job_pb2  # noqa: E402
from meridian.client import WorkerClient  # noqa: E402

ROWS = COLS = 8
SITE = "solo"


def make_job(data_dir, model):
    job = job_pb2.JobConfig()
    job.name = "export-weights"
    job.seed = 11
    job.time_budget_s = 60
    site = job.site.add()
    site.name = SITE
    site.address = "tcp://127.0.0.1:0"
    site.workers.add().count = 1
    job.model.CopyFrom(model)
    job.data.dir = data_dir
    job.server.eval_period_s = 5
    job.server.join_timeout_s = 60
    job.fault.checkpoint_period_s = 0
    return job


def mlp():
    model = job_pb2.ModelConfig(kind=job_pb2.MLP)
    model.hidden.extend([6, 5])
    return model


def cnn():
    model = job_pb2.ModelConfig(kind=job_pb2.CNN)
    model.layers.add(kind=job_pb2.CONV, channels=3, kernel=3)
    model.layers.add(kind=job_pb2.BATCH_NORM)  # running statistics too
    model.layers.add(kind=job_pb2.RELU)
    model.layers.add(kind=job_pb2.MAX_POOL)
    return model


class ExportWeightsTest(unittest.TestCase):

    def setUp(self):
        self.dir = live_site.make_temp_dir("export-weights")
        self.data = os.path.join(self.dir, "data")
        live_site.write_synthetic_idx(self.data, train_samples=200,
                                      test_samples=50, rows=ROWS, cols=COLS)
        self.procs = live_site.Processes(self.dir)
        self.addCleanup(live_site.remove_dir, self.dir)
        self.addCleanup(self.procs.stop_all)

    def export(self, job_path, out):
        return subprocess.run([live_site.ARGS.meridian, "export-weights",
                               job_path, "--out", out],
                              capture_output=True, text=True, timeout=120)

    def welcome_of(self, job, name):
        """The file export-weights wrote for `job` and the model the site
        hands its worker: ({name: array} of the file, layout, [arrays])."""
        job_path = os.path.join(self.dir, name + ".pbtxt")
        live_site.write_job(job, job_path)
        out = os.path.join(self.dir, name + ".safetensors")
        done = self.export(job_path, out)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn("parameters", done.stdout)
        site_out = os.path.join(self.dir, name + "-out")
        os.makedirs(site_out)
        _, endpoint = self.procs.start_site(job_path, SITE, site_out)
        layout = meridian.tensors.weights_layout(out)
        client = WorkerClient.from_job(job, SITE, 0, layout, endpoint)
        try:
            client.wait_for_server()
            welcome = client.join()
            arrays = [np.array(a) for a in welcome.arrays]
            client.bye()
        finally:
            client.close()
        return meridian.load_weights(out), layout, arrays

    def check_equal(self, weights, layout, arrays):
        self.assertEqual(list(weights), [t.name for t in layout.tensors])
        self.assertEqual(len(arrays), len(layout.tensors))
        for info, array in zip(layout.tensors, arrays):
            tensor = weights[info.name]
            self.assertEqual(str(tensor.dtype), "torch.float32", info.name)
            self.assertEqual(tuple(tensor.shape), tuple(info.shape))
            np.testing.assert_array_equal(
                tensor.numpy().reshape(-1), array.reshape(-1),
                err_msg=info.name)
        # Not all zero: the initialisation, not an empty model.
        self.assertTrue(any(np.abs(a).max() > 0 for a in arrays))

    def test_mlp_weights_are_the_sites_welcome_model(self):
        weights, layout, arrays = self.welcome_of(
            make_job(self.data, mlp()), "mlp")
        self.assertEqual([(t.name, tuple(t.shape)) for t in layout.tensors],
                         [("fc0.weight", (6, ROWS * COLS)), ("fc0.bias", (6,)),
                          ("fc1.weight", (5, 6)), ("fc1.bias", (5,)),
                          ("fc2.weight", (10, 5)), ("fc2.bias", (10,))])
        self.check_equal(weights, layout, arrays)
        # A PyTorch copy of the model starts from exactly these values.
        import torch
        sys.path.insert(0, os.path.join(live_site.ARGS.source, "examples",
                                        "mlp"))
        try:
            from train import Mlp
        finally:
            sys.path.pop(0)
        model = Mlp([ROWS * COLS, 6, 5, 10])
        model.load_state_dict(weights)
        for info, array in zip(layout.tensors, arrays):
            np.testing.assert_array_equal(
                model.state_dict()[info.name].numpy().reshape(-1),
                array.reshape(-1))
        self.assertIsInstance(model(torch.zeros(1, 1, ROWS, COLS)),
                              torch.Tensor)

    def test_cnn_weights_are_the_sites_welcome_model(self):
        weights, layout, arrays = self.welcome_of(
            make_job(self.data, cnn()), "cnn")
        self.check_equal(weights, layout, arrays)

    def test_an_external_job_and_a_missing_file_are_refused(self):
        job = make_job(self.data, mlp())
        live_site.write_job(job, os.path.join(self.dir, "mlp.pbtxt"))
        weights = os.path.join(self.dir, "w.safetensors")
        self.assertEqual(self.export(os.path.join(self.dir, "mlp.pbtxt"),
                                     weights).returncode, 0)
        job.model.Clear()
        job.model.kind = job_pb2.EXTERNAL
        job.model.weights = weights
        job.model.metrics.add().name = "accuracy"
        group = job.site[0].workers[0]
        group.command.extend(["python3", "train.py"])
        path = os.path.join(self.dir, "external.pbtxt")
        live_site.write_job(job, path)
        out = os.path.join(self.dir, "again.safetensors")
        done = self.export(path, out)
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertIn("EXTERNAL", done.stderr)
        self.assertFalse(os.path.exists(out))
        done = self.export(os.path.join(self.dir, "missing.pbtxt"), out)
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertIn("missing.pbtxt", done.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
