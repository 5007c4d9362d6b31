"""Trace replay, phase 1 (issue 30): the readers of every format agree on a generated trace with known sharing,
bad input names file:line and the field, the ideal cache and the windows do what they say, the prompts are exact
and share exactly the trace's blocks (checked by the emulator's own radix cache), and the verdict line reads right.
No network, no process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from servesweep.cli.trace import command as trace_cli
from servesweep.results.trace_fidelity import trace_fidelity
from servesweep.workload.tokenizer import render_chatml
from servesweep.workload.trace import synth
from servesweep.workload.trace.block_prompts import TracePrompts
from servesweep.workload.trace.cache import ideal_cached_tokens, ideal_hit_ratio, parse_tokens
from servesweep.workload.trace.model import Trace, TraceError, TraceRequest
from servesweep.workload.trace.readers import detect_format, read_trace
from servesweep.workload.trace.window import speed_up, window

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def shared():
    return synth.shared_prefix_requests(40, groups=4, prefix_blocks=2, own_blocks=1, seed=3)


def write(tmp_path: Path, kind: str, trace: Trace) -> Path:
    writers = {
        "mooncake": lambda p: synth.write_mooncake(p, trace),
        "azure": lambda p: synth.write_azure(p, trace),
        "bailian": lambda p: synth.write_bailian(p, trace),
        "bailian_csv": lambda p: synth.write_bailian(p, trace, as_csv=True),
        "sessions": lambda p: synth.write_sessions(p, trace),
    }
    suffix = ".csv" if kind in ("azure", "bailian_csv") else ".jsonl"
    return writers[kind](tmp_path / f"{kind}{suffix}")


# ------------------------------------------------------------------------------------------- readers


@pytest.mark.parametrize("kind", ["mooncake", "bailian", "bailian_csv"])
def test_formats_with_block_ids_keep_the_known_sharing(tmp_path, shared, kind):
    p = write(tmp_path, kind, shared.trace)
    t = read_trace(p, block_size=512)  # the Bailian files were written in 512-token blocks
    assert [r.input_length for r in t.requests] == [r.input_length for r in shared.trace.requests]
    assert [r.hash_ids for r in t.requests] == [r.hash_ids for r in shared.trace.requests]
    assert t.requests[5].timestamp_ms == pytest.approx(500.0)
    assert ideal_hit_ratio(t) == pytest.approx(shared.expected_hit_ratio)
    assert shared.expected_hit_ratio == pytest.approx((40 - 4) / 40 * 1024 / (sum(r.input_length for r in t.requests) / 40), rel=1e-9)


def test_azure_csv_has_no_sharing_and_relative_times(tmp_path, shared):
    p = write(tmp_path, "azure", shared.trace)
    assert detect_format(p) == "azure"
    t = read_trace(p)
    assert t.requests[0].timestamp_ms == 0.0
    assert t.requests[10].timestamp_ms == pytest.approx(1000.0, abs=0.01)
    assert [r.output_length for r in t.requests] == [8] * 40
    assert ideal_hit_ratio(t) == 0.0
    ids = [i for r in t.requests for i in r.hash_ids]
    assert len(ids) == len(set(ids))


def test_sessions_turns_share_their_previous_turns_full_blocks(tmp_path):
    s = synth.session_requests(sessions=3, turns=3, first_blocks=2, grow_blocks=1)
    p = write(tmp_path, "sessions", s.trace)
    t = read_trace(p)
    assert t.source == "sessions:sessions.jsonl"
    assert sorted(t.sessions()) == ["s0", "s1", "s2"]
    first, second = (t.requests[i] for i in t.sessions()["s1"][:2])
    assert second.hash_ids[:2] == first.hash_ids[:2] and second.hash_ids[2] not in first.hash_ids
    assert (second.turn, second.delay_ms) == (1, 50.0)
    assert ideal_cached_tokens(t)[t.sessions()["s1"][2]] == 3 * 512
    assert ideal_hit_ratio(t) == pytest.approx(s.expected_hit_ratio)
    # Bailian's sessions are chat_id/parent_chat_id chains with turns from 1
    b = read_trace(synth.write_bailian(tmp_path / "b.jsonl", t), block_size=512)
    assert [len(v) for v in b.sessions().values()] == [3, 3, 3]
    assert {r.turn for r in b.requests} == {0, 1, 2}


def test_native_format_round_trips(tmp_path, shared):
    t = read_trace(write(tmp_path, "mooncake", shared.trace))
    t.save(tmp_path / "x.trace.jsonl")
    assert json.loads((tmp_path / "x.trace.jsonl").read_text().splitlines()[0])["servesweep_trace"] == 1
    back = read_trace(tmp_path / "x.trace.jsonl")
    assert back == t


@pytest.mark.parametrize(
    "line, fmt, expect",
    [
        ('{"timestamp": 0, "output_length": 3, "hash_ids": [1]}', "mooncake", "bad.jsonl:2: input_length: missing"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}', "mooncake",
         "bad.jsonl:2: hash_ids: 1 ids, but input_length=600 in blocks of 512 tokens takes 2"),
        ('{"timestamp": "soon", "input_length": 6, "output_length": 3, "hash_ids": [1]}', "mooncake",
         "bad.jsonl:2: timestamp: expected a number, got 'soon'"),
        ('{"timestamp": 0, "input_length": 6, "output_length": -1, "hash_ids": [1]}', "mooncake",
         "bad.jsonl:2: output_length: Input should be greater than or equal to 0"),
        ("{not json", "mooncake", "bad.jsonl:2: not JSON"),
        ('{"session_id": "a", "turn": 0, "input_length": 5, "output_length": 1, "colour": 1}', "sessions",
         "bad.jsonl:2: colour: not a field of the session format"),
    ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, fmt, expect):
    good = {"mooncake": '{"timestamp": 0, "input_length": 6, "output_length": 3, "hash_ids": [1]}',
            "sessions": '{"session_id": "a", "turn": 1, "input_length": 5, "output_length": 1}'}[fmt]
    p = tmp_path / "bad.jsonl"
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        read_trace(p, fmt)
    assert expect in str(e.value)


def test_bad_csv_and_unknown_files(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\nyesterday,10,2\n")
    with pytest.raises(TraceError, match=r"a.csv:3: TIMESTAMP: expected a date and time, got 'yesterday'"):
        read_trace(p)
    q = tmp_path / "b.jsonl"
    q.write_text('{"prompt": "hi"}\n')
    with pytest.raises(TraceError, match=r"b.jsonl:1: cannot tell the trace format"):
        read_trace(q)
    r = tmp_path / "c.jsonl"
    r.write_text('{"timestamp_ms": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceError, match=r"c.jsonl:1: not a servesweep trace"):
        Trace.load(r)


# ------------------------------------------------------------------------------------------- cache, windows


def req(t, n, ids, **kw):
    return TraceRequest(timestamp_ms=t, input_length=n, output_length=4, hash_ids=ids, **kw)


def test_ideal_cache_is_a_radix_lru_in_tokens():
    t = Trace(block_size=10, requests=[
        req(0, 25, [1, 2, 3]),
        req(1, 25, [1, 2, 4]),  # 20 tokens of prefix
        req(2, 25, [1, 2, 3]),  # the same prompt: all but its last token
        req(3, 25, [9, 2, 3]),  # same ids after another first block: a radix path, no match
        req(4, 15, [1, 5]),
    ])
    assert ideal_cached_tokens(t) == [0, 20, 24, 0, 10]
    # a 30-token cache keeps only the latest request's blocks: request 4 finds [1] evicted by request 3's
    assert ideal_cached_tokens(t, 30) == [0, 20, 24, 0, 0]
    assert parse_tokens("2M") == 2_000_000 and parse_tokens("500k") == 500_000 and parse_tokens("inf") is None
    with pytest.raises(ValueError, match="cache size 'lots'"):
        parse_tokens("lots")


def test_window_cuts_samples_whole_sessions_and_retimes():
    reqs = [req(i * 100.0, 5, [i]) for i in range(100)]
    reqs += [req(2000.0 + k, 5, [1000 + k], session_id="s", turn=k) for k in range(3)]
    t = Trace(block_size=512, requests=sorted(reqs, key=lambda r: r.timestamp_ms))
    w = window(t, start_s=1.0, duration_s=2.0)
    assert len(w.requests) == 20 + 3 and w.requests[0].timestamp_ms == 0.0
    half = window(t, sample=0.5, seed=1)
    assert 30 < len(half.requests) < 70
    assert sum(r.session_id == "s" for r in half.requests) in (0, 3)
    assert window(t, sample=0.5, seed=1) == half
    assert speed_up(t, 4).requests[-1].timestamp_ms == t.requests[-1].timestamp_ms / 4
    with pytest.raises(ValueError, match="sample=0"):
        window(t, sample=0)


# ------------------------------------------------------------------------------------------- prompts


@pytest.fixture(scope="module")
def built(shared):
    return TracePrompts(shared.trace, seed=0)


def server_ids(tp: TracePrompts, i: int) -> list[int]:
    p = tp.prompt(i)
    return tp.tok.encode(render_chatml(p.messages) if p.messages is not None else p.text)


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prompts_are_exact_and_share_exactly_the_traces_blocks(built, shared):
    trace = shared.trace
    ids = [server_ids(built, i) for i in range(12)]
    assert [len(x) for x in ids] == [r.input_length for r in trace.requests[:12]]
    assert built.verify() == {}
    # same group (i, i + 4): the two prefix blocks, token for token, and not one token more
    assert common(ids[0], ids[4]) == 1024 and common(ids[1], ids[9]) == 1024
    # other groups share only what the chat template opens every prompt with
    assert common(ids[0], ids[1]) == built.before
    # another seed (another replay): not even the first block in common
    other = TracePrompts(trace, seed=1)
    assert common(server_ids(other, 0), ids[0]) == built.before


def test_completions_prompts_and_a_probed_template(shared):
    small = Trace(block_size=512, requests=shared.trace.requests[:6])
    c = TracePrompts(small, endpoint="completions")
    assert c.verify() == {} and c.prompt(0).text is not None
    assert common(c.tok.encode(c.prompt(0).text), c.tok.encode(c.prompt(4).text)) == 1024
    probed = TracePrompts(small, template_overhead=12)  # a server whose template adds 12 tokens
    assert probed.verify() == {}
    tiny = Trace(block_size=512, requests=[req(0, 4, [1])])
    with pytest.raises(ValueError, match="input_length=4 leaves no room"):
        TracePrompts(tiny)


def test_the_emulators_radix_cache_serves_the_expected_tokens(built, shared):
    """The emulator's engine (simulated time, no process) reports each request's cached tokens: they are the ideal
    cache's, request by request."""
    from servesweep.sglang.serverargs import resolve_server
    from servesweep.sim.engine import Engine, EngineRequest

    eng = Engine(resolve_server({"model_path": "meta-llama/Llama-3.1-8B-Instruct", "sim_gpu": "H100"}))
    n = 16
    reqs = [EngineRequest(f"r{i}", server_ids(built, i), 4, lambda *a: None, ignore_eos=True) for i in range(n)]
    eng.run_simulated([(0.5 * i, r) for i, r in enumerate(reqs)])
    head = Trace(block_size=512, requests=shared.trace.requests[:n])
    assert [r.cached_tokens for r in reqs] == ideal_cached_tokens(head)
    f = trace_fidelity(head, [{"prompt_tokens": len(r.prompt_ids), "cached_tokens": r.cached_tokens} for r in reqs])
    assert f.faithful and f.requests_cache_off == 0
    assert f.verdict == f"replay faithful: cache hits {100 * f.expected_hit_ratio:.1f}% expected / {100 * f.expected_hit_ratio:.1f}% measured"


