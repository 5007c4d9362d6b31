"""`servesweep plan`: expand an experiment, drop infeasible points with their reason, estimate wall time, and order
the server configurations so the matrix restarts the server as few times as possible.

All memory arithmetic comes from `servesweep.sglang.serverargs.resolve_server` (the same code the emulator runs), and time
estimates from the step-time model the emulator runs (`servesweep.sglang.stepmodel`), so plan, dry run and emulator agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from servesweep.config.experiment import (
    KV_OVERFLOW,
    Experiment,
    ServerConfig,
)
from servesweep.config.point import LoadPoint
from servesweep.matrix.timeline import attach_schedule, packed_json, print_packed

# Fixed costs (seconds) of the documented simple estimate (docs/experiments.md#time-estimates).
# one role start: ~1.5 s to the first task, 4 module/script tasks, readiness polls (bench/bench_role.py: 5.5 s on an
# idle localhost; over SSH and under load more)
ANSIBLE_RUN_S = 7.0
EMULATOR_LOAD_S = 2.0  # the emulator's simulated load + warmup, tokenizer and pool set-up
SGLANG_FIXED_START_S = 90.0  # SGLang process start, CUDA graph capture, warmup (excluding weight loading)
WEIGHT_LOAD_BYTES_PER_S = 2.0e9  # weights read from local disk/page cache per GPU
POINT_OVERHEAD_S = 6.0  # Locust subprocess start, prompt pool, template probe, result files
LONG_PREFILL_S = 20.0  # a prefill this long is worth a warning
MULTI_MINUTE_S = 60.0
OVERRIDE_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# Stable pitfall codes (`plan --json` → "pitfalls"): what people running these matrices by hand get wrong.
CONTEXT_TOO_SHORT = "context_length_too_short"  # --context-length below prompt + output of some points
CONTEXT_ABOVE_MAX = (
    "context_length_above_model_max"  # above config.json's maximum without the override variable
)
TP_OVER_KV_HEADS = "tp_exceeds_kv_heads"  # KV heads replicate: KV capacity per GPU stops growing with tp
MEMORY_FIT = (
    "kv_state_memory"  # KV pool and recurrent-state slots per tp and memory fraction; points that do not fit
)
# points past the KV pool kept on purpose (`keep: [kv_overflow]`): run and labelled instead of dropped
KV_OVERFLOW_KEPT = KV_OVERFLOW
SPEC_RESET = "spec_resets_max_running_requests"  # any spec algorithm sets max_running_requests=48 when unset
MULTI_MINUTE_PREFILL = "multi_minute_prefill"  # TTFT of the last concurrent prompt above a minute
OVER_BUDGET = "over_budget"  # the estimate exceeds budget.wall_time; the points to cut first
CANNOT_START = "server_cannot_start"  # the configuration fails SGLang's start-up checks (memory, tp)
GENERIC_UNPLANNED = (
    "generic_server_unplanned"  # launcher.command: no memory plan, no SGLang checks, rough times
)
GENERIC_START_S = 120.0  # a generic server's start (unknown: model load, warmup), for the time estimate only
# Stopping a server before the next starts on its GPUs: the role's `stopped` run (a few tasks, no readiness wait:
# 1.5-2 s locally, more over SSH), then SIGTERM and the server's teardown (SGLang: scheduler and detokenizer
# processes exit, NCCL and CUDA contexts freed) until its port is closed. The emulator exits at once.
ANSIBLE_STOP_RUN_S = 3.0
SERVER_STOP_S = 10.0
EMULATOR_STOP_S = 0.5
PITFALLS = (
    CONTEXT_TOO_SHORT,
    CONTEXT_ABOVE_MAX,
    TP_OVER_KV_HEADS,
    MEMORY_FIT,
    KV_OVERFLOW_KEPT,
    SPEC_RESET,
    MULTI_MINUTE_PREFILL,
    OVER_BUDGET,
    CANNOT_START,
    GENERIC_UNPLANNED,
)


@dataclass
class PointPlan:
    """A load point of the plan (the LoadPoint the run passes to its load generator) and what the planner made of
    it."""

    point: LoadPoint
    feasible: bool = True
    reasons: list[str] = field(default_factory=list)  # why it was dropped
    warnings: list[str] = field(default_factory=list)
    est_s: float = 0.0
    detail: dict[str, Any] = field(
        default_factory=dict
    )  # prefill_s, ttft_s, itl_s, request_s, last_ttft_s; replay
    codes: list[str] = field(default_factory=list)  # pitfall codes this point is affected by (see PITFALLS)
    search: dict[str, Any] | None = None  # a search block's combination: start, probes, time (capacity_plan)

    @property
    def id(self) -> str:
        return self.point.id

    @property
    def workload(self) -> str:
        """The experiment's name for the point's workload (what reports group by)."""
        assert self.point.workload_name is not None  # every point of an experiment has one (points_for)
        return self.point.workload_name


@dataclass
class ConfigPlan:
    config: ServerConfig
    resolved: Any = (
        None  # servesweep.sglang.serverargs.ResolvedServer, None when the configuration cannot start
    )
    error: str | None = None
    points: list[PointPlan] = field(default_factory=list)
    excluded_points: int = 0
    warnings: list[str] = field(default_factory=list)
    start_s: float = 0.0
    stop_s: float = (
        0.0  # stopping this server so the next can take its GPUs (a restart is a stop and a start)
    )
    facts: dict[str, Any] = field(default_factory=dict)
    restart: bool = True  # False when the previous configuration launches the same server
    error_code: str | None = None
    context_fix: dict[str, Any] | None = None  # what to set instead when the context length is too short

    @property
    def feasible_points(self) -> list[PointPlan]:
        return [p for p in self.points if p.feasible] if self.error is None else []

    @property
    def est_s(self) -> float:
        fp = self.feasible_points
        return ((self.start_s + self.stop_s) if (fp and self.restart) else 0.0) + sum(p.est_s for p in fp)


@dataclass
class Plan:
    experiment: Experiment
    configs: list[ConfigPlan]
    excluded_configs: list[tuple[ServerConfig, int]]
    warnings: list[str] = field(default_factory=list)
    cut_first: list[str] = field(default_factory=list)  # point ids to drop first to fit the budget
    pitfalls: list[dict[str, Any]] = field(
        default_factory=list
    )  # structured, one entry per code (see PITFALLS)
    decision: dict[str, Any] | None = None  # the decide block's predicted time to decision (attach_decision)

    @property
    def total_s(self) -> float:
        return sum(c.est_s for c in self.configs)

    @property
    def budget_s(self) -> float | None:
        return self.experiment.budget.wall_time_s

    @property
    def restarts(self) -> int:
        return sum(1 for c in self.configs if c.feasible_points and c.restart)

    def point_plans(self) -> list[PointPlan]:
        return [p for c in self.configs for p in c.points]


# ----------------------------------------------------------------------------------------------------------------


def make_plan(exp: Experiment) -> Plan:
    configs, excluded = exp.server_configs()
    plans = [_plan_config(exp, cfg) for cfg in configs]
    plans = _order(plans)
    plan = Plan(exp, plans, excluded)
    _budget(plan)
    _global_warnings(plan)
    plan.pitfalls = _pitfalls(plan)
    return plan


def _resolve_args(exp: Experiment, cfg: ServerConfig) -> dict[str, Any]:
    from servesweep.sglang.flags import HOST_SETTINGS

    args = {k: v for k, v in cfg.flags.items() if v is not None and k not in HOST_SETTINGS}
    args["model_path"] = exp.model.path
    if exp.model.served_model_name:
        args["served_model_name"] = exp.model.served_model_name
    if exp.launcher.gpu:
        args["sim_gpu"] = exp.launcher.gpu
    args["sim_sglang_version"] = exp.sglang_version
    return args


def _plan_config(exp: Experiment, cfg: ServerConfig) -> ConfigPlan:
    """Resolve one server configuration the way SGLang starts it, then check and price each of its points."""
    from servesweep.sglang.models import load_model_arch
    from servesweep.sglang.serverargs import resolve_server

    cp = ConfigPlan(cfg)
    points, dropped = exp.points_for(cfg)
    cp.excluded_points = len(dropped)
    cp.points = [PointPlan(p) for p in points]
    why = _power_limit_problem(exp, cfg)
    if why is not None:  # the role would refuse it on the host: refused here, before any server starts
        cp.error = why
        return cp
    if exp.launcher.generic:
        return _plan_generic(exp, cp)
    try:
        arch = load_model_arch(exp.model.path)
    except (ValueError, OSError) as e:
        cp.error = f"model: {e}"
        return cp
    problems = _start_problems(exp, cfg, arch)
    if problems:
        ctx_asked = cfg.flags.get("context_length")
        cp.error = "; ".join(problems)
        cp.error_code = CONTEXT_ABOVE_MAX if ctx_asked and ctx_asked > arch.max_position_embeddings else None
        return cp
    try:
        rs = resolve_server(
            _resolve_args(exp, cfg), cfg.env, extra_spec_algorithms=set(exp.launcher.extra_spec_algorithms)
        )
    except (ValueError, RuntimeError) as e:  # SGLang's own start-up errors (context override, memory)
        cp.error = str(e)
        return cp
    cp.resolved = rs
    cp.facts = _server_facts(rs, arch)
    # the spec reset is reported by _running_cap_warning with the concurrencies it caps
    cp.warnings.extend(w for w in rs.warnings if "reset to 48" not in w)
    if rs.tp_size > arch.num_kv_heads:
        cp.warnings.append(
            f"tp_size {rs.tp_size} exceeds the model's {arch.num_kv_heads} KV heads: KV heads replicate, so KV bytes "
            f"per token per GPU stay at {rs.kv_bytes_per_token / 1024:.0f} KiB (as at tp {arch.num_kv_heads}) and KV "
            "capacity per GPU stops growing with tp"
        )
    _plan_points(exp, cfg, rs, arch, cp)
    return cp


def _power_limit_problem(exp: Experiment, cfg: ServerConfig) -> str | None:
    """A gpu_power_limit_w outside the GPU's allowed range (its profile: launcher.gpu, the emulator's default GPU
    where the emulator runs), or None. Without a known GPU (real hardware, launcher.gpu unset) the role's script
    checks the range on the host (NVML's constraints) and fails the start instead."""
    from servesweep.sglang.gpus import POWER_LIMIT_AXIS, power_limit_problem

    watts = cfg.flags.get(POWER_LIMIT_AXIS)
    if watts is None or not (exp.launcher.gpu or exp.launcher.emulator):
        return None
    why = power_limit_problem(exp.launcher.gpu or None, float(watts))
    return f"{POWER_LIMIT_AXIS} {watts:g}: {why}" if why else None


def _price_under_limit(timer: _Timer | None, cfg: ServerConfig) -> None:
    """Steps priced under the configuration's power limit (a compute-bound prefill slows; StepModel.set_power)."""
    from servesweep.sglang.gpus import POWER_LIMIT_AXIS

    watts = cfg.flags.get(POWER_LIMIT_AXIS)
    lim = timer.rs.gpu.power if timer is not None else None
    if timer is not None and watts is not None and lim is not None:
        timer.model.set_power(lim.cap_share(float(watts)))


def _overrides_context(cfg: ServerConfig) -> bool:
    """Whether the configuration's environment lets SGLang run above the model's maximum context."""
    return cfg.env.get(OVERRIDE_ENV) in ("1", "true", "True")


def _start_problems(exp: Experiment, cfg: ServerConfig, arch) -> list[str]:
    """Why SGLang would refuse to start this configuration (heads, GPUs per host, context), before resolving it."""
    tp = int(cfg.flags.get("tp_size") or 1)
    dp = int(cfg.flags.get("dp_size") or 1)
    problems = []
    if arch.num_heads % tp:
        problems.append(f"tp_size {tp} does not divide the model's {arch.num_heads} attention heads")
    if tp * dp > exp.launcher.gpus_per_host:
        problems.append(
            f"tp_size × dp_size = {tp * dp} GPUs, more than launcher.gpus_per_host ({exp.launcher.gpus_per_host})"
        )
    ctx_asked = cfg.flags.get("context_length")
    if ctx_asked and ctx_asked > arch.max_position_embeddings and not _overrides_context(cfg):
        problems.append(
            f"context_length {ctx_asked} is above the model's maximum {arch.max_position_embeddings}: SGLang refuses to "
            f"start unless server.env sets {OVERRIDE_ENV}=1"
        )
    return problems


def _server_facts(rs, arch) -> dict[str, Any]:
    """What the plan reports of one resolved server (`plan --json` → configs[].facts)."""
    from servesweep.sglang.memory import kv_heads_per_rank

    return {
        "gpu": rs.gpu.name,
        "context_len": rs.context_len,
        "kv_capacity_tokens": rs.max_total_num_tokens,
        "kv_bytes_per_token_per_gpu": rs.kv_bytes_per_token,
        "kv_heads_per_gpu": kv_heads_per_rank(arch, rs.tp_size),
        "state_slot_bytes_per_gpu": rs.state_slot_bytes,
        "state_slots": rs.state_slots,
        "max_running_requests": rs.effective_max_running_requests,
        "mem_fraction_static": rs.mem_fraction_static,
        "chunked_prefill_size": rs.chunked_prefill_size,
        "spec_algorithm": rs.spec_algorithm,
        "memory_usage": rs.memory_usage,
        "hybrid": rs.is_hybrid,
    }


def _plan_points(exp: Experiment, cfg: ServerConfig, rs, arch, cp: ConfigPlan) -> None:
    """Check every point of a startable configuration against its server, price the feasible ones, and record the
    context length to set and the running-request cap they meet."""
    mrr = rs.effective_max_running_requests
    spec_reset = rs.spec_algorithm is not None and cfg.flags.get("max_running_requests") is None
    cp.start_s = _start_estimate(exp, rs)
    cp.stop_s = ANSIBLE_STOP_RUN_S + (EMULATOR_STOP_S if exp.launcher.emulator else SERVER_STOP_S)
    try:
        timer = _Timer(rs, exp)
    except Exception as e:  # the step model is the emulator's; a plan must still print without it
        timer = None
        cp.warnings.append(f"time estimate without the step model ({e})")
    _price_under_limit(timer, cfg)
    # one context length that covers every point of this configuration (what to set instead)
    need_max = max(
        (p.point.prompt_tokens + p.point.output_tokens + rs.num_reserved_tokens for p in cp.points), default=0
    )
    for pp in cp.points:
        _check_point(exp, cfg, rs, arch, pp, mrr, spec_reset, need_max)
        if pp.feasible:
            _estimate_point(exp, rs, pp, timer)
            if exp.search is not None and timer is not None:
                from servesweep.matrix.capacity_plan import price_search

                prompt, output, rate = pp.point.prompt_tokens, pp.point.output_tokens, None
                if (rp := (pp.detail.get("replay") or {})) and rp.get("requests"):
                    # a speed-up search: the trace's mean lengths, its arrivals at speed 1 (workload/trace/replay_estimate.py)
                    prompt, output = round(rp["prompt_mean"]), round(rp["output_mean"])
                    rate = rp["rate_rps"] / rp["speed_up"]
                n = rp.get("requests") if rp else None
                pp.search = price_search(
                    exp, rs, timer, prompt, output, POINT_OVERHEAD_S, rate_per_load=rate, requests=n
                )
                pp.est_s = pp.search["seconds"]
    if any(CONTEXT_TOO_SHORT in pp.codes for pp in cp.points):
        want = _needed_context(need_max)
        above = want > arch.max_position_embeddings and not _overrides_context(cfg)
        cp.context_fix = {
            "context_length": rs.context_len,
            "largest_point_tokens": need_max,
            "set_context_length": want,
            "model_max": arch.max_position_embeddings,
            "set_env": {OVERRIDE_ENV: "1"} if above else {},
        }
    warning = _running_cap_warning(cp, rs, spec_reset)
    if warning:
        cp.warnings.append(warning)


def _running_cap_warning(cp: ConfigPlan, rs, spec_reset: bool) -> str | None:
    """The concurrencies that queue behind max_running_requests, and the spec reset to 48 when it set the cap."""
    from servesweep.sglang.serverargs import SPEC_MAX_RUNNING_REQUESTS

    mrr = rs.effective_max_running_requests
    capped = sorted({p.point.concurrency for p in cp.points if p.feasible and p.point.concurrency > mrr})
    queue = f": concurrency {', '.join(map(str, capped))} will queue" if capped else ""
    if spec_reset:
        msg = (
            f"speculative decoding ({rs.spec_algorithm_asked}) resets max_running_requests to "
            f"{SPEC_MAX_RUNNING_REQUESTS} because it is not set"
        )
        if mrr < SPEC_MAX_RUNNING_REQUESTS:
            msg += f", and the server caps it further to {mrr} (KV / state slots)"
        return msg + queue + ("; set server.base.max_running_requests" if capped else "")
    if capped:
        return f"the server runs at most {mrr} requests at once{queue}"
    return None


def _plan_generic(exp: Experiment, cp: ConfigPlan) -> ConfigPlan:
    """A server servesweep knows nothing of (launcher.command): every point runs, SGLang's memory arithmetic and
    pitfalls do not apply, and the time estimate is only the fixed costs plus the load's own bound."""
    ld = exp.load
    cp.facts = {"server": "generic", "command": exp.launcher.command}
    cp.start_s = ANSIBLE_RUN_S + GENERIC_START_S
    cp.stop_s = ANSIBLE_STOP_RUN_S + SERVER_STOP_S
    for pp in cp.points:
        pp.codes.append(GENERIC_UNPLANNED)
        sched = (ld.requests / pp.point.rate_rps) if (pp.point.rate_rps and ld.requests) else 0.0
        pp.est_s = POINT_OVERHEAD_S + ld.warmup_s + (ld.duration_s or sched)
    return cp


def _needed_context(n: int) -> int:
    """The next power of two above n (what people set --context-length to)."""
    return 1 << max(12, math.ceil(math.log2(n + 1)))


def _check_point(exp, cfg, rs, arch, pp: PointPlan, mrr: int, spec_reset: bool, need_max: int) -> None:
    p, o, c = pp.point.prompt_tokens, pp.point.output_tokens, pp.point.concurrency
    need = p + o + rs.num_reserved_tokens
    if need >= rs.context_len:
        want = _needed_context(need_max)
        fix = f"set context_length to {want} (covers the largest point, {need_max} tokens)"
        if want > arch.max_position_embeddings and not _overrides_context(cfg):
            fix += f" and {OVERRIDE_ENV}=1 (above the model's maximum {arch.max_position_embeddings})"
        extra = f" + {rs.num_reserved_tokens} reserved draft tokens" if rs.num_reserved_tokens else ""
        pp.reasons.append(f"prompt {p} + output {o}{extra} = {need} ≥ context length {rs.context_len}; {fix}")
        pp.codes.append(CONTEXT_TOO_SHORT)
    if p + o > rs.max_total_num_tokens:
        pp.codes.append(MEMORY_FIT)
        pp.reasons.append(
            f"one request needs {p + o} tokens of KV but the pool holds {rs.max_total_num_tokens} "
            f"(tp {rs.tp_size}, mem_fraction_static {rs.mem_fraction_static})"
        )
    elif min(c, mrr) * (p + o) > rs.max_total_num_tokens:
        fit = rs.max_total_num_tokens // (p + o)
        over = (
            f"KV capacity {rs.max_total_num_tokens} tokens < {min(c, mrr)} running × {p + o} tokens: at most {fit} "
            "requests of this size fit, the rest would queue or be retracted"
        )
        if KV_OVERFLOW in exp.keep:  # measured on purpose: runs, labelled in the plan, manifest and report
            pp.codes.append(KV_OVERFLOW_KEPT)
            pp.warnings.append(
                f"{KV_OVERFLOW}: kept past the KV pool on purpose (keep {KV_OVERFLOW}); {over}"
            )
        else:
            pp.codes.append(MEMORY_FIT)
            pp.reasons.append(over)
    pp.feasible = not pp.reasons
    if pp.feasible and c > mrr:
        why = " (speculative decoding's reset to 48)" if spec_reset else ""
        pp.warnings.append(f"concurrency {c} > max running requests {mrr}{why}: {c - mrr} requests queue")
        if spec_reset:
            pp.codes.append(SPEC_RESET)
        if rs.is_hybrid and rs.state_slots // max(1, rs.mamba_ratio) <= mrr:
            pp.codes.append(MEMORY_FIT)  # the state slots, not the KV pool, bound the running requests


class _Timer:
    """Prices one closed-loop point with the emulator's step-time model and accept-length model."""

    def __init__(self, rs, exp: Experiment, overrides: dict[str, str] | None = None):
        from servesweep.sglang.stepmodel import StepModel, calibration_for

        self.rs = rs
        self.model = StepModel(rs, calibration_for(rs, overrides))
        self.accept = 1.0
        if rs.spec_algorithm:
            from servesweep.sglang.speculative import accept_model

            extra = {a.upper() for a in exp.launcher.extra_spec_algorithms}
            self.accept = accept_model(
                rs.spec_algorithm,
                num_steps=rs.spec_num_steps,
                eagle_topk=rs.spec_eagle_topk,
                num_draft_tokens=rs.spec_num_draft_tokens,
                tree=rs.spec_algorithm.upper() in extra,
            ).mean

    def prefill_s(self, prompt: int) -> float:
        chunk = self.rs.chunked_prefill_size if self.rs.chunked_prefill_size > 0 else prompt
        t, done = 0.0, 0
        while done < prompt:
            n = min(chunk, prompt - done)
            t += self.model.prefill(1, n, done, n * (done + n / 2))
            done += n
        return t

    def decode_step_s(self, batch: int, ctx: int) -> float:
        return self.model.decode(batch, batch * ctx)


def _trace_fields(pp: PointPlan) -> dict[str, Any] | None:
    """A trace point's LoadPoint fields (its workload's), None for any other point."""
    return pp.point.model_dump() if pp.point.workload == "trace" and pp.point.trace else None


def _estimate_point(exp: Experiment, rs, pp: PointPlan, timer: _Timer | None) -> None:
    ld = exp.load
    p, o, c = pp.point.prompt_tokens, pp.point.output_tokens, pp.point.concurrency
    replay = None
    if (fields := _trace_fields(pp)) is not None:
        from servesweep.workload.trace.replay_estimate import replay_plan

        try:
            replay = replay_plan(fields)
        except (OSError, ValueError) as e:  # the file is checked again when the point runs
            pp.warnings.append(f"trace {fields['trace']}: {e}")
        if replay is not None and replay.requests:
            p, o = max(1, round(replay.prompt_mean)), max(1, round(replay.output_mean))  # the mean request
    # the batch: the running cap, and the KV pool (a point kept past it runs as many as fit)
    b = max(1, min(c, rs.effective_max_running_requests, rs.max_total_num_tokens // max(1, p + o)))
    if timer is not None:
        prefill = timer.prefill_s(p)
        steps = math.ceil(max(1, o - 1) / timer.accept)
        itl = timer.decode_step_s(b, p + o // 2)
    else:
        # simple roofline: prefill at 40 % of peak FLOP/s, decode reads the weights once per step
        a, g = rs.arch, rs.gpu
        prefill = 2 * a.active_params * p / (g.bf16_flops * 0.4 * rs.tp_size)
        steps = max(1, o - 1)
        itl = (a.total_params * a.weight_bytes / rs.tp_size + rs.kv_bytes_per_token * b * (p + o // 2)) / (
            g.hbm_bandwidth * 0.7
        )
    # A wave of b requests: their prefills run one after the other (they stall decodes), then b decode together.
    wave = b * prefill + steps * itl
    if replay is not None:
        # a replay: its schedule at the speed-up, or the server's pace when slower (workload/trace/replay_estimate.py)
        request_s = prefill + steps * itl
        measure = replay.seconds(request_s, b)
        running = replay.running(request_s, min(c, b))
        kv = replay.kv_tokens(running)
    elif ld.requests is not None:
        measure = math.ceil(ld.requests / b) * wave
        if pp.point.rate_rps:  # open loop: the schedule, unless the server is slower than the rate
            measure = max(measure, ld.requests / pp.point.rate_rps)
    else:
        measure = (ld.duration_s or 0.0) + wave  # running streams finish after the duration
    pp.detail = {
        "prefill_s": round(prefill, 4),
        "ttft_s": round(prefill * (b + 1) / 2, 4),
        "itl_s": round(itl / (timer.accept if timer else 1.0), 5),
        "request_s": round(prefill + steps * itl, 3),
    }
    if replay is not None:
        pp.detail["replay"] = replay.as_dict() | {"running": round(running, 1), "kv_tokens": kv}
        if kv > rs.max_total_num_tokens:
            pp.warnings.append(
                f"the replay's ~{running:.0f} running requests hold ~{kv:,} KV tokens, more than the pool's "
                f"{rs.max_total_num_tokens:,}: the radix cache evicts (fewer hits than the trace's ideal "
                f"{100 * replay.ideal_hit_ratio:.0f}%)"
            )
    pp.est_s = POINT_OVERHEAD_S + ld.warmup_s + measure
    # The first token of the last of c concurrent prompts (closed loop: all c arrive together). Their prefills share
    # the GPU one after another (chunked prefill runs one chunk budget per step), so the b that run wait ≈ b ×
    # prefill; the c - b queued ones start only when a running request finishes, one wave (b prefills + the decode)
    # later per extra wave. A single 29 s prefill is then a multi-minute TTFT at concurrency 4.
    waves = math.ceil(c / b)
    last_ttft = b * prefill + (waves - 1) * (b * prefill + steps * itl)
    pp.detail["last_ttft_s"] = round(last_ttft, 2)
    if prefill >= LONG_PREFILL_S or last_ttft >= MULTI_MINUTE_S:
        msg = f"prefill of {p} tokens takes ~{prefill:.1f} s at tp {rs.tp_size}"
        if c > 1:
            msg += f"; the last of {c} concurrent prompts waits ~{last_ttft / 60:.1f} min for its first token"
            if waves > 1:
                msg += f" ({waves - 1} more waves queue behind {b} running)"
        if last_ttft >= MULTI_MINUTE_S:
            msg += ": multi-minute TTFT"
            pp.codes.append(MULTI_MINUTE_PREFILL)
        pp.warnings.append(msg)
    if prefill * b > ld.first_token_s:
        pp.warnings.append(
            f"the last of {b} concurrent prefills waits ~{prefill * b:.0f} s > load.first_token_s "
            f"({ld.first_token_s:g} s): requests would time out"
        )


def _start_estimate(exp: Experiment, rs) -> float:
    if exp.launcher.emulator:
        return ANSIBLE_RUN_S + EMULATOR_LOAD_S
    weights = rs.memory_usage.get("weight", 0.0) if isinstance(rs.memory_usage, dict) else 0.0
    weight_bytes = (
        float(weights) * (1 << 30) if weights else rs.arch.total_params * rs.arch.weight_bytes / rs.tp_size
    )
    return ANSIBLE_RUN_S + SGLANG_FIXED_START_S + weight_bytes / WEIGHT_LOAD_BYTES_PER_S


def _order(plans: list[ConfigPlan]) -> list[ConfigPlan]:
    """Greedy nearest-neighbour over launch flags, starting from the first configuration: configurations that launch
    the same server become neighbours (no restart between them), and each step changes as few flags as possible."""
    if not plans:
        return plans
    left = plans[:]
    out = [left.pop(0)]
    while left:
        last = out[-1].config
        best = min(left, key=lambda cp: (_distance(last, cp.config), cp.config.index))
        left.remove(best)
        out.append(best)
    prev_key = None
    for cp in out:
        if not cp.feasible_points:
            continue
        cp.restart = cp.config.key() != prev_key
        prev_key = cp.config.key()
    return out


def _distance(a: ServerConfig, b: ServerConfig) -> int:
    keys = set(a.flags) | set(b.flags) | set(a.env) | set(b.env)
    d = sum(1 for k in keys if a.flags.get(k, a.env.get(k)) != b.flags.get(k, b.env.get(k)))
    # a tp change is a full reload of the weights on other GPUs: the most expensive difference
    return d + (3 if a.flags.get("tp_size") != b.flags.get("tp_size") else 0)


def _budget(plan: Plan) -> None:
    budget = plan.budget_s
    if budget is None or plan.total_s <= budget:
        return
    over = plan.total_s - budget
    ranked = sorted((p for c in plan.configs for p in c.feasible_points), key=lambda p: -p.est_s)
    saved = 0.0
    for p in ranked:
        if saved >= over:
            break
        plan.cut_first.append(p.id)
        saved += p.est_s
    plan.warnings.append(
        f"estimated {_fmt_s(plan.total_s)} exceeds the budget of {_fmt_s(budget)} by {_fmt_s(over)}: cut first the "
        f"{len(plan.cut_first)} most expensive points (listed under cut_first)"
    )


def _pitfall(
    code: str, message: str, configs: list[str], points: list[str], detail: dict[str, Any]
) -> dict[str, Any]:
    return {"code": code, "message": message, "configs": configs, "points": points, "detail": detail}


def _points_with(live: list[ConfigPlan], code: str) -> list[str]:
    """Ids of the points of the startable configurations that carry pitfall `code`."""
    return [pp.id for cp in live for pp in cp.points if code in pp.codes]


def _generic_pitfall(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any]:
    """The one pitfall of a generic server (launcher.command): nothing of it is planned."""
    cmd = plan.experiment.launcher.command or []
    bound = (
        " and load.duration_s" if plan.experiment.load.duration_s else " (request-bounded points: unknown)"
    )
    return _pitfall(
        GENERIC_UNPLANNED,
        f"a generic server ({' '.join(cmd[:4])} ...): servesweep does not plan its memory or check "
        "SGLang's pitfalls; every point is kept, and times count only the fixed costs" + bound,
        [cp.config.id for cp in live],
        [pp.id for cp in live for pp in cp.points],
        {"command": cmd},
    )


def _context_too_short(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """context_length below prompt + output: the one length to set instead, and the override it needs."""
    fixes = {cp.config.id: cp.context_fix for cp in live if cp.context_fix}
    if not fixes:
        return None
    want = max(f["set_context_length"] for f in fixes.values())
    env = {k: v for f in fixes.values() for k, v in f["set_env"].items()}
    lengths = sorted({f["context_length"] for f in fixes.values()})
    affected = _points_with(live, CONTEXT_TOO_SHORT)
    msg = (
        f"context_length {', '.join(map(str, lengths))} is below prompt + output of {len(affected)} points (they are "
        f"dropped): set context_length to {want}"
    )
    msg += (
        f" and {OVERRIDE_ENV}=1 in server.env (above the model's maximum)"
        if env
        else f" (within the model's maximum {max(f['model_max'] for f in fixes.values())}: no override needed)"
    )
    detail = {"set_context_length": want, "set_env": env, "per_config": fixes}
    return _pitfall(CONTEXT_TOO_SHORT, msg, sorted(fixes), affected, detail)


def _context_above_max(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """context_length above config.json's maximum without the override variable: SGLang refuses to start."""
    above = [cp for cp in plan.configs if cp.error_code == CONTEXT_ABOVE_MAX]
    if not above:
        return None
    return _pitfall(
        CONTEXT_ABOVE_MAX,
        f"context_length above the model's maximum: SGLang refuses to start unless server.env sets {OVERRIDE_ENV}=1",
        [cp.config.id for cp in above],
        [pp.id for cp in above for pp in cp.points],
        {"set_env": {OVERRIDE_ENV: "1"}},
    )


def _tp_over_kv_heads(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """tp_size above the model's KV heads: KV bytes per token per GPU stop shrinking, with the figures per tp."""
    over = [cp for cp in live if cp.resolved.tp_size > cp.resolved.arch.num_kv_heads]
    if not over:
        return None
    arch = over[0].resolved.arch
    per_tp: dict[int, dict[str, Any]] = {}  # tp_size -> the KV figures of its first configuration
    for cp in live:
        rs = cp.resolved
        per_tp.setdefault(
            rs.tp_size,
            {
                "kv_heads_per_gpu": cp.facts["kv_heads_per_gpu"],
                "kv_bytes_per_token_per_gpu": rs.kv_bytes_per_token,
                "kv_tokens_per_gpu": rs.max_total_num_tokens,
            },
        )
    return _pitfall(
        TP_OVER_KV_HEADS,
        f"tp_size {', '.join(sorted({str(cp.resolved.tp_size) for cp in over}))} exceeds the model's "
        f"{arch.num_kv_heads} KV heads: KV heads replicate, KV bytes per token per GPU stay as at tp "
        f"{arch.num_kv_heads}, so KV capacity per GPU stops growing with tp (the extra GPUs buy compute, not context)",
        [cp.config.id for cp in over],
        [pp.id for cp in over for pp in cp.points],
        {"num_kv_heads": arch.num_kv_heads, "per_tp": dict(sorted(per_tp.items()))},
    )


def _memory_row(cp: ConfigPlan) -> dict[str, Any]:
    """One configuration's KV pool and recurrent-state slots per GPU."""
    rs, mu = cp.resolved, cp.resolved.memory_usage
    return {
        "config": cp.config.id,
        "tp_size": rs.tp_size,
        "mem_fraction_static": rs.mem_fraction_static,
        "weights_gib_per_gpu": mu.get("weight"),
        "kv_gib_per_gpu": mu.get("kvcache"),
        "kv_tokens": rs.max_total_num_tokens,
        "kv_bytes_per_token_per_gpu": rs.kv_bytes_per_token,
        "state_gib_per_gpu": mu.get("mamba", 0.0),
        "state_slot_mib_per_gpu": round(rs.state_slot_bytes / 2**20, 2),
        "state_slots": rs.state_slots,
        "slots_per_running_request": rs.mamba_ratio,
        "max_running_requests": rs.effective_max_running_requests,
    }


def _memory_fit(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """KV and recurrent-state memory of every startable configuration, and the points that do not fit."""
    mem = [_memory_row(cp) for cp in live]
    if not mem:
        return None
    hybrid = any(cp.resolved.is_hybrid for cp in live)
    arch = live[0].resolved.arch
    affected = _points_with(live, MEMORY_FIT)
    head = (
        f"hybrid model: only {arch.full_attention_layers} of {arch.num_layers} layers hold KV; each running "
        "request also holds Gated DeltaNet state slots. "
        if hybrid
        else ""
    )
    rows = "; ".join(
        f"{m['config']} (tp {m['tp_size']}, mem {m['mem_fraction_static']}): KV {m['kv_gib_per_gpu']} GiB = "
        f"{m['kv_tokens']:,} tokens"
        + (
            f", state {m['state_gib_per_gpu']} GiB = {m['state_slots']} slots of {m['state_slot_mib_per_gpu']} MiB"
            if hybrid
            else ""
        )
        + f" → {m['max_running_requests']} running"
        for m in mem[:6]
    )
    more = f" (+{len(mem) - 6} more in detail)" if len(mem) > 6 else ""
    fit = (
        f"{len(affected)} concurrency × context points do not fit (dropped, or queued behind the running-request cap)"
        if affected
        else "Every concurrency × context point fits"
    )
    return _pitfall(
        MEMORY_FIT,
        f"{head}Per GPU: {rows}{more}. {fit}",
        [m["config"] for m in mem],
        affected,
        {"hybrid": hybrid, "per_config": mem},
    )


def _kv_overflow_kept(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """The points kept past the KV pool on purpose (`keep: [kv_overflow]`), with each configuration's pool."""
    kept = _points_with(live, KV_OVERFLOW_KEPT)
    if not kept:
        return None
    pools = {cp.config.id: cp.resolved.max_total_num_tokens for cp in live if any(
        KV_OVERFLOW_KEPT in pp.codes for pp in cp.points)}  # fmt: skip
    where = ", ".join(f"{cid}: {n:,} tokens" for cid, n in list(pools.items())[:6])
    return _pitfall(
        KV_OVERFLOW_KEPT,
        f"{len(kept)} points run past the KV pool on purpose (keep {KV_OVERFLOW}; pool {where}): they measure the "
        "pool (requests queue for KV and are retracted), and their verdicts name KV pressure",
        list(pools),
        kept,
        {"kv_capacity_tokens": pools},
    )


def _spec_reset(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """Speculative decoding sets an unset max_running_requests to 48, capping the concurrency sweep."""
    reset = [
        cp
        for cp in live
        if cp.resolved.spec_algorithm is not None and cp.config.flags.get("max_running_requests") is None
    ]
    if not reset:
        return None
    return _pitfall(
        SPEC_RESET,
        "speculative decoding resets max_running_requests to 48 when it is not set, capping the concurrency "
        "sweep (the higher points only queue): set server.base.max_running_requests, the same in every "
        "configuration, so autoregressive and speculative runs compare",
        [cp.config.id for cp in reset],
        _points_with(live, SPEC_RESET),
        {
            "reset_to": 48,
            "max_running_requests": {
                cp.config.id: cp.resolved.effective_max_running_requests for cp in reset
            },
        },
    )


def _multi_minute_prefill(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """Points whose last concurrent prompt waits more than a minute for its first token."""
    slow = [(cp, pp) for cp in live for pp in cp.points if MULTI_MINUTE_PREFILL in pp.codes]
    if not slow:
        return None
    return _pitfall(
        MULTI_MINUTE_PREFILL,
        f"{len(slow)} points have a multi-minute TTFT: the step model's prefill of one prompt, times the "
        "prompts of one wave (concurrency, up to the running cap) that prefill one after another, plus one "
        "wave per extra group of queued requests (detail: prefill_s of one request, last_ttft_s)",
        sorted({cp.config.id for cp, _ in slow}),
        [pp.id for _, pp in slow],
        {
            pp.id: {"prefill_s": pp.detail.get("prefill_s"), "last_ttft_s": pp.detail.get("last_ttft_s")}
            for _, pp in slow
        },
    )


def _cut_seconds_by_axis(plan: Plan) -> dict[str, dict[str, float]]:
    """Seconds of the cut_first points per value of each axis (config, prompt, output, concurrency)."""
    cut = set(plan.cut_first)
    by: dict[str, dict[str, float]] = {
        "config": {},
        "prompt_tokens": {},
        "output_tokens": {},
        "concurrency": {},
    }
    for pp in plan.point_plans():
        if pp.id in cut:
            for axis, key in (
                ("config", pp.id.split(".")[0]),
                ("prompt_tokens", str(pp.point.prompt_tokens)),
                ("output_tokens", str(pp.point.output_tokens)),
                ("concurrency", str(pp.point.concurrency)),
            ):
                by[axis][key] = round(by[axis].get(key, 0.0) + pp.est_s, 1)
    return by


def _over_budget(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """The estimate exceeds budget.wall_time: the points to cut first and the axis values they sit on."""
    if not plan.cut_first:
        return None
    by = _cut_seconds_by_axis(plan)
    # the axis values whose points cost the most: the ones to trim in the experiment file
    heavy = {axis: sorted(v.items(), key=lambda kv: -kv[1])[:3] for axis, v in by.items()}
    return _pitfall(
        OVER_BUDGET,
        f"estimated {_fmt_s(plan.total_s)} exceeds the budget of {_fmt_s(plan.budget_s or 0)}: cut first the "
        f"{len(plan.cut_first)} most expensive points (listed in points, most expensive first); they sit "
        + "; ".join(f"{axis} {', '.join(k for k, _ in v)}" for axis, v in heavy.items())
        + " (the values to trim first)",
        sorted({pid.split(".")[0] for pid in plan.cut_first}),
        list(plan.cut_first),
        {
            "total_s": round(plan.total_s, 1),
            "budget_s": plan.budget_s,
            "cut_s_by": by,
            "trim_first": {axis: [k for k, _ in v] for axis, v in heavy.items()},
        },
    )


def _cannot_start(plan: Plan, live: list[ConfigPlan]) -> dict[str, Any] | None:
    """Configurations that fail SGLang's start-up checks for a reason no other pitfall names."""
    dead = [cp for cp in plan.configs if cp.error is not None and cp.error_code is None]
    if not dead:
        return None
    return _pitfall(
        CANNOT_START,
        "; ".join(f"{cp.config.id}: {cp.error}" for cp in dead),
        [cp.config.id for cp in dead],
        [pp.id for cp in dead for pp in cp.points],
        {cp.config.id: cp.error for cp in dead},
    )


# The checks `_pitfalls` runs on an SGLang plan, in the order their entries appear.
_PITFALL_CHECKS = (
    _context_too_short,
    _context_above_max,
    _tp_over_kv_heads,
    _memory_fit,
    _kv_overflow_kept,
    _spec_reset,
    _multi_minute_prefill,
    _over_budget,
    _cannot_start,
)


def _pitfalls(plan: Plan) -> list[dict[str, Any]]:
    """One structured entry per pitfall code that applies: code, message, affected configs and points, detail."""
    live = [cp for cp in plan.configs if cp.error is None]
    if plan.experiment.launcher.generic:
        return [_generic_pitfall(plan, live)]
    return [entry for check in _PITFALL_CHECKS if (entry := check(plan, live)) is not None]


# Fewer measured requests than this per point: its p99 is (nearly) its maximum, and the plan says so
TAIL_REQUESTS = 100


def _global_warnings(plan: Plan) -> None:
    exp = plan.experiment
    if exp.launcher.emulator is False and not exp.launcher.gpu and not exp.launcher.generic:
        plan.warnings.append("launcher.gpu is not set: memory arithmetic assumes an H200")
    if exp.launcher.generic and exp.flush_cache_between_points and not exp.launcher.flush_cache_path:
        plan.warnings.append(
            "launcher.flush_cache_path is not set: the generic server's prefix cache (if any) is not flushed "
            "between points; servesweep's cache-busting prompts still keep points apart"
        )
    if not exp.flush_cache_between_points:
        plan.warnings.append("flush_cache_between_points is off: prefix-cache hits can fake a fast prefill")
    n = exp.load.requests
    if n is not None and n < TAIL_REQUESTS and exp.search is None:
        plan.warnings.append(
            f"load.requests is {n}: a p99 of {n} requests is their slowest one, so these points are a smoke test "
            f"of the path, not a measurement of the tails (about {TAIL_REQUESTS} or more per point for a p99)"
        )


# ----------------------------------------------------------------------------------------------------------------
# Output


def _fmt_s(s: float) -> str:
    if s < 90:
        return f"{s:.0f}s"
    if s < 3600 * 1.5:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.2f}h"


def plan_json(plan: Plan) -> dict[str, Any]:
    exp = plan.experiment
    configs = []
    for order, cp in enumerate(plan.configs):
        configs.append(
            {
                "order": order,
                "id": cp.config.id,
                "flags": cp.config.flags,
                "env": cp.config.env,
                "bundle": cp.config.bundle,
                "labels": cp.config.labels,
                "feasible": cp.error is None,
                "error": cp.error,
                "restart": cp.restart,
                "start_s": round(cp.start_s, 1),
                "stop_s": round(cp.stop_s, 1),
                "est_s": round(cp.est_s, 1),
                "facts": cp.facts,
                "warnings": cp.warnings,
                "excluded_points": cp.excluded_points,
                "points": [
                    {
                        "id": p.id,
                        "workload": p.workload,
                        "concurrency": p.point.concurrency,
                        "rate": p.point.rate_rps,
                        "prompt_tokens": p.point.prompt_tokens,
                        "output_tokens": p.point.output_tokens,
                        "feasible": p.feasible and cp.error is None,
                        "reasons": p.reasons if cp.error is None else [f"server configuration: {cp.error}"],
                        "warnings": p.warnings,
                        "est_s": round(p.est_s, 2),
                        "estimate": p.detail,
                        "pitfalls": p.codes,
                        "kept": [KV_OVERFLOW] if KV_OVERFLOW_KEPT in p.codes else [],
                        "search": p.search,
                    }
                    for p in cp.points
                ],
            }
        )
    feasible = sum(len(c.feasible_points) for c in plan.configs)
    total = sum(len(c.points) for c in plan.configs)
    return {
        "experiment": exp.name,
        "sglang_version": exp.sglang_version,
        "model": exp.model.path,
        "gpu": exp.launcher.gpu,
        "emulator": exp.launcher.emulator,
        "generic_command": exp.launcher.command,
        "configs": configs,
        "excluded_configs": [{"id": c.id, "rule": r} for c, r in plan.excluded_configs],
        "points_total": total,
        "points_feasible": feasible,
        "points_infeasible": total - feasible,
        "restarts": plan.restarts,
        "total_s": round(plan.total_s, 1),
        "budget_s": plan.budget_s,
        "within_budget": plan.budget_s is None or plan.total_s <= plan.budget_s,
        "cut_first": plan.cut_first,
        "warnings": plan.warnings,
        "pitfalls": plan.pitfalls,
        "packed": packed_json(plan),
        "decision": plan.decision,
    }


def print_plan(plan: Plan, console) -> None:
    """The plan for a person: header, configurations in run order, dropped points, warnings, totals, pitfalls."""
    _print_header(plan, console)
    console.print(_config_table(plan))
    for cp in plan.configs:
        if cp.error:
            console.print(f"[red]✗ {cp.config.id}[/]: {cp.error}")
        for w in cp.warnings:
            console.print(f"[yellow]! {cp.config.id}[/]: {w}")
    _print_dropped_points(plan, console)
    _print_kept_points(plan, console)
    _print_point_warnings(plan, console)
    if plan.experiment.search is not None:
        from servesweep.matrix.capacity_plan import print_search_plan

        print_search_plan(plan, console)
    _print_totals(plan, console)
    print_packed(plan, console)
    if plan.decision:
        _print_decision(plan.decision, console)


def _print_header(plan: Plan, console) -> None:
    exp = plan.experiment
    server = (
        f"generic server `{' '.join((exp.launcher.command or [])[:4])} ...`"
        if exp.launcher.generic
        else f"SGLang {exp.sglang_version}"
    )
    console.print(
        f"[bold]{exp.name}[/]: {server}, {exp.model.path}, "
        f"{'emulator' if exp.launcher.emulator else exp.launcher.kind} on "
        f"{exp.launcher.gpu or ('an unplanned GPU' if exp.launcher.generic else 'H200 (assumed)')}"
    )
    base = " ".join(f"{k}={v}" for k, v in exp.server.base.items())
    if base:
        console.print(f"base flags: {base}")


def _config_table(plan: Plan):
    """One row per server configuration, in run order: what varies, KV tokens, running cap, points, estimate."""
    from rich.table import Table

    t = Table(title="server configurations (in run order)")
    for col in ("#", "config", "varies", "KV tokens", "max run", "points", "dropped", "est."):
        t.add_column(
            col,
            justify="right" if col in ("#", "KV tokens", "max run", "points", "dropped", "est.") else "left",
        )
    for i, cp in enumerate(plan.configs):
        flags = " ".join(f"{k}={v}" for k, v in cp.config.labels.items())
        if cp.error:
            t.add_row(
                str(i + 1), cp.config.id, flags, "-", "-", "0", str(len(cp.points)), "[red]cannot start[/]"
            )
            continue
        dropped = sum(1 for p in cp.points if not p.feasible)
        t.add_row(
            str(i + 1),
            cp.config.id + ("" if cp.restart else " (no restart)"),
            flags.strip(),
            f"{cp.facts['kv_capacity_tokens']:,}" if "kv_capacity_tokens" in cp.facts else "-",
            str(cp.facts.get("max_running_requests", "")),
            str(len(cp.feasible_points)),
            str(dropped),
            _fmt_s(cp.est_s),
        )
    return t


def _print_dropped_points(plan: Plan, console) -> None:
    """The infeasible points of startable configurations with their reasons (the first 60)."""
    drops = [(p.id, "; ".join(p.reasons)) for cp in plan.configs if not cp.error for p in cp.points
             if not p.feasible]  # fmt: skip
    _print_points(console, f"dropped points ({len(drops)})", "reason", drops)


def _print_kept_points(plan: Plan, console) -> None:
    """The points kept past the KV pool on purpose (keep: [kv_overflow]), each with its arithmetic (the first 60).
    No square brackets in the texts: rich would read them as markup."""
    kept = [(p.id, w.split("; ", 1)[-1]) for cp in plan.configs for p in cp.feasible_points
            for w in p.warnings if w.startswith(f"{KV_OVERFLOW}:")]  # fmt: skip
    title = f"points kept past the KV pool on purpose ({len(kept)}, keep {KV_OVERFLOW})"
    _print_points(console, title, "KV overflow", kept)


def _print_points(console, title: str, what: str, rows: list[tuple[str, str]]) -> None:
    """A table of points and one text each (the first 60); nothing without a row."""
    from rich.table import Table

    if not rows:
        return
    t = Table(title=title)
    t.add_column("point")
    t.add_column(what)
    for pid, text in rows[:60]:
        t.add_row(pid, text)
    if len(rows) > 60:
        t.add_row("…", f"{len(rows) - 60} more (see --json)")
    console.print(t)


def _print_point_warnings(plan: Plan, console) -> None:
    """Each kind of point warning once per configuration (the kind is the text before its first colon); the kept
    points' KV overflow has its own table."""
    seen = set()
    for cp in plan.configs:
        for p in cp.feasible_points:
            for w in p.warnings:
                if w.startswith(f"{KV_OVERFLOW}:"):
                    continue
                key = (cp.config.id, w.split(":")[0])
                if key not in seen:
                    seen.add(key)
                    console.print(f"[yellow]! {p.id}[/]: {w}")


def _print_totals(plan: Plan, console) -> None:
    """Points to run, server starts and the estimate; then the plan's warnings, pitfalls and points to cut."""
    j = plan_json(plan)
    budget = f" (budget {_fmt_s(plan.budget_s)})" if plan.budget_s else ""
    console.print(
        f"[bold]{j['points_feasible']}[/] points to run, {j['points_infeasible']} dropped, "
        f"{sum(c.excluded_points for c in plan.configs)} excluded by rules; {plan.restarts} server starts; "
        f"estimated {_fmt_s(plan.total_s)}{budget}"
    )
    for w in plan.warnings:
        console.print(f"[yellow]! {w}[/]")
    # The memory arithmetic is always shown; it is a pitfall only when some point does not fit (plan --json keeps
    # it among the pitfalls either way, with its per-configuration detail)
    memory = [pf for pf in plan.pitfalls if pf["code"] == MEMORY_FIT and not pf["points"]]
    pitfalls = [pf for pf in plan.pitfalls if pf not in memory]
    for pf in memory:
        console.print(f"[bold]memory[/]: {pf['message']}")
    if pitfalls:
        console.print(f"[bold]pitfalls ({len(pitfalls)})[/]")
        for pf in pitfalls:
            console.print(f"[magenta]{pf['code']}[/] ({len(pf['points'])} points): {pf['message']}")
    if plan.cut_first:
        console.print(
            "cut first: " + ", ".join(plan.cut_first[:20]) + (" …" if len(plan.cut_first) > 20 else "")
        )


# ----------------------------------------------------------------------------------------------------------------
# The decision (an experiment's decide: block, matrix/decision.py)


def decision_cells(plan: Plan, timer_for=None) -> list:
    """One decision cell per (startable configuration, workload shape) with feasible points: the concurrencies
    it may be probed at (decide.lower to the largest feasible point, capped by decide.upper) and the step model's
    prediction there. `timer_for(config_plan)` gives the timer (default: the emulator's step model as planned)."""
    from servesweep.matrix.capacity_agent import AGENT
    from servesweep.matrix.capacity_plan import predicted
    from servesweep.matrix.decision import Cell, Shape
    from servesweep.results.pergpu import flags_gpus

    exp = plan.experiment
    d = exp.decide
    assert d is not None
    top = d.upper or max(exp.load.concurrency)
    cells = []
    for cp in plan.configs:
        if cp.resolved is None or not cp.feasible_points:
            continue
        timer = timer_for(cp) if timer_for else _decision_timer(exp, cp)
        if not timer_for:
            _price_under_limit(timer, cp.config)
        shapes: dict[Any, int] = {}
        kinds: dict[Any, tuple[str, int]] = {}
        for pp in cp.feasible_points:
            key = (pp.workload, pp.point.prompt_tokens, pp.point.output_tokens)
            shapes[key] = max(shapes.get(key, 0), pp.point.concurrency)
            turns = int(pp.point.session_turns or 1) if pp.point.workload == AGENT else 1
            kinds[key] = (pp.point.workload, turns)
        for (wl, p, o), most in shapes.items():
            upper = min(top, most) if most >= d.lower else d.lower
            cells.append(
                Cell(
                    cp.config.id,
                    Shape(wl, p, o, *kinds[(wl, p, o)]),
                    flags_gpus(cp.config.flags, exp.launcher.gpus),
                    d.lower,
                    upper,
                    _predictor(predicted, timer, cp.resolved, p, o),
                    start_s=cp.start_s + cp.stop_s,
                )
            )
    return cells


def _decision_timer(exp: Experiment, cp: ConfigPlan) -> _Timer:
    """The step model a configuration's cells predict with: the emulator's own calibration where it has one (one
    the emulator will refuse is left to its start to say so: the plan prices the default)."""
    try:
        return _Timer(cp.resolved, exp, sim_calibration(exp, cp.config))
    except ValueError:
        return _Timer(cp.resolved, exp)


def sim_calibration(exp: Experiment, cfg: ServerConfig) -> dict[str, str] | None:
    """The emulator's `--sim-calibration` of a configuration as the step model's overrides (the configuration's
    flag wins over launcher.sim_args: it is rendered after them and the emulator keeps the last), so the decision's
    predictions are those of the emulator it probes; None for a real server or none given."""
    if not exp.launcher.emulator:
        return None
    text = cfg.flags.get("sim_calibration", exp.launcher.sim_args.get("sim_calibration"))
    if not text:
        return None
    out = {}
    for part in str(text).split(","):
        k, _, v = part.partition("=")
        if k.strip():
            out[k.strip()] = v.strip()
    return out


def _predictor(predicted, timer, rs, prompt: int, output: int):
    """The step model's closed-loop figures of one (configuration, shape) as a function of concurrency."""

    def at(concurrency: int) -> dict[str, float]:
        return predicted(timer, rs, prompt, output, concurrency)

    return at


def decision_overhead_s(exp: Experiment) -> float:
    """What one probe costs besides its requests: the point's fixed costs and its warm-up."""
    return POINT_OVERHEAD_S + exp.load.warmup_s


def decision_settings(exp: Experiment) -> dict[str, Any]:
    """run_decision's settings from the decide block (the plan's prediction and the run's decision share them)."""
    d = exp.decide
    assert d is not None
    return {
        "confidence": d.confidence,
        "resolution": d.resolution,
        "max_requests": d.max_requests,
        "max_probe_s": d.max_probe_time_s,
        "max_looks": d.max_looks,
        "prior_margin": d.prior_margin,
        "unprobed_margin": d.unprobed_margin,
        "cell_sigma": d.cell_sigma,
        "share_one_user": d.share_one_user,
        "skip_first_round": d.skip_first_round,
        "knee_margin": d.knee_margin,
        "overhead_s": decision_overhead_s(exp),
    }


def attach_decision(plan: Plan, hosts, seed: int = 0, max_parallel: int | None = None) -> dict[str, Any]:
    """The predicted time to decision: the decision procedure run on the step model with the measurement noise of
    matrix/decision.py (seeded), its probes packed onto the hosts' GPUs (at most `max_parallel` servers at once:
    the schedule's, which says 1 for `parallel: false`) as `servesweep run` packs them
    (matrix/decision_packed.py, on virtual time: the same loop, the simulated executor), and the answer's
    confidence at the end and at the budget (the anytime answer then). Kept on the plan as `plan.decision`."""
    from servesweep.matrix.decision import Noise, simulated_measure
    from servesweep.matrix.decision_packed import SimulatedExecutor, run_decision_packed

    exp = plan.experiment
    d = exp.decide
    assert d is not None
    cells = decision_cells(plan)
    noise = Noise()
    packed = run_decision_packed(
        cells,
        d.tiers,
        simulated_measure(noise, {c.key: c.predicted for c in cells}, seed),
        list(hosts),
        SimulatedExecutor({cp.config.id: cp.stop_s for cp in plan.configs}),
        max_parallel=max_parallel,
        snapshot_s=plan.budget_s,  # the anytime answer at the budget, if it runs past it
        **decision_settings(exp),
        noise=noise,
    )
    run = packed.run
    at_budget = None
    if packed.at_budget is not None:
        at_budget = {"label": packed.at_budget.label, "counts": packed.at_budget.counts()}
    serial = sum(run.config_seconds.values())
    gpu_s = sum(v * run.config_gpus[k] for k, v in run.config_seconds.items())
    plan.decision = {
        "method": "racing with sequential probes on the step model (matrix/decision.py), seeded noise, packed onto "
        "the hosts' GPUs as the run packs them (matrix/decision_packed.py)",
        "questions": len(run.answer.questions),
        "configs": len({c.config for c in cells}),
        "shapes": len({c.shape.key for c in cells}),
        "tiers": list(d.tiers),
        "probes": len(run.records),
        "requests": sum(r.requests for r in run.records),
        "serial_s": round(serial, 1),
        "packed_wall_s": round(packed.wall_s, 1),
        "max_parallel": max_parallel,
        "lanes": len(packed.lanes),
        "restarts": sum(packed.restarts.values()),
        "gpu_s": round(gpu_s, 1),
        "grid_serial_s": round(plan.total_s, 1),
        "budget_s": plan.budget_s,
        "within_budget": plan.budget_s is None or packed.wall_s <= plan.budget_s,
        "confidence": d.confidence,
        "resolution": d.resolution,
        "counts": run.answer.counts(),
        "label": run.answer.label,
        "at_budget": at_budget,
        "answer": [q.as_dict() for q in run.answer.questions],
    }
    return plan.decision


def _print_decision(dec: dict[str, Any], console) -> None:
    """The predicted time to decision and the confidence it reaches, next to the grid's time."""
    c = dec["counts"]
    console.print(
        f"[bold]time to decision[/] ({dec['questions']} questions: {dec['shapes']} shapes × {len(dec['tiers'])} "
        f"tiers over {dec['configs']} configurations): {dec['probes']} probes, {_fmt_s(dec['serial_s'])} serial, "
        f"[bold]{_fmt_s(dec['packed_wall_s'])} packed[/] ({dec['gpu_s'] / 3600:.1f} GPU-h) against the grid's "
        f"{_fmt_s(dec['grid_serial_s'])} serial"
        + (
            f"; budget {_fmt_s(dec['budget_s'])}" + ("" if dec["within_budget"] else " [red]exceeded[/]")
            if dec["budget_s"]
            else ""
        )
    )
    console.print(
        f"  confidence it reaches: {c.get('decided', 0)} decided at {dec['confidence']:.0%} per interval, "
        f"{c.get('tie', 0)} ties within {dec['resolution']:.0%}, {c.get('none', 0)} tiers no configuration holds, "
        f"{c.get('leading', 0) + c.get('open', 0)} unsettled"
    )
    if dec.get("at_budget"):
        console.print(f"  at the budget: {dec['at_budget']['label']}")
    console.print(
        f"  servesweep run packs it so: {dec['lanes']} server starts on the hosts' GPUs"
        + (f" (at most {dec['max_parallel']} at once)" if dec["max_parallel"] else "")
        + (f", {dec['restarts']} of them a configuration started again" if dec["restarts"] else "")
        + ("; over the budget it stops there with the best answer so far, labelled" if not dec["within_budget"] else "")
    )


def plan_experiment(exp: Experiment, file: str, max_parallel: int | None = None) -> Plan:
    """What `servesweep plan FILE` shows: the experiment's points, their schedule on the inventory's hosts (at most
    `max_parallel` servers at once) and, with a `decide:` block, the decision's plan."""
    plan = make_plan(exp)
    schedule = attach_schedule(plan, file, max_parallel)
    if exp.decide is not None:
        attach_decision(plan, schedule.hosts, max_parallel=schedule.max_parallel)
    return plan
