"""The emulator over real HTTP: the official openai client, exact stream bytes, endpoints, errors, /metrics."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import openai
import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from servesweep.sglang.serverargs import resolve_server
from servesweep.sim import engine as sim_engine
from servesweep.sim.answer_stream import answer_table
from servesweep.sim.cli import parse_args
from servesweep.sim.connection import Connection
from servesweep.sim.exposition import EXPECTED_0_5_23
from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http, post_json, probe, probe_many, run, sse_events
from servesweep.sim.server import SimApp
from servesweep.workload.tokenizer import load_tokenizer, render_chatml

MODEL = "Qwen/Qwen3.6-27B"


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    gt = tmp_path_factory.mktemp("sim") / "gt.jsonl"
    with start_sim(
        ["--model-path", MODEL, "--enable-metrics", "--enable-cache-report", "--served-model-name", "qwen36"],
        ground_truth=gt,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def client(sim):
    return openai.OpenAI(base_url=sim.base_url + "/v1", api_key="none", max_retries=0)


def test_openai_client_streams_chat_and_completions(sim, client):
    stream = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_completion_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    text, usage, finish, ids = [], None, None, set()
    for chunk in stream:
        ids.add(chunk.id)
        assert chunk.model == "anything"  # the request's model is echoed, not validated
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert finish == "length" and usage.completion_tokens == 12
    prompt = render_chatml([{"role": "user", "content": "Tell me a story."}])
    assert usage.prompt_tokens == len(load_tokenizer().encode(prompt))
    out = "".join(text)
    # one piece per token of the serving tokenizer, plausible text rather than an echo
    assert len(load_tokenizer().encode(out)) == 12 and "story" not in out
    assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", ids.pop())

    comp = client.completions.create(model="m", prompt="Once upon a time", max_tokens=7, stream=True)
    pieces = [c.choices[0].text for c in comp if c.choices]
    assert len(load_tokenizer().encode("".join(pieces))) == 7
    full = client.completions.create(
        model="m", prompt="Once upon a time", max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert full.usage.completion_tokens == 5 and full.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, extra_body={"ignore_eos": True}
    )
    assert chat.usage.completion_tokens == 6 and len(load_tokenizer().encode(chat.choices[0].message.content)) == 6


def test_chat_stream_bytes_match_sglang_0_5_23(sim):
    st, hdr, body = post_json(
        sim.base_url + "/v1/chat/completions",
        {"model": "qwen36", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
         "ignore_eos": True, "stream_options": {"include_usage": True}},
    )  # fmt: skip
    assert st == 200 and hdr["content-type"] == "text/event-stream; charset=utf-8"
    ev = sse_events(body)
    assert ev[-1] == b"[DONE]"
    chunks = [json.loads(e) for e in ev[:-1]]
    # role chunk first; msgspec key order
    assert json.loads(ev[0], object_pairs_hook=lambda p: [k for k, _ in p]) == [
        "id", "object", "created", "model", "choices"
    ]  # fmt: skip
    assert json.dumps(chunks[0]["choices"][0], separators=(",", ":")) == (
        '{"index":0,"delta":{"reasoning_content":null,"role":"assistant","content":""},'
        '"logprobs":null,"finish_reason":null,"matched_stop":null}'
    )
    content = chunks[1:6]
    for raw, c in zip(ev[1:6], content, strict=True):
        assert raw.startswith(
            b'{"id":"' + c["id"].encode() + b'","object":"chat.completion.chunk","created":'
        )
        assert b'"choices":[{"index":0,"delta":{"reasoning_content":null,"content":"' in raw
        assert raw.endswith(b'"},"logprobs":null,"finish_reason":null,"matched_stop":null}]}')
        assert "usage" not in c
    fin = ev[6]
    assert fin.endswith(
        b'"choices":[{"index":0,"delta":{"reasoning_content":null},"logprobs":null,"finish_reason":"length",'
        b'"matched_stop":null}]}'
    )
    usage = ev[7]
    assert re.fullmatch(
        rb'\{"id":"[0-9a-f]{32}","object":"chat.completion.chunk","created":\d+,"model":"qwen36","choices":\[\],'
        rb'"usage":\{"prompt_tokens":\d+,"total_tokens":\d+,"completion_tokens":5,'
        rb'"prompt_tokens_details":\{"cached_tokens":\d+\},"reasoning_tokens":0,"completion_tokens_details":null\}\}',
        usage,
    ), usage
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1


def test_usage_only_on_request_and_continuous_usage(sim):
    st, _, body = post_json(
        sim.base_url + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
            "ignore_eos": True,
        },
    )
    ev = sse_events(body)
    assert all(b'"usage"' not in e for e in ev) and ev[-1] == b"[DONE]"
    st, _, body = post_json(
        sim.base_url + "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True, "ignore_eos": True,
         "stream_options": {"continuous_usage_stats": True}},
    )  # fmt: skip
    chunks = [json.loads(e) for e in sse_events(body)[:-1]]
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 2, 3, 4]
    assert "usage" not in chunks[0] and "usage" not in chunks[-1]  # not on the role or finish chunks


def test_cached_tokens_and_cache_salt(sim):
    words = " ".join(["alpha beta gamma delta"] * 150)
    req = {"model": "m", "prompt": words, "max_tokens": 2, "ignore_eos": True}
    post_json(sim.base_url + "/v1/completions", req)
    _, _, b2 = post_json(sim.base_url + "/v1/completions", req)
    u2 = json.loads(b2)["usage"]
    assert u2["prompt_tokens_details"]["cached_tokens"] >= u2["prompt_tokens"] - 16
    _, _, b3 = post_json(sim.base_url + "/v1/completions", {**req, "cache_salt": "tenant-42"})
    assert json.loads(b3)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_native_generate_cumulative_text(sim):
    st, _, body = http(
        "POST",
        sim.base_url + "/generate",
        json.dumps(
            {"text": "Hello", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}, "stream": True}
        ).encode(),
    )
    ev = sse_events(body)
    assert ev[-1] == b"[DONE]"
    objs = [json.loads(e) for e in ev[:-1]]
    texts = [o["text"] for o in objs]
    assert all(texts[i].startswith(texts[i - 1]) for i in range(1, len(texts)))
    assert [o["meta_info"]["completion_tokens"] for o in objs] == [1, 2, 3, 4]
    assert objs[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert all(o["meta_info"]["finish_reason"] is None for o in objs[:-1])
    assert len(objs[-1]["output_ids"]) == 4 and "e2e_latency" in objs[-1]["meta_info"]
    st, _, body = http("POST", sim.base_url + "/generate", json.dumps({"input_ids": [1, 2, 3]}).encode())
    out = json.loads(body)
    assert (
        st == 200
        and out["meta_info"]["prompt_tokens"] == 3
        and out["meta_info"]["finish_reason"]["type"]
        in (
            "length",
            "stop",
        )
    )


def test_models_model_info_and_errors_of_the_http_layer(sim):
    st, _, body = http("GET", sim.base_url + "/v1/models")
    card = json.loads(body)["data"][0]
    assert card["id"] == "qwen36" and card["owned_by"] == "sglang" and card["root"] == MODEL
    assert card["max_model_len"] == 262144
    st, _, body = http("GET", sim.base_url + "/v1/models/nope")
    assert st == 404 and body == (
        b'{"error":{"message":"The model \'nope\' does not exist","type":"invalid_request_error",'
        b'"param":"model","code":"model_not_found"}}'
    )
    st, _, body = http("GET", sim.base_url + "/model_info")
    info = json.loads(body)
    assert info["architectures"] and info["served_model_name"] == "qwen36" and info["is_generation"] is True
    assert http("GET", sim.base_url + "/v1/chat/completions")[::2] == (
        405,
        b'{"detail":"Method Not Allowed"}',
    )
    assert http("GET", sim.base_url + "/no/such/path")[::2] == (404, b'{"detail":"Not Found"}')
    st, _, body = http("POST", sim.base_url + "/v1/chat/completions", b"{}", {"content-type": "text/plain"})
    assert st == 400
    err = json.loads(body)
    assert err["type"] == "Bad Request" and "Only 'application/json' is allowed" in err["message"]
    st, _, body = http(
        "POST", sim.base_url + "/v1/chat/completions", b"{not json", {"content-type": "application/json"}
    )
    assert st == 400 and "JSON decode error" in json.loads(body)["message"]


def test_flush_cache_refuses_while_busy(sim):
    text = (
        b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
        b"the operation will not be performed.)\n"
    )
    st, _, body = http("POST", sim.base_url + "/flush_cache")
    assert (st, body) == (200, text)
    box = {}

    def long_stream():
        box["r"] = post_json(
            sim.base_url + "/v1/completions",
            {"prompt": "x", "max_tokens": 300, "ignore_eos": True, "stream": True},
        )

    t = threading.Thread(target=long_stream)
    t.start()
    time.sleep(0.3)
    st, _, body = http("GET", sim.base_url + "/flush_cache")
    t.join(30)
    # http_server.py flush_cache: the scheduler's FlushCacheReqOutput(success=False) has no message
    assert (st, body) == (400, b"Flush cache failed.\n")
    assert box["r"][0] == 200


def test_abort_request_ends_the_stream_with_abort(sim):
    async def go():
        import asyncio

        task = asyncio.ensure_future(
            probe(sim.host, sim.port, "/v1/chat/completions",
                  {"messages": [{"role": "user", "content": "x"}], "max_tokens": 600, "ignore_eos": True,
                   "stream": True, "rid": "abort-me-1"})
        )  # fmt: skip
        await asyncio.sleep(0.8)
        st, _, _ = post_json(sim.base_url + "/abort_request", {"rid": "abort-me-1"})
        assert st == 200
        return await task

    res = run(go())
    chunks = res.json_events()
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert 0 < len(res.token_events()) < 600


def test_metrics_names_types_and_counts(sim):
    for stream in (True, False):
        post_json(sim.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": stream})
    st, hdr, body = http("GET", sim.base_url + "/metrics")
    assert st == 200
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    # prometheus_client's parser strips the _total suffix of counters
    for name, typ in EXPECTED_0_5_23.items():
        assert name in fams, name
        assert fams[name].type == typ, (name, fams[name].type)
    ttft = fams["sglang:time_to_first_token_seconds"]
    les = [
        s.labels["le"]
        for s in ttft.samples
        if s.name.endswith("_bucket") and s.labels["is_streaming"] == "true"
    ]
    assert les[:3] == ["0.1", "0.2", "0.4"] and les[-2:] == ["400.0", "+Inf"]
    run_g = fams["sglang:num_running_reqs"].samples[0].labels
    assert run_g == {
        "engine_type": "unified",
        "model_name": "qwen36",
        "moe_ep_rank": "0",
        "pp_rank": "0",
        "tp_rank": "0",
    }
    gen = {s.labels["is_streaming"]: s.value for s in fams["sglang:generation_tokens"].samples}
    assert gen["true"] > 0 and gen["false"] > 0
    assert "# HELP sglang:prompt_tokens_total Number of prefill tokens processed." in body.decode()
    assert "_created" not in body.decode()
    before = gen["true"]
    post_json(
        sim.base_url + "/v1/completions", {"prompt": "x", "max_tokens": 3, "ignore_eos": True, "stream": True}
    )
    _, _, body = http("GET", sim.base_url + "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    after = {s.labels["is_streaming"]: s.value for s in fams["sglang:generation_tokens"].samples}["true"]
    assert after == before + 3


def test_ground_truth_matches_what_the_client_received(sim):
    payloads = [
        {
            "messages": [{"role": "user", "content": f"q{i}"}],
            "max_tokens": 6 + i,
            "ignore_eos": True,
            "stream": True,
        }
        for i in range(4)
    ]
    res = run(
        probe_many(sim.host, sim.port, "/v1/chat/completions", payloads, headers=None)
    )  # no X-Request-Id: ids are the response ids
    ids = {r.json_events()[0]["id"]: r for r in res}
    deadline = time.time() + 5
    while time.time() < deadline:
        lines = {ln["id"]: ln for ln in sim.read_ground_truth() if ln["id"] in ids}
        if len(lines) == len(ids):
            break
        time.sleep(0.2)
    assert len(lines) == len(ids)
    for rid, r in ids.items():
        ln = lines[rid]
        assert len(ln["chunks"]) == len(r.token_events())
        assert sum(n for _, n in ln["chunks"]) == ln["completion_tokens"] == len(r.token_events())
        assert ln["recv_ns"] <= ln["headers_ns"] <= ln["chunks"][0][0] <= ln["end_ns"]
        # the client receives each chunk after the server wrote it (same monotonic clock on one host)
        for (w, _), (a, _) in zip(ln["chunks"], r.token_events(), strict=True):
            assert a >= w
        assert ln["finish_reason"] == "length" and ln["fault"] is None and ln["status"] == 200
        # every chunk was written at, never before, the engine's scheduled step end
        assert len(ln["sched_ns"]) == len(ln["chunks"])
        assert all(w >= s for (w, _), s in zip(ln["chunks"], ln["sched_ns"], strict=True))


def test_stream_stays_whole_and_in_order_when_the_socket_fills():
    """Token chunks go straight to the socket while the transport holds nothing, else through its buffer. Here the
    server's socket has a small send buffer and the client reads slower than the stream comes, so the socket fills,
    drains a little and fills again many times: every chunk must still arrive once and in order (a chunk written
    around buffered bytes breaks the chunked encoding or the word order). The emulator's app runs in this process
    on a real uvloop loop and a real TCP connection, because only here can the server end's buffer be made small."""
    n = 600
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "slow"}],
            "max_tokens": n,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
    args = parse_args(["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--sim-calibration", "speedup=4"])
    resolved = resolve_server({k: v for k, v in vars(args).items() if k != "launch_command"}, {})
    data = bytearray()

    def slow_client(port: int) -> None:
        with socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small window: the server end fills
            c.settimeout(30)
            c.connect(("127.0.0.1", port))
            c.sendall(request)
            t0 = time.monotonic()
            while chunk := c.recv(512 if time.monotonic() - t0 < 1.5 else 65536):
                data.extend(chunk)
                if time.monotonic() - t0 < 1.5:
                    time.sleep(0.004)  # ~125 KB/s: slower than the stream

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        app = SimApp(args, resolved, sim_engine)
        app.loop = loop
        app.load()
        app.ready = True
        app.engine.start(loop)
        ls = socket.create_server(("127.0.0.1", 0))
        ls.setblocking(False)
        client = threading.Thread(target=slow_client, args=(ls.getsockname()[1],))
        client.start()
        srv, _ = await loop.sock_accept(ls)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # fixed (no autotuning): it fills at once
        await loop.connect_accepted_socket(lambda: Connection(app), srv)
        await asyncio.wait_for(loop.run_in_executor(None, client.join), 30)
        await app.engine.stop()
        ls.close()

    uvloop.run(scenario())
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    payload = bytearray()
    while True:  # decode the chunked encoding strictly: every size line must match its data
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert rest == b"\r\n"
            break
        payload += rest[:size]
        assert rest[size : size + 2] == b"\r\n", "chunk data does not end where its size line says"
        rest = rest[size + 2 :]
    events = sse_events(bytes(payload))
    assert events[-1] == b"[DONE]"
    objs = [json.loads(e) for e in events[:-1]]
    text = "".join(o["choices"][0]["delta"].get("content") or "" for o in objs if o["choices"])
    assert objs[0]["choices"][0]["delta"]["role"] == "assistant"
    assert objs[-1]["choices"][0]["finish_reason"] == "length"
    assert len([o for o in objs if o["choices"] and o["choices"][0]["delta"].get("content")]) == n
    # exactly the emulator's answer to this prompt, one token per chunk: nothing lost, doubled or swapped
    table = answer_table("slow", n, 0, seed=args.sim_seed, fault=None, prompt_tokens=0, speculative=False,
                         tokenizer=load_tokenizer(None))  # fmt: skip
    assert text == "".join(table.words)


