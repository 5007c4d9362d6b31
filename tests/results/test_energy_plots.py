"""The report's energy plots (issue 31): tokens per joule against concurrency, throttled points marked."""

from __future__ import annotations

import pytest

from servesweep.results import plots

pytestmark = pytest.mark.fast


def test_tokens_per_joule_vs_concurrency_draws_each_configuration_and_rings_throttled_points():
    svg = plots.tokens_per_joule_vs_concurrency(
        {"tp1": [(1, 0.09), (4, 0.34), (16, 1.07)], "tp2": [(1, 0.05), (16, None)]},
        "output tokens per joule vs concurrency",
        throttled=[(16, 1.07)],
    )
    assert svg.startswith("<svg") and "output tokens per joule" in svg
    assert "tp1" in svg and "tp2" in svg and "GPU throttled" in svg
    # a log2 concurrency axis labelled at the measured values (1 to 16 spans 8x or more)
    assert all(f">{c}<" in svg for c in ("1", "4", "16"))
    assert "GPU throttled" not in plots.tokens_per_joule_vs_concurrency({"tp1": [(1, 0.1), (2, 0.2)]}, "t")
