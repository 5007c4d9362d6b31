"""Experiment files: the YAML a user writes to describe a benchmark matrix, and its expansion into server
configurations and load points.

Parsed with ruamel.yaml (round-trip mode keeps each key's line) and typed with pydantic, so every error names the
file, the line, the key and what is wrong: ``experiment.yaml:14: server.axes.tp_size: expected a list of integers,
got 'four'``. Unknown keys are errors with a did-you-mean. Every check is the model's own (field validators, the
server flags by SGLang's flag table in Experiment._flags, the checks across fields in Experiment._semantics), so an
Experiment validated from anything (a file, a dry run's shrunk copy, the one a run's manifest stored) passed them all.

Server flags use SGLang's argparse dest names (``tp_size``, ``context_length``, ...). Older or aliased names are
mapped to the current ones here (``mamba_scheduler_strategy`` -> ``mamba_radix_cache_strategy``); the Ansible role
renders them back into the flag names of the SGLang version the experiment targets.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.reader import ReaderError

from servesweep.config.answers_block import Answers
from servesweep.config.decide import DecideBlock
from servesweep.config.point import (
    DEFAULT_MAX_FAILURE_RATE,
    REQUEST_ID_PREFIX,
    LoadPoint,
    check_arrival,
    check_extra_body,
    parse_seconds,
    seconds_alias,
)
from servesweep.config.search_block import SearchBlock
from servesweep.sglang.flags import (
    did_you_mean,
    human_int,
    normalise_flags,
)
from servesweep.sglang.server_command import PLACEHOLDER as _PLACEHOLDER
from servesweep.sglang.server_command import PLACEHOLDERS

ENDPOINTS = ("chat", "completions", "generate")
Endpoint = Literal["chat", "completions", "generate"]
LOAD_AXES = ("concurrency", "prompt_tokens", "output_tokens", "workload", "endpoint", "rate")
SGLANG_INFO_PATHS = {"model_info": "/model_info", "server_info": "/server_info", "models": "/v1/models"}
_VERSION = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# the error types of a check across fields (Experiment._semantics) and of a server flag (Experiment._flags):
# pydantic reports each at the key it names
SEMANTIC = "semantic"
FLAG = "flag"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FLAG_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,127}$")
# `keep:` values: points the planner would drop that an experiment keeps on purpose (labelled in the plan, the
# manifest's point warnings and the report). kv_overflow: running requests × (prompt + output) above the KV pool
# (each request alone fits): the point measures the pool, queueing and retractions, which is what it is kept for
KV_OVERFLOW = "kv_overflow"
KEEP = {
    KV_OVERFLOW: "points whose running requests × (prompt + output) exceed the KV pool (each one alone fits)"
}


class ExperimentError(ValueError):
    """One or more problems in an experiment file; str() gives one 'file:line: key: what' line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def duration_s(v: Any) -> float:
    """'2h' -> 7200, '90m' -> 5400, '30s' / 30 -> 30."""
    return parse_seconds(v)


# --------------------------------------------------------------------------------------------------------------
# The schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Target(_Strict):
    """Where the server runs. `base_url`: an existing server servesweep does not manage (one configuration, checked
    but never restarted). Otherwise Ansible manages it on `host_group` of `inventory` ('local' = this machine)."""

    base_url: str | None = None
    inventory: str | None = None
    host_group: str = "gpu"
    address: str = Field("127.0.0.1", description="where the load generator reaches the server")
    port: int = Field(30000, ge=0, le=65535, description="0: pick a free port at run time (local only)")

    @model_validator(mode="after")
    def _one(self) -> Target:
        if self.base_url is None and self.inventory is None:
            raise ValueError(
                "give either target.base_url (an existing server) or target.inventory ('local' or a path)"
            )
        if self.base_url is not None and self.inventory is not None:
            raise ValueError("give target.base_url or target.inventory, not both")
        if self.base_url is not None and not re.match(r"^https?://[^/\s]+", self.base_url):
            raise ValueError(f"target.base_url {self.base_url!r} must start with http:// or https://")
        if self.port == 0 and self.inventory != "local":
            raise ValueError(
                "target.port 0 (a free port picked at run time) works only with inventory 'local'"
            )
        return self

    @property
    def managed(self) -> bool:
        return self.base_url is None

    def url(self, port: int | None = None) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return f"http://{self.address}:{port if port is not None else self.port}"


class Model(_Strict):
    path: str = Field(description="HF id or a local directory (the server's --model-path)")
    tokenizer: str | None = Field(None, description="for sizing prompts; None: servesweep's default")
    served_model_name: str | None = None


