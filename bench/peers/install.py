"""Create each peer's own virtual environment under bench/.peers-venv/<tool> and install it from PyPI.

One environment per tool, because their pins conflict. SGLang and vLLM are installed with --no-deps plus only
what their benchmark clients import (no GPU stacks); the list is requirements-<tool>.txt beside this file.
Idempotent: a tool whose environment already imports is left alone. Returns {tool: "ok" | why it failed}.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE.parent / ".peers-venv"

# (pip arguments, import that proves the client loads)
PLAN: dict[str, tuple[list[list[str]], str]] = {
    "sglang": (
        [["--no-deps", "sglang"], ["-r", str(HERE / "requirements-sglang.txt")]],
        "sglang.benchmark.serving",
    ),
    "vllm": ([["--no-deps", "vllm"], ["-r", str(HERE / "requirements-vllm.txt")]], "vllm.benchmarks.serve"),
    "guidellm": ([["guidellm"]], "guidellm"),
    "aiperf": ([["aiperf"]], "aiperf"),
    "genai-bench": ([["genai-bench"]], "genai_bench"),
}


def _imports(py: Path, module: str) -> tuple[bool, str]:
    r = subprocess.run([str(py), "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    return r.returncode == 0, (r.stderr.strip().splitlines() or [""])[-1]


def ensure(tools: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for t in tools:
        steps, module = PLAN[t]
        venv = VENVS / t
        py = venv / "bin" / "python"
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "-U", "pip"], check=False)
        ok, why = _imports(py, module)
        if not ok:
            for args in steps:
                r = subprocess.run(
                    [str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True
                )
                if r.returncode != 0:
                    why = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
                    break
            ok, why2 = _imports(py, module)
            why = why2 or why
        out[t] = "ok" if ok else f"does not import {module}: {why}"
        print(f"peer {t}: {out[t]}", flush=True)
    return out


if __name__ == "__main__":
    ensure(sys.argv[1:] or list(PLAN))
