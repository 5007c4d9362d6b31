"""The one way a results file crosses a stage: a pydantic model of the whole file (`VersionedFile`), one schema
version, one load that names the file and the field a file gets wrong, one atomic save that writes only what the load
accepts. summary.json (results/point_summary.py), capacity.json and searches/<search>.json (results/capacity.py)
and the needle probes' answers/<config>.json (results/needle_file.py) are its subclasses; manifest.json
(results/manifest.py) follows the same rules with its own lock.

A file without `schema_version` is the format written before its model existed; each subclass says what that is.
Where it is the same keys (all four here), it loads as the current version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, ValidationError

from servesweep.results.store import write_json_atomic


class Strict(BaseModel):
    """A part of a file: every key declared; one the model does not know is an error on load and on save."""

    # NaN and infinity stay what json.dumps writes (NaN, Infinity): a summary of no request has NaN in it
    model_config = ConfigDict(extra="forbid", populate_by_name=True, ser_json_inf_nan="constants")


def field_error(e: ValidationError) -> str:
    """The first problem of a ValidationError as 'dotted.key: message' (and how many more there are)."""
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "(top level)"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {err['msg'].removeprefix('Value error, ')}{more}"


class VersionedFile(Strict):
    """A whole results file. Subclasses declare their version once, `schema_version: Literal[N] = N`, and WHAT (the
    file's name in messages)."""

    WHAT: ClassVar[str] = "results file"

    @classmethod
    def version(cls) -> int:
        """The schema version the subclass declares (its `schema_version` field's default)."""
        return int(cls.model_fields["schema_version"].default)

    @classmethod
    def check(cls, path: str | Path, data: Any) -> Self:
        """`data` as this model; ValueError naming the file and the first field that is wrong. No schema_version:
        the format before the model, read as the current version."""
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a {cls.WHAT} is a JSON object, not {type(data).__name__}")
        version = data.get("schema_version", cls.version())
        if version != cls.version():
            raise ValueError(f"{path}: schema_version {version!r}, expected {cls.version()}")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ValueError(f"{path}: not a valid servesweep {cls.WHAT}: {field_error(e)}") from None

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """The file at `path`, checked (FileNotFoundError; ValueError naming the file and the field)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: no {cls.WHAT}") from None
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.check(path, data)

    def save(self, path: str | Path) -> None:
        """Written atomically (store.write_json_atomic): a reader sees the previous file or this one, whole. Its
        folder (a run's searches/, answers/) is made when missing."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(path), self.as_data())

    def as_data(self) -> dict[str, Any]:
        """The file's JSON: the keys given (a later stage's keys absent until it sets them), with schema_version."""
        data = self.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return {
            "schema_version": self.version(),
            **{k: v for k, v in data.items() if k != "schema_version"},
        }

    @classmethod
    def save_data(cls, path: str | Path, data: dict[str, Any]) -> dict[str, Any]:
        """A file built as JSON checked, then written atomically (nothing is written when it is refused); its JSON
        as written."""
        f = cls.check(path, json.loads(json.dumps(data, default=str)))
        f.save(path)
        return f.as_data()

    @classmethod
    def load_data(cls, path: str | Path) -> dict[str, Any]:
        """The checked file's JSON, for readers that index it."""
        return cls.load(path).as_data()
