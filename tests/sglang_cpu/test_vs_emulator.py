"""The emulator against real SGLang 0.5.23, side by side: one request catalogue sent to both.

Real SGLang runs on this CPU with the tiny random model (`sglang_server`, tests/sglang_cpu/conftest.py); the
emulator (`servesweep sim`) starts with the same model folder (so the same tokenizer, chat template and context
length) and the same flags, rendered from the same ServerArgs fields. Both get, in the same order: chat and
completions, stream and body, `stream_options.include_usage` / `continuous_usage_stats`, `n: 2`, logprobs, the
400s the emulator copies (tests/sim/test_conformance.py's rejected requests and the context checks). Then
`/metrics` (family names, types, label names; at start and after the load), `/get_server_info` keys, `/health`,
`/v1/models`, `/get_model_info`, `/flush_cache`.

What must differ is normalised, nothing else: ids (their count is compared), `created`, text, token strings and
bytes, logprob values, and the chunking of a stream. The real server's detokenizer holds back incomplete UTF-8
(the random model samples single bytes) and its tokenizer manager coalesces outputs when the reader lags, so one
real chunk may carry several tokens: consecutive events of a choice that are equal once normalised count as one,
and per-chunk token lists (logprobs) count as one entry. The counts that do not depend on chunking (prompt
tokens by the same tokenizer, completion tokens, cached tokens, the number of alternatives) are compared as they
are. Every remaining difference is in one of the lists below, with its reason in docs/emulator.md ("Differences
from real SGLang (checked against the running server)"); a difference not listed fails, and so does a listed one
that went away (update the list and the doc).
"""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servesweep.sglang.flags import render_argv
from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http, sse_events

CHAT = "/v1/chat/completions"
COMPLETION = "/v1/completions"
MSG = [{"role": "user", "content": "Say something."}]
USAGE = {"stream_options": {"include_usage": True}}
CONTINUOUS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
JSON_CT = {"content-type": "application/json"}
# the module's fixture starts real SGLang: 25-30 s idle, minutes on a loaded 2-core machine
pytestmark = pytest.mark.timeout(900)
# one server of this module's own flags: its first scrape is the server's state at start (SGLang's warm-up
# request included), and the cache report puts cached-token counts in every usage, compared as they are
FLAGS = {"enable_cache_report": True}
# the same as test_conformance.py's FILE_RE: where SGLang's http_server.py lies on disk (a site-packages path
# here, the Docker image's /sgl-workspace path in the emulator: where SGLang is installed, not what it says)
FILE_RE = re.compile(r'File \\?"[^"\\]*/sglang/srt/entrypoints/http_server\.py\\?"')