class Launcher(_Strict):
    kind: Literal["process", "systemd", "docker"] = "process"
    emulator: bool = Field(False, description="launch `servesweep sim` with the same flags instead of SGLang")
    gpu: str | None = Field(
        None, description="GPU profile for the planner and the emulator (e.g. H200, RTX-A6000)"
    )
    gpus_per_host: int = Field(8, ge=1)
    gpus: int | None = Field(
        None, ge=1, description="GPUs each server takes (a generic server); None: tp_size × dp_size × pp_size"
    )
    python: str | None = Field(
        None, description="interpreter on the host; None: python3 (emulator: this venv's)"
    )
    workdir: str = "/tmp/servesweep-server"
    image: str | None = Field(None, description="docker image; None: lmsysorg/sglang:v<sglang_version>")
    unit: str = "servesweep-sglang"
    become: bool = False
    startup_timeout_s: float = Field(1800.0, gt=0, description="model load + warmup, bounded")
    stop_timeout_s: float = Field(120.0, gt=0)
    health_timeout_s: float = Field(
        10.0, gt=0, description="after each point, per /health try (3 tries): no answer within it = the server hung"
    )
    extra_spec_algorithms: list[str] = Field(
        default_factory=list, description="speculative algorithms of a fork"
    )
    extra_flags: list[str] = Field(
        default_factory=list,
        description="flags of a patched or forked SGLang build that no flag table knows: passed through untyped",
    )
    sim_args: dict[str, Any] = Field(default_factory=dict, description="extra --sim-* flags (emulator only)")
    # A generic OpenAI-compatible server (vLLM, transformers serve, ...): its argv template. Unset: SGLang (or the
    # emulator). The defaults of the four settings below depend on it (see _server_kind_defaults).
    command: list[str] | None = Field(
        None, description="argv template of a non-SGLang server; placeholders " + ", ".join(PLACEHOLDERS)
    )
    health_path: str | None = Field(None, description="readiness: GET answers 200 (default /health)")
    info_paths: dict[str, str] | None = Field(
        None, description="documents read after ready into server_info.json (SGLang: model_info, ...)"
    )
    verify: bool | None = Field(None, description="compare the server's settings (SGLang only; default true)")
    flush_cache_path: str | None = Field(
        None, description="POSTed between points (SGLang: /flush_cache; generic: none)"
    )
    metrics_path: str | None = Field(
        None,
        description="the server's Prometheus endpoint, scraped during the run (SGLang: /metrics; generic: none)",
    )
    api_key_env: str | None = Field(None, description="NAME of the env var holding the server's API key")
    api_key_file: str | None = Field(None, description="a 0600 file holding the API key")
    api_key_vault: str | None = Field(None, description="an Ansible Vault file holding the API key")
    vault_password_file: str | None = Field(
        None, description="the vault's password file; None: $ANSIBLE_VAULT_PASSWORD_FILE"
    )
    server_api_key_env: str | None = Field(
        None, description="generic server: the env var it reads its API key from (e.g. VLLM_API_KEY)"
    )

    @field_validator("extra_flags")
    @classmethod
    def _extra_flags(cls, v):
        for name in v:
            if not _FLAG_NAME.match(name):
                raise ValueError(
                    f"{name!r} is not a flag name (letters, digits, '_' or '-', e.g. ddtree_budget)"
                )
        return v

    @field_validator("api_key_env", "server_api_key_env")
    @classmethod
    def _env(cls, v):
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError("must be the NAME of an environment variable, never the key itself")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v):
        if v is not None:
            if not v:
                raise ValueError("an empty command; give the server's argv template as a list")
            for i, arg in enumerate(v):
                bad = [m for m in _PLACEHOLDER.findall(arg) if m not in PLACEHOLDERS]
                if bad:
                    raise ValueError(
                        f"item {i} ({arg!r}): unknown placeholder {{{bad[0]}}}{did_you_mean(bad[0], PLACEHOLDERS)}; "
                        f"known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
                    )
        return v

    @field_validator("health_path", "flush_cache_path", "metrics_path")
    @classmethod
    def _path(cls, v):
        if v is not None and not v.startswith("/"):
            raise ValueError(f"expected a URL path starting with '/', got {v!r}")
        return v

    @field_validator("info_paths")
    @classmethod
    def _info(cls, v):
        for name, path in (v or {}).items():
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$", name):
                raise ValueError(
                    f"name {name!r} must be letters, digits or '_' (it is a key of server_info.json)"
                )
            if not path.startswith("/"):
                raise ValueError(f"{name}: expected a URL path starting with '/', got {path!r}")
        return v

    @model_validator(mode="after")
    def _server_kind_defaults(self) -> Launcher:
        generic = self.command is not None
        if generic and self.emulator:
            raise ValueError("launcher.command (a generic server) and launcher.emulator: give one of them")
        sources = [k for k in ("api_key_env", "api_key_file", "api_key_vault") if getattr(self, k)]
        if len(sources) > 1:
            raise ValueError(f"give at most one of {', '.join('launcher.' + k for k in sources)}")
        if self.extra_flags and generic:
            raise ValueError(
                "launcher.extra_flags is for SGLang: a generic server's (launcher.command) flags are never checked"
            )
        if self.server_api_key_env and not generic:
            raise ValueError("launcher.server_api_key_env is for a generic server (launcher.command)")
        if generic and self.kind == "docker" and not self.image:
            raise ValueError("launcher.image is required when launcher.command runs in docker")
        # the defaults differ by server kind; filled here so a manifest's copy (resume) reads back the same
        if self.health_path is None:
            self.health_path = "/health"
        if self.info_paths is None:
            self.info_paths = {} if generic else dict(SGLANG_INFO_PATHS)
        if self.verify is None:
            self.verify = not generic
        if "flush_cache_path" not in self.model_fields_set and self.flush_cache_path is None:
            self.flush_cache_path = None if generic else "/flush_cache"
        # a generic server's metrics are not SGLang's (vLLM: vllm:*, transformers serve: none): scraped only when named
        if "metrics_path" not in self.model_fields_set and self.metrics_path is None:
            self.metrics_path = None if generic else "/metrics"
        return self

    @property
    def generic(self) -> bool:
        """A non-SGLang server launched from `command`: no SGLang flag names, memory plan or verification."""
        return self.command is not None

    @property
    def key_given(self) -> bool:
        return bool(self.api_key_env or self.api_key_file or self.api_key_vault)

    @field_validator("sim_args")
    @classmethod
    def _sim(cls, v):
        bad = [k for k in v if not k.replace("-", "_").startswith("sim_")]
        if bad:
            raise ValueError(f"keys must start with sim_ (emulator-only flags), got {bad}")
        return v


class Bundle(_Strict):
    name: str
    flags: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not _NAME.match(v):
            raise ValueError(f"bundle name {v!r} must be letters, digits, '.', '_' or '-'")
        return v


class Server(_Strict):
    base: dict[str, Any] = Field(default_factory=dict)
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    bundles: list[Bundle] = Field(default_factory=list)
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    env_axes: dict[str, list[str | int | float | bool]] = Field(default_factory=dict)


def _chat_only() -> list[Endpoint]:
    return ["chat"]