# ------------------------------------------------------------------------------------------- verdict, CLI


def test_verdict_names_what_is_off(shared):
    t = shared.trace
    exp = ideal_cached_tokens(t)
    recs = [{"trace_index": i, "prompt_tokens": r.input_length, "cached_tokens": exp[i]} for i, r in enumerate(t.requests)]
    ok = trace_fidelity(t, recs)
    pct = f"{100 * shared.expected_hit_ratio:.1f}%"
    assert ok.verdict == f"replay faithful: cache hits {pct} expected / {pct} measured"
    cold = [{**r, "cached_tokens": 0} for r in recs[:30]]
    bad = trace_fidelity(t, cold)
    assert not bad.faithful
    assert "% expected / 0.0% measured" in bad.verdict and "30/40 requests measured" in bad.verdict
    assert bad.requests_cache_off == 30 - 4 and bad.first_off[0].index == 4
    with pytest.raises(ValueError, match="trace_index=99"):
        trace_fidelity(t, [{"trace_index": 99, "prompt_tokens": 1}])


def test_trace_cli_convert_stats_sample(tmp_path, shared):
    src = write(tmp_path, "mooncake", shared.trace)
    run = CliRunner().invoke
    r = run(trace_cli, ["convert", str(src), str(tmp_path / "n.trace.jsonl")])
    assert r.exit_code == 0, r.output
    assert "wrote 40 requests" in r.output
    r = run(trace_cli, ["stats", str(tmp_path / "n.trace.jsonl"), "--bucket", "1s"])
    assert r.exit_code == 0, r.output
    assert f"ideal prefix-cache hit rate: {100 * shared.expected_hit_ratio:.1f}% at unlimited cache" in r.output
    assert "10.00" in r.output and "input_length: mean" in r.output
    r = run(trace_cli, ["stats", str(src), "--cache-tokens", "1k", "--json"])
    s = json.loads(r.output)
    assert s["requests"] == 40 and s["ideal_hit_ratio"] == 0.0 and s["cache_tokens"] == 1000
    r = run(trace_cli, ["sample", str(src), str(tmp_path / "w.jsonl"), "--start", "1s", "--duration", "2s"])
    assert r.exit_code == 0 and "wrote 20 of 40 requests" in r.output
    r = run(trace_cli, ["stats", str(tmp_path / "missing.jsonl")])
    assert r.exit_code == 1 and "no such trace file" in r.output


