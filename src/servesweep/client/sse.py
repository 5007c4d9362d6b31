"""The SSE stream parser: how a streamed OpenAI-compatible response (chat, completions, SGLang's /generate) becomes
one request's record. Runs inside the Locust process, after the stream has ended (the per-chunk read loop only cuts
lines and keeps their kernel stamps, `cut_lines`); the record's columns are defined in results/records.py.
"""

from __future__ import annotations

import json
import re

import orjson

from servesweep.client.answer_texts import add_texts, set_texts
from servesweep.client.stream_choices import ChoiceTally, _count

_CONTEXT_400 = re.compile(r"context length|context window|maximum allowed length|maximum context", re.I)
_MSG_MAX = 300


def short(msg: object) -> str:
    s = str(msg).replace("\n", " ")
    return s if len(s) <= _MSG_MAX else s[: _MSG_MAX - 1] + "…"


def error_message(body: bytes) -> str:
    try:
        d = json.loads(body)
    except ValueError:
        return body[:_MSG_MAX].decode("utf-8", "replace")
    if isinstance(d, dict):
        e = d.get("error", d)
        if isinstance(e, dict) and e.get("message"):
            return str(e["message"])
        if isinstance(e, str):
            return e
    return body[:_MSG_MAX].decode("utf-8", "replace")


def classify_status(status: int, message: str) -> str:
    if status == 400 and _CONTEXT_400.search(message):
        return "http_400_context"
    if status == 429:
        return "http_429"
    if status >= 500:
        return "http_5xx"
    return "http_4xx"


class _Malformed(Exception):
    """An event whose fields have the wrong types: the chunk is malformed, the user's task goes on."""


def _token_kinds(ev: dict) -> tuple[bool, bool]:
    """(carries reasoning, carries answer: content, text or tool calls) of an OpenAI chunk, in one walk of its
    choices; raises _Malformed when its shape is not an OpenAI chunk's. Token-bearing: either of the two."""
    choices = ev.get("choices")
    if choices is None:
        return False, False
    if not isinstance(choices, list):
        raise _Malformed("choices is not a list")
    r = a = False
    for ch in choices:
        if not isinstance(ch, dict):
            raise _Malformed("a choice is not an object")
        d = ch.get("delta")
        if d is not None:
            if not isinstance(d, dict):
                raise _Malformed("delta is not an object")
            for key in ("content", "reasoning_content"):
                v = d.get(key)
                if v is not None and not isinstance(v, str):
                    raise _Malformed(f"delta.{key} is not a string")
            r = r or bool(d.get("reasoning_content"))
            tc = d.get("tool_calls")
            a = a or bool(d.get("content")) or (isinstance(tc, list) and bool(tc))
        else:
            v = ch.get("text")
            if v is not None and not isinstance(v, str):
                raise _Malformed("text is not a string")
            a = a or bool(v)
    return r, a


def loads_event(payload: bytes):
    """One SSE event's JSON. orjson first (~3x faster; the post-stream parse decodes every chunk); what it refuses
    (NaN, integers past 64 bits, nesting past 1024) goes to the stdlib, so what parses and what a malformed chunk
    says stay exactly as with `json.loads`."""
    try:
        return orjson.loads(payload)
    except ValueError:
        return json.loads(payload)


def is_token_line(line: bytes) -> bool:
    """Used only until the first token (to switch the socket from first-token to stall timeout)."""
    if not line.startswith(b"data:"):
        return False
    payload = line[5:].strip()
    if not payload or payload == b"[DONE]":
        return False
    try:
        ev = loads_event(payload)
        if isinstance(ev, dict) and "meta_info" in ev:  # SGLang's native /generate: cumulative text
            return isinstance(ev.get("text"), str) and bool(ev["text"])
        return isinstance(ev, dict) and any(_token_kinds(ev))
    except (ValueError, RecursionError, _Malformed):
        return False


