"""Needle probes: before a server configuration's load points, a few greedy requests per prompt length of the
matrix, whose answers are scored against the needle their prompt hides (docs/answers.md).

The probes are not load: they go out once the server is ready, are not in any point's records, and their
results go to `answers/<config_id>.json` (results/needle.py reads them), the manifest's configuration and each
point's summary (`needle_accuracy` at its prompt length). The same prompts (same seed, no nonce: a probe's id
names its prompt) go to every configuration of the run, so a speculative bundle's answers compare with the
autoregressive bundle's, prompt by prompt. Greedy (temperature 0), EOS allowed, `max_tokens` with room for a
thinking model's reasoning (its `reasoning_content` and any `<think>` block are not the answer).

While the probes are out, a line says how many are answered, how many are outstanding (at which prompt lengths)
and for how long, every PROGRESS_EVERY_S (`SERVESWEEP_PROBE_PROGRESS_S` sets it): a 100k-token probe takes minutes.
Building the probes' prompts says so once when it takes more than SLOW_BUILD_S (tokenizing long prompts).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servesweep.config.experiment import Experiment
from servesweep.results import manifest as mf
from servesweep.results.answer_checks import degenerate, score_needle
from servesweep.results.needle import is_speculative, needle_warning
from servesweep.results.needle_file import probes_path, save_probes
from servesweep.results.point_summary import SUMMARY, PointSummary
from servesweep.target import http

CONTEXT_MARGIN = 64  # tokens left free under the context length besides the prompt and max_tokens


def probe_lengths(m: mf.Manifest, config_id: str) -> dict[int, int]:
    """{prompt tokens: the largest output tokens of a runnable point at that length} of one configuration."""
    out: dict[int, int] = {}
    for p in m.points.values():
        if (
            p["config_id"] == config_id
            and p["status"] != mf.INFEASIBLE
            and p.get("endpoint", "chat") == "chat"
        ):
            out[p["prompt_tokens"]] = max(out.get(p["prompt_tokens"], 0), p["output_tokens"])
    return out


def _max_tokens(exp: Experiment, flags: dict, prompt_tokens: int, point_output: int) -> int:
    """The probe's max_tokens: the experiment's, within the configuration's context length (at least what the
    matrix's own points at this length ask for, which the planner found to fit)."""
    ctx = flags.get("context_length")
    room = int(ctx) - prompt_tokens - CONTEXT_MARGIN if ctx else exp.answers.max_tokens
    return max(point_output, min(exp.answers.max_tokens, room))


def _ask(url: str, body: dict, api_key: str | None, timeout: float) -> dict:
    """One probe: its answer (content), reasoning, finish reason, or the error that ended it."""
    try:
        r = http.post_json(url, body, api_key=api_key, timeout=timeout)
        msg = (r.get("choices") or [{}])[0]
        m = msg.get("message") or {}
        return {
            "answer": m.get("content") or "",
            "reasoning": m.get("reasoning_content"),
            "finish_reason": msg.get("finish_reason"),
            "completion_tokens": (r.get("usage") or {}).get("completion_tokens"),
            "error": None,
        }
    except (http.ServerError, ValueError, AttributeError, IndexError) as e:
        return {"answer": None, "reasoning": None, "finish_reason": None, "error": str(e)[:500]}


def _model(base_url: str, exp: Experiment, api_key: str | None) -> str:
    if exp.model.served_model_name:
        return exp.model.served_model_name
    try:
        return http.get_json(base_url + "/v1/models", api_key=api_key)["data"][0]["id"]
    except (http.ServerError, KeyError, IndexError, TypeError):
        return exp.model.path


PROGRESS_EVERY_S = 5.0  # a probe line this often while probes are out (one 100k-token probe takes minutes)
PROGRESS_ENV = "SERVESWEEP_PROBE_PROGRESS_S"  # sets it (the tests' short probes)
SLOW_BUILD_S = 2.0  # building the probes' prompts takes longer than this: said once while it runs


