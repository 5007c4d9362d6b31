"""The real-SGLang tier: SGLang 0.5.23 on this CPU with the tiny offline model (docs/sglang-cpu.md).

Nothing here skips. If SGLang's venv cannot be installed or the model cannot be built, every test of the tier fails
with the reason (`make test` runs `servesweep sglang-cpu install` first, so it normally fails there already).

Fixture API (session-scoped; a pytest-xdist worker has its own session, so files that run in different workers
do not share servers):

- `sglang_cpu_env` -> `CpuEnv`: `.python` (SGLang's venv python, Path), `.model` (the tiny model's folder),
  `.stand_in` (the folder put on the server's PYTHONPATH), `.tokenizer_json` (the model's tokenizer.json, for
  servesweep's prompt pools: `model.tokenizer` / `--tokenizer`), `.server_env` (the variables a server needs:
  SGLANG_USE_CPU_ENGINE, PYTHONPATH, offline HF), `.version` ("0.5.23"), `.base_flags` (the CPU flags every
  server gets, by ServerArgs field: device, attention_backend, cuda-graph off, mem_fraction_static,
  max_total_tokens 16384, context_length 4096, enable_metrics).
- `sglang_server` -> a factory `sglang_server(flags: dict | None = None) -> ServerProcess`. `flags` are ServerArgs
  fields added to (or, with value None, removed from) the base flags, e.g. `{"max_running_requests": 2}`. Calls
  with equal flags get the same running server (one start costs 25-80 s on 2 cores), restarted if it died. At most
  two servers run at once (each ~3.6 GB): asking for a third distinct flag set stops the least recently used one,
  so hold a server only within one test. All are stopped at session end.
  `ServerProcess`: `.base_url`, `.host`, `.port`, `.pid` (SGLang's launcher, leader of its own process group),
  `.flags`, `.argv`, `.log_path`, `.log_text()`, `.start_seconds` (launch to /health 200), `.alive()`, `.stop()`,
  and `.record_path`: the stand-in's record of `sgl_kernel` helpers looked up / called by this server.
- `sglang_server_new` -> a factory like `sglang_server` whose servers are never shared (a test may SIGTERM or
  SIGKILL one); stopped at session end if still alive.

Timings from this tier describe a shared 2-core CPU running a 2-layer random model: use them for relative and
functional checks only.

The files run in FILE_ORDER (pytest_collection_modifyitems below), not by name: test_vs_emulator.py needs a fresh
server (its first /metrics scrape is SGLang's state at start) and test_server.py ends by SIGTERMing its server, so
test_server.py comes after test_vs_emulator.py and checks the same server (the same flags) instead of starting its
own: one SGLang start (25-30 s) fewer. test_replay_on_sglang.py replays its traces on that server too, between them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servesweep.sglang.cpu import env as cpu_env
from servesweep.sglang.cpu import local_server

MAX_ALIVE = 2
FILE_ORDER = (
    "test_env.py", "test_stand_in.py", "test_matrix.py", "test_vs_emulator.py", "test_replay_on_sglang.py", "test_server.py",
)


def pytest_collection_modifyitems(items: list) -> None:
    """This tier's tests in FILE_ORDER (each file's own order kept; a file not listed after them), after any test
    collected from elsewhere in the same session."""
    here = Path(__file__).parent

    def key(item) -> int:
        path = Path(str(item.path))
        if path.parent != here:
            return -1
        return FILE_ORDER.index(path.name) if path.name in FILE_ORDER else len(FILE_ORDER)

    items.sort(key=key)  # stable


@dataclass(frozen=True)
class CpuEnv:
    python: Path
    model: Path
    stand_in: Path
    tokenizer_json: Path
    server_env: dict[str, str]
    version: str
    base_flags: dict[str, Any]


@pytest.fixture(scope="session")
def sglang_cpu_env() -> CpuEnv:
    try:
        python = cpu_env.ensure_installed()
        model = cpu_env.ensure_model()
    except cpu_env.InstallError as e:
        pytest.fail(f"the real-SGLang tier cannot run: {e}", pytrace=False)
    return CpuEnv(
        python=python, model=model, stand_in=cpu_env.STAND_IN_DIR, tokenizer_json=model / "tokenizer.json",
        server_env=local_server.server_env(), version=cpu_env.SGLANG_VERSION, base_flags=dict(local_server.BASE_FLAGS),
    )


class _Servers:
    def __init__(self, env: CpuEnv, folder: Path, shared: bool):
        self.env = env
        self.folder = folder
        self.shared = shared
        self.alive: OrderedDict[str, local_server.ServerProcess] = OrderedDict()
        self.all: list[local_server.ServerProcess] = []

    def __call__(self, flags: dict[str, Any] | None = None) -> local_server.ServerProcess:
        key = json.dumps(flags or {}, sort_keys=True, default=str)
        if self.shared and key in self.alive:
            srv = self.alive[key]
            if srv.alive():
                self.alive.move_to_end(key)
                return srv
            srv.stop()
            del self.alive[key]
        if self.shared:
            while len(self.alive) >= MAX_ALIVE:
                _, old = self.alive.popitem(last=False)
                old.stop()
        n = len(self.all)
        record = self.folder / f"server-{n}.sgl_kernel.txt"
        try:
            srv = local_server.start_server(
                flags, model=self.env.model, log_path=self.folder / f"server-{n}.log", record=record
            )
        except RuntimeError as e:
            pytest.fail(f"real SGLang did not start with flags {flags or {}}: {e}", pytrace=False)
        srv.record_path = record
        self.all.append(srv)
        if self.shared:
            self.alive[key] = srv
        return srv

    def close(self) -> None:
        for srv in self.all:
            srv.stop()


@pytest.fixture(scope="session")
def _sglang_logs(tmp_path_factory) -> Path:
    """Server logs and stand-in records, kept by pytest with its temp folders (the last three sessions)."""
    return tmp_path_factory.mktemp("sglang-cpu")


@pytest.fixture(scope="session")
def sglang_server(sglang_cpu_env, _sglang_logs):
    servers = _Servers(sglang_cpu_env, _sglang_logs, shared=True)
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def sglang_server_new(sglang_cpu_env, _sglang_logs):
    servers = _Servers(sglang_cpu_env, _sglang_logs, shared=False)
    yield servers
    servers.close()
