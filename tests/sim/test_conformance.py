"""The emulator against SGLang's own code, per emulated version (0.5.11 and 0.5.23).

SGLang's wheel is installed with --no-deps in the set-up (`sglang_reference.py`); its pydantic protocol models and
its FastAPI request validation run in a child process. For a catalogue of requests, a request SGLang's HTTP layer
rejects must get the same status and the same body from the emulator (the message included, up to where SGLang's
source file lies on disk); a request it accepts must get an answer whose body, or every stream chunk, validates
against SGLang's response models, with SGLang's stream framing. Where SGLang's handler needs its GPU engine (the
context-length checks), the expectation is taken from its source, file and version named.
"""

from __future__ import annotations

import json
import re

import pytest
from sglang_reference import SGLangReference

from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http, sse_events

VERSIONS = ["0.5.11", "0.5.23"]
CTX = 4096
MSG = [{"role": "user", "content": "Say something."}]
JSON_CT = {"content-type": "application/json"}
FILE_RE = re.compile(r'File \\?"[^"\\]*/sglang/srt/entrypoints/http_server\.py\\?"')


@pytest.fixture(scope="module", params=VERSIONS)
def pair(request):
    v = request.param
    ref = SGLangReference(v)
    args = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", str(CTX), "--enable-metrics",
            "--sim-sglang-version", v]  # fmt: skip
    with start_sim(args) as sim:
        yield v, ref, sim
    ref.close()


def _post(sim, path: str, body, headers=JSON_CT):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, out = http("POST", sim.base_url + path, raw, headers)
    return raw, status, out


