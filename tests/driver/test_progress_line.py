"""Issue 34 item 8: without a terminal, `servesweep load`'s progress lines during a long decode show the tokens
being streamed (SSE events the Locust process has read, times tokens per event), not only those of finished
requests: on a 100k-token point the old figure read 68, 0.0, 0.0, 68 while the server streamed steadily."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from servesweep.driver.point_progress import PointWatch
from servesweep.sim.launch import start_sim

LINE = re.compile(r"c2 \(concurrency 2\): (\d+) s, (\d+) done, \d+ failed, ([\d.]+) output tok/s streamed")


def test_lines_during_a_long_decode_show_the_streamed_tokens(tmp_path):
    with start_sim(["--model-path", "Qwen/Qwen3.6-27B", "--sim-gpu", "H200"]) as sim:
        r = subprocess.run(
            [sys.executable, "-m", "servesweep.cli", "load", "--base-url", sim.base_url, "--concurrency", "2"]
            + ["--requests", "2", "--prompt-tokens", "200", "--output-tokens", "600", "--out", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "SERVESWEEP_PROGRESS_EVERY_S": "1"},
        )
    assert r.returncode == 0, r.stderr[-3000:]
    during = [(int(s), int(done), float(tok)) for s, done, tok in LINE.findall(r.stderr)]
    final = float(re.search(r"done in \d+ s, 2 ok, 0 failed, ([\d.]+) output tok/s", r.stderr)[1])
    # lines came while both requests were still decoding (none finished): once the streams began (Locust's start
    # takes a line or two), each line saw tokens streaming, at about the point's own rate
    before_any_finished = [tok for _s, done, tok in during if done == 0]
    began = next(i for i, tok in enumerate(before_any_finished) if tok > 0)
    streaming = before_any_finished[began + 1 :]  # the first window holds the start of the streams
    assert len(streaming) >= 3, r.stderr[-3000:]
    assert all(0.5 * final < tok < 1.6 * final for tok in streaming), (streaming, final, r.stderr[-2000:])


@pytest.mark.fast
def test_tokens_per_event_follow_the_finished_requests():
    w = PointWatch("p", echo=None)
    assert w.tokens_per_event() == 1.0  # nothing finished: an autoregressive server's chunk
    w.rest([{"request_id": "a", "completion_tokens": 30, "chunk_ns": list(range(10))}])  # MTP: 3 tokens a chunk
    w.rest([{"request_id": "w", "warmup": True, "completion_tokens": 5, "chunk_ns": [1]}])  # warmup: not counted
    assert w.tokens_per_event() == 3.0
    w.progress({"completed": 1, "failed": 0, "streamed_events": 40})
    now = w._last_line + 2.0
    assert w.streamed_tok_s(now) == pytest.approx(40 * 3.0 / 2.0)
    w.progress({"completed": 1, "failed": 0, "streamed_events": 12})  # a worker's older file: never backwards
    assert w.streamed_tok_s(now) == pytest.approx(60.0)
