"""What train_plain.py, train.py and evaluate.py share: the options, the
tokenizer, texts as windows of tokens, and the evaluation.

A window is context + 1 consecutive tokens (the model reads the first
context and predicts the last context); a text's windows overlap by one
token, so every token but a text's first is predicted once. Texts are
tokenized one by one (a window never spans two texts).
"""

import argparse
import hashlib
import math
import os
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

import brown
from model import Config
from tokenizer import Tokenizer

TOKENIZER_VERSION = 1  # bump when tokenizer.py learns differently
EVAL_BATCH = 32


def options(description: str, argv: Optional[Sequence[str]] = None):
    """The example's command line; every script takes all of it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="", type=Config.parse,
                        help="model fields to change, e.g. width=256,layers=6 "
                        "(default %s)" % (Config(),))
    parser.add_argument("--split", default="iid", choices=("iid", "genre"),
                        help="how the training texts are dealt to sites")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100,
                        help="steps of linear learning-rate warm-up")
    parser.add_argument("--eval-windows", type=int, default=256,
                        help="validation windows an evaluation reads")
    parser.add_argument("--sample-windows", type=int, default=64,
                        help="windows of a site's training sample")
    parser.add_argument("--write-weights", action="store_true",
                        help="write initial.safetensors and exit")
    parser.add_argument("--minutes", type=float, default=5.0,
                        help="train_plain.py: training time")
    parser.add_argument("--steps", type=int, default=0,
                        help="train_plain.py: stop after this many steps")
    parser.add_argument("--report-every", type=int, default=200,
                        help="train_plain.py: steps between evaluations")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def tokenizer(texts: Dict[str, str], vocab_size: int) -> Tokenizer:
    """The BPE of vocab_size tokens learnt from the corpus's training texts
    (every site's: brown.training_texts), read from the user's cache
    (~/.cache/meridian/tokenizers) when an earlier process learnt it, else
    learnt (a few seconds) and cached there."""
    names = brown.training_texts(list(texts))
    digest = hashlib.sha256(("%d %d %s" % (TOKENIZER_VERSION, vocab_size,
                                           " ".join(names))).encode()
                            ).hexdigest()[:16]
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or
                         os.path.expanduser("~/.cache"), "meridian",
                         "tokenizers", "bpe-%d-%s.json" % (vocab_size, digest))
    if os.path.exists(cache):
        return Tokenizer.load(cache)
    learnt = Tokenizer.train([texts[name] for name in names], vocab_size)
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        learnt.save(cache)
    except OSError:
        pass  # a read-only home: learn it again next time
    return learnt


def windows(texts: Sequence[str], tok: Tokenizer, context: int
            ) -> torch.Tensor:
    """Every text's windows of context + 1 tokens, [n, context + 1] int64
    (a text's tail shorter than a window is dropped)."""
    out = []
    for text in texts:
        ids = torch.tensor(tok.encode(text), dtype=torch.int64)
        if len(ids) > context:
            out.append(ids.unfold(0, context + 1, context))
    return torch.cat(out)


def spread(rows: torch.Tensor, count: int) -> torch.Tensor:
    """`count` rows evenly spaced over `rows` (all when it has fewer): a
    fixed sample that covers every text."""
    if count <= 0 or count >= len(rows):
        return rows
    return rows[torch.linspace(0, len(rows) - 1, count).round().long()]


def evaluate(model, rows: torch.Tensor) -> Dict[str, float]:
    """Mean next-token loss (nats) over the windows and its perplexity."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in rows.split(EVAL_BATCH):
            logits = model(batch[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                     batch[:, 1:].reshape(-1),
                                     reduction="sum").item()
            tokens += batch[:, 1:].numel()
    loss = total / tokens
    return {"perplexity": math.exp(loss), "loss": loss}


def warmup(optimizer, steps: int):
    """Linear warm-up of the learning rate over `steps` steps, then
    constant (a run ends at a time budget, not a step count)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, steps)))


def load_corpus() -> Dict[str, str]:
    """brown.load(), or exit saying why the corpus is missing and what to
    run (brown.CorpusMissing) instead of a traceback."""
    try:
        return brown.load()
    except brown.CorpusMissing as error:
        raise SystemExit("language_model: %s" % error) from None


def texts_of(texts: Dict[str, str], names: Sequence[str]) -> list:
    return [texts[name] for name in names]


def place():
    """(site index, sites, worker index, workers) of this program in its
    job: the MERIDIAN_* variables `meridian run` sets, else what the job
    file ($MERIDIAN_JOB) and the site's name give."""
    import meridian
    from meridian.environment import site_index

    env = meridian.environment()
    job = meridian.load_job(env.job) if env.job else None
    if env.site_index is not None:
        site = env.site_index
    elif job is not None and env.site:
        site = site_index(job, env.site)
    else:
        raise SystemExit("language_model: set MERIDIAN_SITE_INDEX, or "
                         "MERIDIAN_JOB and MERIDIAN_SITE")
    sites = env.site_count or (len(job.site) if job is not None else 1)
    workers = env.worker_count or (
        sum(group.count for group in job.site[site].workers)
        if job is not None else 1)
    return site, sites, env.worker_index or 0, workers
