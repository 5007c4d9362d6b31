"""Real SGLang 0.5.23 on this CPU: it starts with the CPU flags, answers what servesweep reads (/health,
/get_server_info, a streamed chat with usage, /metrics), touches no sgl_kernel helper the stand-in lacks, and
SIGTERM to its launcher stops it and every process it started. One server serves the whole file (the last test
stops it): test_vs_emulator.py's, the CPU flags with `enable_cache_report` (the tier runs this file after that one,
conftest.FILE_ORDER), so no server starts for this file."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import requests
from test_vs_emulator import FLAGS  # the server test_vs_emulator.py started (conftest.FILE_ORDER)
from tokenizers import Tokenizer

import servesweep.sglang.cpu.env as cpu_env

TEMPLATE = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def _stream_chat(url: str, content: str, max_tokens: int) -> list[dict]:
    body = {
        "model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 1.0,
    }
    chunks = []
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == b"data: [DONE]", lines[-3:]
    for ln in lines[:-1]:
        assert ln.startswith(b"data: "), ln
        chunks.append(json.loads(ln[6:]))
    return chunks


def test_health_server_info_and_stream(sglang_server, sglang_cpu_env):
    srv = sglang_server(FLAGS)
    assert requests.get(srv.base_url + "/health", timeout=30).status_code == 200
    info = requests.get(srv.base_url + "/get_server_info", timeout=30).json()
    assert info["version"] == cpu_env.SGLANG_VERSION
    assert (info["device"], info["attention_backend"]) == ("cpu", "torch_native")
    assert info["context_length"] == 4096
    assert info["max_total_num_tokens"] == 16384  # the KV pool from --max-total-tokens, not from GPU memory
    assert info["model_path"] == str(sglang_cpu_env.model)

    content = "Find the needle in the haystack and say the secret number."
    chunks = _stream_chat(srv.base_url, content, max_tokens=24)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text, "the random model streamed no text"
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish == ["length"]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 24
    # the server counts the prompt with its chat template, exactly as the model's tokenizer does
    tok = Tokenizer.from_file(str(sglang_cpu_env.tokenizer_json))
    expected = len(tok.encode(TEMPLATE.format(content=content), add_special_tokens=False).ids)
    assert usage["usage"]["prompt_tokens"] == expected

    metrics = requests.get(srv.base_url + "/metrics", timeout=30).text
    families = {ln.split()[2] for ln in metrics.splitlines() if ln.startswith("# TYPE sglang:")}
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds"):
        assert name in families, f"{name} missing from real SGLang's /metrics ({len(families)} families)"
    assert len(families) >= 60


def test_no_unimplemented_sgl_kernel_helper_is_called(sglang_server):
    """The stand-in recorded every helper SGLang looked up while starting and serving (the test above streamed):
    none it does not implement was called, and each one looked up is one the stand-in lists (NOT_NEEDED) with
    the reason, so a new SGLang that reaches for another helper fails here."""
    from test_stand_in import stand_in_lists

    srv = sglang_server(FLAGS)
    _stream_chat(srv.base_url, "one more request through prefill and decode", max_tokens=8)
    implemented, not_needed = stand_in_lists()
    lines = set(srv.record_path.read_text().split("\n")) - {""} if srv.record_path.exists() else set()
    called = sorted(ln.split(" ", 1)[1] for ln in lines if ln.startswith("call "))
    assert called == [], f"SGLang called sgl_kernel helpers the stand-in does not implement: {called}"
    looked_up = {ln.split(" ", 1)[1] for ln in lines if ln.startswith("lookup ")}
    assert looked_up, "the stand-in recorded nothing: was it on the server's PYTHONPATH?"
    unknown = sorted(looked_up - set(not_needed) - set(implemented))
    assert unknown == [], f"SGLang looks up sgl_kernel helpers the stand-in does not list: {unknown}"


def test_sigterm_stops_the_server_and_its_children(sglang_server):
    srv = sglang_server(FLAGS)
    leader = psutil.Process(srv.pid)
    family = [leader, *leader.children(recursive=True)]
    names = {p.name() for p in family}
    assert len(family) >= 3, f"expected the launcher, scheduler and detokenizer: {names}"
    os.kill(srv.pid, signal.SIGTERM)  # the launcher only, as a user's Ctrl-C/kill would
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_running(p) for p in family):
        time.sleep(0.2)
    left = [(p.pid, p.name()) for p in family if _running(p)]
    assert left == [], f"still running 30 s after SIGTERM to SGLang's launcher: {left}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