# ------------------------------------------------------------------------------------------- replay schedule, point


def test_schedule_keeps_sessions_on_one_worker_and_the_traces_times():
    from servesweep.workload.arrivals import TraceSchedule, session_worker

    reqs = [req(i * 10.0, 5, [i]) for i in range(20)]
    reqs += [req(5.0 + 40 * s + k, 5, [100 + 10 * s + k], session_id=f"s{s}", turn=k, delay_ms=20.0 if k else None)
             for s in range(6) for k in range(3)]  # fmt: skip
    t = Trace(block_size=512, requests=sorted(reqs, key=lambda r: r.timestamp_ms))
    args = ([r.timestamp_ms for r in t.requests], [r.session_id for r in t.requests],
            [r.delay_ms for r in t.requests], [r.turn for r in t.requests])  # fmt: skip
    shares = [TraceSchedule(*args, speed_up=2.0, index=w, count=2, start_ns=0) for w in range(2)]
    starts = [[s for _, s in iter(sch.next_start, None)] for sch in shares]
    got = sorted(i for ss in starts for s in ss for i in s.indices)
    assert got == list(range(len(t.requests)))  # every request once, over the two workers
    for w, ss in enumerate(starts):
        assert [s.offset_ns for s in ss] == sorted(s.offset_ns for s in ss)
        for s in ss:
            sid = t.requests[s.indices[0]].session_id
            if sid is not None:
                assert len(s.indices) == 3 and session_worker(sid, 2) == w
                assert [t.requests[i].turn for i in s.indices] == [0, 1, 2] and s.delays_ms == (None, 10.0, 10.0)
    one = TraceSchedule(*args, speed_up=2.0, start_ns=1000)
    slot, first = one.next_start()
    assert slot == 1000 and first.indices == (0,)
    slot, second = one.next_start()
    assert slot == 1000 + int(5.0 / 2 * 1e6) and len(second.indices) == 3


