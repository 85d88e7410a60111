"""What the end-to-end scenarios of bench/scenarios share.

Every scenario (geo_vs_lan, heterogeneity, noniid, chaos,
compression_updates, workload_speed, worker_endpoint) is built from these
modules; none keeps a copy of what they do:

  cli         the flags the scenarios share (OUTDIR, --quick, --binary,
              --dry-run, --summarize-only, --publish / --no-publish)
  runner      the binaries (checked; a missing default one built with
              tools/build), `meridian run` of a job into its run directory
              with a timeout, `meridian validate`, dry runs
  jobs        job-file pieces (header, sites, sync blocks) and the shipped
              deploy/configs/*.pbtxt with fields overridden
  workloads   the models a scenario trains (--workload)
  reports     a run's report.json, its timelines, wanem's traffic.csv
  repeats     --repeat N: round-robin order, medians with their ranges
  tables      markdown tables and number formats
  goals       goal checks: wanted / measured / met rows
  results     OUTDIR/results.md and results.json, then publishing them
  publish     the generated block of docs/results/<name>.md
  provenance  the command line, git commit, date and machine of a run

Only the standard library is used. ROOT is the repository this copy of the
scenarios belongs to (build/bin, tools/build and deploy/configs are found
under it).
"""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))


def shown(path: str) -> str:
    """`path` relative to the repository when it is in it (as the commands
    in the docs name it), else absolute."""
    path = os.path.abspath(path)
    return (os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep)
            else path)
