"""The reliability figures of issue 35 at their full size, outside the test suite (which runs smaller counts):

    .venv/bin/python bench/bench_reliability.py fuzz  [--experiments 10000] [--streams 10000] [--seed 35]
    .venv/bin/python bench/bench_reliability.py kills [--cycles 30] [--points 8] [--seed 35]

`fuzz`: the property tests of the experiment parser (tests/config/test_fuzz_experiment.py: a value at any key, an
inserted key, arbitrary text, truncated or spliced files) and of the SSE parser (tests/client/test_fuzz_sse.py: any
stream of lines) with their own strategies and checks, run for --experiments generated experiment files (split
evenly over the four experiment properties) and --streams generated SSE streams, seeded (Hypothesis'
derandomized search from --seed; no example database, so a rerun with the same seed sees the same inputs). Every
generated input is counted as the property runs it; a property that fails is a crash, printed with its falsifying
example. The tests' own settings (max_examples) are untouched: `make test` keeps its smaller counts.

`kills`: tests/matrix/test_reliability_kills.py with SERVESWEEP_KILL_CYCLES, SERVESWEEP_KILL_POINTS and
SERVESWEEP_KILL_SEED: `servesweep run` of an emulator matrix SIGKILLed at random moments (start-up and Ansible, a
point streaming, right after a point finished), `--resume` after each kill, every point checked done exactly once
and every byte of a finished point kept. The test's own line says how many kills landed.

Both print one JSON line of figures (docs/reliability.md, BENCHMARKS.md) and exit 1 when anything failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT_TESTS = ROOT / "tests" / "config" / "test_fuzz_experiment.py"
SSE_TESTS = ROOT / "tests" / "client" / "test_fuzz_sse.py"


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _properties(mod) -> list:
    return [
        f
        for name, f in sorted(vars(mod).items())
        if name.startswith("test_") and getattr(f, "is_hypothesis_test", False)
    ]


def _run_property(test, examples: int, seed: int) -> dict:
    """Run one Hypothesis test's own body with its own strategies for `examples` inputs; count what it ran."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    count = 0
    inner = test.hypothesis.inner_test

    def counted(**kw):
        nonlocal count
        count += 1
        inner(**kw)

    counted.__name__ = inner.__name__
    run = hseed(seed)(
        settings(
            max_examples=examples,
            deadline=None,
            database=None,
            derandomize=False,
            suppress_health_check=list(HealthCheck),
        )(given(**test.hypothesis._given_kwargs)(counted))
    )
    t0 = time.monotonic()
    error = None
    try:
        run()
    except Exception:  # a failing property: the falsifying example is in the traceback
        error = traceback.format_exc()[-3000:]
    return {
        "property": inner.__name__,
        "inputs": count,
        "seconds": round(time.monotonic() - t0, 1),
        "error": error,
    }


def fuzz(args) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    exp_props = _properties(_module(EXPERIMENT_TESTS))
    sse_props = _properties(_module(SSE_TESTS))
    rows = []
    per = -(-args.experiments // len(exp_props))
    for i, p in enumerate(exp_props):
        rows.append({"kind": "experiment files", **_run_property(p, per, args.seed + i)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    per = -(-args.streams // len(sse_props))
    for i, p in enumerate(sse_props):
        rows.append({"kind": "SSE streams", **_run_property(p, per, args.seed + 100 + i)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    crashes = [r for r in rows if r["error"]]
    for r in crashes:
        print(f"CRASH in {r['property']}:\n{r['error']}", file=sys.stderr)
    figures = {
        "bench": "fuzz",
        "seed": args.seed,
        "experiment_files": sum(r["inputs"] for r in rows if r["kind"] == "experiment files"),
        "sse_streams": sum(r["inputs"] for r in rows if r["kind"] == "SSE streams"),
        "crashes": len(crashes),
        "seconds": round(sum(r["seconds"] for r in rows), 1),
        "properties": {r["property"]: r["inputs"] for r in rows},
    }
    print(json.dumps(figures))
    return 1 if crashes else 0


def kills(args) -> int:
    env = dict(
        os.environ,
        SERVESWEEP_KILL_CYCLES=str(args.cycles),
        SERVESWEEP_KILL_POINTS=str(args.points),
        SERVESWEEP_KILL_SEED=str(args.seed),
    )
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-s",
        "-p",
        "no:cacheprovider",
        "tests/matrix/test_reliability_kills.py",
    ]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    out = r.stdout + r.stderr
    m = re.search(r"(\d+) SIGKILLs at (\[.*?\]) s survived; (\d+) points, (\d+) bytes lost", out)
    phases: dict[str, int] = {}
    for k in re.findall(r"'(\w+)@", m.group(2)) if m else []:
        phases[k] = phases.get(k, 0) + 1
    figures = {
        "bench": "kills",
        "seed": args.seed,
        "cycles": args.cycles,
        "points": args.points,
        "sigkills": int(m.group(1)) if m else None,
        "by_phase": phases,
        "bytes_lost": int(m.group(4)) if m else None,
        "passed": r.returncode == 0,
        "seconds": round(time.monotonic() - t0, 1),
    }
    if r.returncode != 0:
        print(out[-5000:], file=sys.stderr)
    print(json.dumps(figures))
    return 0 if r.returncode == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser(
        "fuzz", help="10k experiment files and 10k SSE streams through the parsers' properties"
    )
    f.add_argument("--experiments", type=int, default=10_000)
    f.add_argument("--streams", type=int, default=10_000)
    f.add_argument("--seed", type=int, default=35)
    k = sub.add_parser("kills", help="servesweep run SIGKILLed at random moments, resumed each time")
    k.add_argument(
        "--cycles", type=int, default=30, help="kill attempts (some land after the matrix is done)"
    )
    k.add_argument("--points", type=int, default=8, help="points of the matrix (concurrency 1..N)")
    k.add_argument("--seed", type=int, default=35)
    k.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    return fuzz(args) if args.what == "fuzz" else kills(args)


if __name__ == "__main__":
    sys.exit(main())
