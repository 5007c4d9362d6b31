#!/usr/bin/env python3
"""SGLang's launch-server flag table, read from SGLang's own argparse parser, one JSON file per version.

    python scripts/sglang_flags.py 0.5.11 0.5.23            # writes src/servesweep/sglang/flags/sglang-<v>.json
    python scripts/sglang_flags.py --check 0.5.11 0.5.23    # also checks each table against SGLang's parser

For each version it runs `pip install --no-deps --target <cache>/sglang-<v> sglang==<v> <light deps>` (the cache is
a throwaway folder, `--cache` or a temporary one), then, in a child `python -I -S` (standard library only) with that
folder first on `sys.path`, builds the parser exactly as `sglang.srt.server_args.prepare_server_args` does
(`argparse.ArgumentParser(prog="sglang serve")` + `ServerArgs.add_cli_args(parser)`) and reads its actions. No AST
fallback is used: SGLang's own parser code runs.

SGLang's GPU stack (torch, triton, transformers, ...) is not installed. A module that an `import` written in SGLang
asks for and that is not there becomes a stub whose attributes are inert, falsy placeholders (its `__version__` is
the one SGLang's wheel pins); `importlib.util.find_spec` probes still find nothing, so SGLang's feature checks see a
CPU machine with nothing installed; other packages' optional imports fail as usual. `sglang/__init__.py` (the
frontend language and transformers patches) is not run, only `sglang.srt.server_args` and what it imports. The
stubbed names are listed in each table (`stubbed_modules`); no `SGLANG_*` variable is set.

`--check` rebuilds a parser from each JSON table alone (`servesweep.sglang.flags.parser_from_table`) and compares it with SGLang's real
parser: the defaults of a bare parse, every option string with a valid value, one at a time (the namespaces' dests
and values must be equal), and prefix matching (`allow_abbrev`): every proper prefix of every long option must
resolve to the same dest, or fail as ambiguous, in both. It also compares the defaults with the literal defaults
written in SGLang's source (AST), a cross-check that the stubs changed none. Exit status 1 if the parsers differ.
"""

from __future__ import annotations

import abc
import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "src" / "servesweep" / "sglang" / "flags"
TABLE_FORMAT = 2  # servesweep.sglang.flags reads this format

# Small packages SGLang's server_args imports whose behaviour matters to the parser, installed for real: msgspec
# (0.5.20+'s ServerArgs is a msgspec Struct whose field defaults are the flags' defaults), orjson (the JSON-list
# argparse type), packaging and typing_extensions (version checks, Literal), dill (a default computed at import).
LIGHT_DEPS = ["msgspec", "orjson", "typing_extensions", "packaging", "dill"]


# --------------------------------------------------------------------------------------------------------------------
# Stubs for SGLang's heavy imports (used only in the child process that imports SGLang)


# dunder names a stub must not claim to have: their presence changes how copy, typing, inspect, os and
# descriptors treat an object
_DENY_DUNDERS = frozenset(
    "__deepcopy__ __copy__ __reduce__ __reduce_ex__ __getstate__ __setstate__ __wrapped__ __signature__ __origin__ "
    "__args__ __parameters__ __set_name__ __get__ __set__ __delete__ __fspath__ __index__ __int__ __float__ "
    "__await__ __aiter__ __class_getitem__ __dataclass_fields__ __slots__ __annotations__ "
    "__all__ __path__ __file__ __spec__ __loader__ __isabstractmethod__ __len__ __iter__ __next__ __bool__ "
    "__struct_fields__ __supertype__ __objclass__ __self__ __call__ __members__".split()
)


def _no_such(name: str) -> bool:
    return name in _DENY_DUNDERS or (name.startswith("_pytest") or name.startswith("_ipython"))


# calls that fail on a machine without a GPU driver, as they fail there (triton: "0 active drivers")
_RAISE_ON_CALL = frozenset({"get_current_target", "get_device_capability", "get_device_properties"})


