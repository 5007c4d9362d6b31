"""Logprobs in SGLang's format, with invented values (docs/emulator.md, "Logprobs").

What a request asks for, as SGLang's OpenAI layer reads it (`serving_chat.py`, `serving_completions.py`):
- chat: `return_logprob = request.logprobs`, `top_logprobs_num = request.top_logprobs or 0` (`top_logprobs` without
  `logprobs: true` is ignored);
- completions: `return_logprob = request.logprobs is not None`, `top_logprobs_num = request.logprobs`.
Neither checks a range: a `top_logprobs_num` ≤ 0 means no alternatives (the tokenizer manager adds
`output_top_logprobs` to `meta_info` only when it is > 0).

The values: each emitted token (its text and its position in the request's answer table) gets a logprob in
[-1.5, -0.001] and a ranked list of alternatives: the token itself first (the emitted token is the most likely one),
then other single-token words of the serving tokenizer (the app's word table, `text.WordTable`) with lower
logprobs, all distinct texts (SGLang's completions `top_logprobs` is a dict keyed by token text). Values are
multiples of 0.001, so every JSON writer (json, orjson, msgspec, pydantic) prints them alike; a greedy request
replayed gets the same values. At most as many alternatives as the word table has distinct words.

Only requests that ask for logprobs use this module: `LogprobStream` (a `stream.GenerationStream` subclass) is built
for them alone, so the per-chunk path of every other request is unchanged (not one extra operation).
"""

from __future__ import annotations

import zlib

from . import protocol as P
from .stream import GenerationStream

NULL = b'"logprobs":null'


def requested(kind: str, body: dict) -> int | None:
    """None when the request does not ask for logprobs, else its `top_logprobs_num` (≤ 0: none)."""
    if kind == "chat":
        if not body.get("logprobs"):
            return None
        k = body.get("top_logprobs")
    elif kind == "completion":
        k = body.get("logprobs")
        if k is None:
            return None
    else:
        return None
    return int(k or 0)


def _bool_error(v):
    """Pydantic's lax `bool` from JSON: None when `v` passes, else (type, message)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float) and v in (0, 1):
        return None
    if isinstance(v, str):
        if v.lower() in ("0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"):
            return None
        return "bool_parsing", "Input should be a valid boolean, unable to interpret input"
    if isinstance(v, int | float):
        return "bool_parsing", "Input should be a valid boolean, unable to interpret input"
    return "bool_type", "Input should be a valid boolean"


def _int_error(v):
    """Pydantic's lax `Optional[int]` from JSON: None when `v` passes, else (type, message)."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return None
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return "finite_number", "Input should be a finite number"
        if v.is_integer():
            return None
        return "int_from_float", "Input should be a valid integer, got a number with a fractional part"
    if isinstance(v, str):
        try:
            int(v.strip())
            return None
        except ValueError:
            return "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
    return "int_type", "Input should be a valid integer"


def field_errors(kind: str, body: dict) -> list[dict]:
    """SGLang's request-model errors (pydantic) for the logprobs fields of a chat / completions body."""
    errs = []
    checks = (
        (("logprobs", _bool_error), ("top_logprobs", _int_error))
        if kind == "chat"
        else (("logprobs", _int_error),)
    )
    for name, check in checks:
        if name in body:
            bad = check(body[name])
            if bad is not None:
                errs.append({"type": bad[0], "loc": ("body", name), "msg": bad[1], "input": body[name]})
    return errs


def _milli(h: int, lo: int, hi: int) -> int:
    return lo + h % (hi - lo + 1)


