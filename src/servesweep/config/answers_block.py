"""The experiment's `answers:` block: the needle probes `servesweep run` sends to each server configuration
(matrix/answer_probes.py; docs/answers.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Answers(BaseModel):
    model_config = ConfigDict(extra="forbid")

    needle_probes: bool = Field(
        True,
        description="false: no needle probes (answers are still checked for degeneration on every point)",
    )
    probes_per_length: int = Field(
        3, ge=1, le=50, description="probe prompts per prompt length of the matrix"
    )
    max_tokens: int = Field(
        4096, ge=16, description="a probe's max_tokens: room for a thinking model's reasoning and its answer"
    )
    timeout_s: float = Field(900.0, gt=0, description="one probe request's longest wait (a 100k prefill)")
    seed: int = Field(24, description="the probe prompts' seed: the same prompts go to every configuration")