class _Inert:
    """Anything: callable, subscriptable, iterable (empty), usable as a base class and a decorator; falsy."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __call__(self, *a: Any, **k: Any) -> Any:
        if self.__dict__.get("_name") in _RAISE_ON_CALL:
            raise RuntimeError(f"stub: {self.__dict__['_name']}() has no GPU here")
        if len(a) == 1 and not k and isinstance(a[0], (types.FunctionType, staticmethod, classmethod)):
            return a[0]  # used as a decorator: keep the function
        return _Inert()

    def __getattr__(self, name: str) -> Any:
        if _no_such(name):
            raise AttributeError(name)
        x = _Inert()
        x.__dict__["_name"] = name
        return x

    def __getitem__(self, k: Any) -> Any:
        return _Inert()

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (_InertBase,)

    def __or__(self, other: Any) -> Any:
        return _Inert()

    __ror__ = __or__

    def __eq__(self, other: Any) -> bool:
        return other is self

    def __lt__(self, other: Any) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __float__(self) -> float:
        return 0.0

    def __arith__(self, *other: Any) -> Any:
        return _Inert()

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __arith__
    __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = __neg__ = __and__ = __rand__ = __lshift__ = __arith__

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *a: Any) -> None:
        return None

    def __contains__(self, item: Any) -> bool:
        return False

    def __setitem__(self, k: Any, v: Any) -> None:
        pass

    def __delitem__(self, k: Any) -> None:
        pass

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return "<stub>"


class _InertMeta(abc.ABCMeta):
    # an ABCMeta, so that `class X(nn.Module, ABC)` has a metaclass; `register` is the stub's (transformers'
    # AutoProcessor.register(config, processor)), not ABCMeta's
    def register(cls, *a: Any, **k: Any) -> Any:
        return a[0] if a else None

    def __getattr__(cls, name: str) -> Any:
        if _no_such(name):
            raise AttributeError(name)
        return _Inert()

    def __getitem__(cls, k: Any) -> Any:
        return cls


class _InertBase(metaclass=_InertMeta):
    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if _no_such(name):
            raise AttributeError(name)
        return _Inert()


# attributes a stub module does not have: SGLang probes `hasattr(torch, "npu")` and then insists on an NPU
_STUB_MODULE_LACKS = frozenset({"npu"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if _no_such(name) or (name.startswith("__") and name.endswith("__")) or name in _STUB_MODULE_LACKS:
            raise AttributeError(name)
        if name[:1].isupper():
            # a class-like name: a fresh subclassable type per name
            cls = _InertMeta(name, (_InertBase,), {"__module__": self.__name__})
            setattr(self, name, cls)
            return cls
        return _Inert()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: a module the real finders could not find becomes a stub when it is imported (never
    `sglang.*`); a probe through `importlib.util.find_spec` still finds nothing, so feature checks see it absent."""

    def __init__(self, versions: dict[str, str] | None = None) -> None:
        self.stubbed: set[str] = set()
        self.versions = versions or {}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top == "sglang":
            return None
        # the first frame outside importlib: a probe (importlib.util.find_spec) finds nothing, and only an import
        # written in SGLang (or in a stub) gets a stub; other packages' optional imports fail as they would
        f = sys._getframe(1)
        while f is not None:
            if f.f_code is importlib.util.find_spec.__code__:
                return None
            if not f.f_code.co_filename.startswith("<frozen importlib"):
                break
            f = f.f_back
        importer = "" if f is None else str(f.f_globals.get("__name__", ""))
        if importer.split(".")[0] != "sglang" and importer.split(".")[0] not in self.stubbed:
            return None
        self.stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: Any) -> None:
        module.__version__ = self.versions.get(module.__name__, "0.0.0")
        module.__file__ = f"<stub {module.__name__}>"