def test_a_trace_point_and_its_workload(tmp_path, shared):
    from servesweep.config.point import LoadPoint
    from servesweep.workload.build import build_workload

    path = write(tmp_path, "mooncake", shared.trace)
    base = {"base_url": "http://127.0.0.1:1", "concurrency": 4, "requests": 1, "model": "m", "probe": False}
    with pytest.raises(ValueError, match="the trace workload needs a trace file"):
        LoadPoint(**base, workload="trace")
    with pytest.raises(ValueError, match="a trace replays at its own timestamps"):
        LoadPoint(**base, workload="trace", trace=str(path), arrival="constant", rate_rps=2)
    with pytest.raises(ValueError, match="trace: only with workload trace"):
        LoadPoint(**base, trace=str(path))
    p = LoadPoint(**base, workload="trace", trace=str(path), trace_start_s=1.0, trace_window_s=1.0, trace_speedup=4)
    with pytest.raises(ValueError, match="not cycled as a pool; build them with build_workload"):
        build_workload(p)
    w = build_workload(p, trace_replay=True)
    assert w.trace is not None and len(w.bodies) == 10 and w.nonce_digits == 0
    assert w.output_tokens == [8] * 10 and w.path == "/v1/chat/completions"
    body = json.loads(b"".join(w.bodies[0]))
    assert body["max_tokens"] == 8 and body["ignore_eos"] is True and body["stream"] is True
    assert w.trace.trace.requests[0].timestamp_ms == 0.0 and w.trace.speed_up == 4


