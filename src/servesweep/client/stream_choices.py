"""The choices of one stream (`n > 1`): which chunk belongs to which choice, and each choice's token count.

With `n > 1` a server interleaves its choices' chunks, each chunk carrying one choice (its `index`); with
`continuous_usage_stats` each chunk's `usage.completion_tokens` is its own choice's running count (SGLang:
`serving_chat.py`, `serving_completions.py`). A record keeps the lead choice's chunks, the choice whose token came
first: its `chunk_ns` / `chunk_tokens` are one answer's cadence (ITL and TPOT of what one reader sees), and its first
chunk is the first token of any choice (TTFT). Used by `sse.parse_stream` after the stream, never per chunk.
"""

from __future__ import annotations


def _count(v) -> int | None:
    """A token count from the server, or None when it is not a plausible one (wrong type, negative, absurd)."""
    return v if type(v) is int and 0 <= v < 2**53 else None


class ChoiceTally:
    """Per-choice state while one finished stream's events are parsed."""

    __slots__ = ("lead", "seen", "tokens", "said")

    def __init__(self) -> None:
        self.lead: int | None = None  # the choice whose token came first
        self.seen: set[int] = set()
        self.tokens: dict[int, int] = {}  # choice -> completion tokens its continuous usage said so far
        self.said = True  # every token chunk said its choice's count

    def token_chunk(self, ev: dict, usage: dict | None) -> tuple[bool, int | None]:
        """A token-bearing event: (it is the lead choice's, the tokens it added to its choice or None when the
        server did not say, or said nonsense)."""
        choices = ev.get("choices") or ()
        i = choices[0].get("index", 0) if choices and isinstance(choices[0], dict) else 0
        i = i if type(i) is int and 0 <= i < 2**15 else 0
        self.seen.add(i)
        if self.lead is None:
            self.lead = i
        c = _count(usage.get("completion_tokens")) if usage else None
        prev = self.tokens.get(i, 0)
        k = None
        if c is not None and c >= prev and c - prev < 2**31:
            k = c - prev
            self.tokens[i] = c
        else:
            self.said = False
        return i == self.lead, k

    def fill(self, rec: dict) -> None:
        """`choices`, and with more than one: `lead_choice` and `choice_completion_tokens` (index order; null when
        the server did not say per choice)."""
        rec["choices"] = len(self.seen) or None
        if len(self.seen) > 1:
            rec["lead_choice"] = self.lead
            top = max(self.seen) + 1
            known = self.said and all(i in self.tokens for i in range(top))
            rec["choice_completion_tokens"] = [self.tokens[i] for i in range(top)] if known else None
