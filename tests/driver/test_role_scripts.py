"""The sglang_server role's readiness probe (files/wait_ready.py) bringing a server log back, at ten times its
1 MiB limit: a chatty server's log, a single line longer than the limit, and the API key where the cut falls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "ansible/roles/sglang_server/files/wait_ready.py"
LIMIT = 1 << 20  # wait_ready.LOG_MAX_BYTES
KEY = "sk-servesweep-probe-0123456789abcdef"


def _log_only(workdir: Path, lines: int, key: str | None = None) -> str:
    args = [sys.executable, str(PROBE), "--url", "http://127.0.0.1:9", "--log-only", "--log-lines", str(lines)]
    if key:
        (workdir / "secret.key").write_text(key)
        args += ["--api-key-file", "./secret.key"]
    r = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(r.stdout)["log"]


def test_a_ten_mebibyte_log_brings_back_its_last_whole_lines_within_the_limit(tmp_path):
    line = "[2026-12-02 03:00:00] Decode batch, #running-req: 8, #token: 4096, gen throughput (token/s): 390.1\n"
    body = line * (10 * LIMIT // len(line) + 1)
    (tmp_path / "server.log").write_text(body + "last line 1\nlast line 2\n")
    assert (tmp_path / "server.log").stat().st_size > 10 * LIMIT
    out = _log_only(tmp_path, 200)
    assert out.splitlines()[-2:] == ["last line 1", "last line 2"]
    assert len(out.splitlines()) == 200 and set(out.splitlines()[:-2]) == {line.rstrip("\n")}
    # every line of a log longer than the limit, asked for more lines than the limit holds: whole lines only
    out = _log_only(tmp_path, 10**9)
    assert len(out.encode()) <= LIMIT
    assert set(out.splitlines()[:-2]) == {line.rstrip("\n")}, "the first line kept is whole, not cut at the limit"


def test_a_single_line_longer_than_the_limit_is_not_brought_back_and_says_so(tmp_path):
    (tmp_path / "server.log").write_text("start\n" + "x" * (10 * LIMIT) + "\n")
    out = _log_only(tmp_path, 50)
    assert "x" not in out and "longer than 1048576 bytes" in out
    (tmp_path / "server.log").write_text("start\n" + "x" * (10 * LIMIT) + "\nserver crashed\n")
    assert _log_only(tmp_path, 50) == "server crashed\n"


def test_the_api_key_cut_in_two_by_the_limit_leaves_no_fragment(tmp_path):
    # SGLang logs server_args (api_key among them) on one line; here the limit's cut falls inside the key
    keyline = f"server_args=ServerArgs(model_path='m', api_key='{KEY}')"
    cut_in_line = keyline.index(KEY) + len(KEY) // 2
    tail_len = LIMIT - (len(keyline) - cut_in_line)
    tail = "\n" + "y" * (tail_len - 2) + "\n"
    body = "z" * (10 * LIMIT) + "\n" + keyline + tail
    (tmp_path / "server.log").write_text(body)
    assert body[-LIMIT:].startswith(KEY[len(KEY) // 2 :]), "the cut is inside the key"
    out = _log_only(tmp_path, 1000, key=KEY)
    assert KEY[len(KEY) // 2 :] not in out and "api_key" not in out
    assert out == "y" * (tail_len - 2) + "\n"
    # the key line whole within the limit: redacted, as at every start
    (tmp_path / "server.log").write_text(keyline + "\nready\n")
    out = _log_only(tmp_path, 1000, key=KEY)
    assert KEY not in out and out == "server_args=ServerArgs(model_path='m', api_key='<redacted>')\nready\n"
