"""The chaos scenario (bench/scenarios/chaos): the three-region job run
fault-free and then with faults injected on a schedule.

  main       the flags, the rounds (a fault-free and a chaos run each), the
             results written and published
  job        the job: deploy/configs/three-regions.pbtxt with the
             scenario's changes; its sites
  schedule   what to inject when (seeded), and the faults' names
  run        one run of `meridian run`: launched, sampled, waited for,
             saved and loaded back (--reanalyse), stopped on Ctrl-C
  inject     the faults injected into a run, and a schedule carried out
  sampler    each site server's metrics and the run's processes, sampled
             once a second; commit counts as series
  processes  the run's processes and listening ports, from /proc
  wan        `meridian wanem ctl` and the links' bandwidth
  analyse    per fault: detection, recovery and the training time lost;
             the partition's commit rates against the fault-free run
  checks     conservation and cleanup: each run's summary, the replicas'
             difference, processes and ports left behind
  report     one round's tables and goals (OUTDIR/results.md, .json)
  summary    --repeat N: the rounds' medians with their ranges
  slow_phase the slow-link phase after the rounds: the shipped job with
             link us-ap slowed to each rate (bench/scenarios/slow_link)

Every message is prefixed "[chaos]", "[chaos r2/3]" during round 2 of 3.
"""

from scenariolib import runner

_round = ""  # " r2/3" while round 2 of 3 runs (--repeat)


def log(message: str) -> None:
    """Prints "[chaos] MESSAGE" ("[chaos r2/3] ..." in round 2 of 3)."""
    runner.log("chaos" + _round, message)


def set_round(k: int, rounds: int) -> None:
    """Round `k` of `rounds` runs now (the log prefix names it when there
    is more than one); k = 0: between rounds."""
    global _round
    _round = f" r{k}/{rounds}" if rounds > 1 and k else ""
