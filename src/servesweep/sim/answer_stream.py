"""A request's answer text, prepared before its stream: the pieces of sim/replies.py as one byte string with
offsets (text.WordTable's layout), so the per-chunk path keeps slicing bytes and computes nothing per chunk.

The engine fixes how many tokens a request will generate when it is submitted (max_new_tokens, or its EOS draw);
that many pieces are built then: the reasoning's share first (a thinking model's `reasoning_content`), then the
answer. Answer faults (faults.ANSWER_KINDS) come from the request's `X-Sim-Fault` or the server's
`--sim-answer-fault`; they change the text only, so the stream keeps its fast path.
"""

from __future__ import annotations

import weakref
from array import array
from itertools import accumulate

from .faults import ANSWER_KINDS, Fault
from .replies import answer_words, thinking_words
from .text import WordTable

# At most this many pieces are built per request (≈ 0.3 µs each); a longer generation cycles through them.
MAX_PIECES = 32768
# Each tokenizer's decoded single tokens (id -> decode([id])), at most this many; the answers' grammar uses a few
# thousand ids, the prompts' needle words add a few more.
PIECE_CACHE_MAX = 1 << 16
_piece_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def split_fault(fault: Fault | None, server_answer_fault: Fault | None) -> tuple[Fault | None, Fault | None]:
    """(the stream fault, the answer fault) of a request: an answer fault of its own replaces the server's."""
    if fault is not None and fault.kind in ANSWER_KINDS:
        return None, fault
    return fault, server_answer_fault


def prompt_text(kind: str, body: dict) -> str:
    """The text the needle is looked for in: a chat's message contents, a completion's prompt string."""
    if kind == "chat":
        parts = []
        for m in body.get("messages") or ():
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(p["text"] for p in c if isinstance(p, dict) and isinstance(p.get("text"), str))
        return "\n".join(parts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else ""


def answer_table(
    prompt: str,
    total: int,
    reasoning: int,
    *,
    seed: int,
    fault: Fault | None,
    prompt_tokens: int,
    speculative: bool,
    tokenizer=None,
) -> WordTable:
    """The request's text as a WordTable: `reasoning` pieces of thinking, then the answer, `total` pieces in all
    (at least 1, at most MAX_PIECES), the byte string doubled so a window that wraps is still one slice.

    With the serving `tokenizer`, each piece is one of its tokens ("passage," is two), so a client that
    re-tokenizes the streamed text counts what `usage.completion_tokens` says, as with SGLang."""
    total = max(1, min(total, MAX_PIECES))
    reasoning = min(reasoning, total)
    pieces = _tokens(thinking_words(prompt, reasoning, seed=seed, fault=fault), tokenizer) if reasoning else []
    answer = answer_words(
        prompt,
        total - reasoning,
        seed=seed,
        fault=fault,
        prompt_tokens=prompt_tokens,
        speculative=speculative,
    )
    pieces = (pieces + _tokens(answer, tokenizer))[:total]
    data = "".join(pieces).encode()
    # pieces are ASCII: characters are bytes
    offsets = array("q", accumulate(map(len, pieces * 2), initial=0))
    return WordTable(ids=(), words=tuple(pieces), blob=data + data, offsets=offsets, n=len(pieces))


def _tokens(words: list[str], tokenizer) -> list[str]:
    """`words` re-cut at the tokenizer's token boundaries (each piece is at least one token, so there are at least
    as many tokens as words); without a tokenizer, the words as they are.

    Piece k is `tokenizer.decode([ids[k]])`, each distinct id decoded once per tokenizer (a bounded cache): one
    encode per request instead of one decode per token as well (tests/sim/test_answer_stream.py compares)."""
    if tokenizer is None or not words:
        return words
    ids = tokenizer.encode("".join(words))
    try:
        cache = _piece_caches.setdefault(tokenizer, {})
    except TypeError:  # no weak reference to it: each distinct id decoded once for this request
        cache = {}
    try:
        return list(map(cache.__getitem__, ids))
    except KeyError:
        pass
    new = set(ids).difference(cache)
    if len(cache) + len(new) > PIECE_CACHE_MAX:  # full: start again with this request's ids
        cache.clear()
        new = set(ids)
    decode = tokenizer.decode
    for i in new:
        cache[i] = decode([i])
    return list(map(cache.__getitem__, ids))


def greedy_eos_seed(body: dict, ids) -> int | None:
    """A greedy request's (temperature 0) seed for its EOS draw, from its prompt's tokens: the same prompt gets
    the same answer length on every server (the speculative bundle's answers compare with the autoregressive
    one's); None for sampled requests, which draw from the engine's generator."""
    sp = body.get("sampling_params")
    if not isinstance(sp, dict):
        sp = body
    if sp.get("temperature") != 0:
        return None
    return hash((len(ids), tuple(ids[-256:])))  # a tuple of ints hashes the same in every process
