#!/usr/bin/python3
"""examples/fashion_mnist: the plain PyTorch script and its Meridian
version differ by at most 15 lines; train.py --write-weights writes the
initial weights whose layout is the model's; train.py and evaluate.py run
as `meridian run` starts them (the MERIDIAN_* environment, the job file)
against FakeSite, a test double of the site server, until it says stop
The slow tier also runs train_plain.py alone for an epoch (it learns), and
the documented command end to end in three emulated regions
(test_three_regions_end_to_end). Quick tier otherwise.
"""

import difflib
import os
import shutil
import subprocess
import sys
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()

import numpy as np  # noqa: E402

import meridian  # noqa: E402
from fake_site import FakeSite  # noqa: E402
from meridian import wire_pb2 as wire  # noqa: E402

MAX_DIFF_LINES = 15
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def example_dir():
    return os.path.join(live_site.ARGS.source, "examples", "fashion_mnist")


def changed_lines(before, after):
    """Lines removed plus lines added (what `diff` prints with < and >)."""
    return sum(1 for line in difflib.ndiff(before, after)
               if line[:2] in ("- ", "+ "))


class ExampleTest(unittest.TestCase):

    def setUp(self):
        self.dir = live_site.make_temp_dir("example")
        self.addCleanup(live_site.remove_dir, self.dir)
        for name in ("train.py", "train_plain.py", "evaluate.py",
                     "three-regions.pbtxt"):
            shutil.copy(os.path.join(example_dir(), name), self.dir)

    def run_example(self, argv, env=None, timeout=300):
        child = live_site.child_env()
        child.update(env or {})
        done = subprocess.run([sys.executable] + argv, cwd=self.dir,
                              env=child, capture_output=True, text=True,
                              timeout=timeout)
        self.assertEqual(done.returncode, 0, "%s:\n%s\n%s" %
                         (argv, done.stdout, done.stderr[-5000:]))
        return done

    def test_the_meridian_version_differs_by_at_most_15_lines(self):
        with open(os.path.join(example_dir(), "train_plain.py")) as f:
            plain = f.read().splitlines()
        with open(os.path.join(example_dir(), "train.py")) as f:
            meridian_version = f.read().splitlines()
        changed = changed_lines(plain, meridian_version)
        sys.stderr.write("train_plain.py -> train.py: %d lines changed "
                         "(%d and %d lines long)\n" %
                         (changed, len(plain), len(meridian_version)))
        self.assertLessEqual(changed, MAX_DIFF_LINES)
        # docs/python.md shows that diff: the same changed lines.
        with open(os.path.join(live_site.ARGS.source, "docs",
                               "python.md")) as f:
            guide = f.read()
        shown = guide.split("```diff\n", 1)[1].split("```", 1)[0]
        documented = sorted(line for line in shown.splitlines()
                            if line[:1] in ("+", "-"))
        actual = sorted(line[0] + line[2:] for line in
                        difflib.ndiff(plain, meridian_version)
                        if line[:2] in ("- ", "+ "))
        self.assertEqual(documented, actual)

    def write_weights(self):
        self.run_example(["train.py", "--write-weights"])
        path = os.path.join(self.dir, "initial.safetensors")
        self.assertTrue(os.path.isfile(path))
        return path

    def test_write_weights_gives_the_models_layout(self):
        path = self.write_weights()
        sys.path.insert(0, self.dir)
        try:
            import train_plain
        finally:
            sys.path.remove(self.dir)
        from meridian.binding import model_layout
        layout = meridian.tensors.weights_layout(path)
        self.assertEqual(layout, model_layout(train_plain.Net()))
        self.assertEqual(layout.tensors[0].name, "layers.0.0.weight")

    def environ(self, role, endpoint, weights):
        return {"MERIDIAN_ROLE": role,
                "MERIDIAN_JOB": os.path.join(self.dir,
                                             "three-regions.pbtxt"),
                "MERIDIAN_SITE": "eu", "MERIDIAN_SITE_INDEX": "1",
                "MERIDIAN_SITE_COUNT": "3", "MERIDIAN_WORKER_INDEX": "1",
                "MERIDIAN_WORKER_COUNT": "2", "MERIDIAN_CONNECT": endpoint,
                "MERIDIAN_WEIGHTS": weights, "MERIDIAN_STEP_TIME_S": "0",
                "MERIDIAN_SEED": "1", "MERIDIAN_OUT": self.dir,
                "OMP_NUM_THREADS": "1"}

    @unittest.skipUnless(os.path.isdir(FASHION_MNIST),
                         "needs Debian's dataset-fashion-mnist")
    def test_train_py_as_a_worker_of_the_fake_site(self):
        weights = self.write_weights()
        initial = meridian.load_weights(weights)
        layout = meridian.tensors.weights_layout(weights)
        model = [initial[t.name].float().numpy().reshape(-1).copy()
                 for t in layout.tensors]
        state = {"version": 0}

        def answer(stop=False):
            if stop:
                return FakeSite.header(wire.MODEL, model=wire.Model(
                    stop=True, stop_reason="target reached")), []
            header = FakeSite.header(wire.MODEL, model=wire.Model(
                version=state["version"], plan=wire.CommitPlan(
                    local_steps=4)))
            return FakeSite.with_model(header, layout, model)

        def script(site, received):
            kind = received.header.type
            if kind == wire.HELLO:
                body = wire.Welcome(model_version=0, site_workers=2,
                                    plan=wire.CommitPlan(local_steps=4))
                layout.to_specs(body.layout)
                return [FakeSite.with_model(FakeSite.header(
                    wire.WELCOME, welcome=body), layout, model)]
            if kind == wire.COMMIT:
                # A site of one worker under SUM: W += U.
                for values, change in zip(model, received.payload):
                    values += change
                state["version"] += 1
                return [answer(stop=state["version"] == 5)]
            return [(FakeSite.header(wire.BYE), [])]

        with FakeSite(script) as site:
            self.run_example(["train.py"], self.environ("worker",
                                                        site.endpoint,
                                                        weights))
        self.assertEqual(site.errors, [])
        hello = site.of_type(wire.HELLO)[0].header
        self.assertEqual((hello.sender.site, hello.sender.id), ("eu", 1))
        self.assertEqual(meridian.layout.Layout.from_specs(
            hello.hello.layout), layout)
        commits = site.of_type(wire.COMMIT)
        self.assertEqual(len(commits), 5)
        self.assertEqual([c.header.commit.local_steps for c in commits],
                         [4] * 5)
        self.assertEqual([c.header.commit.base_version for c in commits],
                         [0, 1, 2, 3, 4])
        self.assertTrue(any(np.abs(change).max() > 0
                            for change in commits[0].payload))
        bye = site.of_type(wire.BYE)[0].header.bye
        self.assertEqual((bye.stats.steps, bye.stats.commits), (20, 5))
        self.assertGreater(bye.stats.last_loss, 0)

    @unittest.skipUnless(os.path.isdir(FASHION_MNIST),
                         "needs Debian's dataset-fashion-mnist")
    def test_evaluate_py_as_the_evaluator_of_the_fake_site(self):
        weights = self.write_weights()
        initial = meridian.load_weights(weights)
        layout = meridian.tensors.weights_layout(weights)
        model = [initial[t.name].float().numpy() for t in layout.tensors]

        def script(site, received):
            task_id = (0 if received.header.type == wire.HELLO
                       else received.header.eval_result.task_id)
            split = {0: wire.VALIDATION, 1: wire.TRAINING_SAMPLE}.get(task_id)
            header = FakeSite.header(wire.EVAL_TASK, eval_task=wire.EvalTask(
                task_id=task_id + 1, split=split or 0, model_version=3,
                stop=split is None))
            if split is None:
                return [(header, [])]
            return [FakeSite.with_model(header, layout, model)]

        with FakeSite(script) as site:
            self.run_example(["evaluate.py"], self.environ(
                "evaluator", site.endpoint, weights))
        self.assertEqual(site.errors, [])
        hello = site.of_type(wire.HELLO)[0].header
        self.assertEqual(hello.sender.role, wire.ROLE_EVALUATOR)
        results = [r.header.eval_result
                   for r in site.of_type(wire.EVAL_RESULT)]
        self.assertEqual([(r.task_id, r.samples, r.error) for r in results],
                         [(1, 10000, ""), (2, 1000, "")])
        for r in results:
            metrics = {m.name: m.value for m in r.metrics}
            self.assertEqual(sorted(metrics), ["accuracy", "loss"])
            # The untrained model: about chance.
            self.assertLess(metrics["accuracy"], 0.3)
            self.assertGreater(metrics["loss"], 1.5)

    @unittest.skipUnless(os.environ.get("MERIDIAN_SLOW_TESTS") == "1",
                         "slow tier (MERIDIAN_SLOW_TESTS=1)")
    def test_train_plain_learns_in_one_epoch(self):
        done = self.run_example(["train_plain.py", "1"],
                                {"OMP_NUM_THREADS": "1"}, timeout=600)
        accuracy = float(done.stdout.split("'accuracy': ")[1].split(",")[0])
        sys.stderr.write("train_plain.py, one epoch: %s" % done.stdout)
        self.assertGreater(accuracy, 0.75)  # 0.83 measured

    @unittest.skipUnless(os.environ.get("MERIDIAN_EXAMPLE_VENV"),
                         "slow tier (MERIDIAN_EXAMPLE_VENV: the package "
                         "installed as docs/python.md says)")
    def test_three_regions_end_to_end(self):
        """The documented command, run.sh, trains the user's model in three
        emulated regions to the job's target: PyTorch workers and
        evaluators started by `meridian run`, with `python3` the venv's of
        the documented install. Every site has a curve of the evaluator's
        metric, every link carried bytes, the plots render."""
        venv = os.environ["MERIDIAN_EXAMPLE_VENV"]
        shutil.copy(os.path.join(example_dir(), "run.sh"), self.dir)
        shutil.copy(os.path.join(example_dir(), "three-regions.pbtxt"),
                    self.dir)
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # the installed package, nothing else
        env["PATH"] = os.path.join(venv, "bin") + ":" + env["PATH"]
        env["MERIDIAN"] = live_site.ARGS.meridian
        out = os.path.join(self.dir, "run")
        done = subprocess.run(["sh", "run.sh", "--out", out], cwd=self.dir,
                              env=env, capture_output=True, text=True,
                              timeout=900)
        self.assertEqual(done.returncode, 0,
                         done.stdout[-3000:] + done.stderr[-3000:])
        import json
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
        sites = report["sites"]
        self.assertEqual(sorted(s["name"] for s in sites), ["ap", "eu", "us"])
        self.assertTrue(any(s.get("reached_target") for s in sites),
                        [(s["name"], s.get("stop_reason")) for s in sites])
        for site in sites:
            self.assertFalse(site.get("no_curve_reason"), site["name"])
            names = {m["name"] for point in site["timeline"]
                     for m in point.get("metrics", [])}
            self.assertEqual(names, {"accuracy", "loss"}, site["name"])
            self.assertGreater(site["final_accuracy"], 0.8, site["name"])
        self.assertEqual(len(report["links"]), 6)
        for link in report["links"]:
            self.assertGreater(float(link["bytes"]), 0, link)
        plots = os.path.join(self.dir, "plots")
        drawn = subprocess.run([live_site.ARGS.meridian, "report", out,
                                "--out", plots], capture_output=True,
                               text=True, timeout=300)
        self.assertEqual(drawn.returncode, 0, drawn.stderr)
        self.assertTrue(os.path.isfile(
            os.path.join(plots, "accuracy_vs_time.png")))
        sys.stderr.write(done.stdout[-1500:])


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
