"""What one load point is: the contract between `servesweep load`, the orchestrator and the Locust user.

Pure pydantic, no Locust or gevent import, so the orchestrator can build and validate points in a process that
must never be monkey-patched. Validation errors name the field that is wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servesweep.config.output_dist import parse_output_dist

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_POINT_ID = re.compile(r"^[A-Za-z0-9._=-]{1,120}$")
# Headers that carry secrets; they must come through api_key_env, never through the point (which is written to disk).
_SECRET_HEADERS = {"authorization", "proxy-authorization", "x-api-key", "api-key", "cookie"}
# Body keys the load generator owns: a point that overrode them would no longer measure what it says it does.
_OWNED_BODY_KEYS = {"model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens"}


class LoadPoint(BaseModel):
    """One load point: `concurrency` users streaming requests at one server, in a closed loop (default) or at an
    open-loop arrival rate (constant or Poisson, `rate_rps`), with `concurrency` as the cap of streams in flight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="server root, e.g. http://127.0.0.1:30000 (no /v1)")
    model: str | None = Field(
        None, description="model name sent in each body; None: the first of GET /v1/models"
    )
    endpoint: Literal["chat", "completions", "generate"] = Field(
        "chat", description="/v1/chat/completions, /v1/completions, or SGLang's native /generate"
    )
    concurrency: int = Field(
        ge=1,
        le=100_000,
        description="number of Locust users: the closed loop's streams, or open loop's cap of streams in flight",
    )
    arrival: Literal["closed", "constant", "poisson"] = Field(
        "closed",
        description="closed: each user sends again as soon as its stream ends; constant/poisson: requests are "
        "scheduled at rate_rps (open loop), at most `concurrency` in flight (a due request waits for a free one)",
    )
    rate_rps: float | None = Field(None, gt=0, description="open loop: requests per second over all workers")
    prompt_tokens: int = Field(ge=1, description="target prompt length as the server counts it")
    output_tokens: int = Field(ge=1, description="fixed output length (max_tokens with ignore_eos)")
    requests: int | None = Field(None, ge=1, description="measured requests to complete, then stop")
    duration_s: float | None = Field(None, gt=0, description="measured time; running streams still finish")
    warmup_s: float = Field(0.0, ge=0, description="requests scheduled before start+warmup_s are warmup")
    tokenizer: str | None = None
    cache_bust: bool = True
    seed: int = 0
    pool_size: int | None = Field(None, ge=1, description="distinct prompts in the pool; None: derived")
    api_key_env: str | None = Field(None, description="NAME of the environment variable holding the API key")
    connect_s: float = Field(10.0, gt=0)
    first_token_s: float = Field(900.0, gt=0, description="a 100k prefill under load is legitimate")
    stall_s: float = Field(
        120.0, gt=0, description="longest gap allowed between chunks after the first token"
    )
    total_s: float = Field(3600.0, gt=0, description="longest whole request")
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
    ignore_eos: bool = Field(
        True, description="send ignore_eos (False: leave it out, for servers that reject it)"
    )
    # -- workloads (docs/workloads.md) --
    workload: Literal["synthetic", "shared_prefix", "dataset", "agent"] = "synthetic"
    output_dist: str | None = Field(
        None, description="output lengths drawn per prompt, e.g. 'lognormal:mean=512,sigma=0.5'; None: fixed"
    )
    shared_prefix_tokens: int = Field(0, ge=0, description="shared_prefix: tokens each group shares")
    num_groups: int = Field(1, ge=1, description="shared_prefix: number of groups")
    dataset: str | None = Field(None, description="dataset: a ShareGPT JSON or JSONL file")
    dataset_min_tokens: int | None = Field(None, ge=0)
    dataset_max_tokens: int | None = Field(None, ge=0)
    thinking: bool | None = Field(
        None, description="reasoning models: chat_template_kwargs.enable_thinking; None: the server's default"
    )
    session_turns: int = Field(4, ge=1, description="agent: turns per session")
    tool_result_tokens: int = Field(
        500, ge=0, description="agent: tokens of the tool result after each answer"
    )
    think_time_s: float = Field(
        0.0, ge=0, description="agent: pause between a turn's answer and the next turn"
    )
    context_cap_tokens: int = Field(
        100_000, ge=1, description="agent: a session ends before its context passes this"
    )
    extra_body: dict = Field(default_factory=dict)
    headers: dict[str, str] = Field(default_factory=dict)
    point_id: str | None = Field(None, description="None: derived from the load axes")
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
        bad = sorted(k for k in v if k in _OWNED_BODY_KEYS)
        if bad:
            raise ValueError(
                f"extra_body keys {bad} are set by the load generator from the point's own fields"
            )
        try:
            json.dumps(v)
        except (TypeError, ValueError) as e:
            raise ValueError(f"extra_body is not JSON-serialisable: {e}") from None
        return v

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
        if self.arrival == "closed" and self.rate_rps is not None:
            raise ValueError(
                f"rate_rps={self.rate_rps:g}: a rate needs arrival 'constant' or 'poisson' (closed loop has none)"
            )
        if self.arrival != "closed" and self.rate_rps is None:
            raise ValueError(f"rate_rps: arrival {self.arrival!r} needs a rate in requests per second")
        if not self.probe and self.model is None:
            raise ValueError("model: required when probe is False (nothing asks the server for it)")
        if self.workload == "shared_prefix" and not 0 < self.shared_prefix_tokens < self.prompt_tokens:
            raise ValueError(
                f"shared_prefix_tokens={self.shared_prefix_tokens}: the shared_prefix workload needs "
                f"0 < shared_prefix_tokens < prompt_tokens={self.prompt_tokens}"
            )
        if self.workload != "shared_prefix" and self.shared_prefix_tokens:
            raise ValueError("shared_prefix_tokens: only with workload shared_prefix")
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
        """Hash of everything that changes what is measured (not the labels or the id)."""
        exclude = {"point_id", "labels"}
        # A closed point's open-loop fields hold their defaults: they are not part of its digest.
        if self.arrival == "closed":
            exclude |= {"arrival", "rate_rps"}
        d = self.model_dump(exclude=exclude)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()

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