def _generate_event(ev: dict, prev_text: int) -> tuple[bool, dict | None, str | None]:
    """(new tokens?, usage-like dict, finish reason) of one native /generate event (cumulative `text`, counts in
    `meta_info`). A finish_reason object {"type": "length", ...} becomes its type."""
    text = ev.get("text")
    meta = ev.get("meta_info")
    if not isinstance(text, str) or not isinstance(meta, dict):
        raise _Malformed("a /generate event needs a string text and an object meta_info")
    u = {
        "prompt_tokens": meta.get("prompt_tokens"),
        "completion_tokens": meta.get("completion_tokens"),
        "prompt_tokens_details": {"cached_tokens": meta.get("cached_tokens")},
    }
    if meta.get("reasoning_tokens"):
        u["reasoning_tokens"] = meta["reasoning_tokens"]
    fr = meta.get("finish_reason")
    fin = None
    if isinstance(fr, dict):
        fin = fr.get("type") if isinstance(fr.get("type"), str) else json.dumps(fr)
    elif isinstance(fr, str):
        fin = fr
    elif fr is not None:
        raise _Malformed("meta_info.finish_reason is neither an object nor a string")
    return len(text) > prev_text, u, fin


def cut_lines(
    body: bytearray, reached: list[int], stamps: list[int], last: int, lines: list[bytes], times: list[int]
) -> None:
    """Cut `body` (a response body read in one go) into its complete lines, appended to `lines`, each with the
    stamp of the read that completed it: read j brought the body up to `reached[j]` bytes and has stamp
    `stamps[j]`; bytes beyond the last entry came with a read whose stamp is `last`. A trailing piece without a
    newline is not a line (a cut stream's half event)."""
    if len(body) > reached[-1]:
        reached = [*reached, len(body)]
        stamps = [*stamps, last]
    data = bytes(body)
    j = 0
    start = 0
    find = data.find
    while True:
        k = find(b"\n", start)
        if k < 0:
            return
        k += 1
        while reached[j] < k:
            j += 1
        lines.append(data[start:k])
        times.append(stamps[j])
        start = k


def _usage_complete(usage: dict | None) -> bool:
    if not usage:
        return False
    return (
        _count(usage.get("prompt_tokens")) is not None and _count(usage.get("completion_tokens")) is not None
    )


PARSE_SLICE = 16  # lines parsed between two calls of parse_stream's `pause` (~0.1 ms of work)


