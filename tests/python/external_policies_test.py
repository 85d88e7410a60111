#!/usr/bin/python3
"""The site policies that need the evaluator's answers, on an external
PyTorch model (the built-in MLP as examples/mlp's train.py and
evaluate.py, small) under a real `meridian run`, asserted on report.json.
Slow tier (MERIDIAN_SLOW_TESTS=1); Fashion-MNIST from Debian's
dataset-fashion-mnist, a slice of it.

AdspTest: policy ADSP with workers of two emulated device speeds (10 and
60 ms a step). Its commit-rate search evaluates the loss through the
evaluator's TRAINING_SAMPLE tasks (model.loss_metric); the report counts
those evaluations and the search time, and shows ADSP's commit schedule:
every worker commits at about the same rate, so a fast worker folds
several times the steps of a slow one into a commit.

SkewScoutTest: three sites of disjoint classes, Gaia with SkewScout on θ.
Models travel to the peers, each receiver's evaluator scores the pair (its
own snapshot, then the travelled model) on its own training sample, and
the controller moves θ: travels sent and scored, decisions with both
scores, θ changed from the job's, the timeline following the knob, and
each site's label histogram showing the skew.

The budgets count from the start of training; an evaluator that loads
its data late on a loaded machine still has most of them.
"""

import json
import os
import re
import subprocess
import sys
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()
EXAMPLE = os.path.abspath(os.path.join(live_site.ARGS.source, "examples",
                                       "mlp"))
DATA = "/usr/share/datasets/fashion-mnist"
SLOW = os.environ.get("MERIDIAN_SLOW_TESTS") == "1"
HIDDEN = "32"


def program(script, *args):
    """A command of examples/mlp on one PyTorch thread."""
    words = ["env", "OMP_NUM_THREADS=1", sys.executable,
             os.path.join(EXAMPLE, script), "--hidden", HIDDEN, *args]
    return "command: [" + ", ".join('"%s"' % w for w in words) + "]"


def workers(count, step_time_s):
    return ("workers { count: %d step_time_s: %g %s }"
            % (count, step_time_s, program("train.py")))


# Everything but the sites, the sync and the policy: the MLP as an
# EXTERNAL model, a slice of Fashion-MNIST (PARTITION: the sites' shares),
# frequent evaluations.
COMMON = """
seed: 1
stop_at_target: false
evaluator { %s }
model {
  kind: EXTERNAL
  weights: "initial.safetensors"
  metrics { name: "accuracy" higher_is_better: true }
  metrics { name: "loss" higher_is_better: false }
  loss_metric: "loss"
}
data {
  dir: "%s"
  normalization: STANDARDIZE
  train_limit: 6000
  test_limit: 1000
  PARTITION
}
optimizer { learning_rate: 0.02 momentum: 0.9 batch_size: 32 }
server { eval_period_s: 1 join_timeout_s: 60 }
fault { max_restarts: 1 }
""" % (program("evaluate.py", "--sample", "500"), DATA)


def builtin(text):
    """The job `text` with the built-in MLP it mirrors and no programs:
    what `meridian export-weights` takes."""
    text = re.sub(r"command: \[[^\]]*\]", "", text)
    text = re.sub(r"evaluator \{[^{}]*\}", "", text)
    return re.sub(r"model \{(?:[^{}]|\{[^{}]*\})*\}",
                  "model { kind: MLP hidden: %s }" % HIDDEN, text)


@unittest.skipUnless(SLOW, "slow tier: set MERIDIAN_SLOW_TESTS=1")
@unittest.skipUnless(os.path.isdir(DATA),
                     "needs Debian's dataset-fashion-mnist")