def _pinned_versions(target: str) -> dict[str, str]:
    """`Requires-Dist: torch==2.11.0` lines of SGLang's wheel -> {"torch": "2.11.0"}: the stubs' __version__."""
    import glob
    import re

    out: dict[str, str] = {}
    for meta in glob.glob(os.path.join(target, "sglang-*.dist-info", "METADATA")):
        for line in Path(meta).read_text(encoding="utf-8").splitlines():
            m = re.match(r"Requires-Dist:\s*([A-Za-z0-9_.\-]+)(?:\[[^]]*\])?\s*==\s*([^;\s]+)", line)
            if m:
                name = m.group(1).lower().replace("-", "_")
                out.setdefault(name, m.group(2))
                out.setdefault(name.removesuffix("_python"), m.group(2))  # flashinfer_python -> flashinfer
    return out


def _load_sglang_parser(target: str) -> tuple[argparse.ArgumentParser, list[str]]:
    """SGLang's own launch-server parser, built as prepare_server_args builds it, with the GPU stack stubbed."""
    sys.path.insert(0, target)
    for k in [k for k in os.environ if k.startswith("SGLANG_")]:
        del os.environ[k]
    finder = _StubFinder(_pinned_versions(target))
    sys.meta_path.append(finder)
    # the package without its __init__ (which patches transformers and loads the frontend language): only
    # sglang.srt.server_args and what it imports run
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [os.path.join(target, "sglang")]
    sys.modules["sglang"] = pkg
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from sglang.srt.server_args import ServerArgs  # noqa: E402

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    logging.disable(logging.NOTSET)
    return parser, sorted(finder.stubbed)


# --------------------------------------------------------------------------------------------------------------------
# Reading argparse actions into a table

_STD_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse._ExtendAction: "extend",
}
if hasattr(argparse, "BooleanOptionalAction"):
    _STD_ACTIONS[argparse.BooleanOptionalAction] = "boolean_optional"

# SGLang's own Action subclasses, by class name, and the standard behaviour each has (argparse_actions.py)
_SGLANG_ACTIONS = {
    "DeprecatedStoreTrueAction": "store_true",  # warns, stores True
    "DeprecatedStoreConstAction": "store_const",  # warns, stores const_value
    "DeprecatedAliasStoreAction": "store",  # warns, stores the value under the new dest
    "DeprecatedAction": "deprecated",  # error_message set: parser.error(...); else warns and stores nothing
    "LoRAPathAction": "lora_paths",  # list of paths or JSON objects {"lora_name", "lora_path"}
}
_STD_ACTION_ATTRS = {
    "option_strings",
    "dest",
    "nargs",
    "const",
    "default",
    "type",
    "choices",
    "required",
    "help",
    "metavar",
    "container",
    "deprecated",
}

_TYPE_KINDS = {int: "int", float: "float", str: "str", json.loads: "json"}
# SGLang's own argparse types, by function name -> the kind the table names (servesweep.sglang.flags implements each)
_SGLANG_TYPE_KINDS = {
    "human_readable_int": "human_int",  # 128k -> 128000, 1M -> 1000000, 32Ki -> 32768 (suffixes case-sensitive)
    "json_list_type": "json",  # orjson.loads
    "nullable_str": "nullable_str",  # "" or "None" -> None
    "parse_cuda_graph_backend_arg": "cuda_graph_backend",  # str; "tc_piecewise" rejected before the choices
    "parse_cuda_graph_config_arg": "cuda_graph_config",  # JSON object {phase: {allowed key: value}}
}


def _callable_name(t: Any) -> str:
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)
    return f"{mod}.{name}" if mod and mod != "builtins" else name


def _type_kind(t: Any) -> str | None:
    if t is None:
        return None
    if t in _TYPE_KINDS:
        return _TYPE_KINDS[t]
    return _SGLANG_TYPE_KINDS.get(getattr(t, "__name__", ""), "custom")


