#!/usr/bin/env python3
"""Checks of the end-to-end scenarios (bench/scenarios) that run no
training: their shared library (scenariolib), the arithmetic their tables
and goals rest on, and the job files they write, validated by the real
binary.

  scenarios_test.py --meridian BIN --source DIR [unittest args]

RepeatsTest        medians of repeated runs with runs that missed a target;
                   the cells and rows of medians
TablesAndGoalsTest markdown rows, number and size formats; goal rows as a
                   table and as results.json's "goals"
PublishTest        docs/results/<name>.md: the generated block replaced
                   keeping the text outside it, inserted after the first
                   heading, a new file with its title, a broken block
                   refused; when a run publishes; the provenance lines
RunnerTest         a missing binary named; `meridian run` of a job: its
                   report read back, a failing run and one past its
                   timeout named (a stand-in binary)
JobsTest           the shipped three-region job with fields overridden,
                   validated; the sync blocks
EntryPointTest     every command without a suffix is a thin entry point
                   that imports its module's main() (--help works)
HeterogeneityTest  BSP's extrapolated lower bound and ADSP's lead against
                   it; --dry-run with edge links and a delay sweep, and
                   with the CNN workload;
                   --summarize-only refusing a missing run
GeoVsLanTest       --bandwidth reaches every inter-site link and a bad rate
                   is refused naming it; --regions 11 --dry-run validates;
                   --summarize-only names a missing run; Gaia held against
                   a LAN-BSP faster than LAN
CompressionUpdatesTest
                   a valid job per workload (--dry-run), an unknown workload
                   refused, the side-by-side table's ratios
WorkloadSpeedTest  reading meridian_bench's JSON: the wall-clock rate, the
                   kernel set it ran on, a failed benchmark named
NoniidTest         ALGORITHM@SECONDS: a valid job that sends between
                   clocks, refused for FedAvg; SkewScout's estimate spread
                   per (site, peer) against their sampling error;
                   --summarize-only rebuilds the medians from the runs in
                   OUTDIR, names a missing one, publishes only with
                   --publish; --dry-run validates every cell's job
LanguageModelWorkloadTest
                   --workload lm: geo_vs_lan's and noniid's jobs run the
                   example's programs (one worker a site, an evaluator,
                   the genre split through --split) and validate; issue
                   36's goals; the shortfall of a perplexity in percent
SweepTest          every method the same trials, its documented setting
                   first; the best trial (fastest, ties by bytes); the
                   goals from the best settings' medians (--summarize-only);
                   --dry-run validates every trial
PytorchMlpTest     --dry-run exports the built-in MLP's weights and validates
                   the built-in and the PyTorch job
ChaosTest          --dry-run validates the job (the shipped one with the
                   scenario's changes) and prints the schedule
"""
import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

MERIDIAN = None  # path of the meridian binary (--meridian)
SOURCE = None    # repository root (--source)


def scenario(name):
    """The module bench/scenarios/NAME.py, or scenariolib.NAME for the
    shared library's ("scenariolib.repeats")."""
    return importlib.import_module(name)


SCENARIOS = ("chaos", "compression_updates", "geo_vs_lan", "heterogeneity",
             "noniid", "slow_link", "sweep", "worker_endpoint",
             "workload_speed")


def script(name):
    return os.path.join(SOURCE, "bench", "scenarios", name)