def progress_every_s() -> float:
    """The interval of the probes' progress lines: $SERVESWEEP_PROBE_PROGRESS_S, else PROGRESS_EVERY_S."""
    try:
        return max(0.01, float(os.environ.get(PROGRESS_ENV) or PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S


@contextmanager
def said_if_slow(say: Callable[[str], None], what: str, after_s: float = SLOW_BUILD_S) -> Iterator[None]:
    """Run the block; when it takes more than `after_s`, `say` gets one line while it still runs."""
    timer = threading.Timer(after_s, say, args=(f"{what} (over {after_s:g} s so far)",))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def wait_with_progress(
    futures: dict[Future, int], say: Callable[[str], None], every_s: float, what: str = "needle probe(s)"
) -> float:
    """Wait for every future ({future: its prompt length}); while some are out, every `every_s` a line says how
    many are answered, how many are outstanding and at which lengths, and the time since the call; a last line
    when all are in. Returns the seconds it took."""
    t0 = time.monotonic()
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=every_s)
        if pending:
            at = ", ".join(f"{n:,}" for n in sorted({futures[f] for f in pending}))
            say(
                f"{len(futures) - len(pending)} of {len(futures)} {what} answered, {len(pending)} outstanding at "
                f"{at} prompt tokens ({time.monotonic() - t0:.1f} s)"
            )
    took = time.monotonic() - t0
    say(f"{len(futures)} of {len(futures)} {what} answered ({took:.1f} s)")
    return took


def run_probes(
    exp: Experiment,
    flags: dict,
    lengths: dict[int, int],
    base_url: str,
    api_key: str | None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Send the probes of every length (all at once: a few requests) and score them; `progress` gets a line when
    they go out, then "k of n answered, m outstanding" every progress_every_s() while some are out, and one when
    the last is in (and one while their prompts are built, if that takes more than SLOW_BUILD_S)."""
    from servesweep.workload.prompts import build_pool

    a = exp.answers
    say = progress or (lambda _line: None)
    shown = ", ".join(f"{n:,}" for n in sorted(lengths))
    model = _model(base_url, exp, api_key)
    jobs: list[tuple[dict[str, Any], dict]] = []
    t_build = time.monotonic()
    with said_if_slow(say, f"building the needle probes' prompts at {shown} tokens, cached for later runs"):
        pools = {
            length: build_pool(
                length, a.probes_per_length, tokenizer=exp.model.tokenizer, seed=a.seed, cache_bust=False
            )
            for length in sorted(lengths)
        }
    built_s = time.monotonic() - t_build
    for length, out_tokens in sorted(lengths.items()):
        for i, prompt in enumerate(pools[length]):
            body = {
                "model": model,
                "messages": prompt.render(""),
                "max_tokens": _max_tokens(exp, flags, length, out_tokens),
                "temperature": 0,
                "stream": False,
            }
            jobs.append(({"id": f"{length}/{i}", "prompt_tokens": length, "expected": prompt.answer}, body))
    url = base_url + "/v1/chat/completions"
    built = f"; prompts built in {built_s:.1f} s" if built_s > SLOW_BUILD_S else ""
    say(f"{len(jobs)} needle probe(s) at {shown} prompt tokens sent (greedy, up to {a.timeout_s:g} s each{built})")
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as ex:
        futures = {
            ex.submit(_ask, url, body, api_key, a.timeout_s): meta["prompt_tokens"] for meta, body in jobs
        }
        wait_with_progress(futures, say, progress_every_s())
        got = [f.result() for f in futures]  # in the order sent (dicts keep it)
    probes = []
    for (meta, _), g in zip(jobs, got, strict=True):
        ok = g["answer"] is not None and meta["expected"] is not None
        probes.append({**meta, **g, "correct": score_needle(g["answer"], meta["expected"]) if ok else None})
    return {
        "model": model,
        "speculative": is_speculative(flags),
        "lengths": _by_length(probes),
        "probes": probes,
    }


def _by_length(probes: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in probes:
        d = out.setdefault(
            str(p["prompt_tokens"]), {"n": 0, "correct": 0, "failed": 0, "no_needle": 0, "degenerate": 0}
        )
        # the probe's answer judged like every load request's (a random model's greedy answers are floods a
        # needle score alone does not name)
        if p.get("answer") and degenerate(p["answer"])[0]:
            d["degenerate"] += 1
        # a prompt too short to hide a needle: its answer still compares (speculative vs autoregressive)
        if p["expected"] is None:
            d["no_needle"] += 1
            continue
        if p["correct"] is None:
            d["failed"] += 1
            continue
        d["n"] += 1
        d["correct"] += bool(p["correct"])
    for d in out.values():
        d["needle_accuracy"] = d["correct"] / d["n"] if d["n"] else None
    return out


def probe_configuration(
    exp: Experiment, m: mf.Manifest, config_id: str, base_url: str, api_key: str | None, event: Callable
) -> None:
    """The hook the orchestrator calls once a configuration's server is ready: probe it (once per run: a resumed
    run keeps the probes it has), write the results, print one line per prompt length."""
    path = probes_path(m.run_dir, config_id)
    lengths = probe_lengths(m, config_id)
    if not exp.answers.needle_probes or not lengths or path.is_file():
        return
    flags = m.configs[config_id].get("flags") or {}
    def progress(line: str) -> None:
        event(f"  [dim]{config_id}: {line}[/]")

    probes = run_probes(exp, flags, lengths, base_url, api_key, progress)
    data = save_probes(m.run_dir, {"config_id": config_id, **probes})  # checked: results/needle_file.py
    m.configs[config_id]["needle_accuracy"] = {k: v["needle_accuracy"] for k, v in data["lengths"].items()}
    m.save()
    for length, v in data["lengths"].items():
        event(length_line(config_id, length, v))
    for length, v in data["lengths"].items():  # after the lines: the loud part, as for degenerate answers
        if warning := needle_warning(config_id, length, v):
            event(f"[bold red]{warning}[/]")


def length_line(config_id: str, length: str, v: dict) -> str:
    """The console's line for one prompt length of a configuration's probes (rich markup)."""
    acc = v["needle_accuracy"]
    shown = "-" if acc is None else f"{acc:.0%}"
    color = "green" if acc == 1 else "red" if acc is not None and acc < 0.5 else "yellow"
    fails = f", {v['failed']} failed" if v["failed"] else ""
    if v.get("degenerate"):
        fails += f", {v['degenerate']} degenerate answers"
    if not v["n"] and v.get("no_needle"):  # say why there is no score, instead of a bare "- (0/0)"
        fails += f"; no needle: {length}-token prompts are too short to hide one (docs/answers.md)"
    return f"  [{color}]needle {config_id} @ {length} tokens: {shown} ({v['correct']}/{v['n']}{fails})[/]"


def needle_into_summary(summary: dict, folder: Path, run_dir: Path, config_id: str) -> None:
    """A point's summary (and its summary.json in `folder`) gets its configuration's needle accuracy at the
    point's prompt length, beside its speed (the exporter's gauge and the report read it there)."""
    from servesweep.results.needle import needle_for_point

    length = (summary.get("point") or {}).get("prompt_tokens")
    acc = needle_for_point(run_dir, config_id, length) if length else None
    if acc is None:
        return
    summary["needle_accuracy"] = acc
    f = Path(folder) / SUMMARY
    if f.is_file():
        PointSummary.load(f).model_copy(update={"needle_accuracy": acc}).save(f)