def test_trace_synth_writes_a_trace_stats_reads_back(tmp_path):
    run = CliRunner().invoke
    for fmt in ("mooncake", "native", "sessions"):
        out = tmp_path / f"s-{fmt}.jsonl"
        r = run(trace_cli, ["synth", str(out), "--format", fmt, "--requests", "12", "--groups", "3"])
        assert r.exit_code == 0, r.output
        said = r.output.rsplit("ideal hit rate ", 1)[1].strip()
        r = run(trace_cli, ["stats", str(out), "--json"])
        assert r.exit_code == 0, r.output
        assert said == f"{100 * json.loads(r.output)['ideal_hit_ratio']:.1f}%", fmt
    b = tmp_path / "b.jsonl"
    assert run(trace_cli, ["synth", str(b), "--format", "bailian", "--block-size", "16"]).exit_code == 0
    assert read_trace(b).block_size == 16


@pytest.mark.fast
def test_peers_replay_formats_read_as_mooncake_and_bailian(tmp_path):
    # AIPerf's mooncake_trace and vLLM's timed-trace make hash_ids optional: such lines get blocks of their own
    p = tmp_path / "aiperf.jsonl"
    p.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\n'
        '{"timestamp": 250, "input_length": 700, "output_length": 5}\n'
    )
    t = read_trace(p)
    assert t.source.startswith("mooncake:") and [len(r.hash_ids) for r in t.requests] == [2, 2]
    assert not set(t.requests[0].hash_ids) & set(t.requests[1].hash_ids)
    # guidellm's trace replay: absolute Unix seconds, no block ids: `--from bailian`, re-timed from the first request
    g = tmp_path / "guidellm.jsonl"
    g.write_text(
        '{"timestamp": 1733300000.0, "input_length": 256, "output_length": 128}\n'
        '{"timestamp": 1733300000.5, "input_length": 300, "output_length": 64}\n'
    )
    t = read_trace(g, "bailian", block_size=512)
    assert [r.timestamp_ms for r in t.requests] == [0.0, 500.0] and t.block_size == 512
