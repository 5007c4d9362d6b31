"""A closed loop's first round is a burst: its users start together, so at a long prompt their prefills queue
behind each other and the last one's first token comes several prefills late. Once answers end at different times
(lengths drawn from a distribution here; speculative decoding's acceptance on a real server) the users drift apart
and the running load has no such tail. (With equal lengths on a prefill-first server they stay in lockstep and every
round is a burst: the running load has it too, and leaving the first out changes nothing.) A decision with
`skip_first_round` judges a probe on the requests past it (`decision_run.after_first_round`): real Locust against
the emulator here."""

from __future__ import annotations

import numpy as np
import pytest

from servesweep.config.point import LoadPoint
from servesweep.driver.point_run import run_point
from servesweep.matrix.decision_run import after_first_round
from servesweep.results.records import read_parquet
from servesweep.sim.launch import start_sim

MODEL = "Qwen/Qwen3.6-27B"
USERS = 6


@pytest.fixture(scope="module")
def sim():
    with start_sim(["--model-path", MODEL, "--sim-calibration", "speedup=8"]) as s:
        yield s


def test_the_first_round_is_each_users_first_request_and_holds_the_bursts_ttft_tail(sim, tmp_path):
    p = LoadPoint(
        base_url=sim.base_url, model=MODEL, probe=False, prompt_tokens=12000, output_tokens=128,
        output_dist="lognormal:mean=128,sigma=0.6", seed=3, concurrency=USERS, requests=6 * USERS,
    )  # fmt: skip
    s = run_point(p, tmp_path / "p")
    assert s["requests"]["ok"] == 6 * USERS, s["requests"]
    table = read_parquet(tmp_path / "p" / "records.parquet")
    recs = table.to_pylist()
    rest = after_first_round(table).to_pylist()

    # one request left out per user, and it is that user's earliest
    kept = {r["request_id"] for r in rest}
    dropped = [r for r in recs if r["request_id"] not in kept]
    users = {(r["worker"], r["user"]) for r in recs}
    assert len(users) == USERS and len(dropped) == USERS == len(recs) - len(rest)
    for r in dropped:
        mine = [x["scheduled_ns"] for x in recs if (x["worker"], x["user"]) == (r["worker"], r["user"])]
        assert r["scheduled_ns"] == min(mine), r

    # the burst: its last first token waits for the other prefills; past it, no request waits that long
    def ttft(rows):
        return np.array([(r["first_token_ns"] - r["sent_ns"]) / 1e6 for r in rows])

    burst, steady = ttft(dropped), ttft(rest)
    assert burst.max() > 2.5 * burst.min(), burst  # queued behind the others' prefills
    assert burst.max() > 1.5 * np.percentile(steady, 95), (burst, steady)
    print(f"\nfirst round TTFT ms {np.sort(burst).round(0)}; after it p50 {np.median(steady):.0f}, "
          f"p95 {np.percentile(steady, 95):.0f}")
