"""The emulator's answers (sim/replies.py) against the answer checks (results/answer_checks.py), issue 24: a healthy
emulator passes every check, and each answer fault is caught by its own check."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import servesweep.sim.replies as sim_answers
from servesweep.results.answer_checks import (
    answer_mismatch_rate,
    degenerate,
    degenerate_rate,
    needle_accuracy,
    score_needle,
)
from servesweep.sim.faults import Fault
from servesweep.sim.replies import (
    LOOP_TOKEN,
    Needle,
    answer_text,
    answer_words,
    find_needle,
    parse_answer_fault,
)
from servesweep.workload.prompts import build_pool

pytestmark = pytest.mark.fast  # the fast tier: starts no process (tests/conftest.py)


@pytest.fixture(scope="module")
def prompts() -> list[tuple[str, str]]:
    """(prompt text, needle answer) of real servesweep prompts: a chat pool and a completions pool of 3k tokens."""
    chat = build_pool(3000, 8, seed=11, cache_dir=None)
    comp = build_pool(3000, 4, seed=12, endpoint="completions", cache_dir=None)
    out = [(p.messages[-1]["content"], p.answer) for p in chat.prompts]
    out += [(p.text, p.answer) for p in comp.prompts]
    assert all(a for _, a in out)
    return out


def test_find_needle(prompts):
    for text, answer in prompts:
        needle = find_needle(text)
        assert needle is not None and needle.code == answer
        assert f"access code for the {needle.subject}?" in text
    assert find_needle("Tell me a story.") is None
    q = "Question: What is the access code for the amber archive? Answer with the code only."
    assert find_needle("No fact here. " + q) is None
    fact = " The access code for the amber archive is willow-1234."
    assert find_needle("Text." + fact + " More text.\n\n" + q) == Needle("amber archive", "willow-1234")


@pytest.mark.parametrize("n", [1, 2, 16, 256, 2048, 8192])
def test_healthy_answers_pass_every_check(prompts, n):
    texts = [answer_text(t, n, seed=3) for t, _ in prompts]
    assert degenerate_rate(texts) == 0.0, [degenerate(t)[1] for t in texts]
    assert needle_accuracy(zip(texts, [a for _, a in prompts], strict=True)) == 1.0


def test_healthy_answer_shape(prompts):
    text, answer = prompts[0]
    words = answer_words(text, 64, seed=3)
    assert len(words) == 64 and words[0] == " " + answer
    assert all(w.startswith(" ") and len(w) > 1 for w in words)
    blob = "".join(words)
    assert json.dumps(blob)[1:-1] == blob and blob.isascii()  # goes into a JSON string unescaped
    assert answer_text(text, 64, seed=3).startswith(f"{answer} The access code for the ")


def test_prompt_without_needle_gets_prose():
    text = answer_text("Summarise the history of the lighthouse.", 400, seed=1)
    assert len(text.split()) == 400 and not degenerate(text)[0]


def test_deterministic_and_prefix_stable(prompts):
    text, _ = prompts[1]
    a = answer_words(text, 300, seed=5)
    assert a == answer_words(text, 300, seed=5)
    assert answer_words(text, 120, seed=5) == a[:120]  # max_tokens cuts the same answer, never changes it
    b = answer_words(text, 300, seed=6)
    assert b[:10] == a[:10] and b != a  # the same code and its 9-word restatement, other prose
    assert answer_words(prompts[2][0], 300, seed=5) != a


def test_loop_is_caught_by_the_degeneration_check(prompts):
    loop = parse_answer_fault("loop")
    texts = [answer_text(t, 256, seed=3, fault=loop) for t, _ in prompts]
    assert texts[0] == " ".join([LOOP_TOKEN.strip()] * 256)
    assert degenerate_rate(texts) == 1.0
    assert needle_accuracy(zip(texts, [a for _, a in prompts], strict=True)) == 0.0
    later = parse_answer_fault("loop:40")
    texts = [answer_text(t, 256, seed=3, fault=later) for t, _ in prompts]
    assert degenerate_rate(texts) == 1.0
    assert needle_accuracy(zip(texts, [a for _, a in prompts], strict=True)) == 1.0  # stated, then looped
    assert not degenerate(answer_text(prompts[0][0], 12, seed=3, fault=loop))[0]  # too short to judge


def test_wrong_past_is_caught_by_needle_scoring(prompts):
    fault = parse_answer_fault("wrong_past:10000")
    answers = [a for _, a in prompts]
    short = [answer_text(t, 64, seed=3, fault=fault, prompt_tokens=3000) for t, _ in prompts]
    long = [answer_text(t, 64, seed=3, fault=fault, prompt_tokens=30000) for t, _ in prompts]
    assert needle_accuracy(zip(short, answers, strict=True)) == 1.0
    assert needle_accuracy(zip(long, answers, strict=True)) == 0.0
    assert degenerate_rate(long) == 0.0  # fluent and wrong: only the needle check sees it
    # without prompt_tokens the length is estimated as chars / 4 (a 3k-token prompt is ≈ 12-15k chars)
    estimated = parse_answer_fault("wrong_past:1000")
    assert not score_needle(answer_text(prompts[0][0], 8, fault=estimated), answers[0])


def test_spec_diverge_is_caught_by_the_comparison(prompts):
    fault = parse_answer_fault("spec_diverge")
    ar = [answer_text(t, 200, seed=3, fault=fault, speculative=False) for t, _ in prompts]
    spec = [answer_text(t, 200, seed=3, fault=fault, speculative=True) for t, _ in prompts]
    assert ar == [answer_text(t, 200, seed=3) for t, _ in prompts]  # without speculation: the healthy answer
    r = answer_mismatch_rate(spec, ar)
    assert r["mismatch_rate"] == 1.0 and 0 < r["prefix_agreement"] < 0.1
    assert degenerate_rate(spec) == 0.0
    assert needle_accuracy(zip(spec, [a for _, a in prompts], strict=True)) == 1.0  # diverges after the code
    healthy = [answer_text(t, 200, seed=3, speculative=True) for t, _ in prompts]
    assert answer_mismatch_rate(healthy, ar)["mismatch_rate"] == 0.0  # a lossless server matches
    at_zero = parse_answer_fault("spec_diverge:0")
    spec0 = [answer_text(t, 200, seed=3, fault=at_zero, speculative=True) for t, _ in prompts]
    assert needle_accuracy(zip(spec0, [a for _, a in prompts], strict=True)) == 0.0


def test_other_faults_leave_the_answer_healthy(prompts):
    text, _ = prompts[0]
    assert answer_words(text, 50, fault=Fault("stall", 1.0)) == answer_words(text, 50)


def test_parse_answer_fault():
    assert parse_answer_fault("loop") == Fault("loop", 0.0)
    assert parse_answer_fault("LOOP:16") == Fault("loop", 16.0)
    assert parse_answer_fault("wrong_past:30000") == Fault("wrong_past", 30000.0)
    assert parse_answer_fault("spec_diverge") == Fault("spec_diverge", 8.0)
    with pytest.raises(ValueError, match="needs an argument"):
        parse_answer_fault("wrong_past")
    with pytest.raises(ValueError, match="unknown answer fault"):
        parse_answer_fault("stall:1", where="--sim-fault-rate")
    with pytest.raises(ValueError, match="whole number"):
        parse_answer_fault("loop:1.5")
    with pytest.raises(ValueError, match="not a number"):
        parse_answer_fault("loop:x")


def test_sim_answers_imports_nothing_of_the_load_generator():
    tree = ast.parse(Path(sim_answers.__file__).read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in mods if m.startswith("servesweep")} <= {"servesweep.sim.faults"}
