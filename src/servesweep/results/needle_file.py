"""A configuration's needle probes, `answers/<config_id>.json` in a run folder (written by matrix/answer_probes.py,
read by results/needle.py: the report's Answers section, each point's needle accuracy, the exporter): its one model,
`NeedleProbesFile`, with one load and one atomic save (results/schema.py VersionedFile), schema_version 1.

The file holds the configuration, the model name the probes asked, whether the configuration decodes
speculatively, `lengths` (prompt tokens as text -> the score at that length) and `probes` (one per prompt; the same
prompt has the same `id` in every configuration, so speculative and autoregressive answers compare prompt by
prompt). A file without `schema_version` is the format before the model, with the same keys: it loads as version 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Final, Literal

from servesweep.results.runfolder import RunError
from servesweep.results.schema import Strict, VersionedFile

PROBES_DIR: Final = "answers"


class LengthScore(Strict):
    """The probes of one prompt length: scored (`n`), right, failed, too short to hide a needle, degenerate."""

    n: int
    correct: int
    failed: int
    no_needle: int
    degenerate: int
    needle_accuracy: float | None  # correct / n (None: nothing scored)


class NeedleProbe(Strict):
    """One probe: its prompt, the code hidden in it, what came back and whether it states the code."""

    id: str
    prompt_tokens: int
    expected: str | None  # None: the prompt is too short to hide a needle
    answer: str | None  # None: the request failed (`error` says why)
    reasoning: str | None = None
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None
    correct: bool | None  # None: not scored


class NeedleProbesFile(VersionedFile):
    """answers/<config_id>.json, schema_version 1."""

    WHAT: ClassVar[str] = "needle probes file"

    schema_version: Literal[1] = 1
    config_id: str
    model: str
    speculative: bool
    lengths: dict[str, LengthScore]
    probes: list[NeedleProbe]


def probes_path(run_dir: str | Path, config_id: str) -> Path:
    return Path(run_dir) / PROBES_DIR / f"{config_id}.json"


def save_probes(run_dir: str | Path, data: dict[str, Any]) -> dict[str, Any]:
    """A configuration's probe results (matrix/answer_probes.py) checked, written atomically; the JSON written."""
    return NeedleProbesFile.save_data(probes_path(run_dir, data.get("config_id", "")), data)


def read_all_probes(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """Every configuration's probe file, checked, by configuration id ({}: none). RunError naming the file and the
    field of one that is not valid (what report, compare and gate print)."""
    folder = Path(run_dir) / PROBES_DIR
    out = {}
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            d = NeedleProbesFile.load_data(f)
        except (OSError, ValueError) as e:
            raise RunError(str(e)) from None
        out[d["config_id"]] = d
    return out