def _chunks(body: bytes) -> list[dict]:
    """The JSON events of an SSE body; SGLang's framing: `data: <json>\\n\\n` events, `data: [DONE]\\n\\n` last."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    events = sse_events(body)  # checks every event is `data: ...` and ends with a blank line
    assert events[-1] == b"[DONE]"
    return [json.loads(e) for e in events[:-1]]


# requests SGLang's HTTP layer rejects before its handler: the emulator must answer byte for byte the same
REJECTED = {
    "chat without messages": ("/v1/chat/completions", {"model": "m"}, JSON_CT),
    "chat messages not a list": ("/v1/chat/completions", {"messages": "hi"}, JSON_CT),
    "completion without prompt": ("/v1/completions", {"model": "m", "max_tokens": 4}, JSON_CT),
    "completion max_tokens=0": ("/v1/completions", {"prompt": "x", "max_tokens": 0}, JSON_CT),
    "invalid JSON": ("/v1/chat/completions", b'{"messages": [', JSON_CT),
    "JSON not an object": ("/v1/completions", b"[1, 2]", JSON_CT),
    "wrong content type": ("/v1/chat/completions", {"messages": MSG}, {"content-type": "text/plain"}),
    "chat logprobs not a boolean": ("/v1/chat/completions", {"messages": MSG, "logprobs": "maybe"}, JSON_CT),
    "chat logprobs=2": ("/v1/chat/completions", {"messages": MSG, "logprobs": 2}, JSON_CT),
    "chat logprobs list, top_logprobs fractional": (
        "/v1/chat/completions",
        {"messages": MSG, "logprobs": [1], "top_logprobs": 1.5},
        JSON_CT,
    ),
    "chat top_logprobs not a number": (
        "/v1/chat/completions",
        {"messages": MSG, "logprobs": True, "top_logprobs": "x"},
        JSON_CT,
    ),
    "completion logprobs not an integer": ("/v1/completions", {"prompt": "x", "logprobs": "two"}, JSON_CT),
    "completion logprobs an object": ("/v1/completions", {"prompt": "x", "logprobs": {}}, JSON_CT),
}


@pytest.mark.parametrize("case", list(REJECTED))
def test_rejected_requests_match_sglang_byte_for_byte(pair, case):
    _, ref, sim = pair
    path, body, headers = REJECTED[case]
    raw, status, out = _post(sim, path, body, headers)
    want_status, want = ref.http(path, raw, headers)
    assert want_status == 400, want
    assert status == want_status
    assert FILE_RE.sub("FILE", out.decode()) == FILE_RE.sub("FILE", want.decode())
    assert ref.validate("ErrorResponse", json.loads(out)) is None


# requests SGLang accepts: (path, body, SGLang's response model, its stream chunk model)
ACCEPTED = {
    "chat": ("/v1/chat/completions", {"messages": MSG, "max_tokens": 5}),
    "chat logprobs top_logprobs=2": (
        "/v1/chat/completions",
        {"messages": MSG, "max_tokens": 5, "logprobs": True, "top_logprobs": 2},
    ),
    "chat top_logprobs without logprobs": (
        "/v1/chat/completions",
        {"messages": MSG, "max_tokens": 5, "top_logprobs": 2},
    ),
    "completion logprobs=2": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 5, "logprobs": 2}),
    "chat with unknown fields": (
        "/v1/chat/completions",
        {"messages": MSG, "max_tokens": 5, "not_a_field": 1},
    ),
    "chat max_tokens=0": ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}),
    "chat logprobs": ("/v1/chat/completions", {"messages": MSG, "max_tokens": 3, "logprobs": True}),
    "chat tools": (
        "/v1/chat/completions",
        {
            "messages": MSG,
            "max_tokens": 3,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        },
    ),  # fmt: skip
    "completion": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 5}),
    "chat n=2": ("/v1/chat/completions", {"messages": MSG, "max_tokens": 5, "n": 2}),
    "completion n=2": ("/v1/completions", {"prompt": "Once upon", "max_tokens": 5, "n": 2}),
}
MODELS = {"/v1/chat/completions": ("ChatCompletionResponse", "ChatCompletionStreamResponse"),
          "/v1/completions": ("CompletionResponse", "CompletionStreamResponse")}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
@pytest.mark.parametrize("case", list(ACCEPTED))
def test_accepted_requests_validate_against_sglang_models(pair, case, stream):
    _, ref, sim = pair
    path, body = ACCEPTED[case]
    body = {**body, "stream": stream, "stream_options": {"include_usage": True}} if stream else body
    raw, status, out = _post(sim, path, body)
    assert ref.http(path, raw, JSON_CT) == (200, b'{"validated":true}')
    assert status == 200, out
    whole, chunk = MODELS[path]
    n = body.get("n", 1)
    if not stream:
        obj = json.loads(out)
        assert ref.validate(whole, obj) is None
        assert [c["index"] for c in obj["choices"]] == list(range(n))
        reasons = {c["finish_reason"] for c in obj["choices"]}
        assert reasons <= {"stop", "length"}
        comp = obj["usage"]["completion_tokens"]
        assert comp == body["max_tokens"] * n if reasons == {"length"} else comp <= body["max_tokens"] * n
        return
    chunks = _chunks(out)
    for c in chunks:
        assert ref.validate(chunk, c) is None, c
    _check_choices(chunks, n, path, body["max_tokens"])


def _check_choices(chunks: list[dict], n: int, path: str, max_tokens: int) -> None:
    """SGLang's n-choice stream (serving_chat.py / serving_completions.py, tokenizer_manager.py parallel sampling):
    one choice per chunk; each index's chunks under one id of its own (chat: its first chunk the role chunk);
    one finish reason per index (chat: after every choice's content, under the last output's id); the usage
    chunk last, its completion tokens summed over the choices (max_tokens each when every choice ends at length)."""
    usage = chunks[-1]
    body = chunks[:-1]
    assert all(len(c["choices"]) == 1 for c in body)
    finish = [(c["id"], c["choices"][0]) for c in body if c["choices"][0]["finish_reason"]]
    assert sorted(ch["index"] for _, ch in finish) == list(range(n))
    reasons = [ch["finish_reason"] for _, ch in finish]
    assert set(reasons) <= {"stop", "length"}
    assert usage["choices"] == []
    if set(reasons) == {"length"}:
        assert usage["usage"]["completion_tokens"] == max_tokens * n
    assert usage["usage"]["completion_tokens"] <= max_tokens * n
    ids = {}
    for c in body:
        ids.setdefault(c["choices"][0]["index"], set()).add(c["id"])
    if path == "/v1/chat/completions":
        content, ends = body[:-n], body[-n:]  # the finish chunks come after every choice's content
        assert [c for _, c in finish] == [c["choices"][0] for c in ends]
        assert {i for i, _ in finish} == {usage["id"]} == {content[-1]["id"]}
        firsts = {}
        for c in content:
            firsts.setdefault(c["choices"][0]["index"], c["choices"][0]["delta"])
        assert len(firsts) == n and all(d.get("role") == "assistant" for d in firsts.values())
        ids = {}
        for c in content:
            ids.setdefault(c["choices"][0]["index"], set()).add(c["id"])
    assert sorted(ids) == list(range(n)) and all(len(v) == 1 for v in ids.values())
    assert len({next(iter(v)) for v in ids.values()}) == n  # a fresh id per choice


def test_over_context_is_sglang_400(pair):
    """tokenizer_manager.py `_validate_one_request` (both versions): `input >= context_len`, and input +
    max_new_tokens > context_len, answer 400 through serving_base.py `create_error_response`."""
    _, ref, sim = pair
    long = [{"role": "user", "content": "word " * (CTX + 50)}]
    for body in ({"messages": long, "max_tokens": 4}, {"messages": MSG, "max_tokens": CTX}):
        for stream in (False, True):
            _, status, out = _post(sim, "/v1/chat/completions", {**body, "stream": stream})
            err = json.loads(out)
            assert status == 400 and ref.validate("ErrorResponse", err) is None
            assert err["type"] == "BadRequestError" and err["code"] == 400
            assert err["message"].startswith(("The input (", "Requested token count exceeds"))
