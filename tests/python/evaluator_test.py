#!/usr/bin/python3
"""meridian.Evaluator and the evaluator role's client against FakeSite, a
test double of the site server (the server side of EVAL_TASK/EVAL_RESULT
is not written yet; tests/python/external_model_test.py is the end-to-end
test that waits for it): HELLO as ROLE_EVALUATOR with the model's layout
and types, each snapshot loaded into the model before the function of its
split runs (in eval mode, without gradients), metrics and sample counts
reported, an exception reported as the task's error, waiting for a task
with heartbeats, rejoining after ERROR_UNKNOWN_SENDER, stopping when the
task says so. Quick tier.
"""

import os
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


class Net(torch.nn.Module):
    """A Linear layer and a BatchNorm (float running statistics served,
    num_batches_tracked local), with one float16 and one bfloat16 buffer
    and one float64 parameter."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)
        self.register_buffer("scale16", torch.zeros(4, dtype=torch.float16))
        self.register_buffer("brain", torch.zeros(2, 2, dtype=torch.bfloat16))
        self.wide = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def forward(self, x):
        return self.bn(self.fc(x))


def snapshot(layout, value):
    """A model whose every element is `value` + its flat index / 100."""
    return [value + (t.offset + np.arange(t.size)) / 100.0
            for t in layout.tensors]


def task(task_id, split, version, layout=None, arrays=None, stop=False):
    header = FakeSite.header(wire.EVAL_TASK, eval_task=wire.EvalTask(
        task_id=task_id, split=split, model_version=version, stop=stop,
        stop_reason="target reached" if stop else ""))
    if stop:
        return header, []
    return FakeSite.with_model(header, layout, arrays)


def fast_job():
    """A job whose liveness settings make waits short (the evaluator's
    timeouts come from fault { })."""
    job = job_pb2.JobConfig()
    job.site.add(name="fake")
    job.model.kind = job_pb2.EXTERNAL
    job.fault.heartbeat_interval_s = 0.1
    job.fault.server_timeout_s = 1.0
    job.fault.worker_give_up_s = 20
    return job


class EvaluatorTest(unittest.TestCase):

    def setUp(self):
        torch.manual_seed(0)
        self.model = Net()
        self.layout = model_layout(self.model)

    def serve(self, script, validation, training_sample=None, **kwargs):
        with FakeSite(script) as site:
            evaluator = meridian.Evaluator(
                self.model, site="fake", connect=site.endpoint,
                job=kwargs.pop("job", fast_job()), environ={}, **kwargs)
            done = evaluator.serve(validation=validation,
                                   training_sample=training_sample)
            self.assertEqual(site.errors, [])
            return site, evaluator, done

    def test_layout_is_the_state_dicts_floats_with_their_types(self):
        self.assertEqual(
            self.layout.describe(),
            "wide[3]:F64 scale16[4]:F16 brain[2,2]:BF16 fc.weight[2,3] "
            "fc.bias[2] bn.weight[2] bn.bias[2] bn.running_mean[2] "
            "bn.running_var[2]")

    def test_serves_each_split_until_stop(self):
        first, second = snapshot(self.layout, 1.0), snapshot(self.layout, 2.0)
        seen = []

        def script(site, received):
            if received.header.type == wire.HELLO:
                return [task(7, wire.VALIDATION, 40, self.layout, first)]
            if received.header.eval_result.task_id == 7:
                return [task(8, wire.TRAINING_SAMPLE, 41, self.layout,
                             second)]
            return [task(9, 0, 0, stop=True)]

        def validation(model):
            seen.append(("validation", model.training,
                         torch.is_grad_enabled(),
                         model.fc.bias.detach().clone(),
                         model.scale16.clone(), model.wide.detach().clone()))
            return {"accuracy": 0.5, "loss": torch.tensor(1.25)}, 100

        def training_sample(model):
            seen.append(("training", model.fc.bias.detach().clone()))
            return {"loss": 0.75}

        self.model.train()
        site, evaluator, done = self.serve(script, validation,
                                           training_sample)
        self.assertEqual(done, 2)
        self.assertEqual(evaluator.stop_reason, "target reached")
        self.assertTrue(self.model.training, "the model's mode is restored")
        # The HELLO: the evaluator's identity and layout with types.
        hello = site.of_type(wire.HELLO)[0].header
        self.assertEqual(hello.sender.role, wire.ROLE_EVALUATOR)
        self.assertEqual((hello.sender.site, hello.sender.id), ("fake", 0))
        self.assertEqual(hello.hello.worker_index, 0)
        self.assertNotEqual(hello.hello.incarnation, 0)
        self.assertEqual([(s.name, list(s.shape), s.type)
                          for s in hello.hello.layout][:4],
                         [("wide", [3], wire.TENSOR_TYPE_F64),
                          ("scale16", [4], wire.TENSOR_TYPE_F16),
                          ("brain", [2, 2], wire.TENSOR_TYPE_BF16),
                          ("fc.weight", [2, 3], wire.TENSOR_TYPE_F32)])
        # The snapshots were loaded, converted to each tensor's dtype.
        kind, training, grad, bias, half, wide = seen[0]
        self.assertEqual((kind, training, grad), ("validation", False, False))
        np.testing.assert_array_equal(bias.numpy(), np.float32(first[4]))
        np.testing.assert_array_equal(
            half.numpy(), np.float32(first[1]).astype(np.float16))
        self.assertEqual(wide.dtype, torch.float64)
        np.testing.assert_array_equal(wide.numpy(),
                                      np.float32(first[0]).astype(np.float64))
        np.testing.assert_array_equal(seen[1][1].numpy(),
                                      np.float32(second[4]))
        # The results.
        results = [r.header.eval_result
                   for r in site.of_type(wire.EVAL_RESULT)]
        self.assertEqual([r.task_id for r in results], [7, 8])
        self.assertEqual([(m.name, m.value) for m in results[0].metrics],
                         [("accuracy", 0.5), ("loss", 1.25)])
        self.assertEqual(results[0].samples, 100)
        self.assertEqual([(m.name, m.value) for m in results[1].metrics],
                         [("loss", 0.75)])
        self.assertFalse(results[1].HasField("error"))
        # num_batches_tracked stays local: not in the layout.
        self.assertIsNone(self.layout.find("bn.num_batches_tracked"))

    def test_failures_are_reported_as_the_tasks_error(self):
        snap = snapshot(self.layout, 0.0)

        def script(site, received):
            if received.header.type == wire.HELLO:
                return [task(1, wire.VALIDATION, 1, self.layout, snap)]
            task_id = received.header.eval_result.task_id
            if task_id == 1:
                return [task(2, wire.TRAINING_SAMPLE, 1, self.layout, snap)]
            if task_id == 2:
                return [task(3, wire.VALIDATION, 2, self.layout, snap)]
            return [task(4, 0, 0, stop=True)]

        calls = []

        def validation(model):
            calls.append(len(calls))
            if len(calls) == 1:
                raise RuntimeError("CUDA out of memory (pretend)")
            return {"accuracy": float("nan")}

        site, _, done = self.serve(script, validation)
        self.assertEqual(done, 3)
        errors = [r.header.eval_result.error
                  for r in site.of_type(wire.EVAL_RESULT)]
        self.assertEqual(errors[0], "RuntimeError: CUDA out of memory "
                                    "(pretend)")
        self.assertIn("no function for training_sample tasks", errors[1])
        self.assertEqual(errors[2], "ValueError: metric 'accuracy' is nan, "
                                    "not a finite number")
        for r in site.of_type(wire.EVAL_RESULT):
            self.assertEqual(len(r.header.eval_result.metrics), 0)

    def test_waits_with_heartbeats_and_rejoins_as_the_same_process(self):
        snap = snapshot(self.layout, 3.0)
        hellos = []

        def script(site, received):
            if received.header.type == wire.HELLO:
                hellos.append(received.header.hello.incarnation)
                if len(hellos) == 1:
                    # Held three server timeouts, with heartbeats.
                    site.hold(received, 3.0, [task(
                        1, wire.VALIDATION, 5, self.layout, snap)])
                    return []
                return [task(2, 0, 0, stop=True)]
            # The server restarted: it does not know this connection.
            return [FakeSite.error(received, wire.ERROR_UNKNOWN_SENDER,
                                   "unknown connection")]

        site, _, done = self.serve(script, lambda model: {"accuracy": 1.0})
        self.assertEqual(done, 1)
        self.assertEqual(len(hellos), 2)
        self.assertEqual(hellos[0], hellos[1], "the same incarnation")
        # It heartbeat while the first task was held.
        self.assertGreater(len(site.heartbeats), 5)

    def test_a_model_that_differs_from_the_weights_is_named(self):
        directory = live_site.make_temp_dir("evaluator")
        self.addCleanup(live_site.remove_dir, directory)
        path = os.path.join(directory, "initial.safetensors")
        other = Net()
        other.fc = torch.nn.Linear(3, 5)
        meridian.save_initial_weights(other, path)
        with self.assertRaisesRegex(
                meridian.LayoutMismatch,
                r"tensor 'fc.weight': the model's is shape \[2, 3\] F32, "
                r"the site's layout has shape \[5, 3\] F32"):
            meridian.Evaluator(self.model, site="fake",
                               connect="tcp://127.0.0.1:1", weights=path,
                               environ={})


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
