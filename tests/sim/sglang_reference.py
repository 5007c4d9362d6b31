"""SGLang's own OpenAI protocol code, run in a child process, as the reference for the emulator's conformance.

`SGLangReference(version)` installs `sglang==<version> --no-deps` plus the light packages its protocol module and
HTTP validation need (the `openai` release SGLang's wheel pins, pydantic, msgspec, orjson, FastAPI) into a cached
folder, then starts `python -I -S` on this file with that folder alone on `sys.path` (standard library + those
packages, nothing of the test's environment). SGLang's GPU stack is stubbed the way `scripts/sglang_flags.py`
stubs it (same finder), and `sglang/__init__.py` is not run.

In the child, SGLang's code runs:
- `sglang.srt.entrypoints.openai.protocol`: its pydantic request and response models (every body and chunk of the
  emulator is validated against them);
- its HTTP layer's request validation: a FastAPI app with SGLang's `validate_json_request` dependency and
  `validation_exception_handler`, both taken from its `entrypoints/http_server.py` source (AST) and executed as
  written, on the chat and completions routes typed with its request models. So status, body and message of a
  request SGLang rejects before its handler are SGLang's own.

One JSON object per line in, one out: `{"validate": <model name>, "data": obj}` -> `{"ok": bool, "error": str}`;
`{"http": path, "headers": {...}, "body": str}` -> `{"status": int, "body": str}` (a request that passes validation
answers 200 `{"validated": true}`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SERVESWEEP_SGLANG_CACHE", Path(tempfile.gettempdir()) / "servesweep-sglang"))
# the `openai` release each SGLang wheel pins (Requires-Dist: openai==...)
OPENAI_PIN = {"0.5.11": "2.6.1", "0.5.23": "2.8.0"}


def install(version: str) -> Path:
    """The target folder holding sglang==version (no deps) and the light packages, installed once and cached."""
    target = CACHE / f"protocol-{version}"
    stamp = target / ".complete"
    if stamp.exists():
        return target
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "--target",
        str(target),
    ]
    subprocess.run([*pip, "--no-deps", f"sglang=={version}"], check=True)
    light = [f"openai=={OPENAI_PIN[version]}", "pydantic", "msgspec", "orjson", "fastapi"]
    subprocess.run([*pip, "--upgrade", *light], check=True)
    stamp.write_text(version)
    return target


class SGLangReference:
    """The child process for one SGLang version."""

    def __init__(self, version: str):
        self.version = version
        target = install(version)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(target), str(REPO / "scripts")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"SGLang {version} protocol did not load: {ready!r}")

    def _ask(self, obj: dict) -> dict:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def validate(self, model: str, data) -> str | None:
        """None when `data` validates against SGLang's `model`, else pydantic's error text."""
        out = self._ask({"validate": model, "data": data})
        return None if out["ok"] else out["error"]

    def http(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        out = self._ask({"http": path, "headers": headers, "body": body.decode()})
        return out["status"], out["body"].encode()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


# ------------------------------------------------------------------------------------------------ the child process


class _NoXgrammar:
    """First on sys.meta_path: xgrammar is absent, not stubbed. protocol.py imports it in a try/except and falls
    back to `Any` (as on a machine without it); a stub class there would become a pydantic field type."""

    @staticmethod
    def find_spec(fullname, path, target=None):
        if fullname.split(".")[0] == "xgrammar":
            raise ModuleNotFoundError(f"No module named {fullname!r}")
        return None


def _load(target: str, scripts: str):
    import types

    sys.path[:0] = [target, scripts]
    import sglang_flags

    sys.meta_path.insert(0, _NoXgrammar())
    sys.meta_path.append(sglang_flags._StubFinder(sglang_flags._pinned_versions(target)))
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [os.path.join(target, "sglang")]
    sys.modules["sglang"] = pkg
    import logging
    import warnings

    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")
    from sglang.srt.entrypoints.openai import protocol

    return protocol, _validation_app(protocol, Path(target) / "sglang/srt/entrypoints/http_server.py")


def _validation_app(protocol, http_server: Path):
    """A FastAPI app with SGLang's own request-validation dependency and 400 handler on its OpenAI routes."""
    import ast
    from http import HTTPStatus

    from fastapi import Depends, FastAPI, Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import ORJSONResponse

    tree = ast.parse(http_server.read_text())
    handlers = {"validate_json_request", "validation_exception_handler"}
    routes = {
        "openai_v1_completions": "/v1/completions",
        "openai_v1_chat_completions": "/v1/chat/completions",
    }
    funcs = [n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)]
    keep = [f for f in funcs if f.name in handlers or f.name in routes]
    for f in keep:
        f.decorator_list = []
        if f.name in routes:  # the route as SGLang declares it (name, line, types); it answers before serving
            done = ast.parse('return {"validated": True}').body[0]
            f.body = [ast.copy_location(done, f.body[0])]
    ast.fix_missing_locations(tree)
    ns = {
        "Request": Request,
        "RequestValidationError": RequestValidationError,
        "ORJSONResponse": ORJSONResponse,
        "HTTPStatus": HTTPStatus,
        "ErrorResponse": protocol.ErrorResponse,
        "ChatCompletionRequest": protocol.ChatCompletionRequest,
        "CompletionRequest": protocol.CompletionRequest,
        "jsonable_encoder": jsonable_encoder,
    }
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(http_server), "exec"), ns)
    app = FastAPI()
    app.add_exception_handler(RequestValidationError, ns["validation_exception_handler"])
    for name, route in routes.items():
        app.post(route, dependencies=[Depends(ns["validate_json_request"])])(ns[name])
    return app


def _call(app, path: str, headers: dict, body: bytes) -> tuple[int, bytes]:
    """One HTTP request through the ASGI app, in process."""
    import asyncio

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    out = {"status": 0, "body": b""}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg):
        if msg["type"] == "http.response.start":
            out["status"] = msg["status"]
        elif msg["type"] == "http.response.body":
            out["body"] += msg.get("body", b"")

    asyncio.run(app(scope, receive, send))
    return out["status"], out["body"]


def _serve(target: str, scripts: str) -> None:
    protocol, app = _load(target, scripts)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "validate" in cmd:
            try:
                getattr(protocol, cmd["validate"]).model_validate(cmd["data"])
                out = {"ok": True}
            except Exception as e:  # pydantic's ValidationError, or a model SGLang does not have
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        else:
            status, body = _call(app, cmd["http"], cmd["headers"], cmd["body"].encode())
            out = {"status": status, "body": body.decode()}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2])
