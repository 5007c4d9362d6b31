"""Each injected fault does what it says, by header and at a seeded rate, and the ground truth records it."""

from __future__ import annotations

import json
import time

import openai
import pytest

from servesweep.sim.launch import start_sim
from servesweep.sim.probe import probe, probe_many, run
from servesweep.workload.tokenizer import load_tokenizer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = "/v1/chat/completions"


def body(max_tokens: int = 12, **kw) -> dict:
    return {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        **kw,
    }


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("faults") / "gt.jsonl"
    with start_sim(["--model-path", MODEL], ground_truth=gt) as s:
        yield s


def one(sim, fault: str, max_tokens: int = 12, rid: str | None = None):
    headers = {"X-Sim-Fault": fault}
    if rid:
        headers["X-Request-Id"] = rid
    return run(probe(sim.host, sim.port, CHAT, body(max_tokens), headers=headers, timeout=30))


def gt_line(sim, rid: str) -> dict:
    deadline = time.time() + 5
    while time.time() < deadline:
        for ln in sim.read_ground_truth():
            if ln["id"] == rid:
                return ln
        time.sleep(0.1)
    raise AssertionError(f"no ground-truth line for {rid}")


@pytest.mark.parametrize("code", ["429", "500", "503"])
def test_status_faults_before_the_stream(sim, code):
    r = one(sim, code, rid=f"st-{code}")
    assert r.status == int(code) and r.events == []
    err = json.loads(r.body)
    assert err["object"] == "error" and err["code"] == int(code) and "injected fault" in err["message"]
    assert gt_line(sim, f"st-{code}")["fault"] == code


def test_openai_client_sees_rate_limit(sim):
    c = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError):
        c.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_headers={"X-Sim-Fault": "429"}
        )


def test_disconnect_mid_stream(sim):
    r = one(sim, "disconnect:3", max_tokens=20, rid="dc-1")
    assert r.status == 200 and r.error is not None  # the socket closed before the stream ended
    assert len(r.token_events()) == 3 and all(raw != b"[DONE]" for _, raw in r.events)
    ln = gt_line(sim, "dc-1")
    assert len(ln["chunks"]) == 3 and ln["fault"] == "disconnect:3"


def test_error_event_then_done(sim):
    r = one(sim, "error_event:2", max_tokens=20)
    assert r.status == 200 and r.error is None
    raws = [raw for _, raw in r.events]
    assert raws[-1] == b"[DONE]"
    assert raws[-2] == (
        b'{"error": {"object": "error", "message": "Injected fault: error event", "type": "INTERNAL_SERVER_ERROR", '
        b'"param": null, "code": 500}}'
    )
    assert len(r.token_events()) == 2


def test_stall_pauses_the_stream(sim):
    r = one(
        sim, "stall:0.5", max_tokens=200
    )  # ~1 s of generation on this profile: it goes on after the stall
    gaps = r.itls_s()
    assert max(gaps) >= 0.45 and sorted(gaps)[len(gaps) // 2] < 0.1
    # nothing is lost: the tokens generated during the stall arrive together right after it
    chunks = r.json_events()
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    tok = load_tokenizer()  # the emulator's: one token per piece of text
    tokens = [len(tok.encode(c["choices"][0]["delta"].get("content", ""))) for c in chunks if c["choices"]]
    assert sum(tokens) == 200
    assert max(tokens) >= 20


def test_malformed_chunk(sim):
    r = one(sim, "malformed:1", max_tokens=6)
    bad = []
    for _, raw in r.events:
        if raw == b"[DONE]":
            continue
        try:
            json.loads(raw)
        except ValueError:
            bad.append(raw)
    assert len(bad) == 1 and r.events[-1][1] == b"[DONE]"
    assert len(r.token_events()) == 6


def test_slow_first_byte(sim):
    r = one(sim, "slow_first_byte:1.0", max_tokens=4)
    assert (r.headers_ns - r.send_ns) / 1e9 >= 0.95
    assert r.status == 200 and len(r.token_events()) == 4


def test_bad_fault_header_is_a_clear_400(sim):
    r = one(sim, "teapot")
    assert r.status == 400 and "unknown fault kind 'teapot'" in json.loads(r.body)["message"]


def test_fault_rate_is_seeded_and_recorded(tmp_path):
    gt = tmp_path / "gt.jsonl"
    args = ["--model-path", MODEL, "--sim-fault-rate", "429=0.5", "--sim-seed", "3"]
    statuses = []
    for _ in range(2):
        with start_sim(args, ground_truth=gt) as s:
            res = run(probe_many(s.host, s.port, CHAT, [body(2) for _ in range(30)]))
            statuses.append(sorted(r.status for r in res))
    assert statuses[0] == statuses[1]  # same seed, same number of injected faults
    n429 = statuses[0].count(429)
    assert 7 <= n429 <= 23 and statuses[0].count(200) == 30 - n429
    lines = [json.loads(x) for x in gt.read_text().splitlines()]
    assert len(lines) == 60 and sum(ln["fault"] == "429" for ln in lines) == 2 * n429


def test_faults_on_non_streaming_requests(sim):
    def ns(fault: str):
        b = body(8)
        b["stream"] = False
        return run(probe(sim.host, sim.port, CHAT, b, headers={"X-Sim-Fault": fault}, timeout=30))

    r = ns("disconnect")
    assert r.status == 0 and r.error is not None  # closed without a response
    r = ns("error_event")
    assert r.status == 500 and json.loads(r.body)["message"] == "Injected fault: error event"
    r = ns("malformed")
    assert r.status == 200
    with pytest.raises(ValueError):
        json.loads(r.body)
    t0 = time.monotonic()
    r = ns("stall:0.6")
    assert r.status == 200 and time.monotonic() - t0 >= 0.55
    assert json.loads(r.body)["usage"]["completion_tokens"] == 8
