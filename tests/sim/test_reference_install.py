"""The conformance tests' SGLang reference folder is installed race-free (issue 27).

Three xdist workers used to `pip install --upgrade --target` the same fixed folder under /tmp at once; one worker
replaced packages while another imported them (`No module named 'openai.types.shared'`, 36 errors on a cold
machine). This test is that situation on purpose: three processes ask for the folder at the same moment in an empty
cache, and each must then import SGLang's protocol dependencies from it. It also checks the folder lives under the
cache root the suite was given, not a shared name under /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CHILD = r"""
import sys, importlib
sys.path.insert(0, sys.argv[1])
import sglang_reference
target = sglang_reference.install(sys.argv[2])
sys.path.insert(0, str(target))
import openai.types.shared, pydantic, msgspec, orjson, fastapi, attrs  # what the reference child imports
assert (target / "sglang" / "srt" / "entrypoints" / "openai" / "protocol.py").is_file()
print(target)
"""


@pytest.mark.timeout(600)
def test_three_concurrent_installs_into_an_empty_cache(tmp_path):
    env = {**os.environ, "SERVESWEEP_CACHE_DIR": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(HERE), "0.5.23"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)  # fmt: skip
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=540)[0] for p in procs]
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0, out
    targets = {out.strip().splitlines()[-1] for out in outs}
    assert targets == {str(tmp_path / "cache" / "sglang-protocol" / "protocol-0.5.23")}
    # one finished folder, no temporary folder left beside it
    assert sorted(x.name for x in (tmp_path / "cache" / "sglang-protocol").iterdir()) == [
        "protocol-0.5.23", "protocol-0.5.23.lock"]  # fmt: skip