ACCEPTED = {
    "chat stream": (CHAT, {"messages": MSG, "stream": True}),
    "chat stream usage": (CHAT, {"messages": MSG, "stream": True, **USAGE}),
    "chat stream continuous usage": (CHAT, {"messages": MSG, "stream": True, **CONTINUOUS}),
    "chat stream n=2": (CHAT, {"messages": MSG, "stream": True, "n": 2, **USAGE}),
    "chat stream n=2 continuous usage": (CHAT, {"messages": MSG, "stream": True, "n": 2, **CONTINUOUS}),
    "chat body": (CHAT, {"messages": MSG}),
    "chat body n=2": (CHAT, {"messages": MSG, "n": 2}),
    "chat body max_tokens=0": (CHAT, {"messages": MSG, "max_tokens": 0}),
    "completion stream": (COMPLETION, {"prompt": "Once upon", "stream": True}),
    "completion stream usage": (COMPLETION, {"prompt": "Once upon", "stream": True, **USAGE}),
    "completion stream continuous usage": (COMPLETION, {"prompt": "Once upon", "stream": True, **CONTINUOUS}),
    "completion stream n=2": (COMPLETION, {"prompt": "Once upon", "stream": True, "n": 2, **USAGE}),
    "completion body": (COMPLETION, {"prompt": "Once upon"}),
    "completion body n=2": (COMPLETION, {"prompt": "Once upon", "n": 2}),
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
        {"messages": MSG, "stream": True, "n": 2, "logprobs": True, "top_logprobs": 3, **USAGE},
    ),
    "chat stream top_logprobs without logprobs": (CHAT, {"messages": MSG, "stream": True, "top_logprobs": 3}),
    "chat body logprobs top 0": (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 0}),
    "chat body logprobs top 3 n=2": (CHAT, {"messages": MSG, "n": 2, "logprobs": True, "top_logprobs": 3}),
    "completion stream logprobs 0": (COMPLETION, {"prompt": "Once upon", "stream": True, "logprobs": 0}),
    "completion stream logprobs 2": (
        COMPLETION,
        {"prompt": "Once upon", "stream": True, "logprobs": 2, **USAGE},
    ),
    "completion stream logprobs 2 n=2": (
        COMPLETION,
        {"prompt": "Once upon", "stream": True, "n": 2, "logprobs": 2},
    ),
    "completion body logprobs 2": (COMPLETION, {"prompt": "Once upon", "logprobs": 2}),
    "completion body logprobs 2 n=2": (COMPLETION, {"prompt": "Once upon", "n": 2, "logprobs": 2}),
}
# tests/sim/test_conformance.py's requests SGLang's HTTP layer rejects, and the context-length checks of its
# tokenizer manager (the same tokenizer on both sides: the token counts in the message must agree)
LONG = [{"role": "user", "content": "word " * 4200}]
REJECTED = {
    "chat without messages": (CHAT, {"model": "m"}, JSON_CT),
    "chat messages not a list": (CHAT, {"messages": "hi"}, JSON_CT),
    "completion without prompt": (COMPLETION, {"model": "m", "max_tokens": 4}, JSON_CT),
    "completion max_tokens=0": (COMPLETION, {"prompt": "x", "max_tokens": 0}, JSON_CT),
    "invalid JSON": (CHAT, b'{"messages": [', JSON_CT),
    "JSON not an object": (COMPLETION, b"[1, 2]", JSON_CT),
    "wrong content type": (CHAT, {"messages": MSG}, {"content-type": "text/plain"}),
    "chat logprobs not a boolean": (CHAT, {"messages": MSG, "logprobs": "maybe"}, JSON_CT),
    "chat logprobs=2": (CHAT, {"messages": MSG, "logprobs": 2}, JSON_CT),
    "chat top_logprobs not a number": (
        CHAT,
        {"messages": MSG, "logprobs": True, "top_logprobs": "x"},
        JSON_CT,
    ),
    "completion logprobs not an integer": (COMPLETION, {"prompt": "x", "logprobs": "two"}, JSON_CT),
    "completion logprobs an object": (COMPLETION, {"prompt": "x", "logprobs": {}}, JSON_CT),
    "chat input over the context": (CHAT, {"messages": LONG, "max_tokens": 4}, JSON_CT),
    "chat input + max_tokens over the context": (CHAT, {"messages": MSG, "max_tokens": 4096}, JSON_CT),
    "chat stream input over the context": (
        CHAT,
        {"messages": LONG, "max_tokens": 4, "stream": True},
        JSON_CT,
    ),
    "completion input + max_tokens over the context": (
        COMPLETION,
        {"prompt": "Once upon", "max_tokens": 4096},
        JSON_CT,
    ),
}

