"""`servesweep run`'s results table names a workload with the word `servesweep load --workload` and the records
use (issue 34 item 9: the built-in prompts read 'chat', the endpoint, where `load` says 'synthetic')."""

from __future__ import annotations

import pytest

from servesweep.matrix.run_setup import workload_cell
from servesweep.results.manifest import PointEntry


@pytest.mark.fast
@pytest.mark.parametrize(
    ("point", "cell"),
    [
        ({"workload": "chat", "endpoint": "chat"}, "synthetic"),
        ({"workload": "single", "endpoint": "completions"}, "synthetic/completions"),
        ({"workload": "agent_docs", "endpoint": "chat"}, "agent_docs"),
    ],
)
def test_workload_cell(point, cell):
    axes = {"concurrency": 1, "prompt_tokens": 100, "output_tokens": 4}
    assert workload_cell(PointEntry(point={}, config_id="s01", **axes, **point)) == cell
