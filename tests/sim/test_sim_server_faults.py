"""Server-wide faults of the emulator (issue 35): a server that hangs (accepts connections, never answers anything
again, /health included; the process stays up) and one that slows to a crawl (every engine step N times as long),
from a moment on: `--sim-hang-after S`, `--sim-crawl-after S:FACTOR`, or `POST /sim/fault` at run time."""

from __future__ import annotations

import socket
import statistics
import time

import pytest

from servesweep.sim.cli import parse_args
from servesweep.sim.launch import start_sim
from servesweep.sim.probe import http, post_json, probe, run

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = "/v1/chat/completions"


def body(max_tokens: int) -> dict:
    return {
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


def health_answers(host: str, port: int, wait_s: float) -> bytes | None:
    """The first bytes of GET /health within `wait_s`, or None when the connection was accepted and nothing came."""
    with socket.create_connection((host, port), timeout=5) as s:  # accepting still works: a refusal raises
        s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        s.settimeout(wait_s)
        try:
            return s.recv(100)
        except TimeoutError:
            return None


def test_hang_after_seconds_stops_every_answer_and_the_stream_in_flight(tmp_path):
    log = tmp_path / "sim.log"
    with start_sim(["--model-path", MODEL, "--sim-hang-after", "1.5"], log_path=log) as sim:
        t_ready = time.monotonic()
        assert (health_answers(sim.host, sim.port, 2) or b"").startswith(b"HTTP/1.1 200")
        # a stream much longer than the 1.5 s: it gets tokens, then nothing more (not an end, not an error)
        r = run(probe(sim.host, sim.port, CHAT, body(20_000), timeout=5))
        assert r.status == 200 and r.error == "timeout after 5 s", r.error
        toks = r.token_events()
        assert len(toks) > 20
        last = (toks[-1][0] / 1e9) - t_ready
        assert last < 2.5, f"a token {last:.2f} s after ready: the hang came late"
        assert all(raw != b"[DONE]" for _, raw in r.events)
        # nothing answers any more; the port still accepts; the process is alive
        assert health_answers(sim.host, sim.port, 2) is None
        assert health_answers(sim.host, sim.port, 1) is None  # a new connection too
        later = run(probe(sim.host, sim.port, CHAT, body(4), timeout=2))
        assert later.status == 0 and later.error == "timeout after 2 s"
        assert sim.proc.poll() is None
    assert "hanging now (--sim-hang-after 1.5)" in log.read_text()


def test_post_hang_answers_first_then_hangs():
    with start_sim(["--model-path", MODEL]) as sim:
        url = sim.base_url + "/sim/fault"
        st, _, b = http("GET", url)
        assert st == 200 and b == b'{"hung":false,"crawl":1.0}'
        assert post_json(url, {"hang": True, "crawl": 2})[0] == 400  # one at a time
        assert post_json(url, {"hang": True, "after_s": -1})[0] == 400
        assert post_json(url, {"hang": True})[0] == 200
        assert health_answers(sim.host, sim.port, 1.5) is None
        with pytest.raises(TimeoutError):
            http("GET", url, timeout=1.5)


def test_crawl_makes_every_step_slower_by_its_factor_and_everything_still_answers():
    with start_sim(["--model-path", MODEL]) as sim:

        def itl_ms() -> float:
            r = run(probe(sim.host, sim.port, CHAT, body(60), timeout=60))
            assert r.status == 200 and r.error is None
            return statistics.median(r.itls_s()) * 1e3

        before = itl_ms()
        st, _, b = post_json(sim.base_url + "/sim/fault", {"crawl": 8})
        assert st == 200 and b"crawl" in b
        after = itl_ms()
        assert 6.0 < after / before < 10.0, (before, after)
        assert http("GET", sim.base_url + "/health", timeout=2)[0] == 200
        assert http("GET", sim.base_url + "/sim/fault")[2] == b'{"hung":false,"crawl":8.0}'
        print(f"\ncrawl x8: ITL p50 {before:.2f} ms -> {after:.2f} ms")


def test_crawl_after_on_the_command_line():
    with start_sim(["--model-path", MODEL, "--sim-crawl-after", "0.5:5"]) as sim:
        time.sleep(0.7)
        assert http("GET", sim.base_url + "/sim/fault")[2] == b'{"hung":false,"crawl":5.0}'


@pytest.mark.parametrize(
    "flag,value,says",
    [
        ("--sim-crawl-after", "5", "SECONDS:FACTOR"),
        ("--sim-crawl-after", "5:0.5", "FACTOR a number ≥ 1"),
        ("--sim-crawl-after", "x:2", "SECONDS:FACTOR"),
        ("--sim-hang-after", "-1", "seconds ≥ 0"),
        ("--sim-hang-after", "soon", "seconds ≥ 0"),
    ],
)
def test_bad_values_are_refused_naming_the_flag(flag, value, says, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--model-path", MODEL, flag, value])
    err = capsys.readouterr().err
    assert flag in err and says in err, err
