"""The flags the scenarios share, and parsing them.

  parser            an ArgumentParser described by the scenario's docstring
  add_binary        --binary PATH (default build/bin/meridian)
  add_dry_run       --dry-run: write and validate the jobs, run nothing
  add_summarize_only
                    --summarize-only: rebuild the tables from OUTDIR's runs
  add_publishing    --publish / --no-publish / --results-dir (publish.py)
  parse             the arguments, with the run's provenance captured
"""

import argparse
import sys
from typing import Optional, Sequence

from scenariolib import publish, runner
from scenariolib.provenance import Provenance


def parser(doc: str, *, whole_doc: bool = False) -> argparse.ArgumentParser:
    """A parser whose description is the first line of `doc` (the whole
    `doc`, as written, with `whole_doc`)."""
    if whole_doc:
        return argparse.ArgumentParser(
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.split("\n")[0])


def add_binary(parser: argparse.ArgumentParser,
               default: str = runner.DEFAULT_MERIDIAN,
               text: Optional[str] = None) -> None:
    """--binary PATH: the meridian binary (or another the scenario runs);
    `text`: its help."""
    parser.add_argument("--binary", default=default, help=text)


def add_dry_run(parser: argparse.ArgumentParser,
                text: str = "write and validate the configs, run nothing"
                ) -> None:
    """--dry-run: builds nothing and trains nothing; `text`: its help."""
    parser.add_argument("--dry-run", action="store_true", help=text)


def add_summarize_only(parser: argparse.ArgumentParser,
                       note: str = "") -> None:
    """--summarize-only: the tables again from the runs in OUTDIR."""
    parser.add_argument(
        "--summarize-only", action="store_true",
        help="run nothing: rebuild results.md and results.json from the runs "
             "already in OUTDIR" + note)


def add_publishing(parser: argparse.ArgumentParser,
                   selections: str = "") -> None:
    """--publish, --no-publish, --results-dir (see publish.py)."""
    publish.add_arguments(parser, selections)


def parse(parser: argparse.ArgumentParser,
          argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The parsed arguments; `provenance` added: the command line, commit,
    date and machine of this run, for publishing."""
    args = parser.parse_args(argv)
    args.provenance = Provenance.capture(
        None if argv is None else [sys.argv[0], *argv])
    return args
