"""Plausible output text, one word per emitted token, prepared once so the per-chunk path only slices bytes.

Each word (with its leading space) is a single token of the serving tokenizer, so a client that re-tokenizes the
streamed text counts about as many tokens as `usage.completion_tokens`. The words need no JSON escaping, so their
bytes go straight into the pre-built SSE chunk.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an they you
were her she there one all we their has been would will more if can when what so no said who about its into
them time only new some could these two may then first any my now such like our over man me even most made after
also did many before must through back years where much your way well down should because each just those people
how too little state good very make world still own see men work long get here between both life being under never
day same another know while last might us great old year off come since against go came right used take three
states himself few house use during without again place around however home small found thought went say part once
general high upon school every does got united left number course war until always away something fact though water
less public put think almost hand enough far took head yet government system better set told nothing night end why
called didn find look asked later point knew city next program business give group toward young days let room
president side social given present several order national possible rather second face per among form important
often things looked early white case john become large big need four within felt along children saw best church
ever least power development light thing seemed family interest want members mind country area others done turned
although open problem sense service certain kind began law door model data value model system result process
language token memory cache request server answer question reason example simple clear short long
""".split()


@dataclass(frozen=True, slots=True)
class WordTable:
    """Words that are one token each: their ids, and one long byte string with word offsets for O(1) slicing."""

    ids: tuple[int, ...]
    words: tuple[str, ...]
    blob: bytes  # the cycle of words, repeated so any window of `span` words is one slice
    offsets: Sequence[int]  # a tuple or an array("q"); offsets[i] = start of word i in blob (len = 2*n + 1)
    n: int

    def text_bytes(self, start: int, count: int) -> bytes:
        """UTF-8 (and JSON-safe) bytes of `count` words starting at word `start` (mod n); count ≤ n."""
        s = start % self.n
        return self.blob[self.offsets[s] : self.offsets[s + count]]

    def text(self, start: int, count: int) -> str:
        out = []
        while count > 0:
            k = min(count, self.n)
            out.append(self.text_bytes(start, k).decode())
            start += k
            count -= k
        return "".join(out)

    def token_ids(self, start: int, count: int) -> list[int]:
        n = self.n
        return [self.ids[(start + i) % n] for i in range(count)]


def build_word_table(tokenizer, seed: int = 0, size: int = 256) -> WordTable:
    """Keep the words that encode to exactly one token (with a leading space), shuffled by `seed`."""
    seen: set[str] = set()
    pairs: list[tuple[str, int]] = []
    for w in _WORDS:
        if w in seen:
            continue
        seen.add(w)
        ids = tokenizer.encode(" " + w)
        if len(ids) == 1:
            pairs.append((" " + w, ids[0]))
    if len(pairs) < 16:
        raise RuntimeError(f"tokenizer {getattr(tokenizer, 'name', tokenizer)!r}: too few single-token words")
    rng = random.Random(seed)
    # a few hundred words drawn with repetition, like text, so sentences do not visibly cycle
    seq = [pairs[rng.randrange(len(pairs))] for _ in range(size)]
    words = tuple(w for w, _ in seq)
    ids = tuple(i for _, i in seq)
    enc = [w.encode() for w in words] * 2
    offsets = [0]
    for b in enc:
        offsets.append(offsets[-1] + len(b))
    return WordTable(ids=ids, words=words, blob=b"".join(enc), offsets=tuple(offsets), n=len(words))
