"""Logprobs on the emulator: SGLang's format with invented values (sim/logprobs.py). The bytes are compared with
SGLang's own serving code in test_conformance_serving.py (one token per event); here: chunks of several tokens
(`--stream-interval 2`), where 0.5.11 gives every token of a chunk the first token's alternatives and 0.5.23 each
its own, values ≤ 0 with the emitted token first and lower alternatives, and the same values streamed and in a body."""

from __future__ import annotations

import json

import pytest

from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http, sse_events

MSG = [{"role": "user", "content": "Say something."}]


def _post(sim, path, body):
    body = {"model": "m", "max_tokens": 8, "ignore_eos": True, "temperature": 0, **body}
    status, _, out = http(
        "POST", sim.base_url + path, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    assert status == 200, out
    return out


@pytest.mark.parametrize("version", ["0.5.11", "0.5.23"])
def test_multi_token_chunks_and_body(version):
    args = ["--model-path", "Qwen/Qwen3.6-27B", "--context-length", "4096", "--stream-interval", "2",
            "--sim-sglang-version", version]  # fmt: skip
    with start_sim(args) as sim:
        req = {"messages": MSG, "logprobs": True, "top_logprobs": 3}
        chunks = [
            json.loads(e)
            for e in sse_events(_post(sim, "/v1/chat/completions", {**req, "stream": True}))[:-1]
        ]
        body = json.loads(_post(sim, "/v1/chat/completions", req))
        comp = [json.loads(e) for e in sse_events(_post(sim, "/v1/completions",
                                                        {"prompt": "Once upon", "logprobs": 2, "stream": True}))[:-1]]  # fmt: skip
    items = []
    for c in chunks:
        ch = c["choices"][0]
        if ch["delta"].get("content"):
            lp = ch["logprobs"]["content"]
            assert "".join(x["token"] for x in lp) == ch["delta"]["content"]
            assert len(lp) == 2
            tops = [[t["token"] for t in x["top_logprobs"]] for x in lp]
            if version == "0.5.11":
                assert tops[1] == tops[0]
            else:
                assert [t[0] for t in tops] == [x["token"] for x in lp]
            items.extend(lp)
        else:
            assert ch["logprobs"] is None
    assert len(items) == 8
    for x in body["choices"][0]["logprobs"]["content"]:
        assert x["bytes"] == list(x["token"].encode())
        assert x["logprob"] <= 0
        top = x["top_logprobs"]
        assert len(top) == 3 and top[0]["token"] == x["token"] and top[0]["logprob"] == x["logprob"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert len({t["token"] for t in top}) == 3
    # same prompt, greedy: the body's tokens and values are the stream's (0.5.23: alternatives too)
    strip = (lambda x: {**x, "top_logprobs": None}) if version == "0.5.11" else (lambda x: x)
    assert [strip(x) for x in body["choices"][0]["logprobs"]["content"]] == [strip(x) for x in items]
    toks = [t for c in comp for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])]
    assert "".join(toks) == "".join(c["choices"][0]["text"] for c in comp)
    assert all(
        len(d) == 2
        for c in comp
        if c["choices"][0]["logprobs"]
        for d in c["choices"][0]["logprobs"]["top_logprobs"]
    )