# ---------------------------------------------------------------------------------------- the known differences
# Each is explained in docs/emulator.md, "Differences from real SGLang (checked against the running server)".
# /metrics families (prometheus_client's family names: counters without `_total`) real SGLang has and the
# emulator does not, at start and after the load alike: set by SGLang code paths the emulator has no counterpart of
REAL_ONLY_FAMILIES = {
    "sglang:cuda_graph_passes", "sglang:dp_attention_pairs", "sglang:dp_attention_steps",
    "sglang:dp_attention_sync_wait_seconds", "sglang:dp_attention_token_imbalance_ratio",
    "sglang:dp_attention_tokens", "sglang:prefill_effective_tokens", "sglang:routing_key_all_req_count",
    "sglang:routing_key_running_req_count", "sglang:routing_keys_active", "sglang:scheduler_idle_seconds",
    "sglang:scheduler_process_cpu_seconds", "sglang:scheduler_stage_seconds",
    "sglang:startup_cuda_graph_time_seconds",
}  # fmt: skip
# ... and those real SGLang has at start only because its warm-up request (a /generate before /health is 200)
# has already run through them; the emulator shows them after its first request
REAL_ONLY_AT_START = {"sglang:per_stage_req_latency_seconds", "sglang:realtime_tokens"}
# families the emulator writes from its start that real SGLang creates on an event: these three on an event the
# catalogue never causes (an abort, a structured-output request, a speculative verify step) ...
EMULATOR_ONLY_FAMILIES = {"sglang:num_aborted_requests", "sglang:num_so_requests", "sglang:spec_verify_calls"}
# ... and these on the first request with a prefix-cache hit / with two or more output tokens (the warm-up
# request has neither)
EMULATOR_ONLY_AT_START = {"sglang:cached_tokens", "sglang:inter_token_latency_seconds"}
# families both have whose label names differ: {family: (real's, the emulator's)}
LABEL_DIFFERENCES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
# /get_server_info keys (top level, and internal_states[0]) on one side only
SERVER_INFO_ONLY_REAL: set[str] = set()
SERVER_INFO_ONLY_EMULATOR = {"sim_unmodeled_flags"}  # the flags it accepts and does not model (sim/cli.py)
INTERNAL_STATE_ONLY_REAL: set[str] = set()
INTERNAL_STATE_ONLY_EMULATOR: set[str] = set()
# 400 bodies that differ in one phrase: {case: (real SGLang's, the emulator's)}. Real SGLang's routes decode the
# body with orjson (its message), the emulator's validation gives Python json's, as SGLang's handler code run
# in-process does (tests/sim/test_conformance.py)
REJECTED_DIFFERENCES = {"invalid JSON": ("unexpected end of data", "Expecting value")}
# response headers only real SGLang sends: uvicorn echoes the client's `connection: close` (urllib's); the
# emulator closes such a connection without saying so (keep-alive clients, Locust and openai, see no difference)
HEADERS_ONLY_REAL = {"connection": "close"}
# /get_model_info: 0.5.23's `embedding` block (the embedding-model plan SGLang resolves for every model)
MODEL_INFO_ONLY_REAL = {"embedding"}


# ------------------------------------------------------------------------------------------------------ servers
@pytest.fixture(scope="module")
def servers(sglang_server, sglang_cpu_env, tmp_path_factory):
    # the flags the real server gets, rendered by the same flag table: the emulator sees the same command line
    flags = {**sglang_cpu_env.base_flags, **FLAGS}
    args = ["--model-path", str(sglang_cpu_env.model), *render_argv(flags, sglang_cpu_env.version)]
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    # the emulator first: by the time real SGLang is ready (25 s or more) it is past the 5 s after which it
    # writes its process-CPU family, as SGLang is by its /health 200, so both first scrapes are states at start
    with start_sim(args, log_path=log) as sim:
        real = sglang_server(FLAGS)
        yield {"real": real, "emu": sim, "real_start": _get(real.base_url, "/metrics"),
               "emu_start": _get(sim.base_url, "/metrics")}  # fmt: skip


def _get(base: str, path: str) -> str:
    status, _, body = http("GET", base + path)
    assert status == 200, (path, body[:300])
    return body.decode()


def _send(base: str, path: str, body, headers=JSON_CT) -> tuple[int, dict, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, hdrs, out = http("POST", base + path, raw, headers, timeout=60)
    return status, {k.lower(): v for k, v in hdrs.items()}, out


# ------------------------------------------------------------------------------------------------ normalisation
class _Num(str):
    """A JSON number kept as the writer wrote it (so re-writing an event reproduces its bytes)."""


def _parse(raw: bytes):
    return json.loads(raw, parse_float=_Num, parse_int=_Num)


def _write(v) -> str:
    """Compact JSON in the parsed value's key order: SGLang's orjson/msgspec framing (no spaces, UTF-8 as is)."""
    if isinstance(v, _Num):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ",".join(_write(x) for x in v) + "]"
    return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_write(x)}" for k, x in v.items()) + "}"


def _dedupe(items: list) -> list:
    out: list = []
    for x in items:
        if not out or out[-1] != x:
            out.append(x)
    return out


