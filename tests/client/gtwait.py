"""Polling the emulator's ground truth instead of sleeping through its flush period (issue 27).

The emulator buffers its ground-truth lines and flushes them in order about once a second and at exit. One more
request after the run, and a wait for its line, means every request that ended before it is in the file.
(tests/inlocust/locustrun.py has the same helper for the in-Locust session, which cannot import this folder.)
"""

from __future__ import annotations

import json
import time
import urllib.request
import uuid


def ground_truth_so_far(sim, timeout: float = 15.0) -> list[dict]:
    """Every ground-truth line of the requests that ended before this call (the barrier request left out)."""
    mark = f"gt-barrier-{uuid.uuid4().hex}"
    with urllib.request.urlopen(sim.base_url + "/v1/models", timeout=10) as r:
        model = json.load(r)["data"][0]["id"]
    req = urllib.request.Request(
        sim.base_url + "/v1/completions",
        data=json.dumps({"model": model, "prompt": "barrier", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": mark},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
    deadline = time.monotonic() + timeout
    while True:
        got = sim.read_ground_truth()
        if any(d["id"] == mark for d in got):
            return [d for d in got if d["id"] != mark]
        assert time.monotonic() < deadline, f"the emulator's ground truth lacks the barrier after {timeout} s"
        time.sleep(0.05)
