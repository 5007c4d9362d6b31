"""The bytes SGLang writes: SSE chunks, response bodies and error bodies (reference sglang.md §2–4).

Hot-path rule: a stream's JSON is split once per request into constant byte pieces (`ChatChunks`,
`CompletionChunks`); per chunk the server only concatenates those pieces with the word bytes and a few integers.
Everything else (whole bodies, errors, native `/generate` events) is built with `json.dumps` as the non-hot path.

Two shapes: SGLang 0.5.23 builds chat chunks with msgspec (`omit_defaults`: `delta.reasoning_content` always present,
`role`/`content` only when set, `usage` omitted when null); ≤0.5.9 used pydantic `model_dump_json()` (every delta key,
`"tool_calls":null`, and `"usage":null` at the end of every chunk).
"""

from __future__ import annotations

import json
import uuid
from http import HTTPStatus

from . import validation

DONE = b"data: [DONE]\n\n"


def dumps(obj) -> bytes:
    """Compact JSON with raw UTF-8, as ORJSON / msgspec write it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def jstr(s: str) -> bytes:
    return json.dumps(s, ensure_ascii=False).encode()


def new_id() -> str:
    return uuid.uuid4().hex


# UsageInfo has `completion_tokens_details` from 0.5.23 (absent in 0.5.9 … 0.5.22); ChatMessage drops a null
# `tool_calls` from its body from 0.5.22 (a model_serializer). Read in each version's protocol.py.
USAGE_DETAILS_SINCE = (0, 5, 23)
MESSAGE_TOOL_CALLS_UNTIL = (0, 5, 22)


def usage_dict(
    prompt: int, completion: int, cached: int | None, reasoning: int, *, cache_report: bool, details: bool
) -> dict:
    """UsageInfo as SGLang serializes it; `prompt_tokens_details` only with --enable-cache-report,
    `completion_tokens_details` only where the version has the field (`details`)."""
    u = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached or 0} if cache_report else None,
        "reasoning_tokens": reasoning,
    }
    if details:
        u["completion_tokens_details"] = {"reasoning_tokens": reasoning} if reasoning > 0 else None
    return u


# ---------------------------------------------------------------- errors (§4)


def error_body(message: str, status: int, type_: str | None = None) -> bytes:
    """`serving_base.create_error_response`: compact ORJSON `{"object":"error",...}`."""
    if type_ is None:
        type_ = "BadRequestError" if status == 400 else str(status)
    return dumps({"object": "error", "message": message, "type": type_, "param": None, "code": status})


def validation_error_body(errors: list, path: str | None, version: tuple[int, ...]) -> bytes:
    """FastAPI RequestValidationError rewritten to 400 by SGLang (`type` is the status phrase "Bad Request");
    `path` None for the content-type check, which FastAPI reports without the route's location."""
    return error_body(validation.message(errors, path, version), 400, HTTPStatus.BAD_REQUEST.phrase)


def stream_error_event(message: str, status: int) -> bytes:
    """0.5.23 in-stream error: `json.dumps` with its default spaced separators, `type` = the HTTPStatus name."""
    err = {
        "object": "error",
        "message": message,
        "type": HTTPStatus(status).name,
        "param": None,
        "code": status,
    }
    return b"data: " + json.dumps({"error": err}, ensure_ascii=False).encode() + b"\n\n"


def context_too_long(n: int, ctx: int) -> str:
    return f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens)."


def context_exceeded(n: int, m: int, ctx: int) -> str:
    return (
        f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested a total "
        f"of {n + m} tokens: {n} tokens from the input messages and {m} tokens for the completion. Please reduce "
        f"the number of tokens in the input messages or the completion to fit within the limit."
    )


QUEUE_FULL = "The request queue is full."
MODEL_NOT_FOUND = "The model '{}' does not exist"


