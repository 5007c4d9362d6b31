"""Prompts and pools: what a workload's requests are made of, and the nonce that keeps a server's cache from serving
them.

A `Prompt` holds chat messages or a completions text with `NONCE_SLOT` where the nonce goes; `body_parts` gives its
JSON request body split around that slot, so a request is `head + nonce + tail`. A `PromptPool` is prompts of one
shape (synthetic ones from `servesweep.workload.prompts`, or a dataset's from `servesweep.workload.datasets`) with how their nonces
are written.

Cache busting. The load generator fills the slot per request with K decimal digits. Qwen's pre-tokenizer splits
digits one per token, so any K digits are K tokens whatever their neighbours; `nonce_scheme()` checks the property
for the tokenizer in use (and writes the digits spaced out for a tokenizer that merges them). Use the pool's
`nonces()` stream: it writes a counter's digits least-significant first, so consecutive requests differ from their
first digit on and a radix cache cannot serve their prefill.
"""

from __future__ import annotations

import functools
import json
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from servesweep.workload.tokenizer import Tokenizer, count_batch, render_chatml

DEFAULT_NONCE_DIGITS = 8
NONCE_FORMATS = ("digits", "spaced")
ENDPOINTS = ("chat", "completions")

# Marks the nonce's place in a prompt's text; a private-use character that no filler or JSON escaping produces.
NONCE_SLOT = "\ue000"
_SLOT_BYTES = NONCE_SLOT.encode()


@dataclass(eq=False)
class Prompt:
    """One prompt, ready to send. `tokens` is its length as the server counts it, nonce included.

    Chat prompts hold `messages`, completions prompts hold `text`; either has `NONCE_SLOT` where the nonce goes
    (when `nonce_digits` > 0).
    """

    endpoint: str
    tokens: int
    messages: list[dict] | None = None
    text: str | None = None
    nonce_digits: int = 0
    nonce_format: str = "digits"  # "spaced": a space before each digit (see `nonce_scheme`)
    group: int = 0
    shared_prefix_tokens: int = 0
    question: str | None = None
    answer: str | None = None
    output_tokens: int | None = None  # a dataset's reference answer length, when it has one
    _bodies: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def render(self, nonce: str = "") -> list[dict] | str:
        """The messages (chat) or text (completions) with the nonce filled in."""
        width = self.nonce_digits * (2 if self.nonce_format == "spaced" else 1)
        if len(nonce) != width:
            raise ValueError(
                f"nonce {nonce!r}: this prompt takes {self.nonce_digits} digits ({self.nonce_format})"
            )
        if self.messages is not None:
            return [{**m, "content": m["content"].replace(NONCE_SLOT, nonce)} for m in self.messages]
        return (self.text or "").replace(NONCE_SLOT, nonce)

    def as_text(self) -> str:
        """The prompt as one string with the nonce slot left in: ChatML for chat prompts, the text otherwise."""
        if self.messages is not None:
            return render_chatml(self.messages)
        return self.text or ""

    def body_parts(
        self, model: str, max_tokens: int, endpoint: str | None = None, extra: dict | None = None
    ) -> tuple[bytes, bytes]:
        """The JSON request body split around the nonce: a request is `head + nonce + tail`.

        The body is `{"model", "messages"|"prompt"|"text", "max_tokens", "stream": true,
        "stream_options": {"include_usage": true}}` updated with `extra` (e.g. `ignore_eos`,
        `chat_template_kwargs`; a key in `extra` replaces the default). `endpoint` "chat" needs a chat prompt;
        "completions" and "generate" (SGLang's native API) send chat prompts as their ChatML text, which the server
        counts the same. With cache busting off, `tail` is empty and `head` is the whole body. Cached per arguments.
        """
        endpoint = endpoint or self.endpoint
        key = (model, max_tokens, endpoint, json.dumps(extra, sort_keys=True) if extra else "")
        got = self._bodies.get(key)
        if got is not None:
            return got
        with self._lock:
            got = self._bodies.get(key)
            if got is None:
                got = self._bodies[key] = _split_body(
                    self._body_obj(model, max_tokens, endpoint, extra or {})
                )
        return got

    def body(self, model: str, max_tokens: int, nonce: bytes | str = b"", **kw) -> bytes:
        """One whole request body (tests and one-off requests; the load loop joins `body_parts` itself)."""
        head, tail = self.body_parts(model, max_tokens, **kw)
        return head + (nonce.encode() if isinstance(nonce, str) else nonce) + tail

    def _body_obj(self, model: str, max_tokens: int, endpoint: str, extra: dict) -> dict:
        if endpoint == "chat":
            if self.messages is None:
                raise ValueError("endpoint 'chat' needs a chat prompt; this pool was built for completions")
            body: dict[str, Any] = {"model": model, "messages": self.messages, "max_tokens": max_tokens}
        elif endpoint == "completions":
            body = {"model": model, "prompt": self.as_text(), "max_tokens": max_tokens}
        elif endpoint == "generate":
            sp = {"max_new_tokens": max_tokens, **extra.get("sampling_params", {})}
            body = {"text": self.as_text(), "sampling_params": sp, "stream": True}
            body.update({k: v for k, v in extra.items() if k != "sampling_params"})
            return body
        else:
            raise ValueError(f"endpoint {endpoint!r}: expected one of chat, completions, generate")
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body.update(extra)
        return body

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in _PROMPT_FIELDS}
        return {k: v for k, v in d.items() if v is not None}