class LogprobTable:
    """Invented logprobs for a given top_logprobs_num: the emitted token's, and its alternatives drawn from the
    vocabulary (the app's word table: single tokens of the serving tokenizer)."""

    def __init__(self, vocab, k: int):
        self.alts = list(dict.fromkeys(vocab))
        self.k = max(0, min(k, len(self.alts)))

    def entry(self, t: str, i: int) -> tuple[float, list[tuple[str, float]]]:
        """(logprob, top alternatives) of token text t at word index i of its request's table."""
        h = zlib.crc32(b"%d:%s" % (i, t.encode()))
        m = -_milli(h, 1, 1500)
        lp = m / 1000
        row: list[tuple[str, float]] = []
        k = self.k
        if k:
            row.append((t, lp))
            alts = self.alts
            na = len(alts)
            j = h
            seen = {t}
            while len(row) < k:
                alt = alts[j % na]
                j += 1
                if alt in seen:
                    continue
                seen.add(alt)
                m -= _milli(zlib.crc32(b"%d" % (h + len(row))), 1, 2000)
                row.append((alt, m / 1000))
        return lp, row

    def chat_items(self, wt, w: int, n: int, first_top_only: bool = False) -> list[dict]:
        """ChatCompletionTokenLogprob dicts of n tokens from word w of the request's table `wt`. `first_top_only`:
        SGLang 0.5.11 streams give every token of a chunk the alternatives of the chunk's first token
        (`_process_logprobs_tokens(..., use_token_index=False)` reads `top_logprobs[0]`)."""
        out = []
        top0 = None
        for j in range(n):
            i = (w + j) % wt.n
            t = wt.words[i]
            lp, row = self.entry(t, i)
            top = [{"token": a, "bytes": list(a.encode()), "logprob": v} for a, v in row]
            if first_top_only:
                top = top0 = top if top0 is None else top0
            out.append({"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": top})
        return out

    def completion_obj(self, wt, spans) -> dict:
        """SGLang's completions `LogProbs` of the tokens of `spans` ((word, count) of `wt`)."""
        lps, toks, tops = [], [], []
        for w, n in spans:
            for j in range(n):
                i = (w + j) % wt.n
                t = wt.words[i]
                lp, row = self.entry(t, i)
                lps.append(lp)
                toks.append(t)
                tops.append(dict(row))
        return {"text_offset": [-1] * len(toks), "token_logprobs": lps, "tokens": toks,
                "top_logprobs": tops if self.k else []}  # fmt: skip


def table(app, k: int) -> LogprobTable:
    """The app's table for top_logprobs_num k (built once per k)."""
    cache = app.logprob_tables
    k = max(0, k)
    t = cache.get(k)
    if t is None:
        t = cache[k] = LogprobTable(app.words.words, k)
    return t


class LogprobStream(GenerationStream):
    """A chat / completions request that asked for logprobs: the general (not the fast) chunk path, each event
    carrying the logprobs of the tokens it carries, and the body those of all its tokens."""

    __slots__ = ("lpt", "spans", "cur", "v0511")

    def __init__(self, *a, top_k: int, **kw):
        super().__init__(*a, **kw)
        self.fast = False
        self.lpt = table(self.app, top_k)
        self.spans: list[tuple[int, int]] = []  # every (word, tokens) taken, for the body
        self.cur: tuple[int, int] | None = None  # this step's, until an event carries them
        self.v0511 = self.app.version < (0, 5, 12)
        self.fmt = _LogprobFormat(self.fmt, self)

    def _take_text(self, n: int):
        self.cur = (self.word, n)
        self.spans.append(self.cur)
        return super()._take_text(n)

    def pending_logprobs(self, reasoning: bool = False) -> bytes | None:
        """The logprobs of this step's tokens for the step's first event that carries them, else None. SGLang
        0.5.23 puts them on the step's first event (reasoning or content); 0.5.11 on its content event only (a
        step of reasoning alone streams none)."""
        cur = self.cur
        if cur is None or (reasoning and self.v0511):
            return None
        self.cur = None
        if self.kind == "chat":
            return P.dumps({"content": self.lpt.chat_items(self.wt, cur[0], cur[1], self.v0511)})
        return P.dumps(self.lpt.completion_obj(self.wt, (cur,)))

    def _final_body(self) -> bytes:
        import json

        obj = json.loads(super()._final_body())
        if self.kind == "chat":
            lp = {"content": [x for w, n in self.spans for x in self.lpt.chat_items(self.wt, w, n)]}
        else:
            lp = self.lpt.completion_obj(self.wt, self.spans)
        obj["choices"][0]["logprobs"] = lp
        return P.dumps(obj)


class _LogprobFormat:
    """The stream's chunk formatter, its token events carrying the pending logprobs instead of null."""

    __slots__ = ("f", "s")

    def __init__(self, f, s):
        self.f, self.s = f, s

    def __getattr__(self, name):
        return getattr(self.f, name)

    def _with(self, ev: bytes, reasoning: bool = False) -> bytes:
        lp = self.s.pending_logprobs(reasoning)
        if lp is None:
            return ev
        h = len(self.f.head)
        return ev[:h] + ev[h:].replace(NULL, b'"logprobs":' + lp, 1)

    def content(self, text: bytes, usage: bytes = b"") -> bytes:
        return self._with(self.f.content(text, usage))

    def reasoning(self, text: bytes, usage: bytes = b"") -> bytes:
        return self._with(self.f.reasoning(text, usage), True)

    def last(self, text: bytes, reason: str, matched_stop, usage: bytes = b"") -> bytes:
        return self._with(self.f.last(text, reason, matched_stop, usage))