WORKLOAD_KINDS = ("synthetic", "shared_prefix", "dataset", "agent", "trace")
BUILTIN_WORKLOADS = ("single", "chat")  # single-shot synthetic prompts, no settings needed


class WorkloadSpec(_Strict):
    """One named workload of `load.workloads` (docs/workloads.md): LoadPoint's workload knobs, by the same names and
    defaults (a test holds them so); `workload` may be left out when the name is a kind (agent, shared_prefix,
    dataset)."""

    workload: Literal["synthetic", "shared_prefix", "dataset", "agent", "trace"] | None = None
    shared_prefix_tokens: int = Field(0, ge=0)
    num_groups: int = Field(1, ge=1)
    dataset: str | None = None
    dataset_min_tokens: int | None = Field(None, ge=0)
    dataset_max_tokens: int | None = Field(None, ge=0)
    session_turns: int = Field(4, ge=1)
    tool_result_tokens: int = Field(500, ge=0)
    think_time_s: float = Field(0.0, ge=0)
    context_cap_tokens: int = Field(100_000, ge=1)
    output_dist: str | None = None
    thinking: bool | None = None
    # trace replay (docs/workloads.md, "Trace replay"): the file (relative: to the experiment file), the speed-up
    # (a search over `speedup` sets it per probe) and the window
    trace: str | None = None
    trace_speedup: float = Field(1.0, gt=0)
    trace_start_s: float = Field(0.0, ge=0)
    trace_window_s: float | None = Field(None, gt=0)
    trace_sample: float = Field(1.0, gt=0, le=1)

    @field_validator("shared_prefix_tokens", "context_cap_tokens", "tool_result_tokens", mode="before")
    @classmethod
    def _tokens(cls, v):
        return human_int(v) if isinstance(v, str) else v

    @field_validator("think_time_s", "trace_start_s", mode="before")
    @classmethod
    def _dur(cls, v):
        return duration_s(v)

    @field_validator("trace")
    @classmethod
    def _trace_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        # relative: to the experiment file (its folder is the validation context's `base_dir`, see load_experiment)
        base = (info.context or {}).get("base_dir")
        if v and base is not None and not Path(v).expanduser().is_absolute():
            return str((Path(base) / v).resolve())
        return v

    @field_validator("trace_window_s", mode="before")
    @classmethod
    def _window(cls, v):
        return None if v is None else duration_s(v)


class WorkerHosts(_Strict):
    """Locust workers on the hosts of an Ansible inventory group (load.run_point's worker_hosts,
    docs/distributed.md), instead of local worker processes."""

    inventory: str = Field(description="inventory file (relative: to the experiment file)")
    group: str = "loadgen"
    per_host: int = Field(1, ge=1)
    master_host: str = Field(description="the address of this machine that the worker hosts reach")
    master_port: int = Field(5557, gt=0, le=65535)


# load:'s scalars that every point of the matrix takes as they are (LoadPoint fields of the same name and default)
POINT_SCALARS = (
    "arrival",
    "duration_s",
    "warmup_s",
    "seed",
    "cache_bust",
    "connect_s",
    "first_token_s",
    "stall_s",
    "total_s",
    "extra_body",
    "request_id_prefix",
)