def run_script(name, *args):
    return subprocess.run([script(name), *args, "--binary", MERIDIAN],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


class RepeatsTest(unittest.TestCase):
    def test_a_missed_target_counts_as_later_than_any_reached(self):
        repeats = scenario("scenariolib.repeats")
        cell = repeats.median_range([10.1, None, 14.0], unreached=True)
        self.assertEqual(cell["median"], 14.0)
        self.assertEqual((cell["min"], cell["max"]), (10.1, 14.0))
        self.assertEqual((cell["runs"], cell["of"]), (2, 3))
        self.assertIsNone(repeats.median_range(
            [10.1, None, None], unreached=True)["median"])
        # Other quantities leave a None out of the median.
        self.assertEqual(repeats.median_range([1.0, None, 3.0])["median"],
                         2.0)

    def test_a_cell_is_the_median_with_its_range(self):
        repeats = scenario("scenariolib.repeats")

        def one_digit(v):
            return f"{v:.1f}"
        self.assertEqual(repeats.fmt_cell(
            repeats.median_range([3.0, 1.0, 2.0]), one_digit),
            "2.0 (1.0–3.0)")
        # One run: the value alone.
        self.assertEqual(repeats.fmt_cell(repeats.median_range([7.0]),
                                          one_digit), "7.0")
        self.assertEqual(repeats.fmt_cell(repeats.median_range(
            [10.1, None, 14.0], True), one_digit, "reached"),
            "14.0 (10.1–14.0; 2 of 3 reached)")
        self.assertEqual(repeats.fmt_cell(repeats.median_range(
            [10.1, None, None], True), one_digit, "reached"),
            "— (10.1; 1 of 3 reached)")
        self.assertEqual(repeats.fmt_cell(None), "—")

    def test_summarize_and_the_row_of_medians(self):
        repeats = scenario("scenariolib.repeats")
        rows = [{"name": "a", "t": 1.0, "ok": True, "reach": None},
                {"name": "a", "t": 3.0, "ok": False, "reach": 5.0},
                {"name": "a", "t": 2.0, "ok": True, "reach": 4.0}]
        summary = repeats.summarize(rows, ["reach"])
        self.assertNotIn("name", summary)
        self.assertEqual(summary["ok"], {"true": 2, "of": 3})
        self.assertEqual(summary["reach"]["median"], 5.0)  # None is later
        row = repeats.median_row(summary)
        self.assertEqual((row["t"], row["ok"], row["reach"]),
                         (2.0, True, 5.0))
        # Round-robin: run 1 of every variant first.
        self.assertEqual(repeats.order(["x", "y"], 2),
                         [(1, "x"), (1, "y"), (2, "x"), (2, "y")])
        self.assertEqual(repeats.label("x", 2, 3), "x-r2")
        self.assertEqual(repeats.label("x", 1, 1), "x")


class TablesAndGoalsTest(unittest.TestCase):
    def test_rows_and_formats(self):
        tables = scenario("scenariolib.tables")
        self.assertEqual(tables.table(["a", "b"], [[1, ""]]),
                         ["| a | b |", "|---|---|", "| 1 |  |"])
        self.assertEqual(tables.number(None), "—")
        self.assertEqual(tables.number(float("inf")), "∞")
        self.assertEqual(tables.number(12.345, 2, "%"), "12.35%")
        self.assertEqual(tables.data_size(1.5e9), "1.50 GB")
        self.assertEqual(tables.data_size(2048), "2.05 kB")
        self.assertEqual(tables.data_size(2048, "n/a", kilo_digits=1),
                         "2.0 kB")
        self.assertEqual(tables.data_size(17), "17 B")
        self.assertEqual(tables.data_size(None, "n/a"), "n/a")

    def test_goal_rows(self):
        goals = scenario("scenariolib.goals")
        rows = [goals.Goal("speed", "≥ 2×", "3.0×", True),
                goals.Goal("bytes", "fewer", "1.2×", False)]
        self.assertEqual(goals.table(rows), [
            "| goal | wanted | measured | met |", "|---|---|---|---|",
            "| speed | ≥ 2× | 3.0× | yes |", "| bytes | fewer | 1.2× | no |"])
        self.assertEqual(goals.to_json(rows)[1], {
            "goal": "bytes", "wanted": "fewer", "measured": "1.2×",
            "met": False})
        self.assertIs(goals.met(rows, "speed"), True)
        self.assertIsNone(goals.met(rows, "absent"))
        # A goal unpacks like the tuples it replaced.
        goal, wanted, measured, met = rows[0]
        self.assertEqual((goal, wanted, measured, met),
                         ("speed", "≥ 2×", "3.0×", True))


class PublishTest(unittest.TestCase):
    BEGIN = ("<!-- BEGIN GENERATED by bench/scenarios/toy: do not edit by "
             "hand -->")

    @classmethod
    def setUpClass(cls):
        cls.publish = scenario("scenariolib.publish")
        cls.provenance = scenario("scenariolib.provenance").Provenance(
            command="bench/scenarios/toy /tmp/out --quick", commit="abc123",
            dirty=False, started=0.0, cpu="Toy CPU", logical_cpus=2,
            memory_bytes=8 * 2 ** 30)

    def block(self, results):
        return self.publish.block("toy", self.provenance, results, 600.0)

    def test_the_block_names_its_provenance_and_nests_the_tables(self):
        block = self.block("# Toy (bench/scenarios/toy)\n\n| a |\n")
        lines = block.splitlines()
        self.assertEqual(lines[0], self.BEGIN)
        self.assertEqual(lines[-1], "<!-- END GENERATED -->")
        self.assertIn("- Command: `bench/scenarios/toy /tmp/out --quick`",
                      lines)
        self.assertIn("- Commit: `abc123` (clean tree)", lines)
        self.assertIn("- Date: 1970-01-01 00:00 UTC (took 10 min)", lines)
        self.assertIn("- Machine: Toy CPU, 2 logical CPUs, 8.0 GiB memory",
                      lines)
        # The tables' heading sits below the block's own.
        self.assertIn("### Toy (bench/scenarios/toy)", lines)
        self.assertIn("| a |", lines)

    def test_the_block_is_replaced_and_the_text_outside_kept(self):
        old = self.block("old tables\n")
        existing = ("# Toy\n\nIntro by hand.\n\n" + old +
                    "\n## Older measurements\n\n| kept |\n")
        new = self.block("new tables\n")
        updated = self.publish.update(existing, "toy", "Toy", new)
        self.assertEqual(updated, "# Toy\n\nIntro by hand.\n\n" + new +
                         "\n## Older measurements\n\n| kept |\n")
        # Publishing again changes nothing else.
        self.assertEqual(self.publish.update(updated, "toy", "Toy", new),
                         updated)
        # Another scenario's block is not this one's.
        self.assertEqual(self.publish.update(
            updated.replace("/toy:", "/other:"), "toy", "Toy", new).count(
                "<!-- BEGIN GENERATED"), 2)

    def test_without_a_block_it_goes_after_the_first_heading(self):
        new = self.block("tables\n")
        existing = "# Toy\n\n## Older measurements\n\nby hand\n"
        self.assertEqual(
            self.publish.update(existing, "toy", "Toy", new),
            "# Toy\n\n" + new + "\n## Older measurements\n\nby hand\n")
        # No file: created with its title.
        self.assertEqual(self.publish.update(None, "toy", "Toy", new),
                         "# Toy\n\n" + new)

    def test_a_broken_block_is_refused_and_the_file_kept(self):
        broken = "# Toy\n\n" + self.BEGIN + "\nhalf a block\n"
        with self.assertRaises(self.publish.PublishError):
            self.publish.update(broken, "toy", "Toy", self.block("t\n"))
        twice = "# Toy\n\n" + self.block("a\n") + self.block("b\n")
        with self.assertRaises(self.publish.PublishError):
            self.publish.update(twice, "toy", "Toy", self.block("t\n"))
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "toy.md")
            with open(path, "w") as f:
                f.write(broken)
            with self.assertRaises(self.publish.PublishError):
                self.publish.publish("toy", "Toy", "t\n", self.provenance,
                                     False, out)
            with open(path) as f:
                self.assertEqual(f.read(), broken)

    def test_a_complete_run_publishes_a_restricted_one_on_request(self):
        wanted = self.publish.wanted
        self.assertTrue(wanted(argparse.Namespace(publish=None), False))
        self.assertFalse(wanted(argparse.Namespace(publish=None), True))
        self.assertTrue(wanted(argparse.Namespace(publish=True), True))
        self.assertFalse(wanted(argparse.Namespace(publish=False), False))
        self.assertEqual(os.path.basename(self.publish.path_of("d", "toy",
                                                               True)),
                         "toy-quick.md")
        with tempfile.TemporaryDirectory() as out:
            path = self.publish.publish("toy", "Toy", "# T\n\n| x |\n",
                                        self.provenance, True, out)
            with open(path) as f:
                text = f.read()
            self.assertTrue(text.startswith("# Toy (--quick)\n\n" +
                                            self.BEGIN))

    def test_a_workload_publishes_into_its_own_file(self):
        with tempfile.TemporaryDirectory() as out:
            other = os.path.join(out, "language_model.md")
            with open(other, "w") as f:
                f.write("# Language model\n\nkept\n")
            path = self.publish.publish("toy", "Toy", "| x |\n",
                                        self.provenance, False, out,
                                        "language_model")
            self.assertEqual(path, other)
            self.assertFalse(os.path.exists(os.path.join(out, "toy.md")))
            with open(path) as f:
                text = f.read()
            self.assertIn(self.BEGIN, text)
            self.assertTrue(text.rstrip().endswith("kept"))


