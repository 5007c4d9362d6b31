"""Cache-faithful prompts: a trace's requests as prompts whose blocks are exact token blocks of the target tokenizer.

Each block of a request (one `hash_ids` entry, `block_size` tokens, the last one the remainder) becomes text of
exactly that many tokens, so the server's prompt token i is in block i // block_size, as in the trace. A block's
text depends only on its id (and on whether it opens a prompt, where the chat template's opening tokens take its
first places): wherever the trace repeats an id, the server sees the same tokens, and a radix cache serves them.

Never shared by accident: a block's text starts with a code, decimal digits (one token each in Qwen's vocabulary,
checked by `nonce_scheme`) that number it among the blocks following the same prefix, least significant digit
first, so two prompts whose block ids part ways part ways at that block's first token (up to ten such siblings; with
more, within its first log10(siblings) + 1 tokens, far inside the block: no block and no page of 16 is shared). The
codes mix in a salt from the seed: a replay with another seed almost surely shares nothing with this one beyond the
chat template's opening tokens.

Exactness is the prompt pools' (`servesweep.workload.prompts`): filler composed of sentences whose token counts add
up, short blocks filled with digits, and the chat template's tokens (ChatML, or the server's probed
`template_overhead`) taken out of the first block (opening tokens) and the last block (closing tokens), so the
server's `prompt_tokens` equals the trace's `input_length`. The first requests (200k tokens' worth) are counted in
full at build time; `verify` counts any others.

Known approximation: when a prompt's last block is shorter than the template's closing tokens, the missing tokens
come out of the block before it, whose text then differs from that id's elsewhere.
"""

from __future__ import annotations

import random
from pathlib import Path

from servesweep.workload.pool import Prompt, count_prompts, format_nonce, nonce_scheme
from servesweep.workload.prompts import DEFAULT_CACHE_DIR, _bank, _chat_layout, _compose
from servesweep.workload.tokenizer import load_tokenizer
from servesweep.workload.trace.model import Trace

ENDPOINTS = ("chat", "completions")
CODE_DIGITS = 8
_MIN_COMPOSE = 48  # below this many tokens a block body is digits (filler sentences cannot fill it exactly)
_CANARY_TOKENS = 200_000
_CODE_MULT = 7919  # coprime with 10: block index -> code is one to one below 10**digits


