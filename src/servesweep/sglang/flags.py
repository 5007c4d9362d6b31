"""SGLang's launch flags, one table per SGLang version, read from SGLang's own argparse parser (`flags/sglang-<v>.json`,
written by scripts/sglang_flags.py; `flags/README.md` describes the format). Everything servesweep knows of SGLang's
flags comes from these tables:

- `parser(version)`: SGLang's parser itself (option strings, types, choices, defaults, prefix matching and its
  ambiguity errors), which the emulator extends with its own `--sim-*` options;
- `defaults(version)`: every flag's default by ServerArgs field, the name `/server_info` shows;
- `render_argv(flags, version)`: the argv words that set a mapping of flags, under that version's option strings;
- `normalise_flags`: the check and coercion of an experiment's flags. An experiment names a flag by its field
  (dashes, aliases, unique prefixes and the names of other versions are accepted) and stores it under the name the
  newest table gives it, so one experiment reads the same for every version; the value is typed from the table of
  the experiment's `sglang_version`. A name that version's table lacks is an error: another server's flag
  (`FOREIGN_FLAGS`: vLLM's gpu_memory_utilization is SGLang's mem_fraction_static), a typo (did you mean), a flag
  of other SGLang versions (added after, removed after); only the names of `launcher.extra_flags` (a patched or
  forked build's own) pass through untyped.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from importlib import resources
from typing import Any

from servesweep.sglang.gpus import POWER_LIMIT_AXIS

TABLE_FORMAT = 2
_PACKAGE_DATA = "servesweep.sglang"


class FlagError(ValueError):
    """A flag or value SGLang's parser would reject; the message is the parser's own where it has one."""


# --------------------------------------------------------------------------------------------------------------------
# SGLang's own argparse types, as each table names them (`type`)


def human_readable_int(value: str) -> int:
    """SGLang's `human_readable_int` (srt/utils/common.py, the same from 0.5.10 to 0.5.23): SI suffixes k, M, G, T
    (decimals allowed: 25.6k -> 25600) and IEC suffixes Ki, Mi, Gi, Ti, case-sensitive; 1M is 1,000,000, 32K is
    an error."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"Invalid integer value: '{value}'.") from e


def human_int(v: Any) -> int:
    """An integer as an experiment file writes it: an int, or a string SGLang's human_readable_int reads (128k,
    32Ki, 1M = 1,000,000)."""
    if isinstance(v, bool):
        raise ValueError(f"expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return human_readable_int(v)
        except argparse.ArgumentTypeError:
            pass
    raise ValueError(f"expected an integer (e.g. 4096, 128k, 32Ki), got {v!r}")


def _nullable_str(val: str) -> str | None:
    return None if not val or val == "None" else val


def _cuda_graph_backend(raw: str) -> str:
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def _cuda_graph_config(row: dict[str, Any]) -> Any:
    """SGLang's parse_cuda_graph_config_arg: a JSON object {phase: {key: value}} with the keys allowed per phase."""
    allowed = row["type_params"]["allowed_keys_per_phase"]

    def parse(raw: str) -> dict[str, dict[str, Any]]:
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as e:
            raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}") from e
        if not isinstance(parsed, dict):
            raise argparse.ArgumentTypeError("--cuda-graph-config must be a JSON object")
        out: dict[str, dict[str, Any]] = {}
        for phase, settings in parsed.items():
            phase = str(phase)
            if phase not in allowed or not isinstance(settings, dict):
                raise argparse.ArgumentTypeError(f"--cuda-graph-config: bad phase {phase!r} or settings")
            if "backend" in settings:
                _cuda_graph_backend(settings["backend"])
            bad = [k for k in settings if k not in allowed[phase]]
            if bad:
                raise argparse.ArgumentTypeError(f"--cuda-graph-config['{phase}']: unknown key '{bad[0]}'")
            out[phase] = dict(settings)
        return out

    return parse


def type_callable(row: dict[str, Any]) -> Any:
    """The callable for a table row's `type` kind (argparse's `type=`)."""
    kind = row["type"]
    simple = {
        None: None,
        "int": int,
        "float": float,
        "str": str,
        "json": json.loads,
        "human_int": human_readable_int,
        "nullable_str": _nullable_str,
        "cuda_graph_backend": _cuda_graph_backend,
    }
    if kind in simple:
        return simple[kind]
    if kind == "cuda_graph_config":
        return _cuda_graph_config(row)
    raise KeyError(f"no callable for type {kind!r} ({row.get('type_callable')}) of {row['option_strings']}")


def value_from_json(v: Any) -> Any:
    """A table value: {"tuple": [...]}, {"dict": {...}} as Python's; a {"repr": ...} stays the repr string."""
    if isinstance(v, list):
        return [value_from_json(x) for x in v]
    if isinstance(v, dict):
        if "tuple" in v:
            return tuple(value_from_json(x) for x in v["tuple"])
        if "dict" in v:
            return {k: value_from_json(x) for k, x in v["dict"].items()}
        if "repr" in v:
            return v["repr"]
    return v