def _jsonable(v: Any) -> Any:
    """The value itself where JSON holds it exactly, else {"repr": repr(v)}."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else {"repr": repr(v)}
    if isinstance(v, (list, tuple)):
        items = [_jsonable(x) for x in v]
        return items if isinstance(v, list) else {"tuple": items}
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {"dict": {k: _jsonable(x) for k, x in v.items()}}
    return {"repr": repr(v)}  # enums, sets, objects


def _first_line(text: Any) -> str | None:
    if not text:
        return None
    text = str(text).strip()
    if text == argparse.SUPPRESS:
        return "==SUPPRESS=="
    return text.splitlines()[0].strip()


def action_entry(a: argparse.Action) -> dict[str, Any]:
    cls = type(a)
    std = _STD_ACTIONS.get(cls)
    entry: dict[str, Any] = {
        "option_strings": list(a.option_strings),
        "dest": a.dest,
        "action": std or _SGLANG_ACTIONS.get(cls.__name__) or "custom",
    }
    if std is None:
        entry["action_class"] = f"{cls.__module__}.{cls.__qualname__}"
    entry["type"] = _type_kind(a.type)
    if a.type is not None and a.type not in _TYPE_KINDS:
        entry["type_callable"] = _callable_name(a.type)
        if entry["type"] == "cuda_graph_config":
            mod = sys.modules[a.type.__module__]
            entry["type_params"] = {
                "allowed_keys_per_phase": {k: list(v) for k, v in mod.ALLOWED_KEYS_PER_PHASE.items()}
            }
    entry["nargs"] = a.nargs
    entry["choices"] = None if a.choices is None else [_jsonable(c) for c in a.choices]
    if a.choices is not None and isinstance(a.choices, (set, frozenset)):
        entry["choices"] = sorted(entry["choices"], key=str)
    entry["default"] = "==SUPPRESS==" if a.default == argparse.SUPPRESS else _jsonable(a.default)
    entry["const"] = _jsonable(a.const)
    entry["required"] = bool(a.required)
    entry["metavar"] = _jsonable(a.metavar)
    entry["help"] = _first_line(a.help)
    extra = {k: _jsonable(v) for k, v in vars(a).items() if k not in _STD_ACTION_ATTRS}
    if extra:
        entry["extra"] = extra  # an SGLang action's own keywords: new_flag, error_message, const_value
    if entry["action"] == "store" and a.type is None and a.nargs in (None, "?", "*", "+"):
        entry["type"] = "str"  # argparse's default: the string as given
    return entry


def table_from_parser(parser: argparse.ArgumentParser, version: str, stubbed: list[str]) -> dict[str, Any]:
    options = [
        action_entry(a)
        for a in parser._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]
    n_strings = sum(len(o["option_strings"]) for o in options)
    return {
        "format": TABLE_FORMAT,
        "sglang_version": version,
        "produced_by": (
            f"scripts/sglang_flags.py: pip install --no-deps sglang=={version}, then SGLang's own "
            "argparse.ArgumentParser(prog='sglang serve') + ServerArgs.add_cli_args(parser) "
            "(as sglang.srt.server_args.prepare_server_args), GPU stack stubbed, no SGLANG_* variables set"
        ),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "stubbed_modules": stubbed,
        "parser": {
            "prog": parser.prog,
            "allow_abbrev": parser.allow_abbrev,
            "prefix_chars": parser.prefix_chars,
            "exit_on_error": getattr(parser, "exit_on_error", True),
            "help_option_strings": ["-h", "--help"] if parser.add_help else [],
        },
        "counts": {
            "options": len(options),
            "option_strings": n_strings,
            "dests": len({o["dest"] for o in options}),
        },
        "options": options,
    }


# --------------------------------------------------------------------------------------------------------------------
# --check: the table's parser against SGLang's own


def _norm(ns: argparse.Namespace) -> dict[str, Any]:
    return {k: _jsonable(v) for k, v in sorted(vars(ns).items())}


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, Any]:
    """("ok", normalised namespace) or ("error", the argparse message)."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return "ok", _norm(parser.parse_args(argv))
    except SystemExit:
        return "error", err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit"


def _diff(a: tuple[str, Any], b: tuple[str, Any]) -> tuple[Any, Any]:
    """Only the keys whose values differ, when both parsed."""
    if a[0] == b[0] == "ok":
        keys = sorted(
            k for k in a[1].keys() | b[1].keys() if a[1].get(k, "<absent>") != b[1].get(k, "<absent>")
        )
        return {k: a[1].get(k, "<absent>") for k in keys}, {k: b[1].get(k, "<absent>") for k in keys}
    return a, b