_PROMPT_FIELDS = (
    "endpoint",
    "tokens",
    "messages",
    "text",
    "nonce_digits",
    "nonce_format",
    "group",
    "shared_prefix_tokens",
    "question",
    "answer",
    "output_tokens",
)


def _split_body(obj: dict) -> tuple[bytes, bytes]:
    """The body as UTF-8 JSON, split at the nonce slot."""
    # ASCII JSON encodes twice as fast. When its only \u escape is the slot's (no other non-ASCII or control
    # character) and it holds no literal backslash (which could spell a false "\ue000"), it is the UTF-8 JSON.
    raw = json.dumps(obj, separators=(",", ":")).encode()
    escapes = raw.count(b"\\u")
    if escapes == 0:
        return raw, b""
    if escapes == 1 and b"\\\\" not in raw:
        parts = raw.split(b"\\ue000")
        if len(parts) == 2:
            return parts[0], parts[1]
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    parts = raw.split(_SLOT_BYTES)
    if len(parts) == 1:
        return raw, b""
    if len(parts) != 2:
        raise ValueError(f"prompt holds the nonce slot {len(parts) - 1} times; expected once")
    return parts[0], parts[1]


@dataclass(eq=False)
class PromptPool:
    """Prompts of one shape. `prompt_tokens` is the exact length of each (None for datasets, whose lengths vary)."""

    prompts: list[Prompt]
    endpoint: str
    tokenizer: str
    nonce_digits: int
    nonce_tokens: int
    nonce_format: str = "digits"
    prompt_tokens: int | None = None
    template_overhead: int | None = None
    shared_prefix_tokens: int = 0
    num_groups: int = 1
    seed: int = 0
    source: str = "synthetic"
    # How many prompts the tokenizer counted in full at build time (the rest kept their composed length, which those
    # confirmed; see `servesweep.workload.prompts`). None: not given.
    counted_in_full: int | None = None

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[Prompt]:
        return iter(self.prompts)

    def __getitem__(self, i: int) -> Prompt:
        return self.prompts[i]

    def bodies(
        self, model: str, max_tokens: int, endpoint: str | None = None, extra: dict | None = None
    ) -> list[tuple[bytes, bytes]]:
        """`body_parts` of every prompt, in order."""
        return [p.body_parts(model, max_tokens, endpoint, extra) for p in self.prompts]

    def nonces(self, start: int | None = None) -> Nonces:
        """A nonce stream for this pool, in its format (empty nonces when cache busting is off)."""
        return Nonces(self.nonce_digits, start, spaced=self.nonce_format == "spaced")

    def meta(self) -> dict:
        """What a results file should record about the pool."""
        return {
            "source": self.source,
            "endpoint": self.endpoint,
            "tokenizer": self.tokenizer,
            "n": len(self.prompts),
            "prompt_tokens": self.prompt_tokens,
            "template_overhead": self.template_overhead,
            "nonce_digits": self.nonce_digits,
            "nonce_tokens": self.nonce_tokens,
            "nonce_format": self.nonce_format,
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "num_groups": self.num_groups,
            "seed": self.seed,
            "counted_in_full": self.counted_in_full,
        }


