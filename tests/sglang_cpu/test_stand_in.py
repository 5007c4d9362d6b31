"""The `sgl_kernel` stand-in against the installed SGLang: every helper SGLang imports on its CPU path is either
implemented or listed with the reason it is not needed, and the one implemented helper has the semantics of
SGLang's triton kernel. (test_server.py checks at run time that a serving SGLang calls nothing unimplemented.)"""

from __future__ import annotations

import ast
import subprocess
import textwrap
from pathlib import Path

import servesweep.sglang.cpu.env as cpu_env

STAND_IN = cpu_env.STAND_IN_DIR / "sgl_kernel" / "__init__.py"


def stand_in_lists() -> tuple[tuple[str, ...], dict[str, str]]:
    """IMPLEMENTED and NOT_NEEDED as the stand-in declares them (read from its source: it imports torch, which
    servesweep's own venv does not have)."""
    found = {}
    for node in ast.parse(STAND_IN.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("IMPLEMENTED", "NOT_NEEDED"):
                found[node.targets[0].id] = ast.literal_eval(node.value)
    implemented = found["IMPLEMENTED"]
    for name in implemented:
        assert f"def {name}(" in STAND_IN.read_text(), f"{name} is listed as implemented but not defined"
    return implemented, found["NOT_NEEDED"]


def _sglang_source(sglang_cpu_env) -> Path:
    # find_spec locates the package without running its __init__ (importing sglang takes 20-40 s here)
    code = "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('sglang').origin))"
    out = subprocess.run(
        [str(sglang_cpu_env.python), "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return Path(out.stdout.strip())


# How a guard's words read on this tier: SGLang's CPU engine, no accelerator, and no AMX backend (the stand-in
# registers no torch op, so cpu_has_amx_support() is false even on an AMX CPU). Other words: unknown.
_FALSE_WORDS = ("amx", "cuda", "hip", "npu", "xpu", "musa", "mps", "arm64", "sm90", "sm100", "blackwell", "hopper")


def _truth(expr: ast.expr) -> bool | None:
    """True/False when `expr` is decided on the CPU tier, None when it depends on something else."""
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        v = _truth(expr.operand)
        return None if v is None else not v
    if isinstance(expr, ast.BoolOp):
        vals = [_truth(v) for v in expr.values]
        if isinstance(expr.op, ast.And):
            return False if False in vals else (True if all(v is True for v in vals) else None)
        return True if True in vals else (False if all(v is False for v in vals) else None)
    if isinstance(expr, ast.Name | ast.Attribute | ast.Call):
        word = ast.unparse(expr).lower()
        if any(w in word for w in _FALSE_WORDS):
            return False
        if "cpu" in word:
            return True
    return None


def cpu_path_imports(root: Path) -> dict[str, list[str]]:
    """Names SGLang's serving code (srt/, kernels/) imports `from sgl_kernel import ...` where the CPU tier gets:
    every enclosing `if`/`else` branch is possible on a CPU without AMX and one of them is CPU-specific (`if
    _is_cpu:`), or the name ends in `_cpu`: name -> where."""
    found: dict[str, list[str]] = {}
    for sub in ("srt", "kernels"):
        for path in sorted((root / sub).rglob("*.py")):
            text = path.read_text()
            if "sgl_kernel" not in text:  # most files: skip parsing them (a full parse takes minutes on 2 cores)
                continue
            tree = ast.parse(text, filename=str(path))
            parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module == "sgl_kernel"):
                    continue
                branch, child, n = [], node, node
                while n in parents:
                    n = parents[n]
                    if isinstance(n, ast.If):
                        v = _truth(n.test)
                        in_else = any(child is c for c in n.orelse)
                        branch.append(None if v is None else (v != in_else))
                    child = n
                possible = False not in branch
                for alias in node.names:
                    if possible and (True in branch or alias.name.endswith("_cpu")):
                        found.setdefault(alias.name, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_every_cpu_path_import_is_implemented_or_explained(sglang_cpu_env):
    implemented, not_needed = stand_in_lists()
    found = cpu_path_imports(_sglang_source(sglang_cpu_env))
    # the scan itself works: the helper SGLang's allocator imports on every CPU is among them
    assert "assign_req_to_token_pool_cpu" in found
    unexplained = {k: v for k, v in found.items() if k not in implemented and k not in not_needed}
    assert unexplained == {}, (
        "SGLang imports sgl_kernel helpers on its CPU path that the stand-in neither implements nor lists in "
        f"NOT_NEEDED (with the reason): {unexplained}"
    )
    stale = sorted(set(not_needed) - set(found))
    assert stale == [], f"NOT_NEEDED lists helpers SGLang no longer imports on its CPU path: {stale}"


def test_assign_req_to_token_pool_cpu_matches_the_triton_kernel(sglang_cpu_env):
    """The stand-in against a line-by-line transcription of SGLang's triton `assign_req_to_token_pool` (one
    program per request, its source offset the sum of the earlier lengths, 32-wide masked blocks), on batches
    with empty and uneven extents, rows out of order and a non-default pool length."""
    script = textwrap.dedent(
        """
        import random, torch, sgl_kernel

        def triton_semantics(req_pool_indices, req_to_token, start, end, out_cache_loc, pool_len, bs):
            flat = req_to_token.view(-1)
            for pid in range(bs):
                kv_start, kv_end = int(start[pid]), int(end[pid])
                token_pool = int(req_pool_indices[pid]) * pool_len
                out_offset = int((end[:pid] - start[:pid]).sum()) if pid else 0
                save = kv_start
                while save < kv_end:  # cdiv(kv_end - kv_start, 32) blocks, masked at kv_end
                    for j in range(32):
                        if save + j < kv_end:
                            flat[token_pool + save + j] = out_cache_loc[out_offset + save - kv_start + j]
                    save += 32

        rng = random.Random(7)
        for trial in range(200):
            rows, pool_len = rng.randint(1, 8), rng.choice([16, 37, 100])
            bs = rng.randint(1, rows)
            idx = torch.tensor(rng.sample(range(rows), bs), dtype=torch.int64)
            start = torch.tensor([rng.randint(0, pool_len - 1) for _ in range(bs)], dtype=torch.int64)
            end = torch.tensor([rng.randint(int(s), pool_len) for s in start], dtype=torch.int64)
            total = int((end - start).sum())
            loc = torch.randint(0, 10_000, (total,), dtype=torch.int64)
            a = torch.full((rows, pool_len), -1, dtype=torch.int32)
            b = a.clone()
            sgl_kernel.assign_req_to_token_pool_cpu(idx, a, start, end, loc, pool_len)
            triton_semantics(idx, b, start, end, loc, pool_len, bs)
            assert torch.equal(a, b), (trial, idx, start, end)
        try:
            sgl_kernel.verify_tree_greedy_cpu(None)
        except NotImplementedError as e:
            assert "verify_tree_greedy_cpu" in str(e) and "speculative" in str(e), e
        else:
            raise AssertionError("an unimplemented helper did not raise")
        print("ok")
        """
    )
    out = subprocess.run(
        [str(sglang_cpu_env.python), "-c", script], capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(sglang_cpu_env.stand_in), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
