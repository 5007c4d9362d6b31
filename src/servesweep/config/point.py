"""What one load point is: the contract between `servesweep load`, the orchestrator and the Locust user, and the one
table of its knobs.

Pure pydantic, no Locust or gevent import, so the orchestrator can build and validate points in a process that
must never be monkey-patched. Validation errors name the field that is wrong.

The knobs a person sets (`knob(...)` fields) carry their CLI name, help and group here; `servesweep load`'s options
and the Locust form's parameters are generated from them (`knobs()`), and a test holds the experiment's `load:`
keys to the same names and defaults. A knob set elsewhere on one front door (the Locust form's user count, the
experiment's model section) says where in `elsewhere`.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servesweep.config.output_dist import parse_output_dist

# A point fails its check (exit 3 of `servesweep load`, `servesweep run`, headless Locust) when more than this
# share of its measured requests failed: strict enough that CI notices a broken server, loose enough that one
# stray error in a few hundred requests does not fail a job (it is still warned about).
DEFAULT_MAX_FAILURE_RATE = 0.01


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POINT_ID = re.compile(r"^[A-Za-z0-9._=-]{1,120}$")
# a header's value and a records column: no space, nothing a log or the emulator's ground truth ('id#choice') splits on
REQUEST_ID_PREFIX = r"^[A-Za-z0-9._-]{1,64}$"
# Headers that carry secrets; they must come through api_key_env, never through the point (which is written to disk).
_SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
# Body keys the load generator owns: a point that overrode them would no longer measure what it says it does.
_OWNED_BODY_KEYS = {"model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens"}
_SECONDS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

# The knobs' groups, in the order the Locust form and `servesweep load --help` show them.
GROUPS = ("load shape", "prompt & output", "workload", "timeouts", "advanced")
# The front doors that set a point: `servesweep load` (cli), the Locust start form (form), the experiment's load:
SURFACES = ("cli", "form", "yaml")


def parse_seconds(v: Any) -> float:
    """A duration in seconds: a number, or text like 500ms, 90s, 2m, 1.5h, 1d (no unit: seconds)."""
    if isinstance(v, bool):
        raise ValueError(f"expected a duration (e.g. 30s, 90m, 2h), got {v!r}")
    if isinstance(v, int | float):
        return float(v)
    m = _SECONDS.match(v) if isinstance(v, str) else None
    if not m:
        raise ValueError(f"expected a duration (e.g. 30s, 90m, 2h), got {v!r}")
    return float(m[1]) * _UNIT_S[m[2]]


def seconds_alias(v: Any, key: str) -> Any:
    """A settings block's `<key>: 2h` spelled for people, as its `<key>_s` field in seconds (a pydantic
    mode="before" validator's input, returned as it is when it is not a mapping holding `key`)."""
    if isinstance(v, dict) and key in v:
        v = dict(v)
        v[f"{key}_s"] = parse_seconds(v.pop(key))
    return v


def check_arrival(arrival: str, rate: Any, *, rate_name: str, arrival_name: str) -> None:
    """The rate/arrival rule of every front door: a closed loop has no rate, an open loop needs one. The names are
    the front door's own spelling (rate_rps / load.rate / --rate), so the message names what to change."""
    if arrival == "closed" and rate is not None:
        shown = f"={rate:g}" if isinstance(rate, int | float) else ""
        raise ValueError(
            f"{rate_name}{shown}: a rate needs {arrival_name} 'constant' or 'poisson' (closed loop has none)"
        )
    if arrival != "closed" and rate is None:
        raise ValueError(f"{rate_name}: {arrival_name} {arrival!r} needs a rate in requests per second")


def check_extra_body(v: dict) -> dict:
    """The rule of every front door's extra_body: a JSON object without the keys the load generator owns."""
    bad = sorted(k for k in v if k in _OWNED_BODY_KEYS)
    if bad:
        raise ValueError(f"extra_body keys {bad} are set by the load generator from the point's own fields")
    try:
        json.dumps(v)
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra_body is not JSON-serialisable: {e}") from None
    return v