class Nonces:
    """Per-request nonces: a counter from a random start, its K digits written least-significant first.

    Consecutive requests differ from their first digit, and two streams with random starts rarely share more than
    a digit or two at the same moment. `next(nonces)` returns bytes, ready to join between a body's parts.
    """

    __slots__ = ("digits", "spaced", "_i", "_mod")

    def __init__(self, digits: int, start: int | None = None, *, spaced: bool = False):
        self.digits = digits
        self.spaced = spaced
        self._mod = 10**digits
        self._i = (random.SystemRandom().randrange(self._mod) if start is None else start) % self._mod

    def __iter__(self) -> Nonces:
        return self

    def __next__(self) -> bytes:
        if not self.digits:
            return b""
        s = (b"%0*d" % (self.digits, self._i))[::-1]
        self._i = (self._i + 1) % self._mod
        return s if not self.spaced else b" " + b" ".join(s[i : i + 1] for i in range(len(s)))


# ----------------------------------------------------------------------------------------------------------------
# Nonces and token accounting


def format_nonce(digits: str, nonce_format: str) -> str:
    """The nonce as it goes into the prompt: "digits" as is, "spaced" with a space before each digit."""
    return "".join(" " + d for d in digits) if nonce_format == "spaced" else digits


@functools.lru_cache(maxsize=16)
def nonce_scheme(tokenizer: Tokenizer, digits: int) -> tuple[str, int]:
    """(format, tokens): how a nonce of `digits` decimal digits is written, and how many tokens it takes.

    The count must not depend on the digits, or a nonce would change the prompt's length. Qwen's pre-tokenizer
    splits every digit into its own token, so plain digits work and K digits are K tokens. A tokenizer that merges
    digits unevenly (some byte-level BPEs) gets "spaced" digits (" 1 2 3"): a space and a digit make one piece,
    which no merge crosses. Checked in context, over every repeated digit and 200 random nonces.
    """
    if digits <= 0:
        return "digits", 0
    rng = random.Random(digits)
    samples = [d * digits for d in "0123456789"]
    samples += ["".join(rng.choice("0123456789") for _ in range(digits)) for _ in range(200)]
    # Counted against a one-digit nonce (one token), so that the newlines around it stay apart as in a prompt.
    head, tail = "<|im_start|>user\n", "\nThe river was calm."
    seen = {}
    for fmt in NONCE_FORMATS:
        base = len(tokenizer.encode(head + format_nonce("0", fmt) + tail)) - 1
        texts = [head + format_nonce(x, fmt) + tail for x in samples]
        counts = {c - base for c in count_batch(tokenizer, texts)}
        if len(counts) == 1:
            return fmt, counts.pop()
        seen[fmt] = sorted(counts)
    raise ValueError(
        f"tokenizer {tokenizer.name}: a nonce of {digits} digits takes a number of tokens that depends on the digits "
        f"({seen}), so it would change the prompt's length; turn cache busting off"
    )


def nonce_tokens(tokenizer: Tokenizer, digits: int) -> int:
    """Tokens a nonce of `digits` digits takes with this tokenizer (see `nonce_scheme`)."""
    return nonce_scheme(tokenizer, digits)[1]


def count_prompts(tok: Tokenizer, prompts: list[Prompt], overhead: int | None, nonce: str) -> list[int]:
    """Each prompt's length as the server counts it: ChatML + encode, or `overhead` + the content tokens."""
    if overhead is None:
        texts = [(p.as_text()).replace(NONCE_SLOT, nonce) for p in prompts]
        return count_batch(tok, texts)
    contents: list[str] = []
    owner: list[int] = []
    for i, p in enumerate(prompts):
        r = p.render(nonce)
        for c in [m["content"] for m in r] if isinstance(r, list) else [r]:
            contents.append(c)
            owner.append(i)
    out = [overhead] * len(prompts)
    for i, c in zip(owner, count_batch(tok, contents), strict=True):
        out[i] += c
    return out


def check_int(name: str, v: Any, lo: int) -> int:
    """`v` itself when it is an integer (not a bool) of at least `lo`; a ValueError naming `name` otherwise."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{name}={v!r}: expected an integer ≥ {lo}")
    return v
