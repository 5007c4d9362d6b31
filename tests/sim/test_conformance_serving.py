"""The emulator's answers byte for byte against SGLang's own OpenAI serving code, per emulated version (0.5.11, 0.5.23).

SGLang's serving classes run on CPU here (`sglang_reference.py`, `serve`): its `OpenAIServingChat` and
`OpenAIServingCompletion` (`entrypoints/openai/serving_chat.py`, `serving_completions.py`, `serving_base.py`, with
`sse_utils.py`, `usage_processor.py` and `protocol.py`) behind its own route functions from `http_server.py`, in the
child process of the installed wheel (`sglang==<v> --no-deps`). What stands in for what cannot run here:
- the engine: a stub TokenizerManager whose `generate_request` yields the output dicts the real one yields (text so
  far, `meta_info` with id, finish_reason, prompt/completion/cached/reasoning tokens; `index` when n > 1);
- the request's conversion to the engine's input (`_convert_to_internal_request`: chat template, tokenization) is
  replaced by a bare `GenerateReqInput`: the stub engine does not read it, and no bytes of the answer come from it;
- the configuration (`runtime_context.get_serving/get_model/get_observability` in 0.5.23, `server_args` in 0.5.11):
  a bag with SGLang's defaults for what this path reads (no cache report, no default usage, no incremental output,
  no tool or reasoning parser) and None for the rest;
- modules that cannot be imported without a GPU stack: `scripts/sglang_flags.py`'s stubs for third-party packages
  (torch, transformers, jinja2, ...), and `sglang.*` modules whose own import raises here (a GPU probe or a stubbed
  value used at module level) keep what they defined before the error and are stubs for the rest
  (`sglang_reference._Fallback`; `managers/io_struct.py` loses only its msgpack IPC decoder defined at its end).

For each request of the catalogue the emulator answers first; its stream is then replayed into the stub engine:
each content event is one engine output carrying that event's text as the detokenized increment, under the
event's id (so the ids each chunk carries are compared too), one more completion token per output, the finish
reason on each choice's last output; a body that does not stream is one output per choice. SGLang's bytes must
equal the emulator's, status and content type included. Normalised: `"created":<int>` only (both sides stamp the
clock). Logprobs: the logprobs each emulator event carries are fed to the stub as the engine's `(logprob, token id,
token text)` triples (`output_token_logprobs`, `output_top_logprobs` when top_logprobs_num > 0, accumulated per
choice as the tokenizer manager does), and SGLang's serving code must write them back byte for byte. Each event
carries one token here, so 0.5.11's streaming quirk (every token of a chunk gets the first token's alternatives) is
not exercised; tests/sim/test_sim_logprobs.py covers it.
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
CHAT = "/v1/chat/completions"
COMPLETION = "/v1/completions"
MSG = [{"role": "user", "content": "Say something."}]
USAGE = {"stream_options": {"include_usage": True}}
CONTINUOUS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
CREATED = re.compile(rb'"created":\d+')

CATALOGUE = {
    "chat stream": (CHAT, {"messages": MSG, "stream": True}),
    "chat stream usage": (CHAT, {"messages": MSG, "stream": True, **USAGE}),
    "chat stream continuous usage": (CHAT, {"messages": MSG, "stream": True, **CONTINUOUS}),
    "chat stream n=2": (CHAT, {"messages": MSG, "stream": True, "n": 2, **USAGE}),
    "chat body": (CHAT, {"messages": MSG}),
    "chat body n=2": (CHAT, {"messages": MSG, "n": 2}),
    "completion stream": (COMPLETION, {"prompt": "Once upon", "stream": True}),
    "completion stream usage": (COMPLETION, {"prompt": "Once upon", "stream": True, **USAGE}),
    "completion stream continuous usage": (COMPLETION, {"prompt": "Once upon", "stream": True, **CONTINUOUS}),
    "completion stream n=2": (COMPLETION, {"prompt": "Once upon", "stream": True, "n": 2, **USAGE}),
    "completion body": (COMPLETION, {"prompt": "Once upon"}),
    "completion body n=2": (COMPLETION, {"prompt": "Once upon", "n": 2}),
    # logprobs: the emulator's invented values, SGLang's format
    "chat stream logprobs top 0": (
        CHAT,
        {"messages": MSG, "stream": True, "logprobs": True, "top_logprobs": 0},
    ),
    "chat stream logprobs top 3": (
        CHAT,
        {"messages": MSG, "stream": True, "logprobs": True, "top_logprobs": 3},
    ),
    "chat stream logprobs top 3 n=2": (
        CHAT,
        {"messages": MSG, "stream": True, "n": 2, "logprobs": True, "top_logprobs": 3},
    ),
    "chat stream top_logprobs without logprobs": (CHAT, {"messages": MSG, "stream": True, "top_logprobs": 3}),
    "chat body logprobs top 0": (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 0}),
    "chat body logprobs top 3": (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 3}),
    "chat body logprobs top 3 n=2": (CHAT, {"messages": MSG, "n": 2, "logprobs": True, "top_logprobs": 3}),
    "completion stream logprobs 2": (
        COMPLETION,
        {"prompt": "Once upon", "stream": True, "logprobs": 2, **USAGE},
    ),
    "completion stream logprobs 0": (COMPLETION, {"prompt": "Once upon", "stream": True, "logprobs": 0}),
    "completion stream logprobs 2 n=2": (
        COMPLETION,
        {"prompt": "Once upon", "stream": True, "n": 2, "logprobs": 2},
    ),
    "completion body logprobs 2": (COMPLETION, {"prompt": "Once upon", "logprobs": 2}),
    "completion body logprobs 2 n=2": (COMPLETION, {"prompt": "Once upon", "n": 2, "logprobs": 2}),
}


@pytest.fixture(scope="module", params=VERSIONS)
def pair(request):
    v = request.param
    ref = SGLangReference(v)
    args = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", str(CTX), "--sim-sglang-version", v]
    with start_sim(args) as sim:
        yield v, ref, sim
    ref.close()


def _finish(choice: dict, completion: int) -> dict:
    """SGLang's engine finish reason for an OpenAI choice's finish_reason / matched_stop."""
    if choice["finish_reason"] == "length":
        return {"type": "length", "length": completion}
    return {"type": "stop", "matched": choice["matched_stop"]}


def _engine_logprobs(o: dict, lp: dict | None, top: bool) -> None:
    """The engine's (logprob, token id, token text) triples behind a choice's `logprobs` (chat or completions
    shape), set on the engine output `o` as the tokenizer manager puts them in meta_info (`"top"` only with
    top_logprobs_num > 0)."""
    if lp is None:
        return
    if "content" in lp:
        o["logprobs"] = [(x["logprob"], 0, x["token"]) for x in lp["content"]]
        rows = [[(t["logprob"], 0, t["token"]) for t in x["top_logprobs"]] for x in lp["content"]]
    else:
        o["logprobs"] = [(v, 0, t) for v, t in zip(lp["token_logprobs"], lp["tokens"], strict=True)]
        rows = [[(v, 0, t) for t, v in d.items()] for d in lp["top_logprobs"]]
    if top:
        o["top"] = rows


def _outputs(path: str, body: dict, out: bytes) -> list[dict]:
    """The emulator's answer as the engine outputs SGLang's serving code would have received."""
    top = (body.get("top_logprobs") if path == CHAT else body.get("logprobs")) or 0
    if not body.get("stream"):
        obj = json.loads(out)
        u = obj["usage"]
        outs = []
        for c in obj["choices"]:
            comp = u["completion_tokens"] // len(obj["choices"])
            text = c["message"]["content"] if path == CHAT else c["text"]
            outs.append({"index": c["index"], "id": obj["id"] if c["index"] == 0 else f"choice{c['index']}",
                         "text": text, "prompt_tokens": u["prompt_tokens"], "completion_tokens": comp,
                         "finish": _finish(c, comp)})  # fmt: skip
            _engine_logprobs(outs[-1], c["logprobs"], top > 0)
        return outs
    chunks = [json.loads(e) for e in sse_events(out)[:-1]]
    usage = next((c["usage"] for c in chunks if c.get("usage") and not c["choices"]), None)
    prompt = usage["prompt_tokens"] if usage else 0
    outs: list[dict] = []
    last: dict[int, dict] = {}
    for c in chunks:
        if not c["choices"]:
            continue
        ch = c["choices"][0]
        i = ch["index"]
        text = ch["delta"].get("content") if path == CHAT else ch["text"]
        if text:
            done = sum(1 for o in outs if o["index"] == i)
            o = {
                "index": i,
                "id": c["id"],
                "text": text,
                "prompt_tokens": prompt,
                "completion_tokens": done + 1,
            }
            if c.get("usage"):  # continuous usage: the engine's counts at that output
                o["completion_tokens"] = c["usage"]["completion_tokens"]
                o["prompt_tokens"] = c["usage"]["prompt_tokens"]
            _engine_logprobs(o, ch["logprobs"], top > 0)
            outs.append(o)
            last[i] = o
        if ch["finish_reason"]:
            last[i]["finish"] = _finish(ch, last[i]["completion_tokens"])
    return outs


@pytest.mark.parametrize("case", list(CATALOGUE))
def test_answers_match_sglang_serving_byte_for_byte(pair, case):
    _, ref, sim = pair
    path, body = CATALOGUE[case]
    body = {"model": "m", "max_tokens": 5, "ignore_eos": True, **body}
    status, headers, out = http("POST", sim.base_url + path, json.dumps(body).encode(),
                                {"content-type": "application/json"})  # fmt: skip
    assert status == 200, out
    want_status, want_type, want = ref.serve(path, body, _outputs(path, body, out), context_length=CTX)
    ctype = {k.lower(): v for k, v in headers.items()}.get("content-type")
    assert (status, ctype) == (want_status, want_type)
    got, want = CREATED.sub(b'"created":0', out), CREATED.sub(b'"created":0', want)
    if body.get("stream"):  # event by event, for a readable difference
        assert got.split(b"\n\n") == want.split(b"\n\n")
    assert got == want