def _package_flags() -> Any:
    """servesweep.sglang.flags, the table reader the check tests (standard library only, so the child imports it)."""
    sys.path.append(str(REPO / "src"))
    from servesweep.sglang import flags

    return flags


def check_table(sg: argparse.ArgumentParser, table: dict[str, Any]) -> dict[str, Any]:
    """Every option string with a valid value, the bare defaults and every prefix, parsed by both parsers."""
    flags = _package_flags()
    sample_value = flags.sample_words
    tp = flags.parser_from_table(table)
    base: list[str] = []
    for row in table["options"]:
        if row["required"]:
            base += [row["option_strings"][0], *sample_value(row)]
    res: dict[str, Any] = {"option_strings": 0, "same": 0, "both_error": 0, "differ": []}
    a, b = _parse(sg, base), _parse(tp, base)
    if a != b:
        res["differ"].append((["<defaults>"], *_diff(a, b)))
    res["defaults_same"] = a == b
    # the option strings themselves, then each of SGLang's with a valid value (SGLang's action gives the value)
    sg_rows = [
        action_entry(x) for x in sg._actions if x.option_strings and not isinstance(x, argparse._HelpAction)
    ]
    sg_strings = {o for row in sg_rows for o in row["option_strings"]}
    table_strings = {o for row in table["options"] for o in row["option_strings"]}
    res["only_sglang"] = sorted(sg_strings - table_strings)
    res["only_table"] = sorted(table_strings - sg_strings)
    for row in sg_rows:
        for opt in row["option_strings"]:
            argv = base + [opt, *sample_value(row)]
            a, b = _parse(sg, argv), _parse(tp, argv)
            res["option_strings"] += 1
            if a != b:
                res["differ"].append((argv[len(base) :], *_diff(a, b)))
            elif a[0] == "error":
                res["both_error"] += 1
                res.setdefault("errors", []).append((argv[len(base) :], a[1]))
            else:
                res["same"] += 1
    # prefix matching: every proper prefix of every long option string (of either parser), resolved by both
    longs = sorted(o for o in sg_strings | table_strings if o.startswith("--"))
    prefixes = {o[:i] for o in longs for i in range(3, len(o))} - sg_strings - table_strings
    n = unique = ambiguous = 0
    pdiff: list[Any] = []
    for prefix in sorted(prefixes):
        n += 1
        a, b = _resolve(sg, prefix), _resolve(tp, prefix)
        if a != b:
            pdiff.append((prefix, a, b))
        elif a[0] == "ambiguous":
            ambiguous += 1
        else:
            unique += 1
    res["prefixes"] = {
        "checked": n,
        "unique": unique,
        "ambiguous": ambiguous,
        "differ": pdiff[:20],
        "n_differ": len(pdiff),
    }
    res["allow_abbrev"] = (sg.allow_abbrev, tp.allow_abbrev)
    probe = "--cuda-graph-max-bs"

    def outcome(parser: argparse.ArgumentParser) -> str:
        status, got = _parse(parser, base + [probe, "8"])
        return (
            got
            if status == "error"
            else f"parsed into {[k for k in got if 'cuda_graph' in k and got[k] == 8]}"
        )

    res["cuda_graph_max_bs"] = {
        "exact_flag": probe in sg._option_string_actions,
        "sglang": outcome(sg),
        "table": outcome(tp),
        "matches": [s_ for s_ in longs if s_.startswith(probe)],
    }
    return res


def source_defaults(target: str) -> dict[str, Any]:
    """Literal field defaults written in SGLang's source (AST, nothing imported): `class ServerArgs` in
    srt/server_args.py and the field classes in srt/arg_groups/fields/*.py (0.5.15+). A cross-check that the stubs
    changed no default SGLang computes at import time."""
    import ast
    import glob

    srt = os.path.join(target, "sglang", "srt")
    files = [
        os.path.join(srt, "server_args.py"),
        *sorted(glob.glob(os.path.join(srt, "arg_groups", "fields", "*.py"))),
    ]
    out: dict[str, Any] = {}
    for f in files:
        tree = ast.parse(Path(f).read_text(encoding="utf-8"))
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef) or (
                f.endswith("server_args.py") and cls.name != "ServerArgs"
            ):
                continue
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    try:
                        out[st.target.id] = ast.literal_eval(st.value)
                    except (ValueError, SyntaxError, TypeError):
                        pass
    return out