def _norm_logprobs(lp, stream: bool):
    """Values and token strings out, the shape kept; in a stream, per-chunk token lists count as one entry."""
    if lp is None:
        return None
    if "content" in lp:  # chat

        def entry(e):
            out = {**e, "token": "TOK", "bytes": "BYTES", "logprob": "LP"}
            if "top_logprobs" in e:
                out["top_logprobs"] = [{**t, "token": "TOK", "bytes": "BYTES", "logprob": "LP"}
                                       for t in e["top_logprobs"]]  # fmt: skip
            return out

        content = [entry(e) for e in lp["content"]] if lp["content"] is not None else None
        return {**lp, "content": _dedupe(content) if stream and content else content}
    out = {
        **lp,
        "text_offset": list(lp["text_offset"]),
        "token_logprobs": ["LP" for _ in lp["token_logprobs"]],
        "tokens": ["TOK" for _ in lp["tokens"]],
        "top_logprobs": [
            None if d is None else {f"TOK{i}": "LP" for i in range(len(d))} for d in lp["top_logprobs"]
        ],
    }
    if stream:
        out = {k: _dedupe(v) if isinstance(v, list) else v for k, v in out.items()}
    return out


def _norm_choice(c: dict, stream: bool) -> dict:
    c = dict(c)
    for holder in ("delta", "message"):
        if isinstance(c.get(holder), dict):
            c[holder] = {k: ("TEXT" if k in ("content", "reasoning_content") and isinstance(v, str) else v)
                         for k, v in c[holder].items()}  # fmt: skip
    if isinstance(c.get("text"), str):
        c["text"] = "TEXT"
    if "logprobs" in c:
        c["logprobs"] = _norm_logprobs(c["logprobs"], stream)
    return c


def _norm(obj: dict, stream: bool) -> dict:
    o = dict(obj)
    if "id" in o:
        o["id"] = "ID"
    if "created" in o:
        o["created"] = "CREATED"
    if isinstance(o.get("choices"), list):
        o["choices"] = [_norm_choice(c, stream) for c in o["choices"]]
        if stream and o["choices"] and isinstance(o.get("usage"), dict):
            # continuous usage: the counts so far depend on how many tokens this chunk carries
            o["usage"] = {**o["usage"], "completion_tokens": "N", "total_tokens": "N"}
    return o


def _answer(status: int, headers: dict, body: bytes, stream: bool) -> dict:
    """What is compared of one answer: status, content type, and the normalised JSON (a stream: per choice, its
    events with consecutive equal ones merged; the choice-less events in order), plus the number of distinct ids
    and whether every JSON text is written compactly (re-writing it gives its bytes)."""
    out = {"status": status, "content-type": headers.get("content-type")}
    if not stream or status != 200:
        obj = _parse(body)
        out["compact"] = _write(obj).encode() == body
        out["ids"] = 1 if isinstance(obj, dict) and "id" in obj else 0
        out["body"] = _write(_norm(obj, False)) if isinstance(obj, dict) else _write(obj)
        return out
    assert body.endswith(b"data: [DONE]\n\n"), body[-300:]
    events = sse_events(body)[:-1]
    objs = [_parse(e) for e in events]
    out["compact"] = all(_write(o).encode() == e for o, e in zip(objs, events, strict=True))
    out["ids"] = len({o["id"] for o in objs})
    per_choice: dict[int, list[str]] = {}
    rest = []
    for o in objs:
        assert len(o["choices"]) <= 1, o  # SGLang streams one choice per chunk
        text = _write(_norm(o, True))
        if o["choices"]:
            per_choice.setdefault(int(o["choices"][0]["index"]), []).append(text)
        else:
            rest.append(text)
    out["choices"] = {i: _dedupe(v) for i, v in sorted(per_choice.items())}
    out["choice-less events"] = rest
    return out


def _without_weight_versions(body: bytes, max_tokens: int) -> bytes:
    """A listed difference held: real SGLang's body `metadata` has `weight_versions`, one span over choice 0's
    completion tokens, which the emulator does not write; checked here, then taken out."""
    obj = _parse(body)
    spans = obj["metadata"].pop("weight_versions")
    assert spans == [{"version": "default", "start": "0", "end": str(max_tokens)}], spans
    return _write(obj).encode()