def parse_stream(lines: list[bytes], times: list[int], rec: dict, pause=None) -> None:
    """Fill the record from the kept SSE lines: token chunks, usage, finish reason, and the error class if any.
    Whatever the bytes, this never raises and the record fits SCHEMA (a bad field makes a malformed chunk).

    `pause` (the Locust user passes `gevent.sleep`) is called before every PARSE_SLICE lines: when many streams end
    together, whole-stream parses back to back (~2 ms each at 256 chunks; gevent runs 50 ready greenlets before it
    polls sockets again) would leave the other streams unread for longer than a chunk gap, and a late read
    coalesces chunks under one kernel stamp (docs/metrics.md).

    One function on purpose: it runs once per request over up to thousands of lines inside the Locust process, and
    its loop body is the measured cost of the post-stream parse (bench/run_all.py figure 1); helpers per line would
    add a call per chunk."""
    chunk_ns: list[int] = []
    chunk_tokens: list[int] | None = []
    done = False
    error = None
    malformed = None
    usage: dict | None = None
    finish = None
    tally = ChoiceTally()  # n > 1: chunk_ns keeps the lead choice's chunks (client/stream_choices.py)
    prev_text = 0  # /generate: length of the cumulative text so far
    first_reasoning = first_answer = None
    content: list[str] = []
    reasoning: list[str] = []
    generate_text = None
    for i, (line, t) in enumerate(zip(lines, times, strict=True)):
        if pause is not None and not i % PARSE_SLICE:
            pause()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, `event:` lines
        payload = line[5:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        try:
            ev = loads_event(payload)
            if not isinstance(ev, dict):
                raise _Malformed("not a JSON object")
            if ev.get("error") is not None:
                e = ev["error"]
                error = error or short(e.get("message", e) if isinstance(e, dict) else e)
                continue
            if "meta_info" in ev:
                tokens, u, fin = _generate_event(ev, prev_text)
                if tokens:
                    prev_text = len(ev["text"])
                    generate_text = ev["text"]
                    first_answer = first_answer or t
                if fin is not None:
                    finish = fin
                ev = {}
                lead, k = tally.token_chunk(ev, u) if tokens else (False, None)
            else:
                u = ev.get("usage")
                if u is not None and not isinstance(u, dict):
                    raise _Malformed("usage is not an object")
                r, a = _token_kinds(ev)
                tokens = r or a
                if r and first_reasoning is None:
                    first_reasoning = t
                if a and first_answer is None:
                    first_answer = t
                lead, k = tally.token_chunk(ev, u) if tokens else (False, None)
                if lead:  # the answer text is the lead choice's
                    add_texts(ev, content, reasoning)
        except (ValueError, RecursionError, _Malformed) as e:
            what = payload[:120].decode("utf-8", "replace")
            malformed = malformed or short(f"{e}: {what}" if isinstance(e, _Malformed) else what)
            continue
        if u:
            usage = u
        if lead:
            chunk_ns.append(t)
            if chunk_tokens is not None:
                if k is not None:
                    chunk_tokens.append(k)
                else:
                    chunk_tokens = None  # the server does not say per chunk (or says nonsense)
        for ch in ev.get("choices") or ():
            if ch.get("finish_reason") is not None:
                finish = ch["finish_reason"]
    rec["chunk_ns"] = chunk_ns
    rec["chunk_tokens"] = chunk_tokens if chunk_tokens else None
    rec["first_token_ns"] = chunk_ns[0] if chunk_ns else None  # the lead choice's first: any choice's first
    tally.fill(rec)
    rec["first_reasoning_ns"] = first_reasoning
    rec["first_answer_ns"] = first_answer
    set_texts(rec, content, reasoning, generate_text)
    rec["finish_reason"] = (
        finish if isinstance(finish, str) else (json.dumps(finish) if finish is not None else None)
    )
    if usage:
        rec["prompt_tokens"] = _count(usage.get("prompt_tokens"))
        rec["completion_tokens"] = _count(usage.get("completion_tokens"))
        details = usage.get("prompt_tokens_details")
        rec["cached_tokens"] = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
        rt = usage.get("reasoning_tokens")
        cdet = usage.get("completion_tokens_details")
        if rt is None and isinstance(cdet, dict):
            rt = cdet.get("reasoning_tokens")
        rec["reasoning_tokens"] = _count(rt)
    if error is not None:
        rec["error_class"], rec["error_message"] = "stream_error_event", error
    elif malformed is not None:
        rec["error_class"], rec["error_message"] = "malformed_chunk", malformed
    elif finish == "abort" or isinstance(finish, dict):
        rec["error_class"], rec["error_message"] = (
            "stream_error_event",
            short(f"finish_reason {rec['finish_reason']}"),
        )
    elif finish is not None and not isinstance(finish, str):
        rec["error_class"], rec["error_message"] = (
            "malformed_chunk",
            short(f"finish_reason {rec['finish_reason']}"),
        )
    elif not done and not (finish in ("stop", "length") and _usage_complete(usage)):
        # Some servers (transformers serve) end a complete stream without [DONE]: a finish reason and the usage
        # say it ended as it should; without them the stream was cut.
        rec["error_class"], rec["error_message"] = "no_done", "stream ended without data: [DONE]"
    elif not chunk_ns:
        rec["error_class"], rec["error_message"] = "no_tokens", "complete stream without a token"