def check_source_defaults(target: str, table: dict[str, Any]) -> dict[str, Any]:
    src = source_defaults(target)
    same, differ = 0, []
    for row in table["options"]:
        if row["dest"] in src and "action_class" not in row:
            if _jsonable(src[row["dest"]]) == row["default"]:
                same += 1
            else:
                differ.append((row["option_strings"][0], src[row["dest"]], row["default"]))
    return {"compared": same + len(differ), "same": same, "differ": differ}


def _resolve(parser: argparse.ArgumentParser, prefix: str) -> tuple[str, Any]:
    """How argparse reads `prefix` as an option: ("unique", dest), ("ambiguous", message) or ("unknown", None)."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            got = parser._parse_optional(prefix)
    except SystemExit:
        return ("ambiguous", err.getvalue().strip().splitlines()[-1])
    action = (
        None if got is None else got[0] if isinstance(got, tuple) else got[0][0]
    )  # a list from Python 3.12.7
    return ("unknown", None) if action is None else ("unique", action.dest)


# --------------------------------------------------------------------------------------------------------------------
# Driver: install, run the child, write the tables


def write_table(table: dict[str, Any], path: Path) -> None:
    """One option per line: small, and a version bump shows as a readable diff."""
    head = {k: v for k, v in table.items() if k != "options"}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    lines.append('  "options": [')
    rows = [json.dumps(r, ensure_ascii=False) for r in table["options"]]
    lines += [f"    {r}," for r in rows[:-1]] + [f"    {rows[-1]}"]
    lines += ["  ]", "}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _installed_versions(target: str) -> dict[str, str]:
    import glob

    out = {}
    for d in sorted(glob.glob(os.path.join(target, "*.dist-info"))):
        name, _, ver = os.path.basename(d)[: -len(".dist-info")].rpartition("-")
        out[name] = ver
    return out


def install(version: str, cache: Path) -> str:
    target = cache / f"sglang-{version}"
    if not (target / "sglang" / "srt" / "server_args.py").exists():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--no-cache-dir",
            "--target",
            str(target),
            f"sglang=={version}",
            *LIGHT_DEPS,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"pip install of sglang=={version} failed")
    return str(target)


def field_of_dest(target: str) -> dict[str, str]:
    """The dests `ServerArgs.from_cli_args` copies to another field before it builds ServerArgs (`args.tp_size =
    args.tensor_parallel_size` up to 0.5.12), read from SGLang's source (AST): {dest: field}."""
    import ast

    tree = ast.parse(Path(target, "sglang", "srt", "server_args.py").read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "ServerArgs"):
            continue
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name == "from_cli_args"):
                continue
            for st in ast.walk(fn):
                if (
                    isinstance(st, ast.Assign)
                    and len(st.targets) == 1
                    and isinstance(st.targets[0], ast.Attribute)
                    and isinstance(st.value, ast.Attribute)
                    and isinstance(st.value.value, ast.Name)
                    and st.value.value.id == fn.args.args[1].arg
                ):
                    out[st.value.attr] = st.targets[0].attr
    return out