class Load(_Strict):
    """The experiment's load: section. Its keys are LoadPoint's knobs (config/point.py), by the same names and
    defaults; the axes are lists of the knob's values (`rate` for rate_rps), the workload knobs live in
    load.workloads, and the rest are run settings (workers, worker_hosts, max_failure_rate). A test holds it so."""

    concurrency: list[int] = Field(min_length=1)
    arrival: Literal["closed", "constant", "poisson"] = Field(
        "closed",
        description="closed loop, or open loop at load.rate (concurrency caps the streams in flight)",
    )
    rate: list[float] | None = Field(None, min_length=1, description="open loop: requests/s, an axis")
    worker_hosts: WorkerHosts | None = None
    prompt_tokens: list[int] = Field(default_factory=lambda: [2000], min_length=1)
    output_tokens: list[int] = Field(default_factory=lambda: [256], min_length=1)
    endpoint: list[Endpoint] = Field(default_factory=_chat_only, min_length=1)
    workload: list[str] = Field(
        default_factory=lambda: ["single"],
        min_length=1,
        description="names of load.workloads (or single: the built-in single-shot prompts)",
    )
    workloads: dict[str, WorkloadSpec] = Field(default_factory=dict)
    output_dist: str | None = Field(None, description="output lengths drawn per prompt; None: fixed")
    thinking: bool | None = Field(
        None, description="chat_template_kwargs.enable_thinking; None: server default"
    )
    ignore_eos: bool = True
    extra_body: dict[str, Any] = Field(
        {}, description="request-body extras for every point (e.g. n: 2, temperature: 0.7), as LoadPoint's"
    )
    requests: int | None = Field(None, ge=1, description="measured requests per point")
    duration_s: float | None = Field(None, gt=0, description="measured seconds per point")
    warmup_s: float = Field(0.0, ge=0)
    seed: int = 0
    cache_bust: bool = True
    connect_s: float = Field(10.0, gt=0, description="TCP (and TLS) connect timeout")
    first_token_s: float = Field(900.0, gt=0, description="first-token timeout")
    stall_s: float = Field(120.0, gt=0, description="longest gap between chunks after the first token")
    total_s: float = Field(3600.0, gt=0, description="longest whole request")
    request_id_prefix: str | None = Field(
        None,
        pattern=REQUEST_ID_PREFIX,
        description="each request's X-Request-Id starts with this (e.g. the run's name), as LoadPoint's",
    )
    workers: int = Field(0, ge=0, description="Locust worker processes per point (0: one local process)")
    max_failure_rate: float = Field(
        DEFAULT_MAX_FAILURE_RATE,
        ge=0,
        le=1,
        description="exit 3 when a done point's failed share is above this (0.05 or '5%'; 1 or '100%': "
        "off; a point with 0 successes always does); any failure below it is a warning",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_workload(cls, v):
        # before `endpoint` existed, `workload: chat|completions` named the endpoint: keep such files working
        if isinstance(v, dict) and "endpoint" not in v and not v.get("workloads"):
            wl = v.get("workload")
            wls = wl if isinstance(wl, list) else [wl]
            if wl is not None and wls and all(w in ("chat", "completions") for w in wls):
                v = {k: x for k, x in v.items() if k != "workload"}
                v["endpoint"] = wls
        return v

    @field_validator("concurrency", "prompt_tokens", "output_tokens", "workload", "endpoint", mode="before")
    @classmethod
    def _listify(cls, v, info):
        v = v if isinstance(v, list) else [v]
        if info.field_name in ("prompt_tokens", "output_tokens"):
            # 3k / 100k as people write them; a bad string is left for the int check to name
            out = []
            for x in v:
                try:
                    out.append(human_int(x) if isinstance(x, str) else x)
                except ValueError:
                    out.append(x)
            v = out
        return v

    @field_validator("max_failure_rate", mode="before")
    @classmethod
    def _share(cls, v):
        # '5%' as on the command line (--max-failure-rate); a number stays for the range check to judge
        if isinstance(v, str) and v.strip().endswith("%"):
            try:
                return float(v.strip()[:-1]) / 100
            except ValueError:
                raise ValueError(f"{v!r} is not a share like 0.05 or '5%'") from None
        return v

    @field_validator("concurrency", "prompt_tokens", "output_tokens")
    @classmethod
    def _positive(cls, v):
        bad = [x for x in v if x < 1]
        if bad:
            raise ValueError(f"values must be ≥ 1, got {bad}")
        return v

    @field_validator("workloads")
    @classmethod
    def _names(cls, v):
        for name in v:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_]{0,31}$", name):
                raise ValueError(
                    f"workload name {name!r} must be 1-32 letters, digits or '_' (it goes into point ids)"
                )
        return v

    @field_validator(
        "duration_s", "warmup_s", "connect_s", "first_token_s", "stall_s", "total_s", mode="before"
    )
    @classmethod
    def _dur(cls, v):
        return None if v is None else duration_s(v)

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, v):
        return check_extra_body(v)

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, v):
        return v if v is None or isinstance(v, list) else [v]

    @field_validator("rate")
    @classmethod
    def _rate_positive(cls, v):
        bad = [x for x in v or [] if x <= 0]
        if bad:
            raise ValueError(f"rates must be > 0 requests/s, got {bad}")
        return v

    @model_validator(mode="after")
    def _stop(self) -> Load:
        if self.requests is None and self.duration_s is None:
            raise ValueError("give load.requests or load.duration_s (how each point stops)")
        check_arrival(
            self.arrival,
            None if self.rate is None else "set",
            rate_name="load.rate",
            arrival_name="load.arrival",
        )
        if self.worker_hosts is not None and self.workers:
            raise ValueError("load.workers (local processes) and load.worker_hosts: give one of them")
        return self

    @property
    def workload_axis(self) -> bool:
        """True when points differ by named workload: the name then goes into the point ids."""
        return bool(self.workloads) or any(w not in BUILTIN_WORKLOADS for w in self.workload)

    def point_fields(self, name: str) -> dict[str, Any]:
        """The LoadPoint fields every point of workload `name` shares: load:'s scalars, then the workload's."""
        return {k: getattr(self, k) for k in POINT_SCALARS} | self.workload_fields(name)

    def workload_fields(self, name: str) -> dict[str, Any]:
        """The LoadPoint workload fields of a workload name (the load-wide scalars, then the workload's own)."""
        out: dict[str, Any] = {"ignore_eos": self.ignore_eos}
        if self.output_dist is not None:
            out["output_dist"] = self.output_dist
        if self.thinking is not None:
            out["thinking"] = self.thinking
        spec = self.workloads.get(name)
        if spec is None:
            if name in BUILTIN_WORKLOADS:
                return out
            raise KeyError(name)
        own = spec.model_dump(exclude_unset=True)
        if own.get("workload") is None:
            own["workload"] = name if name in WORKLOAD_KINDS else "synthetic"
        return out | own


