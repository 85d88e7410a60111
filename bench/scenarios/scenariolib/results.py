"""A scenario's results: OUTDIR/results.md and results.json, printed, then
published into docs/results/ (publish.py) when the run calls for it.
"""

import argparse
import dataclasses
import json
import os
from typing import Any, Callable, Optional

from scenariolib import publish, runner, shown


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A scenario as its published results name it: bench/scenarios/NAME,
    and the heading of docs/results/NAME.md when the file is created;
    `file`: another file of docs/results/ than NAME.md (a workload's own:
    the language model's runs go to language_model.md)."""
    name: str
    title: str
    file: Optional[str] = None


def write(outdir: str, text: str, data: Any, *, indent: int = 1,
          default: Optional[Callable[[Any], Any]] = None,
          echo: bool = True) -> None:
    """OUTDIR/results.md (`text`) and OUTDIR/results.json (`data`), and
    `text` printed (unless not `echo`)."""
    with open(os.path.join(outdir, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(data, f, indent=indent, default=default)
    if echo:
        print(text)


def publish_if_wanted(scenario: Scenario, args: argparse.Namespace,
                      text: str, restricted: bool) -> int:
    """Publishes `text` (results.md's) when publish.wanted(args,
    restricted); returns the exit status: 1 when the results file could not
    take it (named), else 0."""
    if not publish.wanted(args, restricted):
        return 0
    try:
        path = publish.publish(scenario.name, scenario.title, text,
                               args.provenance, bool(args.quick),
                               args.results_dir, scenario.file)
    except (publish.PublishError, OSError) as error:
        runner.log(scenario.name, f"not published: {error}")
        return 1
    runner.log(scenario.name, f"published in {shown(path)}")
    return 0