def _diff(real, emu) -> str:
    """The lines (JSON cut at its commas) where the two sides differ: `-` real SGLang's, `+` the emulator's."""
    import difflib

    def lines(x):
        return json.dumps(x, indent=1, ensure_ascii=False).replace(",", ",\n").splitlines()

    return "\n".join(d for d in difflib.ndiff(lines(real), lines(emu)) if d[:1] in "-+")


# --------------------------------------------------------------------------------------------------------- tests
def test_answers_match_real_sglang_after_normalising(servers):
    """Every accepted request of the catalogue: status, content type, framing and JSON structure (keys, their
    order, every value not listed as normalised: finish reasons, matched_stop, usage counts, metadata) equal."""
    diffs = {}
    for case, (path, body) in ACCEPTED.items():
        body = {"model": "m", "max_tokens": 5, "ignore_eos": True, **body}
        got = {}
        for side in ("real", "emu"):
            status, headers, out = _send(servers[side].base_url, path, body)
            if side == "real" and not body.get("stream"):
                out = _without_weight_versions(out, body["max_tokens"])
            got[side] = _answer(status, headers, out, bool(body.get("stream")))
        assert got["real"]["status"] == 200, (case, got["real"])
        if got["real"] != got["emu"]:
            diffs[case] = got
    assert not diffs, "\n".join(f"{case}: {_diff(g['real'], g['emu'])}" for case, g in diffs.items())


def test_rejected_requests_match_real_sglang_byte_for_byte(servers):
    """The 400s: status, content type and body bytes equal, only the path of SGLang's http_server.py replaced."""
    diffs = {}
    for case, (path, body, headers) in REJECTED.items():
        got = {}
        for side in ("real", "emu"):
            status, hdrs, out = _send(servers[side].base_url, path, body, headers)
            got[side] = (status, hdrs.get("content-type"), FILE_RE.sub("FILE", out.decode()))
        assert got["real"][0] == 400, (case, got["real"])
        if case in REJECTED_DIFFERENCES:
            theirs, ours = REJECTED_DIFFERENCES[case]
            assert theirs in got["real"][2] and ours not in got["real"][2], (case, got["real"])
            got["real"] = (*got["real"][:2], got["real"][2].replace(theirs, ours))
        if got["real"] != got["emu"]:
            diffs[case] = got
    assert not diffs, json.dumps(diffs, indent=1)


def _headers(base: str, method: str, path: str, body: bytes | None = None) -> dict:
    status, hdrs, out = http(method, base + path, body, JSON_CT if body else {})
    return {"status": status, **{k.lower(): v for k, v in hdrs.items() if k.lower() not in ("date",)}}


def test_response_headers_match_real_sglang(servers):
    """Header names and values (not the date; content-length where the bodies' lengths must differ) of an SSE
    stream, a JSON body, a 400, /health and /flush_cache."""
    stream = json.dumps({"model": "m", "messages": MSG, "max_tokens": 2, "stream": True}).encode()
    body = json.dumps({"model": "m", "messages": MSG, "max_tokens": 2}).encode()
    cases = {"stream": ("POST", CHAT, stream), "body": ("POST", CHAT, body), "400": ("POST", COMPLETION, b"[1]"),
             "health": ("GET", "/health", None), "flush": ("POST", "/flush_cache", b"")}  # fmt: skip
    diffs = {}
    for case, (method, path, raw) in cases.items():
        real, emu = (_headers(servers[s].base_url, method, path, raw) for s in ("real", "emu"))
        if case in ("body", "400"):  # text and the installed file's path differ in length
            real.pop("content-length"), emu.pop("content-length")
        assert {k: real.pop(k, None) for k in HEADERS_ONLY_REAL} == HEADERS_ONLY_REAL, (case, real)
        if (real, list(real)) != (emu, list(emu)):
            diffs[case] = {"real": real, "emu": emu}
    assert not diffs, json.dumps(diffs, indent=1)