def test_native_generate_batch_like_bench_one_batch_server(sim):
    """A batched /generate (what sglang.bench_one_batch_server sends): events carry "index", one [DONE] at the end."""
    batch = {
        "input_ids": [[11, 12, 13, 14], [21, 22, 23], [31, 32]],
        "sampling_params": {"max_new_tokens": 5, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    st, _, body = http("POST", sim.base_url + "/generate", json.dumps(batch).encode())
    ev = sse_events(body)
    assert st == 200 and ev[-1] == b"[DONE]" and ev.count(b"[DONE]") == 1
    objs = [json.loads(e) for e in ev[:-1]]
    assert sorted({o["index"] for o in objs}) == [0, 1, 2]
    for i in range(3):
        mine = [o for o in objs if o["index"] == i]
        assert [o["meta_info"]["completion_tokens"] for o in mine] == [1, 2, 3, 4, 5]
        assert mine[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
        assert mine[0]["meta_info"]["prompt_tokens"] == len(batch["input_ids"][i])
        assert list(mine[0]) == ["text", "output_ids", "meta_info", "index"]
    batch["stream"] = False
    batch["text"], batch["input_ids"] = ["Hello there", "Hi"], None
    del batch["input_ids"]
    st, _, body = http("POST", sim.base_url + "/generate", json.dumps(batch).encode())
    outs = json.loads(body)
    assert st == 200 and isinstance(outs, list) and len(outs) == 2
    assert all(o["meta_info"]["completion_tokens"] == 5 and len(o["output_ids"]) == 5 for o in outs)
    assert all("index" not in o for o in outs)