class RunnerTest(unittest.TestCase):
    # A stand-in for the meridian binary: `run CONFIG --out DIR` writes
    # DIR/report.json, exits 3 for a config naming "fail", runs 60 s for
    # one naming "hang" (SIGINT stops it, as it stops meridian run).
    FAKE = """#!/usr/bin/env python3
import json, os, sys, time
config, out = sys.argv[2], sys.argv[4]
text = open(config).read()
print("fake run of", config, flush=True)
if "fail" in text:
    sys.exit(3)
if "hang" in text:
    time.sleep(60)
os.makedirs(out, exist_ok=True)
json.dump({"final_accuracy": 0.5}, open(os.path.join(out, "report.json"),
                                        "w"))
"""

    def setUp(self):
        self.runner = scenario("scenariolib.runner")
        self.dir = tempfile.mkdtemp()
        self.binary = os.path.join(self.dir, "meridian")
        with open(self.binary, "w") as f:
            f.write(self.FAKE)
        os.chmod(self.binary, 0o755)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.dir])

    def run_job(self, text, timeout=None):
        config = self.runner.write_config(self.dir, "job", text)
        return self.runner.run_job(self.binary, "toy", "job", config,
                                   os.path.join(self.dir, "runs", "job"),
                                   timeout)

    def test_a_job_run_and_its_report_read_back(self):
        done = self.run_job("ok")
        self.assertEqual(done.report, {"final_accuracy": 0.5})
        self.assertGreaterEqual(done.wall_s, 0.0)
        with open(done.run_dir + ".out") as f:
            self.assertIn("fake run of", f.read())

    def test_a_failed_or_hung_run_is_named(self):
        with self.assertRaisesRegex(SystemExit, r"\[toy\] job failed "
                                    r"\(exit 3\); output in .*runs/job"):
            self.run_job("fail")
        with self.assertRaisesRegex(SystemExit, "still running after 1 s"):
            self.run_job("hang", timeout=1)

    def test_a_missing_binary_is_named(self):
        missing = os.path.join(self.dir, "nothing")
        with self.assertRaisesRegex(SystemExit, re.escape(
                f"[toy] {missing} is not an executable")):
            self.runner.require_binary(missing, "toy")
        self.assertEqual(self.runner.require_binary(self.binary, "toy"),
                         self.binary)


class JobsTest(unittest.TestCase):
    def test_the_shipped_job_with_fields_overridden_is_valid(self):
        jobs = scenario("scenariolib.jobs")
        text = jobs.shipped("three-regions")
        text = jobs.set_field(text, "name", '"edited"')
        text = jobs.set_field(text, "time_budget_s", "42")
        text = jobs.set_field(text, "stop_at_target", "false")
        text = jobs.prepend_to_block(text, "sync", "adaptive_threshold: true")
        self.assertIn('name: "edited"', text)
        self.assertEqual(text.count("time_budget_s:"), 1)
        self.assertIn("sync {\n  adaptive_threshold: true", text)
        # A field the job does not have is appended.
        self.assertTrue(jobs.set_field("a: 1", "b", "2").endswith("\nb: 2\n"))
        with self.assertRaises(ValueError):
            jobs.prepend_to_block(text, "nothing", "x: 1")
        with tempfile.TemporaryDirectory() as out:
            path = os.path.join(out, "job.pbtxt")
            with open(path, "w") as f:
                f.write(text + "\n" + jobs.PLAINTEXT + "\n")
            ok, output = scenario("scenariolib.runner").validate(MERIDIAN,
                                                                 path)
            self.assertTrue(ok, output)

    def test_sync_blocks(self):
        jobs = scenario("scenariolib.jobs")
        gaia = jobs.gaia_sync(0.05, jobs.INT8, 8, "THRESHOLD_CONSTANT")
        for field in ("kind: GAIA", "threshold: 0.05",
                      "threshold_mode: RELATIVE", "max_clock_skew: 8",
                      "threshold_schedule: THRESHOLD_CONSTANT",
                      "VALUE_INT8"):
            self.assertIn(field, gaia)
        self.assertNotIn("max_clock_skew", jobs.gaia_sync(0.05))
        self.assertEqual(jobs.sites(jobs.THREE_REGIONS, 4, 0.02, "us")
                         .count('server_site: "us"'), 2)


