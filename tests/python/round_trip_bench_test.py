#!/usr/bin/python3
"""bench/python/round_trip.py without a server: the generated block goes
after the first heading line and replaces itself, keeping every other
line; the table's medians, ranges and ratios; the MLP sizes are what they
say. Quick tier. (The slow tier smoke-runs the benchmark itself:
python_round_trip_smoke.)"""

import os
import sys
import unittest

import live_site

UNITTEST_ARGV = live_site.parse_args()
sys.path.insert(0, os.path.join(live_site.ARGS.source, "bench", "python"))

import round_trip  # noqa: E402


class RoundTripScriptTest(unittest.TestCase):

    def setUp(self):
        self.dir = live_site.make_temp_dir("round-trip")
        self.addCleanup(live_site.remove_dir, self.dir)
        self.path = os.path.join(self.dir, "results.md")

    def read(self):
        with open(self.path) as f:
            return f.read()

    def test_the_block_goes_after_the_heading_and_replaces_itself(self):
        with open(self.path, "w") as f:
            f.write("# Title\n\nProse that stays.\n\n## Later\nmore\n")
        round_trip.write_block(self.path, "first\ntable")
        self.assertEqual(self.read(), "# Title\n\n" + round_trip.BEGIN +
                         "\nfirst\ntable\n" + round_trip.END +
                         "\n\nProse that stays.\n\n## Later\nmore\n")
        round_trip.write_block(self.path, "second")
        self.assertEqual(self.read(), "# Title\n\n" + round_trip.BEGIN +
                         "\nsecond\n" + round_trip.END +
                         "\n\nProse that stays.\n\n## Later\nmore\n")

    def test_the_table(self):
        runs = [{"cpp": c, "python": p, "python_load": p + 0.01,
                 "cpp_commits": 50, "python_commits": 20}
                for c, p in ((0.100, 0.090), (0.080, 0.120), (0.090, 0.099))]
        text = round_trip.table({"10M": runs}, "cmd", 1, 0.5)
        row = [line for line in text.splitlines()
               if line.startswith("| MLP 10M")][0]
        self.assertEqual(
            row, "| MLP 10M (10,063,170) | 3 | 90.0 (80.0–100.0) | "
            "99.0 (90.0–120.0) | 1.10 (0.90–1.50) | 109.0 (100.0–130.0) |")
        self.assertIn("<= 1.5 at 10M: 1.10, met.", text)

    def test_sizes(self):
        self.assertEqual({size: round_trip.parameters(hidden)
                          for size, hidden in round_trip.SIZES.items()},
                         {"1M": 993760, "10M": 10063170, "50M": 49792510})


if __name__ == "__main__":
    unittest.main(argv=UNITTEST_ARGV, verbosity=2)