class ExternalPolicyTest(unittest.TestCase):

    def setUp(self):
        self.dir = live_site.make_temp_dir("external-policy")
        self.addCleanup(live_site.remove_dir, self.dir)

    def run_job(self, text):
        """Writes the job and the MLP's initial weights (`meridian
        export-weights` of the same job with the built-in MLP), runs it to
        the end and returns report.json."""
        job = os.path.join(self.dir, "job.pbtxt")
        with open(job, "w") as f:
            f.write(text)
        mlp = os.path.join(self.dir, "builtin.pbtxt")
        with open(mlp, "w") as f:
            f.write(builtin(text))
        subprocess.run([live_site.ARGS.meridian, "export-weights", mlp,
                        "--out", os.path.join(self.dir,
                                              "initial.safetensors")],
                       check=True, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
        out = os.path.join(self.dir, "out")
        proc = subprocess.run([live_site.ARGS.meridian, "run", job, "--out",
                               out], env=live_site.child_env(),
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stdout[-5000:])
        with open(os.path.join(out, "report.json")) as f:
            return json.load(f)


class AdspTest(ExternalPolicyTest):

    def test_adsp_schedules_workers_of_two_speeds_with_evaluator_losses(self):
        report = self.run_job(COMMON.replace("PARTITION", "") + """
name: "external-adsp"
time_budget_s: 20
site {
  name: "a"
  address: "tcp://127.0.0.1:0"
  %s
  %s
}
policy {
  kind: ADSP
  check_period_s: 2
  initial_commits_per_period: 8
  min_commit_interval_s: 0.05
}
""" % (workers(2, 0.01), workers(2, 0.06)))
        self.assertEqual(report["policy"], "ADSP")
        self.assertTrue(report["outcome"].startswith("time budget"),
                        report["outcome"])
        site = report["sites"][0]
        # The search's loss evaluations came from the evaluator.
        self.assertGreater(site.get("loss_evaluations", 0), 0, site)
        self.assertGreater(site.get("search_time_s", 0), 0, site)
        by_index = {w["index"]: w for w in report["workers"]}
        self.assertEqual(sorted(by_index), [0, 1, 2, 3])
        commits = [by_index[i].get("commits", 0) for i in range(4)]
        steps = [by_index[i].get("steps", 0) for i in range(4)]
        print("adsp: commits", commits, "steps", steps,
              "loss evaluations", site.get("loss_evaluations"),
              "heterogeneity", report.get("heterogeneity"))
        # Equal commit rates, whatever the speed (within 35% on a loaded
        # machine: a fixed step count would make them differ 6x) ...
        self.assertGreaterEqual(min(commits), 5, commits)
        self.assertGreaterEqual(min(commits), 0.65 * max(commits), commits)
        # ... so the fast workers fold more steps into each commit.
        fast = (steps[0] / commits[0] + steps[1] / commits[1]) / 2
        slow = (steps[2] / commits[2] + steps[3] / commits[3]) / 2
        self.assertGreater(fast, 2 * slow, (steps, commits))
        self.assertGreater(report.get("heterogeneity", 0), 2.0)
        self.assertGreater(report.get("final_metric", 0), 0.5)


class SkewScoutTest(ExternalPolicyTest):

    def test_skewscout_scores_travelled_models_and_moves_theta(self):
        sites = "".join(
            'site { name: "%s" %s }\n' % (name, workers(1, 0.01))
            for name in ("a", "b", "c"))
        partition = """site_partition {
    kind: LABEL_SUBSET
    classes { label: [0, 1, 2] }
    classes { label: [3, 4, 5] }
    classes { label: [6, 7, 8, 9] }
  }"""
        report = self.run_job(COMMON.replace("PARTITION", partition) +
                              sites + """
name: "external-skewscout"
time_budget_s: 20
wan { emulate: false control_address: "tcp://127.0.0.1:0" }
policy { kind: ASYNC local_steps: 4 }
sync {
  kind: GAIA
  threshold: 0.05
  max_clock_skew: 2
  compression { value_coding: VALUE_INT8 }
  skewscout {
    enabled: true
    travel_period: 5
    holdout_samples: 300
    target_loss: 0.01
  }
}
""")
        self.assertEqual(len(report["sites"]), 3)
        changed = 0
        held = {"a": {0, 1, 2}, "b": {3, 4, 5}, "c": {6, 7, 8, 9}}
        for site in report["sites"]:
            name = site["name"]
            # The skew: the classes this site's share holds, and only those.
            histogram = site.get("label_histogram", [])
            self.assertEqual(len(histogram), 10, name)
            self.assertEqual({c for c, n in enumerate(histogram) if n > 0},
                             held[name], name)
            skew = site["sync"]["skewscout"]
            self.assertEqual(skew["knob"], "theta", name)
            self.assertGreater(int(skew.get("travels_sent", 0)), 0, name)
            self.assertGreater(int(skew.get("travels_scored", 0)), 0, name)
            decisions = skew.get("decisions", [])
            self.assertGreater(len(decisions), 0, name)
            for d in decisions:
                self.assertNotEqual(d["peer"], name)
                # The receiver's evaluator scored both models on its own
                # training sample (500 samples: evaluate.py --sample).
                self.assertEqual(d["samples"], 500, d)
                self.assertIn("own_accuracy", d)
                self.assertGreaterEqual(d["theta_after"], 0.001)
                self.assertLessEqual(d["theta_after"], 0.5)
                changed += d["theta_after"] != d["theta_before"]
            print("skewscout %s: %d travels sent, %d scored, %d decisions, "
                  "final theta %g" % (name, int(skew["travels_sent"]),
                                      int(skew["travels_scored"]),
                                      len(decisions),
                                      skew.get("final_theta", 0)))
            points = site["timeline"]
            self.assertGreater(len(points), 0, name)
            for point in points:
                self.assertIn("skew_knob", point, name)
        self.assertGreater(changed, 0, "the controller never moved theta")


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
