"""A request's answer text, prepared before its stream: the pieces of sim/answers.py as one byte string with
offsets (text.WordTable's layout), so the per-chunk path keeps slicing bytes and computes nothing per chunk.

The engine fixes how many tokens a request will generate when it is submitted (max_new_tokens, or its EOS draw);
that many pieces are built then: the reasoning's share first (a thinking model's `reasoning_content`), then the
answer. Answer faults (faults.ANSWER_KINDS) come from the request's `X-Sim-Fault` or the server's
`--sim-answer-fault`; they change the text only, so the stream keeps its fast path.
"""

from __future__ import annotations

from array import array

from .answers import answer_words, thinking_words
from .faults import ANSWER_KINDS, Fault
from .text import WordTable

# At most this many pieces are built per request (≈ 0.3 µs each); a longer generation cycles through them.
MAX_PIECES = 32768


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
    offsets = array("q", [0])
    at = 0
    for p in pieces * 2:
        at += len(p)  # pieces are ASCII: characters are bytes
        offsets.append(at)
    return WordTable(ids=(), words=tuple(pieces), blob=data + data, offsets=offsets, n=len(pieces))


def _tokens(words: list[str], tokenizer) -> list[str]:
    """`words` re-cut at the tokenizer's token boundaries (each piece is at least one token, so there are at least
    as many tokens as words); without a tokenizer, the words as they are."""
    if tokenizer is None or not words:
        return words
    return [tokenizer.decode([i]) for i in tokenizer.encode("".join(words))]


def greedy_eos_seed(body: dict, ids) -> int | None:
    """A greedy request's (temperature 0) seed for its EOS draw, from its prompt's tokens: the same prompt gets
    the same answer length on every server (the speculative bundle's answers compare with the autoregressive
    one's); None for sampled requests, which draw from the engine's generator."""
    sp = body.get("sampling_params") if isinstance(body.get("sampling_params"), dict) else body
    if sp.get("temperature") != 0:
        return None
    return hash((len(ids), tuple(ids[-256:])))  # a tuple of ints hashes the same in every process