def child(args: argparse.Namespace) -> int:
    """Runs under `python -I -S` with only the target folder added: SGLang, its light deps and stubs."""
    parser, stubbed = _load_sglang_parser(args.target)
    table = table_from_parser(parser, args.version, stubbed)
    table["field_of_dest"] = field_of_dest(args.target)
    table["light_deps"] = {k: v for k, v in _installed_versions(args.target).items() if k != "sglang"}
    if args.out:
        write_table(table, Path(args.out))
    if args.check:
        written = json.loads(Path(args.out or args.check_path).read_text(encoding="utf-8"))
        result = check_table(parser, written)
        result["source_defaults"] = check_source_defaults(args.target, written)
        print(json.dumps(result, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "versions",
        nargs="*",
        default=["0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.15.post1", "0.5.20", "0.5.23"],
        help="SGLang versions (default: %(default)s)",
    )
    ap.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where sglang-<version>.json go")
    ap.add_argument("--cache", type=Path, help="install folder to keep and reuse (default: a temporary one)")
    ap.add_argument("--check", action="store_true", help="also compare each table's parser with SGLang's own")
    ap.add_argument("--no-write", action="store_true", help="check the committed tables, write nothing")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--version", dest="version", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--check-path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    tmp = None
    cache = args.cache
    if cache is None:
        tmp = tempfile.TemporaryDirectory(prefix="sglang-flags-")
        cache = Path(tmp.name)
    rc = 0
    try:
        for v in args.versions:
            t0 = time.monotonic()
            target = install(v, cache)
            t1 = time.monotonic()
            out = args.out_dir / f"sglang-{v}.json"
            cmd = [
                sys.executable,
                "-I",
                "-S",
                str(Path(__file__).resolve()),
                "--child",
                "--target",
                target,
                "--version",
                v,
            ]
            cmd += ["--check-path", str(out)] if args.no_write else ["--out", str(out)]
            if args.check:
                cmd.append("--check")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode:
                sys.stderr.write(proc.stderr)
                return proc.returncode
            t2 = time.monotonic()
            table = json.loads(out.read_text(encoding="utf-8"))
            c = table["counts"]
            print(
                f"sglang {v}: {c['options']} options, {c['option_strings']} option strings "
                f"(+ -h/--help), {c['dests']} dests; {out.stat().st_size / 1024:.0f} KB"
                f"{'' if args.no_write else ' written to ' + str(out.relative_to(REPO) if out.is_relative_to(REPO) else out)}; "
                f"install {t1 - t0:.1f} s, read{' + check' if args.check else ''} {t2 - t1:.1f} s"
            )
            if args.check:
                rc |= _report_check(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return rc


def _report_check(r: dict[str, Any]) -> int:
    p = r["prefixes"]
    print(
        f"  defaults of a bare parse (required options given): {'same' if r['defaults_same'] else 'DIFFER'}"
    )
    print(
        f"  every option string with a valid value: {r['option_strings']} parsed, {r['same']} same namespace, "
        f"{r['both_error']} rejected by both, {len(r['differ'])} differ"
    )
    for argv, msg in r.get("errors", []):
        print(f"    rejected by both (as SGLang does): {' '.join(argv)}: {msg}")
    for d in r["differ"][:10]:
        print(f"    DIFFERS: {d}")
    if r["only_sglang"] or r["only_table"]:
        print(
            f"  option strings only in SGLang's parser: {r['only_sglang']}; only in the table: {r['only_table']}"
        )
    print(
        f"  prefixes (allow_abbrev {r['allow_abbrev'][0]} / table {r['allow_abbrev'][1]}): {p['checked']} checked, "
        f"{p['unique']} unique, {p['ambiguous']} ambiguous, {p['n_differ']} differ"
    )
    for d in p["differ"][:10]:
        print(f"    DIFFERS: {d}")
    cg = r["cuda_graph_max_bs"]
    print(
        f"  --cuda-graph-max-bs 8: exact flag: {cg['exact_flag']}; SGLang: {cg['sglang']}; table: {cg['table']}; "
        f"options starting so: {cg['matches']}"
    )
    sd = r["source_defaults"]
    print(
        f"  defaults against the literal field defaults in SGLang's source (AST): {sd['compared']} compared, "
        f"{sd['same']} same, {len(sd['differ'])} differ"
    )
    for d in sd["differ"]:
        print(f"    field default in the source {d[1]!r}, parser default {d[2]!r}: {d[0]}")
    bad = bool(
        r["only_sglang"]
        or r["only_table"]
        or r["differ"]
        or p["n_differ"]
        or r["allow_abbrev"][0] != r["allow_abbrev"][1]
        or cg["sglang"] != cg["table"]
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