class EntryPointTest(unittest.TestCase):
    def test_every_command_is_a_thin_entry_point(self):
        for name in SCENARIOS:
            with self.subTest(name):
                path = script(name)
                self.assertTrue(os.access(path, os.X_OK), path)
                with open(path) as f:
                    text = f.read()
                self.assertLessEqual(len(text.splitlines()), 12, text)
                self.assertRegex(text, r"\nfrom [a-z_.]+ import main  ")
                module = "chaos_scenario.main" if name == "chaos" else name
                self.assertTrue(os.path.exists(os.path.join(
                    SOURCE, "bench", "scenarios",
                    module.replace(".", "/") + ".py")))
                proc = subprocess.run([path, "--help"],
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                self.assertEqual(proc.returncode, 0, proc.stdout)
                self.assertIn(f"usage: {name}", proc.stdout)
                self.assertIn("--publish", proc.stdout)


class HeterogeneityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.het = scenario("heterogeneity")

    def row(self, run, network, delay, converged, steps, training_s,
            first_below):
        return {"policy": "BSP", "run": run, "H": 3.2, "workers": 18,
                "network": network, "delay_ms": delay,
                "convergence_time_s": converged, "steps": steps,
                "training_s": training_s, "first_below_steps": first_below}

    def test_bsp_bound_is_loopback_steps_at_the_run_own_rate(self):
        loopback = self.row(1, "none", 0.0, 99.3, 1300, 150.0, 780)
        slow = self.row(1, "edge", 0.0, None, 97, 150.0, None)
        other_round = self.row(2, "edge", 0.0, None, 97, 150.0, None)
        rows = [loopback, slow, other_round]
        self.het.bound_unconverged_bsp(rows)
        # Converged: its own time, not extrapolated.
        self.assertEqual(loopback["convergence_estimate_s"], 99.3)
        self.assertFalse(loopback["extrapolated"])
        # 780 steps at 97 / 150 steps per second.
        self.assertAlmostEqual(slow["convergence_estimate_s"],
                               780 / (97 / 150.0))
        self.assertTrue(slow["extrapolated"])
        # No loopback run in its round: no bound.
        self.assertIsNone(other_round["convergence_estimate_s"])
        self.assertFalse(other_round["extrapolated"])

    def test_lead_counts_against_the_later_of_budget_and_bound(self):
        repeats = scenario("scenariolib.repeats")
        adsp = repeats.median_range([40.0])
        missed = repeats.median_range([None], unreached=True)
        self.assertIsNone(missed)  # no run converged: no cell
        bound = repeats.median_range([800.0])
        self.assertEqual(self.het.lead(adsp, None, 150.0, bound), "≥ 95.0%")
        # A bound below the budget does not lower the budget's claim.
        low = repeats.median_range([100.0])
        self.assertEqual(self.het.lead(adsp, None, 150.0, low), "≥ 73.3%")
        self.assertEqual(self.het.lead(adsp, None, 150.0), "≥ 73.3%")
        self.assertEqual(
            self.het.lead(adsp, repeats.median_range([80.0]), 150.0, bound),
            "50.0%")

    def test_dry_run_with_edge_links_and_delays_validates(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("heterogeneity", out, "--quick", "--network",
                              "none,edge", "--delays", "0,100", "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertEqual(proc.stdout.count(": OK ("), 12, proc.stdout)
            with open(os.path.join(
                    out, "configs", "adsp-h3.2-w18-edge-d100ms.pbtxt")) as f:
                text = f.read()
            self.assertIn('preset: "4g"', text)

    def test_cnn_workload_writes_its_model_steps_and_budget(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("heterogeneity", out, "--quick", "--workload",
                              "cnn-bn", "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertEqual(proc.stdout.count(": OK ("), 3, proc.stdout)
            with open(os.path.join(out, "configs",
                                   "bsp-h3.2-w18.pbtxt")) as f:
                text = f.read()
            self.assertIn('preset: "lenet5-bn"', text)
            self.assertIn("fashion-mnist", text)
            self.assertIn("time_budget_s: 300", text)
            self.assertIn("step_time_s: 0.1 ", text)  # the fast devices

    def test_summarize_only_names_a_missing_run(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("heterogeneity", out, "--quick",
                              "--summarize-only")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn(os.path.join(out, "runs", "adsp-h3.2-w18",
                                       "report.json"), proc.stdout)


class GeoVsLanTest(unittest.TestCase):
    def test_bandwidth_reaches_every_inter_site_link(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("geo_vs_lan", out, "--regions", "11",
                              "--quick", "--workload", "mlp-small",
                              "--bandwidth", "500kbit", "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertEqual(proc.stdout.count(": OK ("), 4, proc.stdout)
            with open(os.path.join(out, "configs",
                                   "gaia-compressed.pbtxt")) as f:
                text = f.read()
            # Every pair of the eleven sites, both directions at 500 kbit.
            self.assertEqual(text.count('bandwidth: "500kbit"'), 55)
            self.assertNotIn("64mbit", text)

    def test_a_bad_rate_is_refused_naming_it(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("geo_vs_lan", out, "--quick", "--bandwidth",
                              "fast", "--dry-run")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("bandwidth 'fast'", proc.stdout)

    def test_summarize_only_names_a_missing_run(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("geo_vs_lan", out, "--quick",
                              "--summarize-only")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn(os.path.join(out, "runs", "lan", "report.json"),
                          proc.stdout)

    def test_gaia_is_also_held_against_a_faster_lan_bsp(self):
        gvl = scenario("geo_vs_lan")
        setup = gvl.Setup()
        high = setup.high

        def row(t, bytes_=None):
            return {f"time_to_{high}_s": t, f"wan_bytes_to_{high}": bytes_,
                    setup.final: 0.88}
        rows = {"lan": row(140.0), "lan-bsp": row(70.0),
                "gaia-compressed": row(75.0, 1e7)}
        goals = {g[0]: g for g in gvl.evaluate_goals(setup, rows)}
        vs_lan = goals[f"gaia-compressed: time to {high} vs LAN"]
        self.assertEqual(vs_lan[2], "0.54×")
        vs_bsp = goals[f"gaia-compressed: time to {high} vs LAN-BSP "
                       "(the faster LAN)"]
        self.assertEqual(vs_bsp[2], "1.07×")
        self.assertTrue(vs_bsp[3])
        # A slower lan-bsp adds nothing.
        rows["lan-bsp"] = row(200.0)
        self.assertEqual(len([g for g in gvl.evaluate_goals(setup, rows)
                              if "LAN-BSP" in g[0]]), 0)


class CompressionUpdatesTest(unittest.TestCase):
    def run_updates(self, *args):
        return subprocess.run(
            [os.path.join(SOURCE, "bench", "scenarios", "compression_updates"),
             *args, "--meridian", MERIDIAN],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def test_dry_run_writes_a_valid_job_per_workload(self):
        with tempfile.TemporaryDirectory() as out:
            proc = self.run_updates(out, "--workload", "mlp,cnn-gn,mf",
                                    "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertEqual(proc.stdout.count(" valid"), 3, proc.stdout)
            with open(os.path.join(out, "cnn-gn.pbtxt")) as f:
                self.assertIn('preset: "lenet5-gn"', f.read())
            with open(os.path.join(out, "mf.pbtxt")) as f:
                text = f.read()
            self.assertIn("ratings {", text)
            self.assertIn("local_steps: 32", text)  # MF's own
            self.assertIn("threshold: 0.05", text)

    def test_an_unknown_workload_is_refused_naming_it(self):
        with tempfile.TemporaryDirectory() as out:
            proc = self.run_updates(out, "--workload", "mlp,resnet",
                                    "--dry-run")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("--workload resnet", proc.stdout)

    def test_summary_ratios(self):
        module = scenario("compression_updates")
        rows = {"int8+zstd1/commit": {"encoded_bytes": 1000.0,
                                      "entries": 1000.0},
                "int8+zstd1/significant": {"encoded_bytes": 180.0,
                                           "entries": 100.0},
                "int8+zstd1/significant-random": {"encoded_bytes": 200.0,
                                                  "entries": 100.0},
                "fp32/significant": {"encoded_bytes": 500.0,
                                     "entries": 100.0}}
        text = module.summary({"toy": {"parameters": 1000, "rows": rows}})
        commit = next(l for l in text.splitlines() if "| commit |" in l)
        significant = next(l for l in text.splitlines()
                           if "| significant |" in l)
        self.assertIn("| 100.00% |", commit)
        self.assertIn("1.0 kB (1/4.0)", commit)   # 4,000 B dense fp32
        self.assertIn("| 10.00% |", significant)
        self.assertIn("500 B (1/8.0)", significant)
        self.assertIn("| 1.80 | 0.90 |", significant)  # B/entry, real/random
        self.assertIn("n/a", significant)  # int4 not measured


def validate_job(test, directory, name, text):
    """Writes job `text` to DIRECTORY/NAME.pbtxt and asserts that
    `meridian validate` accepts it; returns its output."""
    path = os.path.join(directory, name + ".pbtxt")
    with open(path, "w") as f:
        f.write(text)
    proc = subprocess.run([MERIDIAN, "validate", path],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    test.assertEqual(proc.returncode, 0, name + ": " + proc.stdout)
    return proc.stdout


class NoniidTest(unittest.TestCase):
    def test_streamed_variant_is_a_valid_job(self):
        noniid = scenario("noniid")
        algos = noniid.algorithms(1)
        sync = noniid.streamed(algos, "gaia-0.01@0.02")
        self.assertIn("send_period_s: 0.02", sync)
        self.assertIn("threshold: 0.01", sync)
        self.assertIsNone(noniid.streamed(algos, "fedavg-10@0.02"))
        self.assertIsNone(noniid.streamed(algos, "dense@soon"))
        self.assertIsNone(noniid.streamed(algos, "dense"))
        held = noniid.streamed(algos, "dense+held@0.02")
        self.assertIn("own_changes: OWN_CHANGES_WITH_PEERS", held)
        self.assertIn("send_period_s: 0.02", held)
        self.assertIn("kind: DENSE", noniid.streamed(algos, "dense+held"))
        self.assertIsNone(noniid.streamed(algos, "fedavg-10+held"))
        sent = noniid.streamed(algos, "skewscout+sent")
        self.assertIn("own_changes: OWN_CHANGES_AS_SENT", sent)
        self.assertNotIn("WITH_PEERS", sent)
        with tempfile.TemporaryDirectory() as tmp:
            for variant in (sync, held, sent):
                validate_job(self, tmp, "x", noniid.job_text(
                    noniid.Setup(budget=60), "x", "disjoint", variant))

    def test_every_algorithm_is_a_valid_job(self):
        noniid = scenario("noniid")
        with tempfile.TemporaryDirectory() as tmp:
            for name, sync in noniid.algorithms(1).items():
                validate_job(self, tmp, name, noniid.job_text(
                    noniid.Setup(budget=60), name, "dirichlet01", sync))

    def test_held_out_skews_are_valid_jobs_with_their_seed(self):
        noniid = scenario("noniid")
        mlp = noniid.workloads.get("mlp")
        self.assertEqual(set(noniid.skews_of(mlp)),
                         set(noniid.SKEWS) | set(noniid.CHECK_SKEWS))
        self.assertFalse(set(noniid.SKEWS) & set(noniid.CHECK_SKEWS))
        with tempfile.TemporaryDirectory() as tmp:
            for skew in noniid.CHECK_SKEWS:
                text = noniid.job_text(noniid.Setup(budget=60, seed=7), skew,
                                       skew, noniid.algorithms(1)["gaia-0.05"])
                self.assertIn("seed: 7", text)
                self.assertIn(noniid.CHECK_SKEWS[skew], text)
                validate_job(self, tmp, skew, text)

    def test_final_knob_of_fedavg_is_the_agreed_period(self):
        noniid = scenario("noniid")

        def site(period, knob):
            return {"sync": {"diloco": {"adaptive_period": True,
                                        "period": period},
                             "skewscout": {"final_theta": knob}}}
        report = {"sites": [site(4, 3.2), site(4, 5.0)]}
        setup = noniid.Setup(budget=60)
        self.assertEqual(noniid.measure(setup, report)["final_theta"], 4)
        # Gaia's knob is each site's own θ.
        report = {"sites": [{"sync": {"skewscout": {"final_theta": 0.01}}},
                            {"sync": {"skewscout": {"final_theta": 0.03}}}]}
        self.assertAlmostEqual(noniid.measure(setup, report)["final_theta"],
                               0.02)

    def test_summarize_only_rebuilds_the_table_from_the_runs(self):
        def report(final, wan_mb):
            return {"final_accuracy": final, "wan_bytes_total": wan_mb * 1e6,
                    "sites": [{"timeline": [{"t_s": 50, "accuracy": final}]}]}
        finals = {"one-ps": [0.87, 0.85, 0.86], "gaia-0.05": [0.70, 0.74,
                                                             0.72]}
        with tempfile.TemporaryDirectory() as out:
            for name, values in finals.items():
                for r, final in enumerate(values, 1):
                    run_dir = os.path.join(out, "runs",
                                           f"disjoint-{name}-r{r}")
                    os.makedirs(run_dir)
                    with open(os.path.join(run_dir, "report.json"), "w") as f:
                        json.dump(report(final, 10 * r), f)
            published = os.path.join(out, "published")
            args = ("--skews", "disjoint", "--only", "one-ps,gaia-0.05",
                    "--repeat", "3", "--summarize-only", "--results-dir",
                    published)
            proc = run_script("noniid", out, *args)
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertNotIn("running", proc.stdout)  # nothing was run
            # A run that reran nothing publishes only when asked to.
            self.assertFalse(os.path.exists(published))
            os.makedirs(published)
            with open(os.path.join(published, "noniid.md"), "w") as f:
                f.write("# Label skew\n\n## Older\n\nby hand\n")
            proc = run_script("noniid", out, *args, "--publish")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            with open(os.path.join(published, "noniid.md")) as f:
                doc = f.read()
            self.assertTrue(doc.startswith(
                "# Label skew\n\n<!-- BEGIN GENERATED by "
                "bench/scenarios/noniid: do not edit by hand -->\n"), doc)
            self.assertTrue(doc.endswith("## Older\n\nby hand\n"), doc)
            self.assertIn("--summarize-only --results-dir", doc)
            self.assertIn("| disjoint | gaia-0.05 | 0.720 (0.700–0.740) | "
                          "+14.0 |", doc)
            with open(os.path.join(out, "results.md")) as f:
                table = f.read()
            # Medians with their ranges; the loss from the medians.
            self.assertIn("| disjoint | one-ps | 0.860 (0.850–0.870) | +0.0 |",
                          table)
            self.assertIn("| disjoint | gaia-0.05 | 0.720 (0.700–0.740) | "
                          "+14.0 |", table)
            self.assertIn("20.0 (10.0–30.0)", table)  # WAN MB
            # A run missing from OUTDIR is named.
            os.remove(os.path.join(out, "runs", "disjoint-gaia-0.05-r2",
                                   "report.json"))
            proc = run_script("noniid", out, "--skews", "disjoint", "--only",
                              "one-ps,gaia-0.05", "--repeat", "3",
                              "--summarize-only")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn(os.path.join(out, "runs", "disjoint-gaia-0.05-r2",
                                       "report.json"), proc.stdout)

    def test_dry_run_validates_every_cell(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("noniid", out, "--quick", "--dry-run",
                              "--repeat", "2")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            # 2 skews x 4 algorithms, in the order of the runs first.
            self.assertEqual(proc.stdout.count(": OK ("), 8, proc.stdout)
            self.assertIn("runs, in this order: iid-one-ps-r1, iid-dense-r1",
                          proc.stdout)
            self.assertFalse(os.path.exists(os.path.join(out, "runs",
                                                         "iid-one-ps-r1")))

    def test_estimate_spread_is_per_site_and_peer_after_the_transient(self):
        noniid = scenario("noniid")

        def decision(t, peer, estimate):
            # own - travelled = estimate; 100 samples, 20 discordant.
            return {"t_s": t, "peer": peer, "samples": 100,
                    "discordant": 20, "estimate": estimate}
        scouts = [{"decisions": [decision(1, "b", 0.9)] +
                   [decision(30 + i, "b", e)
                    for i, e in enumerate([0.1, 0.2, 0.3])] +
                   [decision(40 + i, "c", e)
                    for i, e in enumerate([0.0, 0.0, 0.0])]}]
        noise = noniid.estimate_noise(scouts, budget=60)
        # The estimate at t = 1 (before 20 s) is left out: pair b has sd
        # 0.1 and mean 0.2, pair c sd 0 and mean 0.
        self.assertAlmostEqual(noise["estimate_spread"], 0.05)
        self.assertAlmostEqual(noise["estimate_mean"], 0.1)
        # sqrt((0.2 - est^2) / 100), median over the six estimates.
        self.assertAlmostEqual(
            noise["estimate_error"],
            (0.2 ** 0.5 / 10 + (0.2 - 0.01) ** 0.5 / 10) / 2)
        self.assertIsNone(noniid.estimate_noise([], 60)["estimate_spread"])


class ChaosTest(unittest.TestCase):
    def test_dry_run_validates_the_job_and_prints_the_schedule(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("chaos", out, "--quick", "--dry-run",
                              "--repeat", "2")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertIn("[chaos] schedule: 5 s worker_kill", proc.stdout)
            self.assertIn("38 s partition ap 40 s", proc.stdout)
            # The crashed site is killed again within its checkpoint period.
            self.assertIn("12 s site_crash us,", proc.stdout)
            self.assertIn("17 s site_crash_again us,", proc.stdout)
            self.assertIn("runs, in this order: r1/fault-free, r1/chaos, "
                          "r2/fault-free, r2/chaos", proc.stdout)
            self.assertIn("OK (3 sites, 12 workers, ASYNC)", proc.stdout)
            with open(os.path.join(out, "job.pbtxt")) as f:
                job = f.read()
            for line in ('name: "three-regions-chaos"', "time_budget_s: 155",
                         "stop_at_target: false", "adaptive_threshold: true",
                         "security { curve: false }", "fault { }"):
                self.assertIn(line, job)
            self.assertEqual(os.listdir(out), ["job.pbtxt"])


    def test_dry_run_of_the_pytorch_workload_exports_the_weights(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("chaos", out, "--quick", "--dry-run",
                              "--workload", "pytorch-mlp")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertIn("OK (3 sites, 12 workers, ASYNC)", proc.stdout)
            with open(os.path.join(out, "job.pbtxt")) as f:
                job = f.read()
            for line in ("kind: EXTERNAL",
                         'weights: "initial.safetensors"',
                         "examples/mlp/train.py", "examples/mlp/evaluate.py",
                         "join_timeout_s: 300", "fault { }"):
                self.assertIn(line, job)
            self.assertEqual(sorted(os.listdir(out)),
                             ["builtin.pbtxt", "initial.safetensors",
                              "job.pbtxt"])

    def test_updates_lost_counts_every_crash_of_the_site(self):
        report = scenario("chaos_scenario.report")
        faults = [{"fault": "site_crash", "target": "site 'us'"},
                  {"fault": "site_crash_again", "target": "site 'us'"},
                  {"fault": "wanem_crash", "target": "wanem"}]

        def run(lost, restarts, site_lost=0):
            recovery = {"restarts": restarts, "lost_commits": site_lost}
            return {"lost_commits": lost,
                    "sites": {"us": {"recovery": recovery},
                              "eu": {"recovery": None}}}
        met = report.updates_lost_goal(run(0, 2), faults)
        self.assertTrue(met.met, met)
        self.assertIn("us crashed 2×, restarted 2×", met.measured)
        # Commits lost to either crash, or a crash the site never came
        # back from, miss the goal.
        self.assertFalse(report.updates_lost_goal(run(12, 2, 12),
                                                  faults).met)
        self.assertFalse(report.updates_lost_goal(run(0, 2, 3), faults).met)
        self.assertFalse(report.updates_lost_goal(run(0, 1), faults).met)

    def test_slow_link_phase_reads_its_runs_back_and_judges_them(self):
        slow_phase = scenario("chaos_scenario.slow_phase")
        self.assertEqual(slow_phase.rates_of("200kbit, 50kbit"),
                         ["200kbit", "50kbit"])
        self.assertEqual(slow_phase.rates_of("none"), [])
        row = {"rate": "50kbit", "exit": 0, "wall_s": 197.0, "slowed": True,
               "set_output": "us-ap: 50kbit", "flush_complete": True,
               "unreachable": [], "replica_difference": 1.3e-06,
               "largest_weight": 0.45,
               "accuracy": {"us": 0.881, "eu": 0.881, "ap": 0.881},
               "flush_s": {"us": 133.5, "eu": 0.9, "ap": 133.7}}
        split = dict(row, rate="200kbit", flush_complete=False, exit=3,
                     unreachable=["ap"], replica_difference=0.07)
        with tempfile.TemporaryDirectory() as out:
            os.makedirs(os.path.join(out, slow_phase.DIRNAME))
            with open(os.path.join(out, slow_phase.DIRNAME,
                                   slow_phase.ROWS), "w") as f:
                json.dump([split, row], f)
            rows = slow_phase.run("unused", out, ["50kbit", "200kbit"],
                                  reanalyse=True)
            self.assertIsNone(slow_phase.run("unused", out, [], True))
        self.assertEqual([r["rate"] for r in rows], ["200kbit", "50kbit"])
        goals = slow_phase.goals(rows)
        self.assertEqual([g.met for g in goals if g.goal.startswith("50")],
                         [True] * 5)
        self.assertEqual([g.met for g in goals if g.goal.startswith("200")],
                         [True, False, False, False, False])
        text = "\n".join(slow_phase.section(rows))
        self.assertIn("## Slow-link phase", text)
        self.assertIn("| 200kbit | 3 | NO |", text)

    def test_programs_are_found_by_their_environment(self):
        processes = scenario("chaos_scenario.processes")
        with tempfile.TemporaryDirectory() as run_dir:
            env = dict(os.environ, MERIDIAN_ROLE="worker",
                       MERIDIAN_SITE="eu", MERIDIAN_WORKER_INDEX="3",
                       MERIDIAN_OUT=run_dir)
            # A program whose command line does not name the run.
            child = subprocess.Popen(["sleep", "30"], env=env)
            try:
                # Until the child has exec'd, /proc shows the parent's
                # command line and environment: wait for that event.
                deadline = time.monotonic() + 60
                while (processes.proc_table().get(child.pid, [""])[0]
                       != "sleep" and time.monotonic() < deadline):
                    time.sleep(0.01)
                self.assertIn(child.pid, processes.run_processes(run_dir))
                self.assertEqual(processes.program_role(child.pid),
                                 ("worker", "eu", 3))
                self.assertEqual(processes.find_pids(run_dir,
                                                     ("worker", "eu", 3)),
                                 [child.pid])
                self.assertEqual(processes.find_pids(run_dir + "x",
                                                     ("worker", "eu", 3)),
                                 [])
            finally:
                child.kill()
                child.wait()


class LanguageModelWorkloadTest(unittest.TestCase):
    """--workload lm in geo_vs_lan and noniid: the jobs run the example's
    programs, one worker a site, an evaluator per site, the genre split
    through the programs' --split; validated on a stand-in weights file
    (the real one needs PyTorch; `meridian validate` reads only the
    tensors' names, shapes and data)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        header = json.dumps({"w": {"dtype": "F32", "shape": [2],
                                   "data_offsets": [0, 8]}}).encode()
        weights = os.path.join(self.tmp.name, "initial.safetensors")
        with open(weights, "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header + bytes(8))
        workloads = scenario("scenariolib.workloads")
        lm = workloads.get("lm")
        self.lm = lm._replace(model=lm.model.replace(workloads.WEIGHTS,
                                                      weights))

    def tearDown(self):
        self.tmp.cleanup()

    def validate(self, name, text):
        return validate_job(self, self.tmp.name, name, text)

    def test_geo_vs_lan_jobs_run_the_programs(self):
        geo = scenario("geo_vs_lan")
        setup = geo.Setup(workload=self.lm, budget=420)
        self.assertEqual((setup.per_site, setup.workers), (1, 3))
        configs = geo.variant_configs(setup)
        for name in ("lan", "lan-bsp", "bsp-over-wan", "gaia-compressed",
                     "diloco-stream"):
            text = configs[name]
            self.assertIn("train.py", text)
            self.assertIn('evaluate.py", "--split", "iid"', text)
            self.assertIn("eval_period_s: 10", text)
            self.assertNotIn("optimizer", text)  # AdamW is the worker's
            out = self.validate(name, text)
            self.assertIn("3 workers", out)
        self.assertIn("count: 3", configs["lan"])
        self.assertEqual(configs["gaia-compressed"].count("count: 1"), 3)
        # Issue 36's goals, not the MLP's.
        lan = {"time_to_55.0_s": 300.0, "final_perplexity": 55.0}
        gaia = {"time_to_55.0_s": 350.0, "wan_bytes_to_55.0": 1e8,
                "final_perplexity": 56.0}
        bsp = {"time_to_55.0_s": 3000.0, "wan_bytes_to_55.0": 1.1e10}
        goals = {g.goal: g for g in geo.evaluate_goals(setup, {
            "lan": lan, "gaia-compressed": gaia, "bsp-over-wan": bsp})}
        time_goal = goals["gaia-compressed: time to 55.0 vs LAN"]
        self.assertEqual((time_goal.wanted, time_goal.met), ("≤ 1.20×", True))
        bytes_goal = goals[
            "gaia-compressed: fewer WAN bytes to 55.0 than BSP over WAN"]
        self.assertEqual((bytes_goal.wanted, bytes_goal.met), ("≥ 100×", True))
        final = goals["gaia-compressed: final perplexity vs LAN"]
        self.assertFalse(final.met)  # 1.8% higher: more than 1%

    def test_noniid_skews_by_the_programs_split(self):
        noniid = scenario("noniid")
        self.assertEqual(list(noniid.skews_of(self.lm)), ["iid", "genre"])
        setup = noniid.Setup(workload=self.lm, budget=420)
        algos = noniid.algorithms(1, self.lm)
        self.assertIn("travel_period: 5", algos["skewscout"])
        for name in ("one-ps", "gaia-0.05", "skewscout"):
            text = noniid.job_text(setup, name, "genre", algos[name])
            self.assertEqual(text.count('"--split", "genre"'), 4, text)
            self.assertNotIn("site_partition", text)
            self.validate(name, text)
        with self.assertRaises(ValueError):
            noniid.job_text(setup, "x", "disjoint", algos["dense"])
        # Perplexity: percent above one parameter server; accuracy: points
        # below.
        self.assertAlmostEqual(noniid.shortfall(self.lm, 50.0, 51.5), 3.0)
        mlp = scenario("scenariolib.workloads").get("mlp")
        self.assertAlmostEqual(noniid.shortfall(mlp, 0.87, 0.86), 1.0)
        self.assertEqual(noniid.shortfall_unit(self.lm), ("%", 3.0))


class SweepTest(unittest.TestCase):
    """bench/scenarios/sweep: every method the same number of trials (its
    documented setting first, the same draw for the same seed); the best
    trial is the fastest to the target, ties within an evaluation period
    broken by fewer bytes; --summarize-only picks the best from the trials
    in OUTDIR and computes the goals from the best settings' medians;
    --dry-run validates every trial."""

    @staticmethod
    def report(t_target, final, wan_mb):
        """A run that reaches 0.87 at `t_target` (None: never) and sends
        `wan_mb` MB evenly over 100 s."""
        timeline = [{"t_s": 10.0, "accuracy": 0.5}]
        if t_target is not None:
            timeline.append({"t_s": t_target, "accuracy": 0.871})
        timeline.append({"t_s": 100.0, "accuracy": final})
        return {"final_accuracy": final, "wan_bytes_total": wan_mb * 1e6,
                "sites": [{"timeline": timeline, "training_s": 100}]}

    @staticmethod
    def write_run(out, label, report, wan_mb):
        run_dir = os.path.join(out, "runs", label)
        os.makedirs(run_dir)
        with open(os.path.join(run_dir, "report.json"), "w") as f:
            json.dump(report, f)
        with open(os.path.join(run_dir, "traffic.csv"), "w") as f:
            f.write("t_s,link,from_site,bytes,messages\n")
            for t in (0, 100):
                f.write(f"{t},us-eu,us,{wan_mb * 1e6 * t / 100},1\n")

    def test_settings_and_the_best_trial(self):
        sweep = scenario("sweep")
        gaia = sweep.METHODS["gaia"]
        first = gaia.settings(4, seed=1)
        self.assertEqual(len(first), 4)
        self.assertEqual(first[0], {"theta": 0.05,
                                    "schedule": "THRESHOLD_CONSTANT",
                                    "inner_lr": 1.0,
                                    "server_momentum": 0.0})
        self.assertEqual(first, gaia.settings(4, seed=1))
        self.assertNotEqual(first, gaia.settings(4, seed=2))
        self.assertEqual(len({json.dumps(k, sort_keys=True)
                              for k in gaia.settings(200, 1)}), 90)  # grid
        s = scenario("geo_vs_lan").Setup(budget=90)
        rows = [{"time_to_target_s": 20.0, "wan_bytes_to_0.87": 5e6},
                {"time_to_target_s": 21.5, "wan_bytes_to_0.87": 1e6},
                {"time_to_target_s": 30.0, "wan_bytes_to_0.87": 1e5},
                {"time_to_target_s": None, "wan_bytes_to_0.87": None,
                 "final_accuracy": 0.86}]
        # Within one evaluation period (2 s) of the fastest: fewer bytes.
        self.assertIs(sweep.best_trial(s, rows), rows[1])
        missed = [{"time_to_target_s": None, "final_accuracy": a}
                  for a in (0.84, 0.86)]
        self.assertIs(sweep.best_trial(s, missed), missed[1])
        lm = scenario("scenariolib.workloads").get("lm")
        self.assertEqual(sweep.with_inner_lr(lm, 0.5).worker_command[-2:],
                         ("--lr", "0.001"))
        self.assertEqual(sweep.setting_text(first[0]),
                         "θ 0.05, schedule constant, inner lr x1, "
                         "server momentum 0")
        mlp = scenario("scenariolib.workloads").get("mlp")
        self.assertIn("momentum: 0.9",
                      sweep.with_server_momentum(mlp, 0.9).server)
        self.assertIs(sweep.with_server_momentum(mlp, 0), mlp)

    def test_summarize_only_picks_the_best_and_checks_the_goals(self):
        # gaia trial 2 is best; diloco trial 1; every best run repeats.
        trials = {"gaia": [(40, 0.88, 20), (30, 0.88, 4)],
                  "diloco": [(35, 0.88, 10), (None, 0.85, 2)]}
        best = {"gaia": (31, 0.88, 4), "diloco": (36, 0.88, 10)}
        with tempfile.TemporaryDirectory() as out:
            for method, rows in trials.items():
                for i, (t, final, mb) in enumerate(rows, 1):
                    self.write_run(out, f"{method}-t{i}",
                                   self.report(t, final, mb), mb)
                for r in (1, 2, 3):
                    t, final, mb = best[method]
                    self.write_run(out, f"{method}-best-r{r}",
                                   self.report(t, final, mb), mb)
            proc = run_script("sweep", out, "--methods", "gaia,diloco",
                              "--trials", "2", "--summarize-only",
                              "--no-publish")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertNotIn("running", proc.stdout)
            with open(os.path.join(out, "results.json")) as f:
                data = json.load(f)
            by_name = {m["method"]: m for m in data["methods"]}
            self.assertEqual(by_name["gaia"]["best_setting"],
                             scenario("sweep").METHODS["gaia"].settings(
                                 2, 1)[1])
            self.assertEqual(by_name["diloco"]["best_setting"]["H"], 160)
            goals = {g["goal"]: g for g in data["goals"]}
            self.assertTrue(goals["gaia: time to 0.87 vs diloco's best"][
                "met"])  # 31 s against 36 s
            self.assertTrue(goals["gaia: WAN bytes to 0.87 vs diloco's "
                                  "best"]["met"])  # 1.24 MB against 3.6 MB

    def test_dry_run_validates_every_trial(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("sweep", out, "--trials", "2", "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            self.assertEqual(len(os.listdir(os.path.join(out, "configs"))),
                             2 * len(scenario("sweep").METHODS))


class PytorchMlpTest(unittest.TestCase):
    def test_dry_run_exports_the_weights_and_validates_both_jobs(self):
        with tempfile.TemporaryDirectory() as out:
            proc = run_script("pytorch_mlp", out, "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stdout)
            for job in ("builtin", "pytorch"):
                self.assertIn("[pytorch_mlp] %s: " % job, proc.stdout)
            self.assertEqual(proc.stdout.count(
                "OK (3 sites, 12 workers, ASYNC)"), 2, proc.stdout)
            # The PyTorch job starts from the built-in model's values, as
            # tensors of the built-in names and shapes.
            self.assertIn("fc0.weight[256,784] fc0.bias[256] "
                          "fc1.weight[10,256] fc1.bias[10]", proc.stdout)
            with open(os.path.join(out, "configs", "pytorch.pbtxt")) as f:
                job = f.read()
            self.assertIn("kind: EXTERNAL", job)
            self.assertIn("train.py", job)
            self.assertIn("evaluate.py", job)


class WorkloadSpeedTest(unittest.TestCase):
    DOC = {
        "context": {"meridian_kernels": "avx512"},
        "benchmarks": [
            {"name": "ModelStep/lenet5/batch:16/real_time",
             "run_type": "iteration", "iterations": 10,
             "real_time": 2.0, "cpu_time": 1.9, "time_unit": "ms",
             "items_per_second": 8000.0},
            {"name": "ModelStep/vgg-small/batch:16/real_time",
             "run_type": "iteration", "error_occurred": True,
             "error_message": "model refused"},
        ],
    }

    def test_reads_the_rate_and_the_kernels(self):
        module = scenario("workload_speed")
        cell = module.parse_benchmark_json(json.dumps(self.DOC), "lenet5", 16)
        self.assertEqual(cell["samples_per_s"], 8000.0)
        self.assertEqual(cell["wall_samples_per_s"], 8000.0)
        self.assertEqual(cell["kernels"], "avx512")
        self.assertIsNone(module.parse_benchmark_json(
            json.dumps(self.DOC), "lenet5", 64))

    def test_a_failed_benchmark_is_an_error_naming_it(self):
        module = scenario("workload_speed")
        with self.assertRaisesRegex(ValueError, "vgg-small.*model refused"):
            module.parse_benchmark_json(json.dumps(self.DOC), "vgg-small", 16)
        with self.assertRaisesRegex(ValueError, "not JSON"):
            module.parse_benchmark_json("{", "lenet5", 16)


def main():
    global MERIDIAN, SOURCE
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meridian", required=True)
    parser.add_argument("--source", required=True)
    args, rest = parser.parse_known_args()
    MERIDIAN, SOURCE = os.path.abspath(args.meridian), args.source
    sys.path.insert(0, os.path.join(SOURCE, "bench", "scenarios"))
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
