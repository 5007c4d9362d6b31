"""Workloads beyond single-shot chat (docs/workloads.md): what a point's requests are made of.

`build_workload(point)` turns a resolved LoadPoint into pre-encoded request bodies (synthetic, shared-prefix and
dataset prompts, each with its own output length when `output_dist` is set), or, for agent sessions, the pieces a
session is grown from turn by turn, or, for a trace replay, one body per trace request in the trace's order with
the schedule to send them on (`TraceSpec`). No Locust or gevent import: `run_point` builds (and disk-caches) it before the
Locust process starts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from servesweep.config.output_dist import parse_output_dist
from servesweep.config.point import LoadPoint
from servesweep.workload.pool import NONCE_SLOT

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}


def request_extra(point: LoadPoint) -> dict:
    """Body fields besides the prompt and the length: streaming with usage, ignore_eos, thinking, the user's extras.
    /generate takes its options in sampling_params and streams without stream_options."""
    extra: dict = {}
    if point.endpoint == "generate":
        sp = {"ignore_eos": True} if point.ignore_eos else {}
        extra["sampling_params"] = {**sp, **point.extra_body.get("sampling_params", {})}
        extra.update({k: v for k, v in point.extra_body.items() if k != "sampling_params"})
        return extra
    so = {"include_usage": True}
    if point.continuous_usage:
        so["continuous_usage_stats"] = True
    extra.update({"stream": True, "stream_options": so})
    if point.ignore_eos:
        extra["ignore_eos"] = True
    extra.update(point.extra_body)
    if point.thinking is not None:  # merged into the user's own chat_template_kwargs, if any
        extra["chat_template_kwargs"] = {
            **point.extra_body.get("chat_template_kwargs", {}),
            "enable_thinking": point.thinking,
        }
    return extra


@dataclass
class Workload:
    """What the users of one point send: per prompt (head, tail) around the nonce, and how to fill the nonce."""

    bodies: list[tuple[bytes, bytes]]
    nonce_digits: int
    nonce_format: str
    path: str
    output_tokens: list[int]  # per body: its max_tokens (target_output_tokens of its records)
    agent: AgentSpec | None = None
    trace: TraceSpec | None = None  # a trace replay: body i is the window's request i


@dataclass
class TraceSpec:
    """A trace replay's schedule and what its fidelity check needs (docs/workloads.md, "Trace replay").

    `trace` is the replayed window at speed 1 (its timestamps as in the file, less the window's start); body i of
    the Workload is its request i. `schedule(index, count)` gives worker `index` of `count` its starts (requests
    and whole sessions) at the trace's timestamps divided by `speed_up`."""

    trace: Any  # servesweep.workload.trace.model.Trace (kept untyped here: no import at module load)
    speed_up: float
    source: str

    def schedule(self, index: int = 0, count: int = 1, start_ns: int | None = None):
        from servesweep.workload.arrivals import TraceSchedule

        reqs = self.trace.requests
        return TraceSchedule(
            [r.timestamp_ms for r in reqs],
            [r.session_id for r in reqs],
            [r.delay_ms for r in reqs],
            [r.turn for r in reqs],
            speed_up=self.speed_up,
            index=index,
            count=count,
            start_ns=start_ns,
        )


@dataclass
class AgentSpec:
    """The parts an agent session is grown from (see `AgentSession`)."""

    first_turns: list[dict]  # per session start: {"messages": [...] with the nonce slot, "nonce_digits", ...}
    tool_results: list[str]  # tool-result texts of `tool_result_tokens` tokens each
    extra: dict  # body fields besides model/messages/max_tokens
    model: str
    output_tokens: int
    turns: int
    cap: int
    think_time_s: float
    tool_tokens: int = 0
    nonce_format: str = "digits"


def _pool(point: LoadPoint, endpoint: str):
    from servesweep.workload.prompts import build_pool

    chat = endpoint == "chat"
    if point.workload == "dataset":
        from servesweep.workload.datasets import load_dataset

        assert point.dataset is not None  # LoadPoint's check: the dataset workload needs a file
        return load_dataset(
            point.dataset,
            n=point.pool_size,
            seed=point.seed,
            min_prompt_tokens=point.dataset_min_tokens,
            max_prompt_tokens=point.dataset_max_tokens,
            tokenizer=point.tokenizer,
            endpoint=endpoint,
            cache_bust=point.cache_bust,
            template_overhead=point.template_overhead if chat else None,
        )
    shared = point.shared_prefix_tokens if point.workload == "shared_prefix" else 0
    return build_pool(
        point.prompt_tokens,
        point.effective_pool_size(),
        tokenizer=point.tokenizer,
        seed=point.seed,
        endpoint=endpoint,
        template_overhead=point.template_overhead if chat else None,
        cache_bust=point.cache_bust,
        shared_prefix_tokens=shared,
        num_groups=point.num_groups if shared else 1,
    )


def output_lengths(point: LoadPoint, n: int, refs: list[int | None] | None = None) -> list[int]:
    """Per prompt: the fixed output length, a seeded draw from output_dist, or (datasets) nothing else given."""
    if point.output_dist is None:
        return [point.output_tokens] * n
    dist = parse_output_dist(point.output_dist)
    if dist is None:  # "dataset": the reference answer's length where the record has one
        return [r or point.output_tokens for r in (refs or [None] * n)]
    rng = random.Random(f"servesweep-output-{point.seed}")
    return [dist.draw(rng) for _ in range(n)]


def build_workload(point: LoadPoint, *, trace_replay: bool = False) -> Workload:
    """The point's request bodies (the point must be resolved: model, template overhead, continuous usage).

    A trace point's bodies are only useful to a caller that sends body i at its slot of `Workload.trace` (the Locust
    user does: client/user.py): such a caller says so with `trace_replay=True`; any other (one that would cycle the
    bodies as a pool) gets a ValueError rather than a replay in the wrong order."""
    if point.model is None:
        raise ValueError("build_workload: the point has no model yet; resolve it first (load.resolve_point)")
    if point.workload == "agent":
        return _build_agent(point, point.model)
    if point.workload == "trace":
        if not trace_replay:
            raise ValueError(
                "workload trace: a trace's bodies are sent at their TraceSchedule slots, body i at request i's, not "
                "cycled as a pool; build them with build_workload(point, trace_replay=True) from a caller that "
                "replays them so (the Locust user)"
            )
        return _build_trace(point, point.model)
    pool_endpoint = "completions" if point.endpoint == "generate" else point.endpoint
    pool = _pool(point, pool_endpoint)
    lengths = output_lengths(point, len(pool), [p.output_tokens for p in pool.prompts])
    extra = request_extra(point)
    bodies = [
        p.body_parts(point.model, n, point.endpoint, extra)
        for p, n in zip(pool.prompts, lengths, strict=True)
    ]
    digits = int(pool.nonce_digits) if point.cache_bust else 0
    return Workload(bodies, digits, pool.nonce_format, PATHS[point.endpoint], lengths)


# ---------------------------------------------------------------- trace replay


def load_point_trace(point: LoadPoint):
    """The point's trace window (read, cut to trace_start_s/trace_window_s, sampled by trace_sample with the seed),
    at speed 1."""
    from servesweep.workload.trace.readers import read_trace
    from servesweep.workload.trace.window import window

    assert point.trace is not None  # LoadPoint's check: the trace workload needs a file
    t = read_trace(point.trace)
    return window(t, point.trace_start_s, point.trace_window_s, point.trace_sample, point.seed)


def _build_trace(point: LoadPoint, model: str) -> Workload:
    from servesweep.workload.trace.block_prompts import TracePrompts

    t = load_point_trace(point)
    if not t.requests:
        raise ValueError(f"trace {point.trace}: no request in the window (start {point.trace_start_s:g} s)")
    endpoint = point.endpoint
    tp = TracePrompts(
        t,
        tokenizer=point.tokenizer,
        endpoint=endpoint,
        template_overhead=point.template_overhead if endpoint == "chat" else None,
        seed=point.seed,
    )
    extra = request_extra(point)
    lengths = [max(1, r.output_length) for r in t.requests]  # a server rejects max_tokens 0
    bodies = [tp.prompt(i).body_parts(model, n, endpoint, extra) for i, n in enumerate(lengths)]
    spec = TraceSpec(trace=t, speed_up=point.trace_speedup, source=t.source or str(point.trace))
    return Workload(bodies, 0, "digits", PATHS[endpoint], lengths, trace=spec)


# ---------------------------------------------------------------- agent sessions


def agent_shared_tokens(point: LoadPoint) -> int:
    """The tools description of an agent point: a system prompt every session shares (half the first turn unless
    given)."""
    return point.shared_prefix_tokens or max(1, point.prompt_tokens // 2)


def _build_agent(point: LoadPoint, model: str) -> Workload:
    from servesweep.workload.prompts import build_pool

    sessions = max(1, min(64, point.concurrency * 2))
    shared = agent_shared_tokens(point)
    if shared >= point.prompt_tokens:
        raise ValueError(
            f"shared_prefix_tokens={shared}: the tools description must be shorter than prompt_tokens"
        )
    first = build_pool(
        point.prompt_tokens,
        sessions,
        tokenizer=point.tokenizer,
        seed=point.seed,
        endpoint="chat",
        template_overhead=point.template_overhead,
        cache_bust=point.cache_bust,
        shared_prefix_tokens=shared,
        num_groups=1,
    )
    tools = []
    if point.tool_result_tokens:
        tr = build_pool(
            point.tool_result_tokens,
            8,
            tokenizer=point.tokenizer,
            seed=point.seed + 1,
            endpoint="completions",
            cache_bust=False,
        )
        tools = [p.as_text() for p in tr.prompts]
    extra = request_extra(point)
    spec = AgentSpec(
        first_turns=[{"messages": p.messages, "nonce_digits": p.nonce_digits} for p in first.prompts],
        tool_results=tools,
        extra=extra,
        model=model,
        output_tokens=point.output_tokens,
        turns=point.session_turns,
        cap=point.context_cap_tokens,
        think_time_s=point.think_time_s,
        tool_tokens=point.tool_result_tokens,
        nonce_format=first.nonce_format,
    )
    # bodies: the first turn of each session, for callers that only look at sizes; sessions build their own.
    bodies = [p.body_parts(model, point.output_tokens, "chat", extra) for p in first.prompts]
    digits = int(first.nonce_digits) if point.cache_bust else 0
    return Workload(bodies, digits, first.nonce_format, PATHS["chat"], [point.output_tokens] * sessions, spec)


@dataclass
class AgentSession:
    """One agent session: the shared tools description, a task, then turns of (answer, tool result) appended."""

    spec: AgentSpec
    messages: list[dict]
    session_id: str
    turn: int = 0
    context_tokens: int = 0  # the last turn's prompt + completion, as the server counted them
    _tool: int = field(default=0)

    @classmethod
    def start(cls, spec: AgentSpec, index: int, nonce: str, session_id: str) -> AgentSession:
        first = spec.first_turns[index % len(spec.first_turns)]
        msgs = [{**m, "content": m["content"].replace(NONCE_SLOT, nonce)} for m in first["messages"]]
        return cls(spec, msgs, session_id, _tool=index)

    def body(self) -> bytes:
        obj = {"model": self.spec.model, "messages": self.messages, "max_tokens": self.spec.output_tokens}
        obj.update(self.spec.extra)
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

    def advance(self, answer: str, prompt_tokens: int | None, completion_tokens: int | None) -> bool:
        """Append the model's answer and a tool result; False when the session is over (turns or context cap)."""
        self.turn += 1
        self.context_tokens = (prompt_tokens or 0) + (completion_tokens or 0)
        if self.turn >= self.spec.turns:
            return False
        tool = (
            self.spec.tool_results[self._tool % len(self.spec.tool_results)] if self.spec.tool_results else ""
        )
        self._tool += 1
        # The next prompt: this context, the tool result, and the template's few tokens around each message.
        nxt = self.context_tokens + self.spec.tool_tokens + self.spec.output_tokens + 16
        if nxt > self.spec.cap:
            return False
        self.messages.append({"role": "assistant", "content": answer})
        self.messages.append({"role": "user", "content": f"Tool result:\n{tool}"})
        return True


def build_bodies(point: LoadPoint) -> tuple[list[tuple[bytes, bytes]], int]:
    """Pre-encoded request bodies of the point's workload: per prompt (head, tail) around the nonce, and the nonce
    length in digits (0 when cache busting is off)."""
    w = build_workload(point)
    return w.bodies, w.nonce_digits
