"""Write a variant of an experiment file: the GPU smoke run and the emulator dry check are the real matrix
(bench/gpu/experiment.yaml) with a few keys changed, so the three never drift apart.

Usage: python bench/gpu/variant.py BASE.yaml OUT.yaml [KEY=JSON ...] [--rename-flag OLD=NEW ...]
  KEY is dotted (load.concurrency, launcher.command); JSON is the new value (a bare word is taken as a string),
  `null` deletes the key. --rename-flag renames a server flag everywhere it appears (server.base, server.axes,
  exclude rules), e.g. to swap a transformers flag for its emulator analogue.
The result is checked with servesweep's own experiment loader, so a broken variant fails here, not mid-run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ruamel.yaml import YAML


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def set_key(doc: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    node = doc
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if value is None:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = value


def rename_flag(doc: dict, old: str, new: str) -> None:
    server = doc.get("server") or {}
    for section in ("base", "axes"):
        d = server.get(section)
        if isinstance(d, dict) and old in d:
            d[new] = d.pop(old)
    for rule in doc.get("exclude") or []:
        if old in rule:
            rule[new] = rule.pop(old)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("set", nargs="*", metavar="KEY=JSON")
    ap.add_argument("--rename-flag", action="append", default=[], metavar="OLD=NEW")
    args = ap.parse_args(argv)
    yaml = YAML(typ="rt")
    doc = yaml.load(args.base.read_text())
    for item in args.rename_flag:
        old, sep, new = item.partition("=")
        if not sep or not old or not new:
            ap.error(f"--rename-flag {item!r}: expected OLD=NEW")
        rename_flag(doc, old, new)
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            ap.error(f"{item!r}: expected KEY=JSON (e.g. load.concurrency=[1,4])")
        set_key(doc, key, _value(raw))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w") as f:
        yaml.dump(doc, f)

    from servesweep.config.experiment import ExperimentError, load_experiment

    try:
        load_experiment(args.out)
    except ExperimentError as e:
        print(f"variant.py: the variant {args.out} is not a valid experiment:\n{e}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
