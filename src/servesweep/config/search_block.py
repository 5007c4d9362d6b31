"""An experiment's `search:` block: capacity at SLO instead of a fixed concurrency list (docs/capacity.md).

```yaml
search:
  axis: concurrency            # or rate (open loop, req/s; load.concurrency then caps the streams in flight), or
                               # speedup (a trace replay's speed-up factor: the replay capacity, docs/workloads.md)
  tiers:                       # one capacity per tier, found in one search that reuses probes across tiers
    interactive: [decode_tokens_per_s_p50>=30, ttft_p95<=15s]
    fast: [decode_tokens_per_s_p50>=100]
  lower: 1
  upper: 256
  start: null                  # null: the planner's estimate from the step model
  resolution: 5%               # 5%: relative; a number: an absolute step (1 = one concurrency step)
  max_probes: 12               # budget per search (one configuration × workload × prompt × output)
  max_time: 30m
```

SLOs are the one grammar of config/slo.py. The matrix's other load axes (prompt_tokens, output_tokens, workload,
endpoint) still multiply: each combination gets its own search.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servesweep.config.point import seconds_alias
from servesweep.config.slo import SLO, SLOError, parse_slos

# metrics of the grammar the search cannot judge on a probe's requests (docs/capacity.md lists what it judges)
NOT_SEARCHED = ("cache_hit_ratio", "schedule_lag", "itl_per_token")
# units a faster emulator multiplies (SearchBlock.scaled_tiers)
RATE_UNITS = ("tok/s", "req/s")


def tier_texts(v: Any, check: Callable[[str, list[SLO]], None]) -> dict[str, list[str]]:
    """A block's `tiers` (a search's or a decision's): a mapping of tier name -> SLO texts (or a list of tiers,
    named tier1, tier2, ...), each tier's SLOs parsed, none empty, and `check(name, parsed)` raising what the
    block cannot judge; the texts kept as written."""
    if isinstance(v, list):  # a list of tiers: named tier1, tier2, ...
        v = {f"tier{i + 1}": t for i, t in enumerate(v)}
    if not isinstance(v, dict):
        raise ValueError("expected a mapping of tier name -> list of SLOs")
    out = {}
    for name, slos in v.items():
        texts = [slos] if isinstance(slos, str) else [str(s) for s in slos or []]
        try:
            parsed = parse_slos(texts)
        except SLOError as e:
            raise ValueError(f"tier {name}: {e}") from None
        if not parsed:
            raise ValueError(f"tier {name}: needs at least one SLO")
        check(str(name), parsed)
        out[str(name)] = texts
    return out


def _searchable(name: str, parsed: list[SLO]) -> None:
    bad = [s.text for s in parsed if s.metric.base in NOT_SEARCHED]
    if bad:
        raise ValueError(f"tier {name}: {', '.join(bad)} cannot be judged by the capacity search")
    if any(s.per_request for s in parsed) and not any(s.goodput for s in parsed):
        raise ValueError(
            f"tier {name}: per-request SLOs only say which requests are good; add goodput_ratio>=X%"
        )


class SearchBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")

    axis: Literal["concurrency", "rate", "speedup"] = "concurrency"
    tiers: dict[str, list[str]] = Field(min_length=1, description="tier name -> SLO texts")
    lower: float = Field(1, gt=0)
    upper: float = Field(gt=0)
    start: float | None = Field(None, gt=0, description="first load probed; None: the planner's estimate")
    resolution: str | float = Field("5%", description="'5%' (relative) or an absolute step")
    max_probes: int | None = Field(None, ge=1, description="distinct loads measured per search")
    max_time_s: float | None = Field(None, gt=0, description="probe seconds per search")
    confidence: float = Field(0.95, gt=0.5, lt=1)
    max_requests: int = Field(800, ge=20, description="requests a probe is topped up to at most")

    @model_validator(mode="before")
    @classmethod
    def _time(cls, v):
        return seconds_alias(v, "max_time")

    @field_validator("tiers", mode="before")
    @classmethod
    def _tiers(cls, v):
        return tier_texts(v, _searchable)

    @field_validator("resolution", mode="before")
    @classmethod
    def _resolution(cls, v):
        text = str(v).strip()
        try:
            x = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            raise ValueError(f"expected a percentage like 5% or a step like 1, got {v!r}") from None
        if x <= 0:
            raise ValueError(f"must be > 0, got {v!r}")
        return text if text.endswith("%") else x

    @model_validator(mode="after")
    def _bounds(self) -> SearchBlock:
        if self.upper < self.lower:
            raise ValueError(f"search.upper {self.upper:g} is below search.lower {self.lower:g}")
        if self.axis == "concurrency":
            for k in ("lower", "upper", "start"):
                x = getattr(self, k)
                if x is not None and x != int(x):
                    raise ValueError(f"search.{k}: a concurrency is a whole number, got {x:g}")
        if self.start is not None and not self.lower <= self.start <= self.upper:
            raise ValueError(f"search.start {self.start:g} is outside [{self.lower:g}, {self.upper:g}]")
        return self

    @property
    def rel(self) -> float:
        return float(self.resolution[:-1]) / 100 if isinstance(self.resolution, str) else 0.0

    @property
    def step(self) -> float:
        return 0.0 if isinstance(self.resolution, str) else float(self.resolution)

    def load_value(self, x: float) -> int | float:
        """A load as the axis takes it: a concurrency is an int."""
        return int(x) if self.axis == "concurrency" else float(x)

    def scaled_tiers(self, speedup: float) -> dict[str, list[str]]:
        """The tiers for an emulator running `speedup` times faster than real time: latencies divided by it, rates
        (tok/s, req/s) multiplied by it, ratios as they are."""
        out = {}
        for name, texts in self.tiers.items():
            scaled = []
            for s in parse_slos(texts):
                unit = s.metric.unit
                if unit == "ms":
                    scaled.append(f"{s.metric.name}{s.op}{s.value / speedup:.6g}ms")
                elif unit in RATE_UNITS:
                    scaled.append(f"{s.metric.name}{s.op}{s.value * speedup:.6g}")
                else:
                    scaled.append(s.text)
            out[name] = scaled
        return out

    def dry_run(self, speedup: float) -> dict[str, Any]:
        """The block for `--dry-run`: the tiers scaled to the faster emulator, the bounds and the budget shrunk."""
        d = self.model_dump(mode="json")
        upper = min(self.upper, max(self.lower, 32.0))
        d.update(
            tiers=self.scaled_tiers(speedup),
            upper=upper,
            start=None if self.start is None else min(self.start, upper),
            max_probes=min(self.max_probes or 8, 8),
            max_time_s=None,
            max_requests=64,
        )
        if self.axis == "speedup":
            # a trace the faster emulator keeps up with at `speedup` times the speed: the bounds scale with it (and
            # each probe's replay is that much shorter)
            d.update(
                lower=self.lower * speedup,
                upper=self.upper * speedup,
                start=None if self.start is None else self.start * speedup,
            )
        return d
