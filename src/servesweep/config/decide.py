"""An experiment's `decide:` block: the question a run must answer, so the planner can plan only the work that
answers it (docs/decision.md).

```yaml
decide:
  best: output_tokens_per_s_per_gpu   # the figure a configuration is ranked by, at its capacity for the tier
  tiers:                              # one answer per workload shape (workload × prompt × output of the load
                                      # axes) and per per-user speed tier (SLOs of config/slo.py's grammar)
    tier1: [decode_tokens_per_s_p50>=30, ttft_p95<=15s]
    tier2: [decode_tokens_per_s_p50>=100]
    tier3: [decode_tokens_per_s_p50>=300]
  confidence: 95%                     # every interval behind a verdict, under early stopping
  resolution: 5%                      # configurations within this of each other are a tie (either answer is right)
  lower: 1                            # concurrencies a capacity may lie in; upper null: max of load.concurrency
  upper: null
  max_requests: 800                   # a probe stops at this many requests whatever its intervals say ...
  max_probe_time: 15m                 # ... or once its requests would take this long, or after max_looks looks
  max_looks: 4                        # (n0, 2 n0, 4 n0, 8 n0 requests); then the point estimates decide
  prior_margin: 2                     # a configuration not yet seen failing is assumed worth at most this many
                                      # times the step model's prediction (racing drops it below that)
  unprobed_margin: null               # the same for a prompt length a configuration has not probed yet (null:
                                      # prior_margin, calibrated by any probe; .inf: measured before it is dropped)
  cell_sigma: 5%                      # a shape not probed keeps this much error of its own (log-sd) beside its
                                      # configuration's fitted calibration: the fit's intervals widen by it
  share_one_user: false               # true: one load-1 stream of a prompt length's shortest output measures its
                                      # other outputs at load 1 (one user: same TTFT, decode carried by the model)
  knee_margin: 2                      # loads searched up to 2 x the step model's throughput knee (null: all)
```

A tier is judged on quantiles (pNN) of per-request metrics only: their anytime-valid intervals are distribution-free
order-statistic bounds (matrix/decision.py); a mean or a scalar has no such bound here, so it is refused with the
list of what is accepted.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from servesweep.config.point import seconds_alias
from servesweep.config.search_block import SearchBlock, tier_texts
from servesweep.config.slo import SLO

# what a decide tier may judge: per-request metrics whose quantiles the decision bounds distribution-free
DECIDE_METRICS = ("ttft", "tpot", "e2e", "decode_tokens_per_s")


def _fraction(v, what: str) -> float:
    text = str(v).strip()
    try:
        x = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(
            f"{what}: expected a percentage like 95% or a fraction like 0.95, got {v!r}"
        ) from None
    return x


def _decidable(name: str, parsed: list[SLO]) -> None:
    for s in parsed:
        stat = s.metric.stat or ""
        if s.metric.base not in DECIDE_METRICS or not stat.startswith("p"):
            raise ValueError(
                f"tier {name}: {s.text} cannot decide: a decide tier judges a percentile (pNN) of "
                f"{', '.join(DECIDE_METRICS)}"
            )


class DecideBlock(BaseModel):
    model_config = ConfigDict(extra="forbid")

    best: Literal["output_tokens_per_s_per_gpu"] = Field(
        "output_tokens_per_s_per_gpu", description="what ranks configurations, at their capacity for a tier"
    )
    tiers: dict[str, list[str]] = Field(min_length=1, description="tier name -> SLO texts")
    confidence: float = Field(0.95, gt=0.5, lt=1)
    resolution: float = Field(0.05, gt=0, lt=1, description="relative: values this close are a tie")
    lower: int = Field(1, ge=1)
    upper: int | None = Field(None, ge=1, description="None: the largest of load.concurrency")
    max_requests: int = Field(800, ge=20)
    max_probe_time_s: float | None = Field(
        900.0, gt=0, description="a probe's requests take at most this long"
    )
    max_looks: int = Field(4, ge=1, le=20, description="looks at n0, 2 n0, ...: then the estimates decide")
    prior_margin: float = Field(2.0, ge=1.0, description="unfailed value <= margin x the step model's")
    unprobed_margin: float | None = Field(
        None,
        ge=1.0,
        description="a prompt length a configuration has not probed: its value <= this x the uncalibrated step "
        "model's (None: prior_margin, and any probe calibrates every prompt length; .inf: dropped only once measured)",
    )
    cell_sigma: float = Field(
        0.05, ge=0, lt=1, description="an unprobed shape's own error (log-sd) beside its configuration's fit"
    )
    share_one_user: bool = Field(
        False,
        description="a load-1 probe of a prompt length's shortest output measures its other outputs at load 1 "
        "(cheaper; its guesses are shared too: docs/decision.md)",
    )
    skip_first_round: bool = Field(
        False,
        description="a probe above load 1 whose open tiers bound TTFT or E2E is judged without each user's first "
        "request (they start together, a burst whose prefills queue, not the load); each look runs `load` more",
    )
    knee_margin: float | None = Field(
        2.0, ge=1.0, description="loads searched up to this x the step model's throughput knee (None: every load)"
    )

    @model_validator(mode="before")
    @classmethod
    def _time(cls, v):
        return seconds_alias(v, "max_probe_time")

    @field_validator("confidence", "resolution", "cell_sigma", mode="before")
    @classmethod
    def _percent(cls, v, info):
        return _fraction(v, info.field_name)

    @field_validator("tiers", mode="before")
    @classmethod
    def _tiers(cls, v):
        return tier_texts(v, _decidable)

    @model_validator(mode="after")
    def _bounds(self) -> DecideBlock:
        if self.upper is not None and self.upper < self.lower:
            raise ValueError(f"decide.upper {self.upper} is below decide.lower {self.lower}")
        return self

    def dry_run(self, speedup: float) -> dict[str, Any]:
        """The block for `--dry-run`: the tiers scaled to the faster emulator (as a search's: latencies divided by
        the speed-up, rates multiplied), a probe at most 64 requests and 2 looks."""
        d = self.model_dump(mode="json")
        d.update(
            tiers=SearchBlock.scaled_tiers(cast(Any, self), speedup),  # it reads the tiers only
            max_requests=min(self.max_requests, 64),
            max_looks=min(self.max_looks, 2),
            max_probe_time_s=None,
        )
        return d