class Budget(_Strict):
    wall_time_s: float | None = Field(None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _wall(cls, v):
        return seconds_alias(v, "wall_time")


class Exporter(_Strict):
    """The run's live client metrics (Prometheus /metrics, docs/observability.md), served while `servesweep run`
    runs; port 0: a free one, printed at the start and recorded in the manifest."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)


class Experiment(_Strict):
    name: str
    description: str | None = None
    sglang_version: str | None = Field(
        None,
        description="the SGLang version the flags are rendered for; required unless launcher.command is set",
    )
    target: Target
    model: Model
    launcher: Launcher = Field(default_factory=Launcher)
    server: Server = Field(default_factory=Server)
    load: Load
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    keep: list[str] = Field(
        default_factory=list,
        description="points the planner would drop, kept on purpose and labelled: kv_overflow (running requests "
        "× context above the KV pool)",
    )
    flush_cache_between_points: bool = True
    parallel: bool = Field(
        True, description="false: one server at a time even where configurations would fit side by side"
    )
    retries: int = Field(
        1,
        ge=0,
        le=10,
        description="times a point is run again after its server died under it (restarted first)",
    )
    slo: list[str] = Field(
        default_factory=list, description="e.g. ttft_p99<=2s, itl_p99<=50ms, error_rate<=1%"
    )
    budget: Budget = Field(default_factory=Budget)
    exporter: Exporter = Field(default_factory=Exporter)
    search: SearchBlock | None = Field(
        None, description="capacity at SLO instead of a fixed concurrency list"
    )
    decide: DecideBlock | None = Field(
        None, description="the question the run must answer (docs/decision.md)"
    )
    answers: Answers = Field(default_factory=Answers, description="needle probes per configuration")

    @model_validator(mode="wrap")
    @classmethod
    def _flags(cls, v: Any, handler: ModelWrapValidatorHandler[Experiment]) -> Experiment:
        """The server flags under the names SGLang's newest flag table gives them, typed by the table of
        `sglang_version` (sglang/flags.py normalise_flags), before the rest is validated; a flag problem is reported
        with the rest's problems in one pass (without the checks across fields, which would only echo it)."""
        if not isinstance(v, dict):
            return handler(v)
        problems: list[tuple[tuple, str]] = []
        v = normalise_flags(v, problems)
        if not problems:
            return handler(v)
        errors = [
            InitErrorDetails(type=PydanticCustomError(FLAG, msg), loc=loc, input=None)
            for loc, msg in problems
        ]
        try:
            handler(v)
        except ValidationError as e:
            errors += [
                InitErrorDetails(
                    type=PydanticCustomError(err["type"], err["msg"]), loc=err["loc"], input=err["input"]
                )
                for err in e.errors()
                if err["type"] != SEMANTIC
            ]
        raise ValidationError.from_exception_data(cls.__name__, errors)

    @model_validator(mode="before")
    @classmethod
    def _search_load(cls, v):
        # a search has one load point per combination, at search.lower of its axis (what the planner checks)
        if isinstance(v, dict) and isinstance(v.get("search"), dict) and isinstance(v.get("load"), dict):
            s = v["search"]
            key = "rate" if s.get("axis") == "rate" else "concurrency"
            # a speed-up search keeps load.concurrency as it is written (the cap of the replay)
            if s.get("axis") != "speedup" and key not in v["load"]:
                v = dict(v)
                v["load"] = {**v["load"], key: [s.get("lower", 1)]}
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not _NAME.match(v):
            raise ValueError(
                f"name {v!r} must be 1-64 letters, digits, '.', '_' or '-' (it names the run folder)"
            )
        return v

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v):
        from servesweep.config.slo import parse_slos

        v = [v] if isinstance(v, str) else v
        if isinstance(v, list):
            parse_slos([str(x) for x in v])
        return v

    @field_validator("keep", mode="before")
    @classmethod
    def _keep(cls, v):
        v = [v] if isinstance(v, str) else v
        if not isinstance(v, list):
            raise ValueError(f"expected a list such as [{KV_OVERFLOW}], got {v!r}")
        for x in v:
            if x not in KEEP:
                known = "; ".join(f"{k}: {what}" for k, what in KEEP.items())
                hint = did_you_mean(str(x), list(KEEP))
                raise ValueError(f"unknown keep {x!r}{hint}; one of {known}")
        return list(dict.fromkeys(v))

    @field_validator("sglang_version", mode="before")
    @classmethod
    def _version(cls, v):
        if v is None:
            return v
        v = str(v)
        if not _VERSION.match(v):
            raise ValueError(f"expected a version like 0.5.23 or 0.5.15.post1, got {v!r}")
        return v

    @model_validator(mode="after")
    def _semantics(self) -> Experiment:
        """The checks across fields (_check_semantics), in the model: every model_validate makes them (an experiment
        file, a dry run's shrunk experiment, the experiment a resumed run's manifest stored), each problem reported
        at the key it names (parse_experiment turns that into the file's line)."""
        problems: list[tuple[tuple, str]] = []
        _check_semantics(self, problems)
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(type=PydanticCustomError(SEMANTIC, msg), loc=loc, input=None)
                    for loc, msg in problems
                ],
            )
        return self

    # ---- expansion ----------------------------------------------------------------------------------------

    def server_configs(self) -> tuple[list[ServerConfig], list[tuple[ServerConfig, int]]]:
        """Every server configuration (axes × env axes × bundles), minus those excluded by a server-only rule.
        Returns (kept, [(excluded, rule index)])."""
        axes = list(self.server.axes.items())
        env_axes = list(self.server.env_axes.items())
        bundles = self.server.bundles or [Bundle(name="base")]
        kept: list[ServerConfig] = []
        dropped: list[tuple[ServerConfig, int]] = []
        combos = itertools.product(
            itertools.product(*[v for _, v in axes]), itertools.product(*[v for _, v in env_axes]), bundles
        )
        for idx, (avals, evals, bundle) in enumerate(combos):
            flags = dict(self.server.base)
            flags.update(dict(zip([k for k, _ in axes], avals, strict=True)))
            flags.update(bundle.flags)
            env = {k: _env_str(v) for k, v in self.server.env.items()}
            env.update({k: _env_str(v) for k, v in zip([k for k, _ in env_axes], evals, strict=True)})
            env.update({k: _env_str(v) for k, v in bundle.env.items()})
            # what tells this configuration from its siblings: the multi-valued axes and the bundle
            labels: dict[str, Any] = {k: v for (k, vs), v in zip(axes, avals, strict=True) if len(vs) > 1}
            labels.update({k: v for (k, vs), v in zip(env_axes, evals, strict=True) if len(vs) > 1})
            if len(self.server.bundles) > 1:
                labels["bundle"] = bundle.name
            cfg = ServerConfig(
                id=_config_id(idx, labels), index=idx, flags=flags, env=env, bundle=bundle.name, labels=labels
            )
            rule = self._excluded_by(cfg.match_values(), server_only=True)
            if rule is None:
                kept.append(cfg)
            else:
                dropped.append((cfg, rule))
        return kept, dropped

    def points_for(self, cfg: ServerConfig) -> tuple[list[LoadPoint], list[tuple[str, int]]]:
        """The load points of configuration `cfg`: the LoadPoints the run passes to its load generator, sent to the
        target's configured address (a run gives them its own server's, its run id and GPU count:
        run_setup.create_run); and the ids of those an exclusion rule drops, with the rule's index (a dropped
        combination, agent sessions on completions say, need not make a valid point)."""
        kept: list[LoadPoint] = []
        dropped: list[tuple[str, int]] = []
        ld = self.load
        named = ld.workload_axis
        rates: Sequence[float | None] = ld.rate or [None]
        # a generic server's /v1/models may list nothing or fail (transformers serve): the model comes from the
        # experiment; SGLang's lists the served name, so it may stay unset there
        model = self.model.served_model_name or (self.model.path if self.launcher.generic else None)
        labels = {"config_id": cfg.id, **{k: str(v) for k, v in cfg.labels.items()}}
        for wl, ep, p, o, c, r in itertools.product(
            ld.workload, ld.endpoint, ld.prompt_tokens, ld.output_tokens, ld.concurrency, rates
        ):
            # with only the built-in workload, ids and the `workload` label name the endpoint alone (short ids)
            head = f"{wl}-{ep}" if named else ep
            tail = "" if r is None else f"-r{r:g}"
            if (
                self.search is not None and self.search.axis == "speedup"
            ):  # the search's template: at its lower
                tail = f"-x{self.search.lower:g}"
            pid = f"{cfg.id}.{head}-p{p}-o{o}-c{c}{tail}"
            values = cfg.match_values() | {
                # without named workloads, an exclusion rule's `workload` matches the endpoint, as the ids do
                "workload": wl if named else ep,
                "endpoint": ep,
                "prompt_tokens": p,
                "output_tokens": o,
                "concurrency": c,
            }
            if r is not None:
                values["rate"] = r
            rule = self._excluded_by(values, server_only=False)
            if rule is not None:
                dropped.append((pid, rule))
                continue
            kept.append(
                LoadPoint(
                    base_url=self.target.url(),
                    model=model,
                    endpoint=ep,
                    concurrency=c,
                    rate_rps=r,
                    prompt_tokens=p,
                    output_tokens=o,
                    requests=ld.requests,
                    tokenizer=self.model.tokenizer,
                    point_id=pid,
                    workload_name=wl if named else ep,  # what reports group by
                    **ld.point_fields(wl if named else "single"),
                    labels=labels,
                )
            )
        return kept, dropped

    def _excluded_by(self, values: dict[str, Any], *, server_only: bool) -> int | None:
        for i, rule in enumerate(self.exclude):
            if server_only and any(k in LOAD_AXES for k in rule):
                continue
            if all(_rule_matches(v, values.get(k, _MISSING)) for k, v in rule.items()):
                return i
        return None

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[
            :12
        ]