class TracePrompts:
    """The trace's requests as prompts for one tokenizer and endpoint (`prompt(i)`), built lazily; block texts are
    made once and reused wherever their id comes back."""

    def __init__(
        self,
        trace: Trace,
        *,
        tokenizer: str | None = None,
        endpoint: str = "chat",
        template_overhead: int | None = None,
        seed: int = 0,
        cache_dir: Path | str | None = DEFAULT_CACHE_DIR,
        check: bool = True,
    ):
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint={endpoint!r}: expected one of {', '.join(ENDPOINTS)}")
        self.trace = trace
        self.endpoint = endpoint
        self.template_overhead = template_overhead
        self.tok = load_tokenizer(tokenizer)
        self.bank = _bank(self.tok, Path(cache_dir).expanduser() if cache_dir is not None else None)
        if endpoint == "chat":
            self.before, self.after = _chat_layout(self.tok, system=False)
            if template_overhead is not None:  # the server's template: ChatML's split of it, the total probed
                self.after = template_overhead - self.before
        else:
            self.before, self.after = (template_overhead or 0), 0
        self.fmt, per8 = nonce_scheme(self.tok, CODE_DIGITS)
        if per8 != CODE_DIGITS:
            raise ValueError(
                f"tokenizer {self.tok.name}: {CODE_DIGITS} digits take {per8} tokens, not one each; trace prompts "
                f"need one token per digit"
            )
        self.sep = self.bank.sep
        self.salt = random.Random(f"servesweep-trace-salt:{seed}").randrange(10**CODE_DIGITS)
        self.seed = seed
        self._index: dict[tuple[int, bool, int], int] = {}
        self._texts: dict[tuple[int, bool, int], str] = {}
        self._layouts = [self._layout(i) for i in range(len(trace.requests))]
        # A block's code is its rank among the blocks that follow the same prefix (in order of first appearance
        # over the whole trace: the same in every process), so the first ten siblings differ from their first
        # digit and any two from their first log10(siblings) + 1 digits.
        children: dict[int, int] = {}
        for lay in self._layouts:
            h = 0
            for key in lay:
                if key not in self._index:
                    self._index[key] = children.get(h, 0)
                    children[h] = self._index[key] + 1
                h = hash((h, key))
        if check:
            self.check_first()

    # -------------------------------------------------------------------------------- layout and block texts

    def _layout(self, i: int) -> list[tuple[int, bool, int]]:
        """Request i's blocks as (id, opens the prompt, content tokens): the trace's sizes less the template's."""
        r = self.trace.requests[i]
        content = r.input_length - self.before - self.after
        if content < 1:
            raise ValueError(
                f"trace request {i}: input_length={r.input_length} leaves no room for content after the "
                f"template's {self.before + self.after} tokens"
            )
        sizes = self.trace.block_sizes(r)
        sizes[0] -= self.before
        sizes[-1] -= self.after
        for k in range(len(sizes) - 1, 0, -1):  # a block that went below 0 borrows from the one before it
            if sizes[k] < 0:
                sizes[k - 1] += sizes[k]
                sizes[k] = 0
        for k in range(len(sizes) - 1):  # the template's opening tokens may reach past a short first block
            if sizes[k] < 0:
                sizes[k + 1] += sizes[k]
                sizes[k] = 0
        return [(bid, k == 0, n) for k, (bid, n) in enumerate(zip(r.hash_ids, sizes, strict=True))]

    def _code(self, key: tuple[int, bool, int], digits: int) -> str:
        v = (self._index[key] * _CODE_MULT + self.salt) % 10**digits
        return format_nonce(f"{v:0{digits}d}"[::-1], self.fmt)  # least significant digit first: siblings differ early

    def _digits(self, rng: random.Random, n: int) -> str:
        return format_nonce("".join(rng.choice("0123456789") for _ in range(n)), self.fmt)

    def block_text(self, key: tuple[int, bool, int]) -> str:
        """The text of one block: `key` = (id, opens a prompt, content tokens)."""
        got = self._texts.get(key)
        if got is not None:
            return got
        bid, opens, n = key
        rng = random.Random(f"servesweep-trace:{self.seed}:{bid}:{int(opens)}:{n}")
        digits = min(CODE_DIGITS, n // 8)
        if n == 0:
            text = ""
        elif digits < 1 or n < digits + self.sep + 1:
            text = self._digits(rng, n)  # a block too short for a code: random digits (its id is all it shares)
        else:
            body = n - digits - self.sep
            text = self._code(key, digits) + "\n"
            if body >= _MIN_COMPOSE:
                try:
                    text += _compose(self.bank, rng, body, end_para=False)
                except ValueError:
                    text += self._digits(rng, body)
            else:
                text += self._digits(rng, body)
        self._texts[key] = text
        return text

    # -------------------------------------------------------------------------------- prompts

    def content(self, i: int) -> str:
        """Request i's prompt content (the user message, or the completions text)."""
        return "".join(self.block_text(k) for k in self._layouts[i])

    def prompt(self, i: int) -> Prompt:
        """Request i as a Prompt (no nonce: a trace's sharing is the point), `tokens` its trace input_length."""
        r = self.trace.requests[i]
        text = self.content(i)
        if self.endpoint == "chat":
            return Prompt("chat", r.input_length, messages=[{"role": "user", "content": text}], output_tokens=r.output_length)
        return Prompt("completions", r.input_length, text=text, output_tokens=r.output_length)

    def verify(self, indices: list[int] | None = None) -> dict[int, int]:
        """Count the prompts of `indices` (None: all) in full as the server counts them; {index: count} of those
        whose count differs from the trace's input_length (empty: all exact)."""
        idx = list(range(len(self.trace.requests))) if indices is None else list(indices)
        prompts = [self.prompt(i) for i in idx]
        overhead = self.template_overhead
        counts = count_prompts(self.tok, prompts, overhead, "")
        return {i: c for i, p, c in zip(idx, prompts, counts, strict=True) if c != p.tokens}

    def check_first(self) -> None:
        """Count the first requests (200k tokens' worth) in full; a RuntimeError naming the first ones off."""
        idx, total = [], 0
        for i, r in enumerate(self.trace.requests):
            if total >= _CANARY_TOKENS:
                break
            idx.append(i)
            total += r.input_length
        off = self.verify(idx)
        if off:
            shown = ", ".join(
                f"request {i}: {c} tokens, not {self.trace.requests[i].input_length}" for i, c in list(off.items())[:5]
            )
            raise RuntimeError(f"tokenizer {self.tok.name}: trace prompts are not exact: {shown}")