def knob(
    default: Any = ...,
    *,
    cli: str,
    group: str,
    help: str,
    elsewhere: dict[str, str] | None = None,
    **kw: Any,
) -> Any:
    """A LoadPoint field a person sets: its CLI name (`--no-x` for a flag whose default is on), group and help.
    `elsewhere`: {surface: where that front door sets it instead} (e.g. the form's user count is Locust's -u)."""
    if group not in GROUPS:
        raise ValueError(f"knob group {group!r} is not one of {GROUPS}")
    extra: dict[str, Any] = {"cli": cli, "group": group}
    if elsewhere:
        extra["elsewhere"] = elsewhere
    return Field(default, description=help, json_schema_extra=extra, **kw)


class LoadPoint(BaseModel):
    """One load point: `concurrency` users streaming requests at one server, in a closed loop (default) or at an
    open-loop arrival rate (constant or Poisson, `rate_rps`), with `concurrency` as the cap of streams in flight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="server root, e.g. http://127.0.0.1:30000 (no /v1)")
    # -- load shape --
    concurrency: int = knob(
        cli="--concurrency",
        group="load shape",
        help="number of Locust users: the closed loop's streams, or open loop's cap of streams in flight",
        elsewhere={"form": "Locust's Number of users (-u)"},
        ge=1,
        le=100_000,
    )
    arrival: Literal["closed", "constant", "poisson"] = knob(
        "closed",
        cli="--arrival",
        group="load shape",
        help="closed: each user sends again as soon as its stream ends; constant/poisson: requests are scheduled "
        "at --rate (open loop), at most --concurrency in flight (a due request waits for a free one)",
    )
    rate_rps: float | None = knob(
        None, cli="--rate", group="load shape", help="open loop: requests per second over all workers", gt=0
    )
    requests: int | None = knob(
        None, cli="--requests", group="load shape", help="measured requests to complete, then stop", ge=1
    )
    duration_s: float | None = knob(
        None,
        cli="--duration",
        group="load shape",
        help="measured time (e.g. 60s); streams still running finish",
        elsewhere={"form": "Locust's Run time (-t)"},
        gt=0,
    )
    warmup_s: float = knob(
        0.0, cli="--warmup", group="load shape", help="requests scheduled in this first time are warmup", ge=0
    )
    # -- prompt & output --
    model: str | None = knob(
        None,
        cli="--model",
        group="prompt & output",
        help="model name sent in each body; unset: the first of GET /v1/models",
        elsewhere={"yaml": "model.served_model_name (model.path for a generic server)"},
    )
    endpoint: Literal["chat", "completions", "generate"] = knob(
        "chat",
        cli="--endpoint",
        group="prompt & output",
        help="/v1/chat/completions, /v1/completions, or SGLang's native /generate",
    )
    prompt_tokens: int = knob(
        2000,
        cli="--prompt-tokens",
        group="prompt & output",
        help="prompt length as the server counts it",
        ge=1,
    )
    output_tokens: int = knob(
        256,
        cli="--output-tokens",
        group="prompt & output",
        help="output length (max_tokens; fixed with ignore_eos)",
        ge=1,
    )
    output_dist: str | None = knob(
        None,
        cli="--output-dist",
        group="prompt & output",
        help="output lengths drawn per prompt, e.g. lognormal:mean=512,sigma=0.5; unset: fixed",
    )
    ignore_eos: bool = knob(
        True,
        cli="--no-ignore-eos",
        group="prompt & output",
        help="leave ignore_eos out of the body (servers that reject it)",
    )
    thinking: bool | None = knob(
        None,
        cli="--thinking",
        group="prompt & output",
        help="reasoning models: chat_template_kwargs.enable_thinking on/off; unset: the server's default",
    )
    tokenizer: str | None = knob(
        None,
        cli="--tokenizer",
        group="prompt & output",
        help="tokenizer for sizing prompts: tokenizer.json, model dir, or qwen3.6 (default)",
        elsewhere={"yaml": "model.tokenizer"},
    )
    cache_bust: bool = knob(
        True,
        cli="--no-cache-bust",
        group="prompt & output",
        help="let requests share prefixes (no per-request nonce)",
    )
    seed: int = knob(0, cli="--seed", group="prompt & output", help="prompt pool seed")
    extra_body: dict = knob(
        {},  # pydantic copies a mutable default for each point
        cli="--extra-body",
        group="prompt & output",
        help='request-body extras as a JSON object, e.g. \'{"n": 2, "temperature": 0.7}\' (sampling fields; not '
        "the keys the load generator sets: model, messages, prompt, stream, max_tokens)",
    )
    # -- workloads (docs/workloads.md) --
    workload: Literal["synthetic", "shared_prefix", "dataset", "agent", "trace"] = knob(
        "synthetic",
        cli="--workload",
        group="workload",
        help="what the requests are made of (docs/workloads.md)",
        elsewhere={"yaml": "load.workloads.<name>.workload (load.workload lists the names)"},
    )
    shared_prefix_tokens: int = knob(
        0,
        cli="--shared-prefix-tokens",
        group="workload",
        help="shared_prefix: tokens each group shares",
        ge=0,
    )
    num_groups: int = knob(
        1, cli="--num-groups", group="workload", help="shared_prefix: number of groups", ge=1
    )
    dataset: str | None = knob(
        None, cli="--dataset", group="workload", help="dataset: a ShareGPT JSON or JSONL file"
    )
    dataset_min_tokens: int | None = knob(
        None, cli="--dataset-min-tokens", group="workload", help="dataset: shortest prompt kept", ge=0
    )
    dataset_max_tokens: int | None = knob(
        None, cli="--dataset-max-tokens", group="workload", help="dataset: longest prompt kept", ge=0
    )
    session_turns: int = knob(
        4, cli="--session-turns", group="workload", help="agent: turns per session", ge=1
    )
    tool_result_tokens: int = knob(
        500,
        cli="--tool-result-tokens",
        group="workload",
        help="agent: tokens of the tool result after each answer",
        ge=0,
    )
    think_time_s: float = knob(
        0.0,
        cli="--think-time",
        group="workload",
        help="agent: pause between a turn's answer and the next turn",
        ge=0,
    )
    context_cap_tokens: int = knob(
        100_000,
        cli="--context-cap",
        group="workload",
        help="agent: a session ends before its context passes this",
        ge=1,
    )
    # trace replay (docs/workloads.md, "Trace replay"): `servesweep load`, the Locust form and experiment files
    # (load.workloads.<name>) replay through the Locust user
    trace: str | None = knob(
        None,
        cli="--trace",
        group="workload",
        help="trace: the trace file (native, Mooncake, Azure, Bailian or sessions; servesweep trace convert)",
    )
    trace_speedup: float = knob(
        1.0,
        cli="--trace-speedup",
        group="workload",
        help="trace: replay this many times faster (timestamps and think times divided by it)",
        gt=0,
    )
    trace_start_s: float = knob(
        0.0,
        cli="--trace-start",
        group="workload",
        help="trace: the window starts this far into the trace (e.g. 10m)",
        ge=0,
    )
    trace_window_s: float | None = knob(
        None,
        cli="--trace-window",
        group="workload",
        help="trace: the window's length (e.g. 5m); unset: to the trace's end",
        gt=0,
    )
    trace_sample: float = knob(
        1.0,
        cli="--trace-sample",
        group="workload",
        help="trace: fraction of the window's requests replayed (whole sessions), seeded by --seed",
        gt=0,
        le=1,
    )
    # -- timeouts (each counts from the start of its own wait: docs/metrics.md) --
    connect_s: float = knob(
        10.0, cli="--connect-timeout", group="timeouts", help="TCP (and TLS) connect", gt=0
    )
    first_token_s: float = knob(
        900.0,
        cli="--first-token-timeout",
        group="timeouts",
        help="wait for the first token (a 100k prefill under load is legitimate)",
        gt=0,
    )
    stall_s: float = knob(
        120.0,
        cli="--stall-timeout",
        group="timeouts",
        help="longest gap allowed between chunks after the first token",
        gt=0,
    )
    total_s: float = knob(3600.0, cli="--total-timeout", group="timeouts", help="longest whole request", gt=0)
    # -- advanced --
    api_key_env: str | None = knob(
        None,
        cli="--api-key-env",
        group="advanced",
        help="NAME of the environment variable holding the API key (never the key itself)",
        elsewhere={"yaml": "launcher.api_key_env"},
    )
    request_id_prefix: str | None = knob(
        None,
        cli="--request-id-prefix",
        group="advanced",
        help="each request's X-Request-Id (and its records' request_id) is PREFIX-<uuid>: e.g. a run's name, to find "
        "its requests in a server's or gateway's log and join them with the records; unset: the bare uuid",
        pattern=REQUEST_ID_PREFIX,
    )
    # -- set by the front doors, not by a person --
    pool_size: int | None = Field(None, ge=1, description="distinct prompts in the pool; None: derived")
    stop_timeout_s: float | None = Field(
        None, ge=0, description="None: long enough for a running stream to end"
    )
    template_overhead: int | None = Field(None, ge=0, description="None: probe the live server once")
    continuous_usage: bool | None = Field(None, description="send continuous_usage_stats; None: probe")
    probe: bool = Field(
        True,
        description="ask the server what is left open (model, template overhead, per-chunk usage); False: model "
        "must be given, the template overhead is the local chat template's, per-chunk usage off unless set",
    )
    headers: dict[str, str] = Field(default_factory=dict)
    point_id: str | None = Field(None, description="None: derived from the load axes")
    workload_name: str | None = Field(
        None,
        description="an experiment's name for the point's workload (a load.workloads key, or the endpoint when the "
        "file names none): what its reports group by; None for a point of `servesweep load`",
    )
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError(f"base_url {v!r} must start with http:// or https:// followed by a host")
        v = v.rstrip("/")
        if v.endswith("/v1"):
            v = v[:-3]
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError(
                f"api_key_env must be the NAME of an environment variable (letters, digits, _), not {len(v)} chars "
                "of something else; never put the key itself here"
            )
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(k for k in v if k.lower() in _SECRET_HEADERS)
        if bad:
            raise ValueError(f"headers {bad} carry secrets; give the key through api_key_env instead")
        return v

    @field_validator("extra_body")
    @classmethod
    def _extra(cls, v: dict) -> dict:
        return check_extra_body(v)

    @field_validator("point_id")
    @classmethod
    def _pid(cls, v: str | None) -> str | None:
        if v is not None and not _POINT_ID.match(v):
            raise ValueError(f"point_id {v!r} must be 1-120 chars of letters, digits, '.', '_', '=', '-'")
        return v

    @model_validator(mode="after")
    def _stop_rule(self) -> LoadPoint:
        if self.requests is None and self.duration_s is None:
            raise ValueError("requests or duration_s: give at least one (how the point stops)")
        check_arrival(self.arrival, self.rate_rps, rate_name="rate_rps", arrival_name="arrival")
        if not self.probe and self.model is None:
            raise ValueError("model: required when probe is False (nothing asks the server for it)")
        if self.workload == "shared_prefix" and not 0 < self.shared_prefix_tokens < self.prompt_tokens:
            raise ValueError(
                f"shared_prefix_tokens={self.shared_prefix_tokens}: the shared_prefix workload needs "
                f"0 < shared_prefix_tokens < prompt_tokens={self.prompt_tokens}"
            )
        if self.workload != "shared_prefix" and self.shared_prefix_tokens:
            raise ValueError("shared_prefix_tokens: only with workload shared_prefix")
        if self.workload == "trace":
            if not self.trace:
                raise ValueError("trace: the trace workload needs a trace file")
            if self.arrival != "closed" or self.rate_rps is not None:
                raise ValueError(
                    f"arrival={self.arrival!r}: a trace replays at its own timestamps (--trace-speedup scales "
                    f"them); leave arrival and rate_rps unset"
                )
            if self.endpoint == "generate":
                raise ValueError("endpoint='generate': trace replay sends chat or completions requests")
            if self.warmup_s:
                raise ValueError(
                    f"warmup_s={self.warmup_s:g}: a trace replay measures every request of its window (start the "
                    f"window later with trace_start_s instead)"
                )
        elif self.trace:
            raise ValueError("trace: only with workload trace")
        if self.workload == "dataset" and not self.dataset:
            raise ValueError("dataset: the dataset workload needs a file (ShareGPT JSON or JSONL)")
        if self.workload == "agent":
            if self.endpoint != "chat":
                raise ValueError(f"endpoint={self.endpoint!r}: agent sessions need the chat endpoint")
            if self.context_cap_tokens <= self.prompt_tokens:
                raise ValueError(
                    f"context_cap_tokens={self.context_cap_tokens} must be above prompt_tokens={self.prompt_tokens}"
                )
        if self.thinking is not None and self.endpoint != "chat":
            raise ValueError("thinking: chat_template_kwargs apply to the chat endpoint only")
        if self.output_dist is not None:
            parse_output_dist(self.output_dist)  # a ValueError names what is wrong
            if self.output_dist.strip() == "dataset" and self.workload != "dataset":
                raise ValueError("output_dist 'dataset' (reference answer lengths) needs workload dataset")
        return self

    # -- derived values (no state: the point is frozen) --

    @property
    def id(self) -> str:
        """point_id, or one derived from the axes (readable, stable, unique enough within a run)."""
        if self.point_id:
            return self.point_id
        stop = f"n{self.requests}" if self.requests else f"d{self.duration_s:g}s"
        base = f"c{self.concurrency}-p{self.prompt_tokens}-o{self.output_tokens}-{self.endpoint}-{stop}"
        if self.arrival != "closed":
            base = f"{self.arrival}{self.rate_rps:g}-{base}"
        if self.workload != "synthetic":
            base = f"{self.workload}-{base}"
        return base + "-" + self.digest()[:6]

    def digest(self) -> str:
        """Hash of everything that changes what is measured (not the labels, the id or the workload's name)."""
        exclude = {"point_id", "workload_name", "labels"}
        # A closed point's open-loop fields hold their defaults: they are not part of its digest.
        if self.arrival == "closed":
            exclude |= {"arrival", "rate_rps"}
        d = self.model_dump(exclude=exclude)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()

    def replaced(self, **changes: Any) -> LoadPoint:
        """This point with `changes` (field values), checked again as a new point (model_copy(update=...) would
        take them unchecked): the run's server and labels given to a planned point, a probe's load, a lane's port."""
        return LoadPoint.model_validate(self.model_dump() | changes)

    def effective_pool_size(self) -> int:
        if self.pool_size is not None:
            return self.pool_size
        # Enough distinct prompts that concurrent users rarely send the same one; the nonce busts the cache anyway.
        n = self.requests if self.requests is not None else 64
        return max(1, min(64, max(self.concurrency, n)))

    def effective_stop_timeout(self) -> float:
        """Seconds Locust waits at the end of a duration point for running streams (they are measured, not dropped)."""
        if self.stop_timeout_s is not None:
            return self.stop_timeout_s
        return min(self.total_s, self.first_token_s + self.stall_s * 4 + 60.0)


# ---------------------------------------------------------------- the knobs' table


@dataclass(frozen=True)
class Knob:
    """One knob of the table: a LoadPoint field a person sets, as the front doors spell it.

    kind: flag (a bool; `--no-x` switches off one that is on by default), switch (on/off, unset: the server's
    default), choice, int, float, seconds (text like 90s on the CLI, seconds in the form), text, json (a JSON object
    as text on the CLI and in the form; empty: {})."""

    name: str
    cli: str
    group: str
    help: str
    default: Any  # the point's default; ... where the point requires a value
    kind: str
    choices: tuple[str, ...] = ()
    optional: bool = False  # None (unset) is a value
    elsewhere: tuple[tuple[str, str], ...] = ()  # (surface, where that front door sets it instead)

    @property
    def dest(self) -> str:
        """The attribute an argparse or click option of this knob fills: the CLI name as an identifier."""
        return self.cli[2:].replace("-", "_")

    def on(self, surface: str) -> bool:
        return surface not in dict(self.elsewhere)

    def option_default(self, surface: str) -> Any:
        """The default this knob's option shows on `surface` ('cli' or 'form'); value() of it is the point's."""
        if self.kind == "flag":
            return False
        if self.default is None or self.default is ... or self.kind == "json":
            return "" if surface == "form" else None
        if self.kind == "seconds" and surface == "cli":
            return f"{self.default:g}s"
        return self.default

    def value(self, raw: Any) -> Any:
        """What an option holds (text from a command line or a form, or a typed default) as the field's value."""
        if self.kind == "flag":
            on = raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1", "yes", "on")
            return not on if self.cli.startswith("--no-") else on
        if self.kind == "json":
            return parse_json_object(raw, self.cli)
        if raw is None or raw == "":
            if self.optional or self.kind == "switch":
                return None
            raise ValueError(f"{self.cli}: give a value")
        try:
            if self.kind == "switch":
                return raw if isinstance(raw, bool) else {"on": True, "off": False}[str(raw)]
            if self.kind == "seconds":
                return parse_seconds(raw)
            if self.kind == "int":
                return int(raw)
            if self.kind == "float":
                return float(raw)
        except (KeyError, ValueError):
            raise ValueError(f"{self.cli}: {raw!r} is not {_KIND_WORDS[self.kind]}") from None
        return raw


_KIND_WORDS = {
    "switch": "on or off",
    "seconds": "a duration like 90s",
    "int": "an integer",
    "float": "a number",
}


def _kind(name: str, annotation: Any) -> tuple[str, tuple[str, ...], bool]:
    """(kind, choices, optional) of a field's type."""
    args = typing.get_args(annotation)
    optional = type(None) in args and isinstance(annotation, types.UnionType)
    base = next((a for a in args if a is not type(None)), annotation) if optional else annotation
    if typing.get_origin(base) is Literal:
        return "choice", tuple(typing.get_args(base)), optional
    if base is bool:
        return ("switch" if optional else "flag"), (), optional
    if base is float:
        return ("seconds" if name.endswith("_s") else "float"), (), optional
    return {int: "int", str: "text", dict: "json"}[base], (), optional


def parse_json_object(raw: Any, what: str) -> dict:
    """A JSON object given as text (or already a mapping); None or empty text is {}. A ValueError names `what`."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        v = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: {raw!r} is not JSON ({e})") from None
    if not isinstance(v, dict):
        raise ValueError(f"{what}: {raw!r} is not a JSON object (give {{\"key\": value, ...}})")
    return v


def knobs(surface: str | None = None) -> list[Knob]:
    """The knobs of the table, in group order (GROUPS), then field order; `surface`: only those it sets itself."""
    out = []
    for name, f in LoadPoint.model_fields.items():
        extra = f.json_schema_extra
        if not isinstance(extra, dict) or "cli" not in extra:
            continue
        kind, choices, optional = _kind(name, f.annotation)
        where = extra.get("elsewhere")  # knob()'s {surface: where}, as JSON schema extra
        k = Knob(
            name=name,
            cli=str(extra["cli"]),
            group=str(extra["group"]),
            help=f.description or "",
            default=... if f.is_required() else f.default,
            kind=kind,
            choices=choices,
            optional=optional,
            elsewhere=tuple((str(s), str(w)) for s, w in where.items()) if isinstance(where, dict) else (),
        )
        if surface is None or k.on(surface):
            out.append(k)
    return sorted(out, key=lambda k: GROUPS.index(k.group))


def knob_values(options: dict[str, Any], surface: str) -> dict[str, Any]:
    """LoadPoint fields from a front door's options ({dest: raw value}) for every knob that door sets itself."""
    return {k.name: k.value(options[k.dest]) for k in knobs(surface) if k.dest in options}