_MISSING = object()


def _rule_matches(want: Any, have: Any) -> bool:
    if have is _MISSING:
        return want is None
    options = want if isinstance(want, list) else [want]
    return any(str(o) == str(have) or _same_number(o, have) for o in options)


def _same_number(a: Any, b: Any) -> bool:
    """2 matches 2.0 (a rate rule written as an integer)."""
    nums = (int, float)
    return isinstance(a, nums) and isinstance(b, nums) and not isinstance(a, bool) and float(a) == float(b)


def _env_str(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


_ABBREV = {
    "tp_size": "tp",
    "dp_size": "dp",
    "context_length": "ctx",
    "mem_fraction_static": "mem",
    "max_running_requests": "mrr",
    "speculative_algorithm": "spec",
    "speculative_num_steps": "steps",
    "speculative_num_draft_tokens": "draft",
    "mamba_radix_cache_strategy": "mamba",
    "chunked_prefill_size": "chunk",
}


def _config_id(idx: int, labels: dict[str, Any]) -> str:
    parts = [f"s{idx + 1:02d}"]
    for k, v in labels.items():
        if k == "bundle":
            parts.append(str(v))
        else:
            parts.append(f"{_ABBREV.get(k, k.lower())}{v}")
    slug = re.sub(r"[^A-Za-z0-9._=-]+", "_", "-".join(parts))
    return slug[:60]


@dataclass
class ServerConfig:
    """One server configuration: the flags (dest names) and environment the server is launched with."""

    id: str
    index: int
    flags: dict[str, Any]
    env: dict[str, str]
    bundle: str
    labels: dict[str, Any] = field(default_factory=dict)

    def match_values(self) -> dict[str, Any]:
        """What exclusion rules can match on: every flag, env var and the bundle name."""
        return {**self.flags, **self.env, "bundle": self.bundle}

    def key(self) -> str:
        """Identity of the launched server: two configurations with the same key need no restart between them."""
        return json.dumps({"flags": self.flags, "env": self.env}, sort_keys=True, default=str)


# --------------------------------------------------------------------------------------------------------------
# Loading with line numbers


def load_experiment(path: str | Path) -> Experiment:
    """Parse and validate an experiment file; raises ExperimentError naming file, line, key and problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ExperimentError([f"{path}: cannot read: {e.strerror}"]) from None
    return parse_experiment(text, str(path), base_dir=path.parent)


def _printable(text: str) -> str:
    """One line of an error whatever a key holds: a control character or a line break (U+0085, U+2028, ...) in a
    key is shown escaped, as in Python's repr, so each problem stays one 'file:line: message' line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def parse_experiment(
    text: str, filename: str = "experiment.yaml", base_dir: Path | None = None
) -> Experiment:
    """The experiment of YAML `text`, validated once (the model's own checks, those across fields included): a
    trace file named relative is taken relative to `base_dir` (the experiment file's folder). ExperimentError: one
    'file:line: key: what' line per problem."""
    yaml = YAML(typ="rt")
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as e:
        line = (e.problem_mark.line + 1) if e.problem_mark else 0
        raise ExperimentError([f"{filename}:{line}: YAML syntax error: {e.problem}"]) from None
    except ReaderError as e:  # a control character: the reader knows its offset, not its line
        line = text.count("\n", 0, max(0, e.position)) + 1
        raise ExperimentError(
            [f"{filename}:{line}: YAML syntax error: character {e.character:#x} is not allowed in YAML"]
        ) from None
    except Exception as e:  # noqa: BLE001 - the YAML library fails on odd scalars with IndexError etc.: a clean error
        line = _first_failing_line(text, type(e))
        raise ExperimentError(
            [f"{filename}:{line}: YAML error: the YAML reader fails here ({type(e).__name__}: {e})"[:500]]
        ) from None
    if not isinstance(doc, CommentedMap):
        raise ExperimentError(
            [f"{filename}:1: expected a mapping of keys (name, target, model, ...) at the top"]
        )
    try:
        return Experiment.model_validate(_plain(doc), context={"base_dir": base_dir})
    except ValidationError as e:
        problems = [_translate(err) for err in e.errors()]
    lines = sorted(((_line_of(doc, loc), _dotted(loc), msg) for loc, msg in problems), key=lambda t: t[0])
    raise ExperimentError([f"{filename}:{n}: {_printable(key)}: {_printable(msg)}" for n, key, msg in lines])


