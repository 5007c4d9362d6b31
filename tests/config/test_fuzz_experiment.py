"""Property tests of the experiment parser: whatever a user types, it either parses or raises ExperimentError whose
every line names the file, a line number inside the file, and (past syntax errors) the key at fault."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesweep.config.experiment import Experiment, ExperimentError, parse_experiment

GOOD = """\
name: fuzz
sglang_version: 0.5.23
target:
  inventory: local
model:
  path: Qwen/Qwen3.6-27B
launcher:
  emulator: true
  gpu: H200
server:
  base:
    context_length: 4096
  axes:
    tp_size: [1, 2]
load:
  concurrency: [1, 4]
  prompt_tokens: [3k]
  output_tokens: 16
  requests: 2
retries: 1
"""
LINES = GOOD.splitlines()
PROBLEM = re.compile(r"^fuzz\.yaml:(\d+): (.+)$")

# values a user plausibly puts in the wrong place
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        ["3k", "100k", "1.5m", "-1", "0", "1e9", "nan", "[1, 2", "{a: 1", "'", "&a", "*a", "!!binary x"]
    ),
)
yaml_values = st.one_of(
    scalars.map(lambda v: repr(v) if isinstance(v, str) else str(v)),
    st.lists(scalars.map(str), max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.dictionaries(st.text("abcxyz_-", min_size=1, max_size=8), scalars.map(str), max_size=3).map(
        lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"
    ),
)


def _check(text: str) -> None:
    n_lines = max(1, len(text.splitlines()))
    try:
        exp = parse_experiment(text, "fuzz.yaml")
    except ExperimentError as e:
        assert e.problems, "an ExperimentError with no problem in it"
        for line in str(e).splitlines():
            m = PROBLEM.match(line)
            assert m, f"not 'file:line: message': {line!r}"
            assert 0 <= int(m.group(1)) <= n_lines + 1, line
            assert m.group(2).strip(), line
        return
    assert isinstance(exp, Experiment)
    # a parsed experiment expands without surprises
    exp.server_configs()


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=st.integers(min_value=0, max_value=len(LINES) - 1), value=yaml_values)
def test_any_value_at_any_key_parses_or_names_its_line(line, value):
    lines = list(LINES)
    key, sep, _ = lines[line].partition(":")
    lines[line] = f"{key}: {value}" if sep else f"{key}{value}"
    _check("\n".join(lines) + "\n")


@settings(max_examples=150, deadline=None)
@given(
    line=st.integers(min_value=0, max_value=len(LINES) - 1),
    key=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
    value=yaml_values,
)
def test_inserted_keys_are_accepted_or_named(line, key, value):
    lines = list(LINES)
    indent = len(lines[line]) - len(lines[line].lstrip())
    lines.insert(line + 1, " " * indent + f"{key}: {value}")
    _check("\n".join(lines) + "\n")


@pytest.mark.fast
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_arbitrary_text_never_crashes_the_parser(text):
    _check(text)


@pytest.mark.fast
@settings(max_examples=150, deadline=None)
@given(cut=st.integers(min_value=0, max_value=len(GOOD)), junk=st.text(max_size=10))
def test_truncated_or_spliced_files(cut, junk):
    _check(GOOD[:cut] + junk + GOOD[cut:] if junk else GOOD[:cut])


@pytest.mark.fast
@pytest.mark.parametrize("junk", ["0\x85\x85", "x\u2028", "a\x1bb"])
def test_a_line_break_or_control_character_in_a_key_stays_one_problem_line(junk):
    # found by test_truncated_or_spliced_files (cut=0, junk='0\x85\x85'): YAML reads U+0085 as part of the key,
    # Python's splitlines breaks the message there, and the problem's line lost its 'file:line:' head
    _check(junk + GOOD)
    with pytest.raises(ExperimentError) as e:
        parse_experiment(junk + GOOD, "fuzz.yaml")
    assert all(c.isprintable() for c in str(e.value).replace("\n", "")), repr(str(e.value))


@pytest.mark.fast
def test_one_clear_message_per_problem_with_key_and_line():
    text = GOOD.replace("concurrency: [1, 4]", "concurrency: [1, four]").replace("retries: 1", "retries: -2")
    text = text.replace("requests: 2", "requests: 2\n  requestz: 3")
    try:
        parse_experiment(text, "fuzz.yaml")
    except ExperimentError as e:
        got = str(e).splitlines()
    else:
        raise AssertionError("accepted a broken file")
    assert any(g.startswith("fuzz.yaml:16: load.concurrency") for g in got), got
    assert any(g.startswith("fuzz.yaml:20: load.requestz") and "requests" in g for g in got), got
    assert any(g.startswith("fuzz.yaml:21: retries") for g in got), got
    assert len(got) == 3, got


@pytest.mark.fast
def test_yaml_syntax_error_names_its_line():
    try:
        parse_experiment(GOOD.replace("  gpu: H200", "  gpu: [H200"), "fuzz.yaml")
    except ExperimentError as e:
        (msg,) = str(e).splitlines()
    else:
        raise AssertionError("accepted a broken file")
    assert re.match(r"fuzz\.yaml:(9|10|11): YAML syntax error", msg), msg
