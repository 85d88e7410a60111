"""A byte-level BPE tokenizer built deterministically from the training
texts.

Tokens 0..255 are the bytes, so every text round-trips exactly (no unknown
token); each further token is a merge of two earlier ones, learnt as in
GPT-2 (Sennrich et al. 2016; Radford et al. 2019): the text is cut into
pieces (a word with the space before it, or one whitespace character),
and the most frequent adjacent pair of tokens inside pieces is merged,
again and again, until the vocabulary has its size. Ties go to the
smallest pair of token ids, so the same texts give the same merges on
every machine and Python version.

Why BPE rather than bytes: on a budget of a few million tokens a token of
about three characters lets a 128-token context hold about 70 words
instead of 25, for an output layer of 1,024 rows that costs little next to
the transformer's blocks.
"""

import heapq
import json
import os
import re
import tempfile
from collections import Counter, defaultdict
from typing import Dict, Iterable, List, Sequence, Tuple

PIECE = re.compile(r" ?\S+|\s")  # a word with its leading space, or one blank

Pair = Tuple[int, int]


class Tokenizer:
    """Byte-level BPE: `merges[i]` is the pair of token ids that token
    256 + i stands for."""

    def __init__(self, merges: Sequence[Pair]):
        self.merges: List[Pair] = [tuple(pair) for pair in merges]
        self._rank: Dict[Pair, int] = {}
        self._bytes: List[bytes] = [bytes([b]) for b in range(256)]
        for i, (left, right) in enumerate(self.merges):
            if not (0 <= left < 256 + i and 0 <= right < 256 + i):
                raise ValueError("merge %d (%d, %d) names a token not yet "
                                 "defined" % (i, left, right))
            self._rank[(left, right)] = i
            self._bytes.append(self._bytes[left] + self._bytes[right])
        self._cache: Dict[str, List[int]] = {}

    @property
    def vocab_size(self) -> int:
        return 256 + len(self.merges)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "Tokenizer":
        """Learns vocab_size - 256 merges from the texts (fewer when every
        piece of the texts is one token before that)."""
        if vocab_size < 256:
            raise ValueError("vocab_size %d < 256 (the bytes)" % vocab_size)
        counts = Counter(piece for text in texts
                         for piece in PIECE.findall(text))
        words = [list(piece.encode()) for piece in sorted(counts)]
        freq = [counts[piece] for piece in sorted(counts)]
        pairs: Dict[Pair, int] = defaultdict(int)
        where: Dict[Pair, set] = defaultdict(set)  # pair -> words holding it
        for w, word in enumerate(words):
            for pair in zip(word, word[1:]):
                pairs[pair] += freq[w]
                where[pair].add(w)
        heap = [(-count, pair) for pair, count in pairs.items()]
        heapq.heapify(heap)
        merges: List[Pair] = []
        while len(merges) < vocab_size - 256 and heap:
            count, pair = heapq.heappop(heap)
            if -count != pairs.get(pair, 0) or count == 0:
                continue  # stale entry: the pair's count changed since
            token = 256 + len(merges)
            merges.append(pair)
            changed = set()
            for w in sorted(where.pop(pair)):
                word = words[w]
                for old in zip(word, word[1:]):
                    pairs[old] -= freq[w]
                    changed.add(old)
                words[w] = word = _merge(word, pair, token)
                for new in zip(word, word[1:]):
                    pairs[new] += freq[w]
                    where[new].add(w)
                    changed.add(new)
            pairs.pop(pair, None)
            for other in changed:
                if pairs.get(other, 0) > 0:
                    heapq.heappush(heap, (-pairs[other], other))
        return cls(merges)

    def _encode_piece(self, piece: str) -> List[int]:
        ids = self._cache.get(piece)
        if ids is None:
            ids = list(piece.encode())
            while len(ids) > 1:  # apply the earliest-learnt merge first
                ranked = [(self._rank.get(pair, len(self._rank)), i)
                          for i, pair in enumerate(zip(ids, ids[1:]))]
                rank, _ = min(ranked)
                if rank == len(self._rank):
                    break
                ids = _merge(ids, self.merges[rank], 256 + rank)
            self._cache[piece] = ids
        return ids

    def encode(self, text: str) -> List[int]:
        out: List[int] = []
        for piece in PIECE.findall(text):
            out += self._encode_piece(piece)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self._bytes[i] for i in ids).decode(errors="replace")

    def save(self, path: str) -> None:
        """Writes the merges as JSON, atomically (processes that build the
        same tokenizer at once each write the same file)."""
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tokenizer-")
        with os.fdopen(fd, "w") as f:
            json.dump({"kind": "byte-bpe", "merges": self.merges}, f)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> "Tokenizer":
        with open(path) as f:
            data = json.load(f)
        if data.get("kind") != "byte-bpe":
            raise ValueError("%s is not a byte-level BPE tokenizer" % path)
        return cls(data["merges"])


def _merge(ids: List[int], pair: Pair, token: int) -> List[int]:
    """`ids` with every non-overlapping occurrence of `pair`, left to
    right, replaced by `token`."""
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(token)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