def _first_failing_line(text: str, exc: type[BaseException]) -> int:
    """The first line whose inclusion makes the YAML reader raise `exc` (the reader gives no position for these)."""
    lines = text.splitlines(keepends=True)
    for n in range(1, len(lines) + 1):
        try:
            YAML(typ="rt").load("".join(lines[:n]))
        except exc:
            return n
        except Exception:  # noqa: BLE001 - a different problem of a truncated document: keep looking
            continue
    return 1


def _plain(node: Any) -> Any:
    if isinstance(node, CommentedMap):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, CommentedSeq):
        return [_plain(v) for v in node]
    if hasattr(node, "value") and type(node).__name__.endswith("ScalarFloat"):
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    return node


def _dotted(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"


def _line_of(doc: Any, loc: tuple) -> int:
    """1-based line of the deepest key of `loc` present in the YAML tree."""
    node, line = doc, 1
    for part in loc:
        if isinstance(node, CommentedMap) and part in node:
            line = node.lc.key(part)[0] + 1
            node = node[part]
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and part < len(node):
            line = node.lc.item(part)[0] + 1
            node = node[part]
        else:
            break
    return line


_TYPE_WORDS = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping",
    "model_type": "a mapping",
}
_LIST_OF = {"concurrency": "integers", "prompt_tokens": "integers", "output_tokens": "integers"}


def _translate(err: Mapping[str, Any]) -> tuple[tuple, str]:
    loc, typ, inp = tuple(err["loc"]), err["type"], err.get("input")
    if typ == "extra_forbidden":
        parent_fields = _fields_at(loc[:-1])
        return loc, f"unknown key '{loc[-1]}'{did_you_mean(str(loc[-1]), parent_fields)}"
    if typ == "missing":
        return loc, "required key is missing"
    if typ == "list_type":
        inner = _LIST_OF.get(str(loc[-1]), "values")
        return loc, f"expected a list of {inner}, got {inp!r}"
    if typ == "literal_error":
        return loc, f"{err['msg'][0].lower()}{err['msg'][1:]}, got {inp!r}"
    if typ in _TYPE_WORDS:
        # an element of a list: name the list, say what its elements must be
        if loc and isinstance(loc[-1], int) and str(loc[-2]) in _LIST_OF:
            return loc[:-1], f"expected a list of {_LIST_OF[str(loc[-2])]}, got {inp!r}"
        return loc, f"expected {_TYPE_WORDS[typ]}, got {inp!r}"
    msg = err["msg"]
    msg = msg.removeprefix("Value error, ")
    return loc, msg


