"""Job files: the pieces the scenarios write them from, and the shipped
deploy/configs/*.pbtxt with fields overridden.

  header           name, seed, target, stop_at_target false, time budget
  site, sites      site blocks with a worker group of a fixed step time
  gaia_sync, dense_sync, model_averaging
                   the sync blocks the scenarios compare
  FP32, INT8, INT4 their compression blocks
  PLAINTEXT        security { curve: false }: wanem then counts ZMTP
                   messages (under CURVE it sees only encrypted frames), and
                   a restarted site server needs no key exchange
  shipped          the text of deploy/configs/NAME.pbtxt
  set_field        a top-level field set (replaced, or appended)
  prepend_to_block a line added at the start of a top-level block
"""

import os
import re
from typing import Iterable, Optional

from scenariolib import ROOT

CONFIGS_DIR = os.path.join(ROOT, "deploy", "configs")

# The three-region job's sites (deploy/configs/three-regions.pbtxt).
THREE_REGIONS = (("us", "us-east-1"), ("eu", "eu-central-1"),
                 ("ap", "ap-southeast-1"))

FP32 = "compression { value_coding: VALUE_FP32 }"
INT8 = ("compression { value_coding: VALUE_INT8 block_size: 256 "
        "zstd_level: 1 }")
INT4 = ("compression { value_coding: VALUE_INT4 block_size: 256 "
        "zstd_level: 1 }")
PLAINTEXT = "security { curve: false }"


def header(name: str, target_field: str, target: float, budget_s: float,
           seed: int = 1) -> str:
    """The first lines of a scenario's job: it trains for the whole budget
    (stop_at_target false) and records when it reaches `target`
    (`target_field`: target_accuracy, or target_metric for MF)."""
    return (f'name: "{name}"\nseed: {seed}\n{target_field}: {target}\n'
            f"stop_at_target: false\ntime_budget_s: {budget_s}")


def site(name: str, region: Optional[str], workers: int,
         step_time_s: float, server_site: Optional[str] = None,
         command: str = "") -> str:
    """A site block on one line: `workers` workers of `step_time_s` device
    steps (running `command`, a `command: [...]` field, when given); with
    `server_site`, its workers use that site's server."""
    where = f' region: "{region}"' if region else ""
    server = f' server_site: "{server_site}"' if server_site else ""
    program = f" {command}" if command else ""
    return (f'site {{ name: "{name}"{where}{server} workers {{ count: '
            f"{workers} step_time_s: {step_time_s}{program} }} }}")


def sites(regions: Iterable[tuple[str, str]], workers_each: int,
          step_time_s: float, server_site: Optional[str] = None,
          command: str = "") -> str:
    """A site block per (name, region), one a line; with `server_site`,
    every other site's workers use that site's server (one parameter
    server for all)."""
    return "\n".join(
        site(name, region, workers_each, step_time_s,
             server_site if server_site and name != server_site else None,
             command)
        for name, region in regions)


def gaia_sync(theta: float, compression: str = "",
              max_clock_skew: Optional[int] = None,
              schedule: Optional[str] = None, topology: str = "",
              extra: str = "") -> str:
    """Gaia's significance filter, threshold `theta` relative to the
    weights; `extra`: more fields of the sync block (skewscout { })."""
    fields = ["kind: GAIA", f"threshold: {theta:g}",
              "threshold_mode: RELATIVE"]
    if schedule:
        fields.append(f"threshold_schedule: {schedule}")
    if max_clock_skew is not None:
        fields.append(f"max_clock_skew: {max_clock_skew}")
    fields += [part for part in (compression, topology, extra) if part]
    return "sync {\n  " + "\n  ".join(fields) + "\n}"


def dense_sync(max_clock_skew: int) -> str:
    """Every change to every site every clock, fp32."""
    return f"sync {{ kind: DENSE max_clock_skew: {max_clock_skew} {FP32} }}"


def model_averaging(period: int) -> str:
    """The models averaged every `period` clocks (FedAvg)."""
    return f"sync {{ kind: MODEL_AVERAGING averaging_period: {period} }}"


def shipped(name: str) -> str:
    """The text of deploy/configs/NAME.pbtxt."""
    with open(os.path.join(CONFIGS_DIR, name + ".pbtxt")) as f:
        return f.read()


def set_field(text: str, field: str, value: str) -> str:
    """`text` with the top-level `field: value` (its first occurrence at the
    start of a line replaced; appended when there is none). `value` is
    written as given: quote a string ('"three-regions"')."""
    pattern = rf'^{re.escape(field)}:\s*("[^"]*"|\S+)'
    line = f"{field}: {value}"
    if re.search(pattern, text, flags=re.M):
        return re.sub(pattern, lambda _: line, text, count=1, flags=re.M)
    return text + ("" if text.endswith("\n") else "\n") + line + "\n"


def prepend_to_block(text: str, block: str, line: str) -> str:
    """`text` with `line` added first in the top-level block `block { }`;
    ValueError when there is no such block."""
    pattern = rf"^({re.escape(block)}\s*\{{)"
    if not re.search(pattern, text, flags=re.M):
        raise ValueError(f"no {block} {{ }} block")
    return re.sub(pattern, lambda m: m.group(1) + "\n  " + line, text,
                  count=1, flags=re.M)