def test_plain_endpoints_match_real_sglang(servers):
    """/health, /v1/models, /get_model_info, /flush_cache (GET and POST): status and bytes (the model card's
    `created` normalised); /get_model_info's keys and values, less the keys listed."""
    real, emu = servers["real"].base_url, servers["emu"].base_url
    created = re.compile(rb'"created":\d+')
    for method, path in (("GET", "/health"), ("GET", "/health_generate"), ("GET", "/v1/models"),
                         ("POST", "/flush_cache"), ("GET", "/flush_cache")):  # fmt: skip
        r, e = (http(method, b + path, b"" if method == "POST" else None) for b in (real, emu))
        assert (r[0], created.sub(b"", r[2])) == (e[0], created.sub(b"", e[2])), path
    r, e = (json.loads(http("GET", b + "/get_model_info")[2]) for b in (real, emu))
    assert set(r) - set(e) == MODEL_INFO_ONLY_REAL and not set(e) - set(r)
    assert {k: v for k, v in r.items() if k in e} == e


def test_server_info_keys_match_real_sglang(servers):
    """/get_server_info: the same keys at the top and in internal_states[0], less those listed."""
    r, e = (json.loads(http("GET", servers[s].base_url + "/get_server_info")[2]) for s in ("real", "emu"))
    assert (set(r) - set(e), set(e) - set(r)) == (SERVER_INFO_ONLY_REAL, SERVER_INFO_ONLY_EMULATOR)
    ri, ei = r["internal_states"][0], e["internal_states"][0]
    assert (set(ri) - set(ei), set(ei) - set(ri)) == (INTERNAL_STATE_ONLY_REAL, INTERNAL_STATE_ONLY_EMULATOR)
    # the values the emulator resolves the way SGLang does for these flags
    for k in ("context_length", "max_total_tokens", "mem_fraction_static", "page_size", "device",
              "enable_cache_report", "model_path", "served_model_name", "max_total_num_tokens", "max_req_input_len",
              "version"):  # fmt: skip
        assert r[k] == e[k], k
    assert ri["memory_usage"]["token_capacity"] == ei["memory_usage"]["token_capacity"]
    assert set(ri["memory_usage"]) == set(ei["memory_usage"])


def _families(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    out = {}
    for f in text_string_to_metric_families(text):
        labels: set[str] = set()
        for s in f.samples:
            labels |= set(s.labels) - {"le"}
        out[f.name] = (f.type, tuple(sorted(labels)))
    return out


def _compare_families(real: dict, emu: dict, real_only: set, emu_only: set) -> None:
    assert (set(real) - set(emu), set(emu) - set(real)) == (real_only, emu_only)
    types = {n: (real[n][0], emu[n][0]) for n in set(real) & set(emu) if real[n][0] != emu[n][0]}
    assert not types, types
    labels = {n: (real[n][1], emu[n][1]) for n in set(real) & set(emu) if real[n][1] != emu[n][1]}
    assert labels == LABEL_DIFFERENCES


def test_metric_families_match_real_sglang_at_start_and_after_load(servers):
    """Family names, types and label names of /metrics, before the catalogue and after it (the emulator's are a
    subset of real SGLang's 82; which it lacks, or shows earlier, is listed)."""
    real0, emu0 = _families(servers["real_start"]), _families(servers["emu_start"])
    # this module's server must be fresh: only SGLang's warm-up request has run (else "at start" means nothing)
    assert "sglang:e2e_request_latency_seconds" in real0
    served = sum(s.value for f in text_string_to_metric_families(servers["real_start"])
                 if f.name == "sglang:num_requests" for s in f.samples)  # fmt: skip
    assert served == 1, f"the real server had served {served} requests before this module (warm-up: 1)"
    _compare_families(real0, emu0, REAL_ONLY_FAMILIES | REAL_ONLY_AT_START,
                      EMULATOR_ONLY_FAMILIES | EMULATOR_ONLY_AT_START)  # fmt: skip
    # the load: a streamed chat twice (a prefix hit the second time), several output tokens
    body = {"model": "m", "messages": MSG, "max_tokens": 4, "ignore_eos": True, "stream": True}
    for side in ("real", "emu"):
        for _ in range(2):
            assert _send(servers[side].base_url, CHAT, body)[0] == 200
    real1, emu1 = (_families(_get(servers[s].base_url, "/metrics")) for s in ("real", "emu"))
    _compare_families(real1, emu1, REAL_ONLY_FAMILIES, EMULATOR_ONLY_FAMILIES)