def model_not_found_body(model_id: str) -> bytes:
    return dumps(
        {
            "error": {
                "message": MODEL_NOT_FOUND.format(model_id),
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        }
    )


# ---------------------------------------------------------------- chat stream (§3)


class ChatChunks:
    """Constant pieces of one chat stream's chunks; `content(text)` etc. return a whole `data: ...\\n\\n` event."""

    __slots__ = ("head", "content_pre", "reason_pre", "mid", "tail", "legacy", "role_event", "id", "created", "ix")  # fmt: skip

    def __init__(self, rid: str, created: int, model: str, legacy: bool, index: int = 0):
        self.id, self.created, self.legacy = rid, created, legacy
        self.ix = b'{"index":%d' % index  # the choice's index (n > 1: each choice has its own)
        self.head = (
            b'data: {"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,"choices":['
            % (
                rid.encode(),
                created,
                jstr(model),
            )
        )
        if legacy:
            self.content_pre = self.ix + b',"delta":{"role":null,"content":"'
            self.reason_pre = self.ix + b',"delta":{"role":null,"content":null,"reasoning_content":"'
            # after content text: close it, then the remaining delta keys
            self.mid = (
                b'","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,'
                b'"matched_stop":null}]'
            )
            self.tail = b',"usage":null}\n\n'
            self.role_event = self.head + self.ix + (
                b',"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},'
                b'"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
            )
        else:
            self.content_pre = self.ix + b',"delta":{"reasoning_content":null,"content":"'
            self.reason_pre = self.ix + b',"delta":{"reasoning_content":"'
            self.mid = b'"},"logprobs":null,"finish_reason":null,"matched_stop":null}]'
            self.tail = b"}\n\n"
            self.role_event = self.head + self.ix + (
                b',"delta":{"reasoning_content":null,"role":"assistant","content":""},'
                b'"logprobs":null,"finish_reason":null,"matched_stop":null}]}\n\n'
            )

    def content(self, text: bytes, usage: bytes = b"") -> bytes:
        # usage, when given, is b',"usage":{...}' (continuous_usage_stats)
        if self.legacy:
            return b"".join(
                (self.head, self.content_pre, text, self.mid, usage or b',"usage":null', b"}\n\n")
            )
        return b"".join((self.head, self.content_pre, text, self.mid, usage, self.tail))

    def reasoning(self, text: bytes, usage: bytes = b"") -> bytes:
        if self.legacy:
            mid = b'","tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]'
            return b"".join((self.head, self.reason_pre, text, mid, usage or b',"usage":null', b"}\n\n"))
        return b"".join((self.head, self.reason_pre, text, self.mid, usage, self.tail))

    def finish(self, reason: str, matched_stop: int | str | None) -> bytes:
        ms = (
            b"null"
            if matched_stop is None
            else (jstr(matched_stop) if isinstance(matched_stop, str) else b"%d" % matched_stop)
        )
        if self.legacy:
            delta = b'{"role":null,"content":null,"reasoning_content":null,"tool_calls":null}'
            end = b',"usage":null}\n\n'
        else:
            delta = b'{"reasoning_content":null}'
            end = b"}\n\n"
        return b'%s%s,"delta":%s,"logprobs":null,"finish_reason":"%s","matched_stop":%s}]%s' % (
            self.head,
            self.ix,
            delta,
            reason.encode(),
            ms,
            end,
        )

    def usage(self, usage: dict) -> bytes:
        return self.head + b'],"usage":' + dumps(usage) + b"}\n\n"


class CompletionChunks:
    """`/v1/completions` stream chunks (pydantic `model_dump_json`, so `"usage":null` ends each chunk)."""

    __slots__ = ("head", "tail", "id", "created", "text_pre")

    def __init__(self, rid: str, created: int, model: str, index: int = 0):
        self.id, self.created = rid, created
        self.text_pre = b'{"index":%d,"text":"' % index  # the choice's index (n > 1: each choice has its own)
        self.head = b'data: {"id":"%s","object":"text_completion","created":%d,"model":%s,"choices":[' % (
            rid.encode(),
            created,
            jstr(model),
        )
        self.tail = b'","logprobs":null,"finish_reason":null,"matched_stop":null}]'

    def content(self, text: bytes, usage: bytes = b"") -> bytes:
        return b"".join(
            (self.head, self.text_pre, text, self.tail, usage or b',"usage":null', b"}\n\n")
        )

    def last(self, text: bytes, reason: str, matched_stop: int | None, usage: bytes = b"") -> bytes:
        ms = b"null" if matched_stop is None else b"%d" % matched_stop
        return b'%s%s%s","logprobs":null,"finish_reason":"%s","matched_stop":%s}]%s}\n\n' % (
            self.head,
            self.text_pre,
            text,
            reason.encode(),
            ms,
            usage or b',"usage":null',
        )

    def usage(self, usage: dict) -> bytes:
        # serving_completions.py writes its final usage chunk with `model_dump_json(exclude_none=True)`
        usage = {k: v for k, v in usage.items() if v is not None}
        return self.head + b'],"usage":' + dumps(usage) + b"}\n\n"


# ---------------------------------------------------------------- whole bodies


def chat_response(
    rid: str,
    created: int,
    model: str,
    content: str | None,
    reasoning: str | None,
    finish: str,
    matched_stop,
    usage: dict,
    tool_calls: bool = True,
) -> bytes:
    """`tool_calls`: whether the message keeps a null `"tool_calls"` (before MESSAGE_TOOL_CALLS_UNTIL)."""
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        message["tool_calls"] = None
    return dumps(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": matched_stop,
                }
            ],
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }
    )


def completion_response(
    rid: str, created: int, model: str, text: str, finish: str, matched_stop, usage: dict
) -> bytes:
    return dumps(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": finish,
                    "matched_stop": matched_stop,
                }
            ],
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }
    )


def finish_reason_obj(reason: str | None, completion: int, eos_id: int, abort: tuple | None = None):
    """Native `/generate` finish_reason: `{"type":"length","length":N}`, `{"type":"stop","matched":id}`, or abort."""
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": completion}
    if reason == "stop":
        return {"type": "stop", "matched": eos_id}
    msg, status = abort or (None, None)
    out = {"type": "abort", "message": msg or "Abort before prefill"}
    if status:
        out["status_code"] = status
        out["err_type"] = HTTPStatus(status).name
    return out