def _fields_at(loc: tuple) -> list[str]:
    model: Any = Experiment
    mapping_key = False  # the part after a dict[str, Model] field is a user's key (a workload name)
    for part in loc:
        if isinstance(part, int) or mapping_key:
            mapping_key = False
            continue
        f = getattr(model, "model_fields", {}).get(part)
        if f is None:
            return []
        ann = f.annotation
        inner = getattr(ann, "__args__", None)
        mapping_key = getattr(ann, "__origin__", None) is dict
        model = next((a for a in (inner or (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _check_semantics(exp: Experiment, problems: list) -> None:
    srv = exp.server
    L = exp.launcher
    if exp.sglang_version is None and not L.generic:
        problems.append(
            (("sglang_version",), "required key is missing (the SGLang version the flags are rendered for)")
        )
    if L.generic and L.key_given and exp.target.managed:
        handed = L.server_api_key_env or any(
            "{api_key_file}" in a or "{api_key_config}" in a for a in L.command or []
        )
        if not handed:
            problems.append(
                (
                    ("launcher", "command"),
                    "an API key is given but the server would not get it: set launcher.server_api_key_env (the "
                    "variable the server reads, e.g. VLLM_API_KEY) or put {api_key_file} / {api_key_config} in "
                    "launcher.command",
                )
            )
    for name in list(srv.env) + list(srv.env_axes):
        if not _ENV_NAME.match(name):
            loc = ("server", "env" if name in srv.env else "env_axes", name)
            problems.append((loc, f"'{name}' is not a valid environment variable name"))
    for name, vals in srv.env_axes.items():
        if not vals:
            problems.append((("server", "env_axes", name), "an axis needs at least one value"))
    names = [b.name for b in srv.bundles]
    for i, b in enumerate(srv.bundles):
        if names.count(b.name) > 1:
            problems.append((("server", "bundles", i, "name"), f"bundle name '{b.name}' is used twice"))
        for k in b.flags:
            if k in srv.axes:
                problems.append(
                    (
                        ("server", "bundles", i, "flags", k),
                        f"'{k}' is also a server axis; a bundle may not override it",
                    )
                )
    for k in srv.axes:
        if k in srv.base:
            problems.append(
                (("server", "axes", k), f"'{k}' is both in server.base and server.axes; keep one")
            )
    if not exp.target.managed and (srv.axes or srv.env_axes or len(srv.bundles) > 1):
        problems.append(
            (
                ("server", "axes"),
                "target.base_url is a server servesweep does not restart: no server axes or bundles",
            )
        )
    _check_workloads(exp, problems)
    _check_traces(exp, problems)
    _check_search(exp, problems)
    _check_decide(exp, problems)
    known = set(LOAD_AXES) | {"bundle"} | set(srv.axes) | set(srv.env_axes) | set(srv.base) | set(srv.env)
    for b in srv.bundles:
        known |= set(b.flags) | set(b.env)
    for i, rule in enumerate(exp.exclude):
        if not rule:
            problems.append((("exclude", i), "an empty rule would exclude everything"))
        for k in rule:
            if k not in known:
                problems.append(
                    (
                        ("exclude", i, k),
                        f"'{k}' is not an axis, flag or env var of this experiment{did_you_mean(k, known)}",
                    )
                )


def _check_workloads(exp: Experiment, problems: list) -> None:
    """Every name of load.workload is defined, and each workload makes valid points with every endpoint and
    prompt length of the matrix (LoadPoint's own checks, so the file fails now and not mid-run)."""
    ld = exp.load
    for i, name in enumerate(ld.workload):
        if name not in ld.workloads and name not in BUILTIN_WORKLOADS:
            defined = sorted(ld.workloads) + list(BUILTIN_WORKLOADS)
            problems.append(
                (
                    ("load", "workload", i),
                    f"workload '{name}' is not defined in load.workloads (defined: {', '.join(defined)})"
                    f"{did_you_mean(name, defined)}",
                )
            )
            continue
        fields = ld.workload_fields(name)
        where = ("load", "workloads", name) if name in ld.workloads else ("load", "workload", i)
        for ep, p in itertools.product(ld.endpoint, ld.prompt_tokens):
            if _combo_excluded(exp, name, ep, p):
                continue
            try:
                LoadPoint(
                    base_url="http://127.0.0.1:1",
                    endpoint=ep,
                    concurrency=1,
                    prompt_tokens=p,
                    output_tokens=ld.output_tokens[0],
                    requests=1,
                    **fields,
                )
            except (ValidationError, ValueError) as e:
                msg = e.errors()[0]["msg"] if isinstance(e, ValidationError) else str(e)
                problems.append(
                    (
                        where,
                        f"workload '{name}' with endpoint {ep}, prompt_tokens {p}: {msg.removeprefix('Value error, ')}",
                    )
                )
                break


def _check_traces(exp: Experiment, problems: list) -> None:
    """A trace workload replays at its own timestamps and measures every request of its window: no open loop, no
    warm-up (docs/workloads.md, "Trace replay")."""
    ld = exp.load
    for name in ld.workloads:
        if ld.workload_fields(name).get("workload") != "trace" or name not in ld.workload:
            continue
        if ld.arrival != "closed" or ld.rate is not None:
            problems.append(
                (
                    ("load", "arrival"),
                    f"workload '{name}' replays a trace at its own timestamps: no load.arrival/rate",
                )
            )
        if ld.warmup_s:
            problems.append(
                (
                    ("load", "warmup_s"),
                    f"workload '{name}' measures every request of its trace window: warmup_s 0 "
                    "(start the window later with trace_start_s instead)",
                )
            )


def _combo_excluded(exp: Experiment, workload: str, endpoint: str, prompt_tokens: int) -> bool:
    """Whether a rule on these three axes alone drops every point of this combination (e.g. agent × completions)."""
    values = {"workload": workload, "endpoint": endpoint, "prompt_tokens": prompt_tokens}
    return any(
        set(rule) <= set(values) and all(_rule_matches(v, values[k]) for k, v in rule.items())
        for rule in exp.exclude
    )


def _check_search(exp: Experiment, problems: list) -> None:
    """A search block replaces the axis it searches: concurrency (closed loop) or load.rate (open loop)."""
    s, ld = exp.search, exp.load
    if s is None:
        return
    if s.axis == "concurrency":
        if ld.arrival != "closed":
            problems.append(
                (("search", "axis"), "a concurrency search is a closed loop: set load.arrival: closed")
            )
        if ld.concurrency != [int(s.lower)]:
            problems.append(
                (("load", "concurrency"), "search.axis concurrency searches it: leave load.concurrency out")
            )
    elif s.axis == "speedup":
        # a replay capacity: the trace's speed-up, every workload a trace, the concurrency one cap
        for i, name in enumerate(ld.workload):
            if not (name in ld.workloads and ld.workload_fields(name).get("workload") == "trace"):
                problems.append(
                    (
                        ("load", "workload", i),
                        f"search.axis speedup replays traces: workload '{name}' is not one",
                    )
                )
        if len(ld.concurrency) != 1:
            problems.append(
                (("load", "concurrency"), "a speed-up search replays at one concurrency cap: give one value")
            )
        if ld.rate is not None:
            problems.append((("load", "rate"), "a trace replays at its own timestamps: leave load.rate out"))
    else:
        if ld.arrival == "closed":
            problems.append((("load", "arrival"), "a rate search is an open loop: set constant or poisson"))
        if ld.rate != [s.lower]:
            problems.append((("load", "rate"), "search.axis rate searches it: leave load.rate out"))


def _check_decide(exp: Experiment, problems: list) -> None:
    """A decide block plans its own capacity searches over the matrix's concurrencies: no search block beside it,
    a closed loop, and its bounds inside what load.concurrency allows."""
    d = exp.decide
    if d is None:
        return
    if exp.search is not None:
        problems.append((("decide",), "decide plans its own capacity searches: leave the search block out"))
    if exp.load.arrival != "closed":
        problems.append((("decide",), "decide ranks closed-loop capacity: set load.arrival: closed"))
    top = max(exp.load.concurrency)
    if d.upper is None and top < d.lower:
        problems.append(
            (("decide", "lower"), f"above the largest load.concurrency ({top}); set decide.upper")
        )
