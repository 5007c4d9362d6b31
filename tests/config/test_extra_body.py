"""load.extra_body in an experiment file: a mapping every point of the matrix sends in its request bodies, checked
with LoadPoint's own rule, and its errors name the file's line like every other key."""

from __future__ import annotations

import textwrap

import pytest

from servesweep.config.experiment import ExperimentError, parse_experiment
from servesweep.config.point import LoadPoint

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)

YAML = """\
name: demo
sglang_version: 0.5.23
target:
  inventory: local
model:
  path: Qwen/Qwen3.6-27B
launcher:
  emulator: true
  gpu: H200
load:
  concurrency: [1, 4]
  requests: 2
{extra}
"""


def _parse(extra: str):
    return parse_experiment(textwrap.dedent(YAML.format(extra=extra)), "experiment.yaml")


def test_every_point_gets_load_extra_body():
    exp = _parse("  extra_body:\n    n: 2\n    temperature: 0.7\n    stop: [x, y]")
    want = {"n": 2, "temperature": 0.7, "stop": ["x", "y"]}
    assert exp.load.extra_body == want
    fields = exp.load.point_fields("single")
    assert fields["extra_body"] == want
    p = LoadPoint(base_url="http://127.0.0.1:30000", concurrency=1, requests=2, **fields)
    assert LoadPoint.model_validate_json(p.model_dump_json()).extra_body == want  # point.json keeps it
    assert _parse("").load.point_fields("single")["extra_body"] == {}


@pytest.mark.parametrize(
    "extra, words",
    [
        ("  extra_body:\n    max_tokens: 5", "extra_body keys ['max_tokens'] are set by the load generator"),
        ("  extra_body: [n, 2]", "expected a mapping"),
    ],
)
def test_bad_extra_body_names_its_line(extra, words):
    with pytest.raises(ExperimentError) as ei:
        _parse(extra)
    (err,) = ei.value.problems
    assert err.startswith("experiment.yaml:13: load.extra_body:") and words in err, err
