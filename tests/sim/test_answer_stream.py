"""answer_stream.answer_table: the cached re-cut (`_tokens`, one encode per request, each distinct id decoded once per
tokenizer) gives exactly the table of the implementation it replaced (one `decode([id])` per token, kept here as the
reference), for many prompts, seeds, lengths, reasoning shares, faults and three kinds of tokenizer; and the answer
re-tokenizes to as many tokens as it has pieces (what `usage.completion_tokens` says)."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

import pytest
from support import byte_level_bpe, metaspace_tokenizer

import servesweep.sim.answer_stream as answer_stream
from servesweep.sim.answer_stream import MAX_PIECES, answer_table
from servesweep.sim.replies import answer_words, parse_answer_fault, thinking_words
from servesweep.sim.text import WordTable
from servesweep.workload.prompts import build_pool
from servesweep.workload.tokenizer import HFTokenizer, load_tokenizer

# ------------------------------------------------------------------ the reference: answer_table before the cache


def _tokens_reference(words: list[str], tokenizer) -> list[str]:
    if tokenizer is None or not words:
        return words
    return [tokenizer.decode([i]) for i in tokenizer.encode("".join(words))]


def answer_table_reference(
    prompt, total, reasoning, *, seed, fault, prompt_tokens, speculative, tokenizer=None
) -> WordTable:
    total = max(1, min(total, MAX_PIECES))
    reasoning = min(reasoning, total)
    pieces = (
        _tokens_reference(thinking_words(prompt, reasoning, seed=seed, fault=fault), tokenizer)
        if reasoning
        else []
    )
    answer = answer_words(
        prompt,
        total - reasoning,
        seed=seed,
        fault=fault,
        prompt_tokens=prompt_tokens,
        speculative=speculative,
    )
    pieces = (pieces + _tokens_reference(answer, tokenizer))[:total]
    data = "".join(pieces).encode()
    offsets = array("q", [0])
    at = 0
    for p in pieces * 2:
        at += len(p)
        offsets.append(at)
    return WordTable(ids=(), words=tuple(pieces), blob=data + data, offsets=offsets, n=len(pieces))


# ------------------------------------------------------------------ cases

NEEDLE = "Filler. The access code for the {} {} is {}. Question: What is the access code for the {} {}? Answer with the code only."
FAULTS = [None, "loop", "loop:5", "wrong_past:0", "wrong_past:100000", "spec_diverge", "spec_diverge:0"]


class _NoWeakref:
    """A tokenizer that takes no weak reference (no per-tokenizer cache: each request decodes its own ids)."""

    __slots__ = ("_tok",)

    def __init__(self, tok):
        self._tok = tok

    def encode(self, text):
        return self._tok.encode(text)

    def decode(self, ids):
        return self._tok.decode(ids)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("tok")
    corpus = [" ".join(answer_words("", 200, seed=s)) for s in range(40)]
    return {
        "qwen3.6": load_tokenizer(None),  # what the emulator serves Qwen/Qwen3.6-27B with
        "byte-level": HFTokenizer(
            Path(byte_level_bpe(tmp / "bl.json", corpus, vocab_size=600, split_digits=True))
        ),
        "metaspace": HFTokenizer(Path(metaspace_tokenizer(tmp / "ms.json", capitalize=True))),
    }


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    chat = build_pool(1500, 3, seed=21, cache_dir=None)
    out = [p.messages[-1]["content"] for p in chat.prompts]
    out += [
        "",
        "slow",
        NEEDLE.format("amber", "heron", "falcon-4812", "amber", "heron"),
        # non-ASCII digits: not a code the emulator reads (its pattern is ASCII), so the answer stays ASCII
        NEEDLE.format("amber", "heron", "falcon-\u0664\u0668\u0661\u0662", "amber", "heron"),
        "caf\u00e9 \u65e5\u672c\u8a9e \U0001f600",
    ]
    return out


def _same(a: WordTable, b: WordTable) -> None:
    assert a.words == b.words
    assert a.blob == b.blob
    assert a.offsets == b.offsets
    assert (a.n, a.ids) == (b.n, b.ids)


def test_cached_pieces_equal_the_reference_byte_for_byte(tokenizers, prompts, monkeypatch):
    rng = random.Random(7)
    cases = 0
    answer_stream._piece_caches.clear()  # start cold
    for tok in [*tokenizers.values(), _NoWeakref(tokenizers["qwen3.6"]), None]:
        for prompt in prompts:
            for fault_spec in FAULTS:
                fault = parse_answer_fault(fault_spec) if fault_spec else None
                for _ in range(4):
                    total = rng.choice([1, 2, 3, 7, 31, 128, 300, 1000])
                    reasoning = rng.choice([0, 0, 1, total // 2, total])
                    kw = dict(seed=rng.randrange(1 << 30), fault=fault, prompt_tokens=rng.choice([0, 50, 5000]),
                              speculative=rng.random() < 0.5, tokenizer=tok)  # fmt: skip
                    _same(
                        answer_table(prompt, total, reasoning, **kw),
                        answer_table_reference(prompt, total, reasoning, **kw),
                    )
                    cases += 1
    # long outputs (one cycle of MAX_PIECES too), the emulator's tokenizer
    for total, reasoning in ((2048, 0), (8192, 0), (8192, 4096), (MAX_PIECES + 5, 100)):
        kw = dict(
            seed=total, fault=None, prompt_tokens=40, speculative=False, tokenizer=tokenizers["qwen3.6"]
        )
        _same(
            answer_table(prompts[2], total, reasoning, **kw),
            answer_table_reference(prompts[2], total, reasoning, **kw),
        )
        cases += 1
    # a cache that fills up starts again and still gives the same pieces
    monkeypatch.setattr(answer_stream, "PIECE_CACHE_MAX", 60)
    tok = tokenizers["byte-level"]
    answer_stream._piece_caches.pop(tok)
    sizes = []
    for s in range(30):
        prompt = prompts[s % len(prompts)]
        kw = dict(seed=s, fault=None, prompt_tokens=0, speculative=False, tokenizer=tok)
        _same(answer_table(prompt, 200, 50, **kw), answer_table_reference(prompt, 200, 50, **kw))
        sizes.append(len(answer_stream._piece_caches[tok]))
        assert sizes[-1] <= 60 + 200  # the bound, or one request's distinct ids over it
    assert any(b < a for a, b in zip(sizes, sizes[1:], strict=False))  # it did start again
    assert cases > 1000


@pytest.mark.fast
def test_answer_retokenizes_to_its_piece_count(tokenizers, prompts):
    """The client's count (re-tokenizing the streamed answer) is the server's: one piece per token."""
    tok = tokenizers["qwen3.6"]
    for i, prompt in enumerate([*prompts[:4], prompts[5]]):
        for fault_spec in FAULTS:
            for n in (1, 17, 500):
                fault = parse_answer_fault(fault_spec) if fault_spec else None
                t = answer_table(
                    prompt, n, 0, seed=i, fault=fault, prompt_tokens=0, speculative=True, tokenizer=tok
                )
                assert t.n == n
                assert len(tok.encode("".join(t.words))) == n
                assert t.blob[: t.offsets[n]].decode() == "".join(t.words)


@pytest.mark.fast
def test_tokens_of_non_ascii_words_equal_the_reference(tokenizers):
    """Pieces that split a multi-byte character (byte-level BPE) decode as the reference does (U+FFFD)."""
    words = [
        " caf\u00e9",
        " \u65e5\u672c\u8a9e",
        " \U0001f600",
        " na\u00efve",
        " \u0664\u0668",
        " plain",
        ",",
    ]
    for tok in tokenizers.values():
        for k in range(1, len(words) + 1):
            for w in (words[:k], words[-k:], words * k):
                assert answer_stream._tokens(w, tok) == _tokens_reference(w, tok)


@pytest.mark.fast
def test_a_needle_with_non_ascii_digits_streams_whole_bytes(tokenizers, prompts):
    """A prompt whose needle code has Arabic-Indic digits: the emulator does not take it for a code (before the fix
    `\\d` matched it, its multi-byte characters were split into U+FFFD pieces and the offsets, counted in
    characters, cut the stream's bytes in the wrong places); every piece is ASCII and the offsets are byte offsets."""
    tok = tokenizers["qwen3.6"]
    for n in (8, 64, 300):
        t = answer_table(prompts[-2], n, 0, seed=3, fault=None, prompt_tokens=0, speculative=False, tokenizer=tok)
        assert all(w.isascii() for w in t.words), [w for w in t.words if not w.isascii()]
        assert t.blob[: t.offsets[t.n]].decode() == "".join(t.words)
        assert all(t.blob[t.offsets[i] : t.offsets[i + 1]].decode() == t.words[i] for i in range(t.n))
