"""Energy as a metric of the SLO grammar and of compare (issue 31): `--slo 'joules_per_token<=0.5'` and its units,
and compare's interval for joules per token: the energy counter is one measurement, the point's token rate is what a
resample of its requests changes (results/compare.py _energy). Pure functions: no server."""

from __future__ import annotations

import numpy as np
import pytest

from servesweep.config.slo import ENERGY, SLOError, metric_name, parse_slos
from servesweep.results.compare import PointSample, bootstrap_changes, metric

pytestmark = pytest.mark.fast


def test_energy_slos_parse_with_their_units_and_refuse_others():
    slos = parse_slos(
        "joules_per_token<=0.5, j_per_out_tok<=2J/tok, out_tok_per_j>=0.4tok/J, power_avg_w<=0.6kW"
    )
    assert [(s.name, s.op, s.value, s.energy) for s in slos] == [
        ("joules_per_token", "<=", 0.5, True),
        ("joules_per_output_token", "<=", 2.0, True),
        ("output_tokens_per_joule", ">=", 0.4, True),
        ("power_avg_w", "<=", 600.0, True),
    ]
    assert not parse_slos("ttft_p99<=2s")[0].energy
    m = metric_name("tokens_per_joule")
    assert (m.unit, m.higher_is_better, m.stat) == ("tok/J", True, None) and set(ENERGY) >= {
        "joules_per_token"
    }
    with pytest.raises(SLOError, match="an energy figure in J/tok takes no unit 'ms'"):
        parse_slos("joules_per_token<=0.5ms")
    with pytest.raises(SLOError, match="unknown metric 'joules_per_token_p99'"):
        parse_slos("joules_per_token_p99<=1")


def sample(n: int, tokens: float, seed: int, energy: dict | None) -> PointSample:
    rng = np.random.default_rng(seed)
    busy = rng.uniform(
        4.0, 6.0, n
    )  # each request held its user 4-6 s: the token rate varies with the resample
    return PointSample(
        ok=np.ones(n, dtype=bool),
        tokens=np.full(n, tokens),
        busy_s=busy,
        window_s=float(busy.sum() / 8),  # 8 users on average
        per_request={"ttft": rng.uniform(100, 200, n)},
        pooled={},
        max_itl=np.zeros(n),
        cached=np.full(n, np.nan),
        prompt=np.full(n, 1000.0),
        energy=energy,
    )


def test_compare_interval_of_joules_per_token_comes_from_the_token_rate():
    e = {
        "joules_per_output_token": 2.0,
        "output_tokens_per_joule": 0.5,
        "joules_per_token": 0.2,
        "power_avg_w": 400,
    }
    a = sample(200, 128, 1, e)
    b = sample(
        200, 128, 2, {k: v * (1.3 if k != "output_tokens_per_joule" else 1 / 1.3) for k, v in e.items()}
    )
    ms = [
        metric(n)
        for n in ("output_tokens_per_s", "joules_per_output_token", "output_tokens_per_joule", "power_avg_w")
    ]
    ch = {c.metric.name: c for c in bootstrap_changes(a, b, ms, resamples=400)}
    j = ch["joules_per_output_token"]
    assert (j.a, j.b) == (pytest.approx(2.0), pytest.approx(2.6)), "the observed values are gpu.json's"
    assert j.verdict == "worse" and j.ci[0] < 0.3 < j.ci[1], j.ci
    # the interval of J per token is the token rate's, mirrored: same relative width
    t = ch["output_tokens_per_s"]
    assert (j.ci[1] - j.ci[0]) == pytest.approx(t.ci[1] - t.ci[0], rel=0.35)
    assert (
        ch["output_tokens_per_joule"].verdict == "worse" and ch["power_avg_w"].ci == (pytest.approx(0.3),) * 2
    )
    none = bootstrap_changes(a, sample(50, 128, 3, None), ms[1:2], resamples=50)[0]
    assert none.verdict == "n/a", "a point without GPU telemetry has no energy to compare"


def test_gpu_json_carries_the_link_traffic_means_where_nvml_has_them():
    from servesweep.results.energy import gpu_energy

    samples = [
        {"t": float(t), "gpus": [{"index": 0, "util_pct": 50, "power_w": 300.0, "energy_mj": 300_000 * t,
                                  "pcie_tx_bps": 5e6 + 1e6 * (t % 2), "pcie_rx_bps": 12e6, "nvlink_tx_bps": None}]}
        for t in range(10)
    ]  # fmt: skip
    g = gpu_energy(samples, 2.0, 8.0)[0]
    assert g["pcie_tx_mb_s_mean"] == pytest.approx(5 + 3 / 7) and g["pcie_rx_mb_s_mean"] == 12.0
    assert g["nvlink_tx_mb_s_mean"] is None and g["nvlink_rx_mb_s_mean"] is None
