"""`servesweep run`'s results table names a workload with the word `servesweep load --workload` and the records
use (issue 34 item 9: the built-in prompts read 'chat', the endpoint, where `load` says 'synthetic')."""

from __future__ import annotations

import pytest

from servesweep.matrix.orchestrator import workload_cell


@pytest.mark.fast
@pytest.mark.parametrize(
    ("point", "cell"),
    [
        ({"workload": "chat", "endpoint": "chat"}, "synthetic"),
        ({"workload": "single", "endpoint": "completions"}, "synthetic/completions"),
        ({"workload": "agent_docs", "endpoint": "chat"}, "agent_docs"),
        ({"workload": "chat"}, "synthetic"),  # a manifest from before load.endpoint
    ],
)
def test_workload_cell(point, cell):
    assert workload_cell(point) == cell