# --------------------------------------------------------------------------------------------------------------------
# The tables


def version_key(v: str) -> tuple[int, ...]:
    """'0.5.15.post1' -> (0, 5, 15, 1), for ordering versions; ValueError for anything else."""
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?", str(v).strip())
    if not m:
        raise ValueError(f"expected a version like 0.5.23 or 0.5.15.post1, got {v!r}")
    return tuple(int(g or 0) for g in m.groups())


@cache
def table_versions() -> tuple[str, ...]:
    """The SGLang versions a table ships for, oldest first."""
    names = [p.name for p in (resources.files(_PACKAGE_DATA) / "flags").iterdir()]
    found = [
        n[len("sglang-") : -len(".json")] for n in names if n.startswith("sglang-") and n.endswith(".json")
    ]
    return tuple(sorted(found, key=version_key))


@cache
def load_table(version: str) -> dict[str, Any]:
    """The raw table of `version`; FlagError naming the versions there are when none ships for it."""
    if version not in table_versions():
        raise FlagError(
            f"no flag table for SGLang {version} (tables: {', '.join(table_versions())}; "
            f"scripts/sglang_flags.py {version} writes one)"
        )
    text = (resources.files(_PACKAGE_DATA) / "flags" / f"sglang-{version}.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    if raw.get("format") != TABLE_FORMAT:
        raise FlagError(f"sglang-{version}.json has format {raw.get('format')}, expected {TABLE_FORMAT}")
    return raw


@dataclass(frozen=True, slots=True)
class Flag:
    """One ServerArgs field of one version and the options that set it; `rows[0]` is the one rendered (an
    option of SGLang's own, not a deprecated alias)."""

    field: str
    version: str
    rows: tuple[dict[str, Any], ...]

    @property
    def row(self) -> dict[str, Any]:
        return self.rows[0]

    @property
    def option(self) -> str:
        """The option string rendered: the one spelled like the field where there is one (--tp-size, not 0.5.11's
        first, --tensor-parallel-size), else SGLang's first (fp8_gemm_runner_backend: --fp8-gemm-backend)."""
        spelled = "--" + self.field.replace("_", "-")
        opts = self.row["option_strings"]
        return spelled if spelled in opts else opts[0]

    @property
    def kind(self) -> str:
        """switch (a bare option), bool (--x / --no-x), list (several values), or value."""
        r = self.row
        if r["action"] == "boolean_optional":
            return "bool"
        if r["nargs"] == 0:
            return "switch"
        if r["nargs"] in ("+", "*") or isinstance(r["nargs"], int) or r["action"] in ("append", "lora_paths"):
            return "list"
        return "value"

    @property
    def default(self) -> Any:
        return value_from_json(self.row["default"])


def _long_name(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


class FlagTable:
    """The flags of one SGLang version by ServerArgs field, and every option string that sets one."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.version: str = raw["sglang_version"]
        # ServerArgs.from_cli_args copies a few dests to other fields (<= 0.5.12: tensor_parallel_size -> tp_size)
        self.field_of_dest: dict[str, str] = dict(raw["field_of_dest"])
        rows: dict[str, list[dict[str, Any]]] = {}
        for row in raw["options"]:
            rows.setdefault(self.field_of_dest.get(row["dest"], row["dest"]), []).append(row)
        self.fields: dict[str, Flag] = {
            f: Flag(f, self.version, tuple(sorted(rs, key=lambda r: "action_class" in r)))
            for f, rs in rows.items()
        }
        self.by_option: dict[str, Flag] = {
            o: flag for flag in self.fields.values() for r in flag.rows for o in r["option_strings"]
        }

    def lookup(self, name: str) -> Flag | None:
        """The flag a name means in this version: a field, an option string's name, or None."""
        name = name.replace("-", "_")
        if name in self.fields:
            return self.fields[name]
        flag = self.by_option.get("--" + name.replace("_", "-"))
        return None if flag is None or flag.kind == "bool" and name.startswith("no_") else flag

    def resolve_prefix(self, name: str) -> Flag | None:
        """A unique prefix of an option string, as SGLang's parser reads it (allow_abbrev); FlagError with the
        parser's own message when ambiguous."""
        if not self.raw["parser"]["allow_abbrev"]:
            return None
        prefix = "--" + name.replace("_", "-")
        hits = sorted({o for o in self.by_option if o.startswith(prefix)})
        if len(hits) > 1:
            raise FlagError(f"ambiguous option: {prefix} could match {', '.join(hits)}")
        return self.by_option[hits[0]] if hits else None


@cache
def table(version: str) -> FlagTable:
    return FlagTable(load_table(version))


def defaults(version: str) -> dict[str, Any]:
    """Every flag's default in `version`, by ServerArgs field (a field argparse leaves unset is left out)."""
    return {
        f: flag.default for f, flag in table(version).fields.items() if flag.row["default"] != "==SUPPRESS=="
    }


# --------------------------------------------------------------------------------------------------------------------
# Names across versions


def _same_meaning(row: dict[str, Any], flag: Flag) -> bool:
    """Whether an option takes the same value as its field's own: an alias, not a switch that stores a constant
    into a field of another type (0.5.15's --disable-piecewise-cuda-graph sets cuda_graph_backend_prefill)."""
    if row is flag.row:
        return True
    if row["action"] in ("store_const", "deprecated"):
        return False
    return Flag(flag.field, flag.version, (row,)).kind == flag.kind


@cache
def _rename_classes() -> dict[str, frozenset[str]]:
    """Names that mean one flag across the tables: a row's field and its option strings' names, joined through
    the option strings versions share (0.5.15 keeps --mamba-scheduler-strategy as an alias of the field
    mamba_radix_cache_strategy, so the 0.5.12 field of that name is the same flag)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for v in table_versions():
        t = table(v)
        for flag in t.fields.values():
            for row in flag.rows:
                if not _same_meaning(row, flag):
                    continue
                for o in row["option_strings"]:
                    if not (flag.kind == "bool" and o.startswith("--no-")):
                        parent[find(_long_name(o))] = find(flag.field)
    classes: dict[str, set[str]] = {}
    for x in list(parent):
        classes.setdefault(find(x), set()).add(x)
    return {x: frozenset(c) for c in classes.values() for x in c}


def flag_in(name: str, version: str, *, prefix: bool = True) -> Flag | None:
    """The flag `name` sets in SGLang `version`: its field or option string there, else the one field of that
    version that another version's name for it maps to, else (`prefix`) a unique prefix (FlagError when
    ambiguous)."""
    t = table(version)
    name = name.replace("-", "_")
    flag = t.lookup(name)
    if flag is not None:
        return flag
    same = {f for f in _rename_classes().get(name, ()) if f in t.fields}
    if len(same) == 1:
        return t.fields[same.pop()]
    return t.resolve_prefix(name) if prefix else None


def canonical_name(field: str) -> str:
    """The name the newest table that has this flag gives it: what an experiment stores."""
    names = _rename_classes().get(field, frozenset({field}))
    for v in reversed(table_versions()):
        hits = sorted(n for n in names if n in table(v).fields)
        if hits:
            return field if field in hits else hits[0]
    return field


def versions_with(name: str) -> list[str]:
    """The versions whose tables know `name` (under any of its names)."""
    names = _rename_classes().get(name.replace("-", "_"), frozenset())
    return [v for v in table_versions() if any(n in table(v).fields for n in names)]


# --------------------------------------------------------------------------------------------------------------------
# Parsers


class _TableAction(argparse.Action):
    """Replays one of SGLang's own action classes from its table row, without their deprecation warnings."""

    def __init__(self, option_strings, dest, row=None, **kwargs):
        self.row = row or {}
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        kind = self.row["action"]
        extra = self.row.get("extra") or {}
        if kind == "store_true":
            setattr(namespace, self.dest, True)
        elif kind == "store_const":
            setattr(namespace, self.dest, value_from_json(extra.get("const_value", self.row.get("const"))))
        elif kind == "store":
            setattr(namespace, self.dest, values)
        elif kind == "deprecated":
            if extra.get("error_message") is not None:
                parser.error(extra["error_message"])
        elif kind == "lora_paths":
            out: list[Any] = []
            for p in values or []:
                p = p.strip()
                out.append(json.loads(p) if p.startswith("{") and p.endswith("}") else p)
            setattr(namespace, self.dest, out)
        else:
            raise NotImplementedError(f"table action {kind!r} for {option_string}")


class _RaisingParser(argparse.ArgumentParser):
    """A parser whose errors raise FlagError (argparse's message) instead of printing usage and exiting."""

    def error(self, message: str):
        raise FlagError(message)


def add_table_options(parser: argparse.ArgumentParser, raw: dict[str, Any]) -> None:
    """Every option of a table, with its dest, type, nargs, choices, default and action."""
    for row in raw["options"]:
        kw: dict[str, Any] = {"dest": row["dest"], "required": row["required"]}
        default = row["default"]
        kw["default"] = argparse.SUPPRESS if default == "==SUPPRESS==" else value_from_json(default)
        if row["help"]:
            kw["help"] = row["help"].replace("%", "%%")
        kind = row["action"]
        choices = None if row["choices"] is None else [value_from_json(c) for c in row["choices"]]
        if "action_class" in row:  # SGLang's own action: replay it
            kw.update(action=_TableAction, row=row, nargs=row["nargs"], choices=choices)
            if row["type"] is not None:
                kw["type"] = type_callable(row)
            if row["nargs"] == 0:
                kw.pop("choices")
            parser.add_argument(*row["option_strings"], **kw)
        elif kind in ("store_true", "store_false", "count"):
            parser.add_argument(*row["option_strings"], action=kind, **kw)
        elif kind in ("store_const", "append_const"):
            parser.add_argument(
                *row["option_strings"], action=kind, const=value_from_json(row["const"]), **kw
            )
        elif kind == "boolean_optional":
            long = [s for s in row["option_strings"] if not s.startswith("--no-")]
            parser.add_argument(*long, action=argparse.BooleanOptionalAction, **kw)
        elif kind in ("store", "append", "extend"):
            kw.update(nargs=row["nargs"], choices=choices, type=type_callable(row))
            if row["const"] is not None:
                kw["const"] = value_from_json(row["const"])
            if row["metavar"] is not None:
                kw["metavar"] = value_from_json(row["metavar"])
            parser.add_argument(*row["option_strings"], action=kind, **kw)
        else:
            raise NotImplementedError(f"action {kind!r} ({row['option_strings']})")


def parser_from_table(
    raw: dict[str, Any], prog: str | None = None, *, raise_errors: bool = False, **kwargs: Any
) -> argparse.ArgumentParser:
    """An argparse parser with a table's option strings, dests, types, nargs, choices, defaults and prefix
    matching; `raise_errors`: errors raise FlagError instead of exiting."""
    p = raw["parser"]
    cls = _RaisingParser if raise_errors else argparse.ArgumentParser
    parser = cls(
        prog=prog or p["prog"],
        allow_abbrev=p["allow_abbrev"],
        prefix_chars=p["prefix_chars"],
        add_help=bool(p["help_option_strings"]),
        **kwargs,
    )
    add_table_options(parser, raw)
    return parser


def parser(version: str, prog: str | None = None, **kwargs: Any) -> argparse.ArgumentParser:
    """SGLang `version`'s launch-server parser (a new one per call: callers add their own options to it)."""
    return parser_from_table(load_table(version), prog, **kwargs)


@cache
def _checking_parser(version: str) -> tuple[argparse.ArgumentParser, tuple[str, ...]]:
    """A raising parser of `version`, and argv words that give its required options (--model-path) a value."""
    required = [
        w for r in load_table(version)["options"] if r["required"] for w in (r["option_strings"][0], "x")
    ]
    return parser(version, raise_errors=True), tuple(required)


def to_fields(ns: argparse.Namespace, version: str) -> argparse.Namespace:
    """A parsed namespace with SGLang's dests renamed to ServerArgs fields, as ServerArgs.from_cli_args does."""
    for dest, field in table(version).field_of_dest.items():
        if hasattr(ns, dest):
            setattr(ns, field, getattr(ns, dest))
            delattr(ns, dest)
    return ns


def sample_words(row: dict[str, Any]) -> list[str]:
    """A valid value for a table row, as the argv words after its option string (the table checks and tests)."""
    if row["nargs"] == 0:
        return []
    if row["choices"]:
        vals = [str(value_from_json(row["choices"][0]))]
    else:
        vals = [
            {
                "int": "2",
                "human_int": "8k",
                "float": "0.5",
                "json": '{"a": 1}',
                "nullable_str": "x",
                "cuda_graph_backend": "full",
                "cuda_graph_config": '{"decode": {"max_bs": 8}}',
            }.get(row["type"] or "str", "x")
        ]
        if row["action"] == "lora_paths":
            vals = ["name=/tmp/adapter", '{"lora_name": "b", "lora_path": "/tmp/b"}']
    if row["nargs"] in ("+", "*"):
        vals = (
            vals * 2
            if not row["choices"] or len(row["choices"]) < 2
            else [str(c) for c in row["choices"][:2]]
        )
    return vals


# --------------------------------------------------------------------------------------------------------------------
# Values: an experiment's value <-> argv words


def _word(v: Any) -> str:
    return json.dumps(v) if isinstance(v, dict | list) else str(v)


def flag_words(flag: Flag, value: Any) -> list[str]:
    """The argv words that set `flag` to `value` (None, and false for a bare switch, leave it out)."""
    if value is None:
        return []
    kind, opt = flag.kind, flag.option
    if kind == "switch":
        return [opt] if value is True else []
    if kind == "bool":
        return [opt] if value else ["--no-" + opt[2:]]
    if flag.row["nargs"] == "?" and value is True:
        return [opt]
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        if flag.row["action"] == "append":
            return [w for x in items for w in (opt, _word(x))]
        return [opt, *map(_word, items)]
    return [opt, _word(value)]


_EXPECT = {
    "int": ("an integer", "integers"),
    "human_int": ("an integer", "integers"),
    "float": ("a number", "numbers"),
    "bool": ("true or false", "booleans"),
    "json": ("JSON (a mapping, a list or a JSON string)", "JSON values"),
    "cuda_graph_config": ("a mapping {phase: {key: value}}", "mappings"),
    "list": ("a list of values", "lists of values"),
}


def expected(flag: Flag | None, plural: bool = False) -> str:
    """How a problem message names what a flag takes."""
    if flag is None:
        return "values" if plural else "a value"
    key = "bool" if flag.kind in ("switch", "bool") else "list" if flag.kind == "list" else flag.row["type"]
    words = _EXPECT.get(key, ("a string", "strings"))
    return words[1] if plural else words[0]


def coerce(flag: Flag, value: Any) -> Any:
    """An experiment's value for `flag`, typed (128k -> 128000, 3 -> 3.0 for a float); ValueError when the type
    is wrong, FlagError with SGLang's parser's message when the parser rejects it (a choice, a bad JSON ...)."""
    if value is None:
        return None
    kind, typ = flag.kind, flag.row["type"]
    if kind in ("switch", "bool") or (flag.row["nargs"] == "?" and isinstance(value, bool)):
        if not isinstance(value, bool):
            raise ValueError(value)
        if kind == "switch" and value and flag.row["action"] == "deprecated":
            _check_words(flag, flag_words(flag, value))
        return value
    if kind == "list":
        items = value if isinstance(value, list) else [value]
        out = [_scalar(typ, x, json_ok=flag.row["action"] == "lora_paths") for x in items]
        _check_words(flag, flag_words(flag, out))
        return out
    out = _scalar(typ, value, json_ok=typ in ("json", "cuda_graph_config"))
    _check_words(flag, flag_words(flag, out))
    return out


def _scalar(typ: str | None, v: Any, json_ok: bool) -> Any:
    if isinstance(v, bool):
        raise ValueError(v)
    if isinstance(v, dict | list):
        if json_ok:
            return v
        raise ValueError(v)
    if typ == "int":
        if not isinstance(v, int):
            raise ValueError(v)
        return v
    if typ == "human_int":
        return human_int(v)
    if typ == "float":
        if not isinstance(v, int | float):
            raise ValueError(v)
        return float(v)
    if isinstance(v, str | int | float):
        return v if json_ok and not isinstance(v, str) else str(v)
    raise ValueError(v)


def _check_words(flag: Flag, words: list[str]) -> None:
    """Parse `words` with the flag's version's own parser: the value must be what SGLang accepts."""
    if words:
        p, required = _checking_parser(flag.version)
        p.parse_args([*required, *words] if words[0] not in required else words)


def render_argv(flags: dict[str, Any], version: str | None) -> list[str]:
    """The argv words for `flags` (experiment names) under SGLang `version`'s option strings, in name order. A
    name the version does not know (a forked build's flag), and every flag of a generic server (`version` None),
    renders as `--name value` (true bare, false/null left out, a list several values, a mapping JSON). Host
    settings (HOST_SETTINGS: the GPUs' power limit, which the sglang_server role applies) are no server flag."""
    out: list[str] = []
    for name in sorted(flags):
        if name in HOST_SETTINGS:
            continue
        value = flags[name]
        flag = None if version is None else flag_in(name, version)
        out += flag_words(flag, value) if flag is not None else plain_words(name, value)
    return out


def plain_words(name: str, value: Any) -> list[str]:
    """The argv words of a flag no table knows (a forked build's, a generic server's, a --config file's key):
    `--name value`; true bare, false/null left out, a list several values, a mapping JSON."""
    opt = "--" + str(name).replace("_", "-")
    if value is True:
        return [opt]
    if value is False or value is None:
        return []
    if isinstance(value, list):
        return [opt, *map(_word, value)]
    return [opt, _word(value)]


# --------------------------------------------------------------------------------------------------------------------
# An experiment's flags


# Set by servesweep itself from other parts of the experiment; an experiment must not set them as flags.
RESERVED_FLAGS = {
    "model_path": "model.path",
    "host": "target.address",
    "port": "target.port",
    "api_key": "secrets",
}


# Server axes that are settings of the GPU host, applied by the sglang_server role before the server starts, not
# flags of the server: gpu_power_limit_w (W, the GPUs' power limit: tasks/power_limit.yml; docs/gpu-telemetry.md).
# Any server (SGLang, the emulator, a generic one) may have them; the planner checks the value against the GPU
# profile's allowed range (sglang/gpus.py power_limit_problem).
HOST_SETTINGS = frozenset({POWER_LIMIT_AXIS})


def host_setting_problem(key: str, value: Any) -> str | None:
    """What is wrong with one value of a host setting, or None."""
    if key == POWER_LIMIT_AXIS:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            return f"expected watts (a positive number), got {value!r}"
    return None


def did_you_mean(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


# --------------------------------------------------------------------------------------------------------------------
# Other servers' flag names

_VLLM, _TRT, _TGI = "vLLM", "TensorRT-LLM", "TGI"
_PREFILL_CHUNK = "the tokens of one prefill chunk; max_prefill_tokens bounds a whole prefill batch"
_PROMPT_AND_OUTPUT = "SGLang bounds prompt and output together"

# A flag of another server (vLLM's `vllm serve`, TensorRT-LLM's `trtllm-serve`, TGI's `text-generation-launcher`)
# that no SGLang table knows: whose it is, SGLang's equivalents (the first whose every name the configured version has
# and does not deprecate; a value is part of the setting), and a note. Names SGLang itself accepts are not here:
# tensor_parallel_size, pipeline_parallel_size, data_parallel_size (SGLang's aliases), vLLM's max_loras (a unique
# prefix of max_loras_per_batch, the same meaning), dtype, quantization, kv_cache_dtype, trust_remote_code, ...
FOREIGN_FLAGS: dict[str, tuple[str, tuple[dict[str, Any], ...], str]] = {
    "gpu_memory_utilization": (_VLLM, ({"mem_fraction_static": None},), ""),
    "max_model_len": (_VLLM, ({"context_length": None},), ""),
    "max_num_seqs": (_VLLM, ({"max_running_requests": None},), ""),
    "max_num_batched_tokens": (
        _VLLM,
        ({"chunked_prefill_size": None},),
        _PREFILL_CHUNK,
    ),
    "enable_prefix_caching": (
        _VLLM,
        (),
        "SGLang caches prefixes by default, in its radix cache: leave it out (disable_radix_cache: true turns it off)",
    ),
    "no_enable_prefix_caching": (_VLLM, ({"disable_radix_cache": True},), ""),
    "enable_chunked_prefill": (
        _VLLM,
        (),
        "SGLang chunks prefills by default: leave it out (chunked_prefill_size sets the chunk, -1 turns it off)",
    ),
    "enforce_eager": (
        _VLLM,
        (
            {"cuda_graph_backend_decode": "disabled", "cuda_graph_backend_prefill": "disabled"},
            {"disable_cuda_graph": True},
        ),
        "",
    ),
    "block_size": (_VLLM, ({"page_size": None},), ""),
    "num_speculative_tokens": (
        _VLLM,
        ({"speculative_num_steps": None},),
        "with speculative_eagle_topk 1, speculative_num_draft_tokens is one more",
    ),
    "speculative_config": (
        _VLLM,
        (),
        "SGLang's are flags: speculative_algorithm, speculative_draft_model_path, speculative_num_steps, "
        "speculative_eagle_topk, speculative_num_draft_tokens",
    ),
    "tokenizer": (_VLLM, ({"tokenizer_path": None},), ""),
    "seed": (_VLLM, ({"random_seed": None},), ""),
    "uvicorn_log_level": (_VLLM, ({"log_level_http": None},), ""),
    "enable_expert_parallel": (
        _VLLM,
        ({"ep_size": None},),
        "a size, not a switch: e.g. ep_size equal to tp_size",
    ),
    "disable_log_requests": (_VLLM, (), "SGLang logs requests only with log_requests: true, so leave it out"),
    "enable_auto_tool_choice": (_VLLM, (), "SGLang parses tool calls once tool_call_parser is set"),
    "hf_overrides": (_VLLM, ({"json_model_override_args": None},), ""),
    "cuda_graph_sizes": (_VLLM, ({"cuda_graph_bs": None},), ""),
    "swap_space": (
        _VLLM,
        (),
        "SGLang has no CPU swap space (enable_hierarchical_cache keeps evicted KV cache in host memory)",
    ),
    "kv_cache_free_gpu_memory_fraction": (
        _TRT,
        ({"mem_fraction_static": None},),
        "TensorRT-LLM's is a share of the memory left after the weights, SGLang's counts the weights too",
    ),
    "max_batch_size": (f"{_TRT}'s and {_TGI}", ({"max_running_requests": None},), ""),
    "max_num_tokens": (
        _TRT,
        ({"chunked_prefill_size": None},),
        _PREFILL_CHUNK,
    ),
    "max_seq_len": (_TRT, ({"context_length": None},), ""),
    "num_shard": (_TGI, ({"tp_size": None},), ""),
    "max_input_tokens": (_TGI, ({"context_length": None},), _PROMPT_AND_OUTPUT),
    "max_input_length": (_TGI, ({"context_length": None},), _PROMPT_AND_OUTPUT),
    "max_batch_prefill_tokens": (_TGI, ({"max_prefill_tokens": None},), ""),
    "max_concurrent_requests": (_TGI, ({"max_running_requests": None},), ""),
    "max_batch_total_tokens": (_TGI, ({"max_total_tokens": None},), ""),
    "cuda_memory_fraction": (_TGI, ({"mem_fraction_static": None},), ""),
    "quantize": (_TGI, ({"quantization": None},), ""),
    "cuda_graphs": (_TGI, ({"cuda_graph_bs": None},), ""),
    "model_id": (_TGI, (), "servesweep sets SGLang's model_path from model.path: leave it out"),
    "hostname": (_TGI, (), "servesweep sets SGLang's host from target.address: leave it out"),
}


def _setting_words(name: str, value: Any) -> str:
    if value is None:
        return name
    return f"{name}: {'true' if value is True else 'false' if value is False else value}"


def sglang_equivalent(setting: dict[str, Any], version: str) -> str | None:
    """A FOREIGN_FLAGS setting under SGLang `version`'s own names ('cuda_graph_bs_decode' for cuda_graph_bs in
    0.5.23), or None when the version lacks or deprecates one of its flags."""
    words = []
    for name, value in setting.items():
        flag = flag_in(name, version, prefix=False)
        if flag is None or "Deprecated" in str(flag.row.get("action_class", "")):
            return None
        words.append(_setting_words(flag.field, value))
    return " and ".join(words)


def foreign_flag_owner(key: str, version: str) -> str:
    """Whose flag `key` (a FOREIGN_FLAGS name) is and what SGLang `version` has instead: "vLLM's; SGLang's is
    mem_fraction_static"."""
    whose, settings, note = FOREIGN_FLAGS[key]
    said = next((s for s in (sglang_equivalent(x, version) for x in settings) if s is not None), None)
    if said is None and settings:  # every equivalent deprecated in this version: name the first anyway
        said = " and ".join(_setting_words(n, v) for n, v in settings[0].items())
    text = f"{whose}'s"
    if said is None:
        return f"{text}; {note}"
    text += f"; in SGLang: {said}" if ":" in said else f"; SGLang's is {said}"
    return text + (f" ({note})" if note else "")


def _version_span(vs: list[str]) -> str:
    """'SGLang 0.5.20 has it', 'SGLang 0.5.20 to 0.5.23 have it'."""
    return f"SGLang {vs[0]} has it" if len(vs) == 1 else f"SGLang {vs[0]} to {vs[-1]} have it"


def _added(before: str, first: str) -> str:
    """When a flag came, from the last table without it and the first with it: exact for consecutive releases
    (0.5.9, 0.5.10), a range otherwise (no table between 0.5.15.post1 and 0.5.20)."""
    b, f = version_key(before), version_key(first)
    if f[:2] == b[:2] and f[2] == b[2] + 1 and b[3] == f[3] == 0:
        return f"added in {first}"
    return f"added after {before}, in {first} at the latest"


def _other_versions_problem(raw_key: str, version: str, elsewhere: list[str]) -> str:
    """A flag some tables have but `version`'s has not: added after it, removed before it, or both."""
    allv = list(table_versions())
    here = allv.index(version)
    newer = [v for v in elsewhere if allv.index(v) > here]
    older = [v for v in elsewhere if allv.index(v) < here]
    head = f"SGLang {version} has no flag '{raw_key}'"
    if newer and not older:
        added = _added(allv[allv.index(newer[0]) - 1], newer[0])
        return (
            f"{head} ({added}: {_version_span(newer)}; raise sglang_version, or name it in "
            "launcher.extra_flags for a build of your own that has it)"
        )
    if older and not newer:
        return f"{head} (removed after {older[-1]}: {_version_span(older)})"
    return f"{head} ({_version_span(elsewhere)})"


def _experiment_flag(
    raw_key: str, version: str, extra: frozenset[str] = frozenset(), emulator: bool = False
) -> tuple[str, Flag | None, str | None]:
    """(the name to store, the flag of `version` or None for one passed through untyped: a name of
    launcher.extra_flags, or the emulator's sim_*; a problem or None)."""
    key = raw_key.replace("-", "_")
    try:
        # another server's name, or a patched build's, is never read as a prefix of one of SGLang's
        flag = flag_in(key, version, prefix=key not in extra and key not in FOREIGN_FLAGS)
    except FlagError as e:
        return key, None, f"{e} (SGLang {version})"
    if flag is not None:
        name = canonical_name(flag.field)
        if name != flag.field and name in table(version).fields:
            name = flag.field  # the newest name is another flag in this version: keep this version's
        if name in RESERVED_FLAGS:
            return name, None, f"set by servesweep from {RESERVED_FLAGS[name]}; do not give it as a flag"
        return name, flag, None
    if key in RESERVED_FLAGS:
        return key, None, f"set by servesweep from {RESERVED_FLAGS[key]}; do not give it as a flag"
    if key in extra:
        return key, None, None  # a patched or forked build's own flag: passed through untyped
    if key.startswith("sim_"):
        if emulator:
            return key, None, None  # the emulator's own (servesweep sim --sim-*), which checks it itself
        return key, None, f"'{raw_key}' is an emulator flag (servesweep sim); launcher.emulator is not true"
    if key in FOREIGN_FLAGS:
        return key, None, f"not an SGLang flag: {key} is {foreign_flag_owner(key, version)}"
    elsewhere = versions_with(key)
    if elsewhere:
        return key, None, _other_versions_problem(raw_key, version, elsewhere)
    hint = did_you_mean(key, table(version).fields)
    if hint:
        return key, None, f"unknown SGLang flag '{raw_key}'{hint}"
    close = difflib.get_close_matches(key, list(FOREIGN_FLAGS), n=1, cutoff=0.8)
    if close:
        owner = foreign_flag_owner(close[0], version)
        return key, None, f"unknown SGLang flag '{raw_key}' (did you mean '{close[0]}'? that is {owner})"
    return (
        key,
        None,
        f"unknown SGLang flag '{raw_key}' (SGLang {version} has no such flag; a flag of a patched or forked build: "
        "name it in launcher.extra_flags)",
    )


def _value_problem(flag: Flag | None, v: Any, plural: bool) -> tuple[Any, str | None]:
    """(the typed value, or a problem)."""
    if flag is None:
        ok = v is None or isinstance(v, str | int | float | bool | list | dict)
        return v, None if ok else f"expected {expected(None, plural)}, got {v!r}"
    try:
        return coerce(flag, v), None
    except FlagError as e:
        return v, f"{e} (SGLang {flag.version}: {flag.option})"
    except (ValueError, TypeError):
        return v, f"expected {'a list of ' if plural else ''}{expected(flag, plural)}, got {v!r}"


def _fix_flags(
    d: Any,
    loc: tuple,
    is_axis: bool,
    version: str | None,
    problems: list,
    extra: frozenset[str] = frozenset(),
    emulator: bool = False,
) -> Any:
    if not isinstance(d, dict):
        return d
    out: dict[str, Any] = {}
    for raw_key, val in d.items():
        kloc = loc + (raw_key,)
        if str(raw_key).replace("-", "_") in HOST_SETTINGS:  # the role's, for every server: checked here
            key, flag = str(raw_key).replace("-", "_"), None
            vals = val if is_axis and isinstance(val, list) else [val]
            problem = next((p for p in (host_setting_problem(key, v) for v in vals) if p), None)
        elif version is None:  # a generic server's flags are its own: no SGLang names or types
            key, flag, problem = raw_key.replace("-", "_"), None, None
            if key in RESERVED_FLAGS:
                problem = f"set by servesweep from {RESERVED_FLAGS[key]}; do not give it as a flag"
        else:
            key, flag, problem = _experiment_flag(str(raw_key), version, extra, emulator)
        if problem is None and key in out:
            problem = f"'{raw_key}' is the same flag as '{key}', given twice"
        if problem is not None:
            problems.append((kloc, problem))
            continue
        if not is_axis:
            out[key], problem = _value_problem(flag, val, False)
        elif not isinstance(val, list):
            problem = f"expected a list of {expected(flag, True)}, got {val!r}"
        elif not val:
            problem = "an axis needs at least one value"
        else:
            vals = [_value_problem(flag, v, True) for v in val]
            problem = next((p for _, p in vals if p), None)
            out[key] = [v for v, _ in vals]
        if problem is not None:
            out.pop(key, None)
            problems.append((kloc, problem))
    return out


def normalise_flags(plain: dict, problems: list) -> dict:
    """An experiment's flags (server.base, server.axes, bundles' flags) under the names the newest table gives
    them, typed by the table of its `sglang_version`; problems as (location, message)."""
    server = plain.get("server")
    if not isinstance(server, dict):
        return plain
    launcher = plain.get("launcher")
    generic = isinstance(launcher, dict) and launcher.get("command") is not None
    listed = launcher.get("extra_flags") if isinstance(launcher, dict) else None
    # flags of a patched or forked build (launcher.extra_flags; the schema reports a malformed list)
    extra = frozenset(x.replace("-", "_") for x in listed if isinstance(x, str)) if isinstance(listed, list) else frozenset()
    emulator = isinstance(launcher, dict) and launcher.get("emulator") is True
    version = None if generic else plain.get("sglang_version")
    if not generic:
        try:
            version_key(str(version))
        except ValueError:
            return plain  # the schema reports a missing or malformed sglang_version
        version = str(version)
        try:
            table(version)
        except FlagError as e:
            problems.append((("sglang_version",), str(e)))
            return plain
    server = dict(server)
    if "base" in server:
        server["base"] = _fix_flags(server["base"], ("server", "base"), False, version, problems, extra, emulator)
    if "axes" in server:
        server["axes"] = _fix_flags(server["axes"], ("server", "axes"), True, version, problems, extra, emulator)
    if isinstance(server.get("bundles"), list):
        bundles = []
        for i, b in enumerate(server["bundles"]):
            if isinstance(b, dict) and "flags" in b:
                b = {
                    **b,
                    "flags": _fix_flags(
                        b["flags"], ("server", "bundles", i, "flags"), False, version, problems, extra, emulator
                    ),
                }
            bundles.append(b)
        server["bundles"] = bundles
    return {**plain, "server": server}
