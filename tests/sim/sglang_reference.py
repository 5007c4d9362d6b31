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

- its OpenAI serving classes (`OpenAIServingChat`, `OpenAIServingCompletion`) behind its own route functions (bodies
  as written), on a stub TokenizerManager whose `generate_request` yields given engine outputs
  (`_StubTokenizerManager`). The serving modules load with `_Fallback` first on `sys.meta_path`: an `sglang.*`
  module whose import raises here keeps what it defined before the error and is a stub for the rest.

One JSON object per line in, one out: `{"validate": <model name>, "data": obj}` -> `{"ok": bool, "error": str}`;
`{"http": path, "headers": {...}, "body": str}` -> `{"status": int, "body": str}` (a request that passes validation
answers 200 `{"validated": true}`); `{"serve": path, "body": obj, "outputs": [...], "reasoning_parser": ...,
"context_length": int}` -> `{"status", "content_type", "body"}` (or `{"crash": traceback}`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the `openai` release each SGLang wheel pins (Requires-Dist: openai==...)
OPENAI_PIN = {"0.5.11": "2.6.1", "0.5.23": "2.8.0"}
# what SGLang's OpenAI serving modules need for real on their import path (attrs: `managers/io_struct.py`)
SERVING_EXTRA = ["attrs"]
VERSIONS = tuple(OPENAI_PIN)


def cache_root() -> Path:
    """Where the suite keeps what it installs: `$SERVESWEEP_CACHE_DIR` (the Makefile points it at the project's
    `.cache/`; `make test-cold` at a new empty folder), else the project's `.cache/`. Never a fixed name under /tmp
    that two checkouts would share."""
    return Path(os.environ.get("SERVESWEEP_CACHE_DIR") or REPO / ".cache")


def _pins(version: str) -> list[str]:
    return [f"openai=={OPENAI_PIN[version]}", "pydantic", "msgspec", "orjson", "fastapi"]


def install(version: str) -> Path:
    """The folder holding sglang==version (no deps), the light packages its protocol and HTTP validation need and
    SERVING_EXTRA, installed once and cached (`make test` installs it before pytest starts).

    Race-free across pytest-xdist workers and checkouts: the first caller installs into a fresh temporary folder
    beside the target, under a file lock, and renames it into place when complete; the others wait on the lock and
    then find the finished folder. A folder is complete only when its `.complete` stamp holds what it was installed
    with, so a change of pins installs anew, and nobody ever sees a half-installed folder (the old race:
    `pip install --upgrade --target` of one worker replaced packages while another imported them)."""
    import fcntl
    import shutil

    want = json.dumps({"sglang": version, "light": _pins(version), "extra": SERVING_EXTRA})
    root = cache_root() / "sglang-protocol"
    target = root / f"protocol-{version}"
    stamp = target / ".complete"
    if stamp.is_file() and stamp.read_text() == want:
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"protocol-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this process dies
        if stamp.is_file() and stamp.read_text() == want:
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".protocol-{version}-", dir=root))
        try:
            pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target", str(tmp)]
            subprocess.run([*pip, "--no-deps", f"sglang=={version}"], check=True)
            subprocess.run([*pip, *_pins(version)], check=True)
            subprocess.run([*pip, "--no-deps", *SERVING_EXTRA], check=True)
            (tmp / ".complete").write_text(want)
            if target.exists():  # an older or unfinished install: nobody holds it, we hold the lock
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
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

    def serve(
        self,
        path: str,
        body: dict,
        outputs: list[dict],
        *,
        reasoning_parser: str | None = None,
        context_length: int = 4096,
    ) -> tuple[int, str, bytes]:
        """(status, content type, body) of SGLang's own route and OpenAI serving class for `body`, its engine
        replaced by a stub that yields `outputs` (see `_StubTokenizerManager`)."""
        out = self._ask({"serve": path, "body": body, "outputs": outputs, "reasoning_parser": reasoning_parser,
                         "context_length": context_length})  # fmt: skip
        if "crash" in out:
            raise RuntimeError(out["crash"])
        return out["status"], out["content_type"], out["body"].encode()

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


def _validation_app(protocol, http_server: Path, serve: bool = False):
    """A FastAPI app with SGLang's own request-validation dependency and 400 handler on its OpenAI routes; their
    bodies answer `{"validated": true}`, or with `serve` run as written (they call `app.state.openai_serving_*`)."""
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
        if f.decorator_list:  # a decorated function's code starts at its first decorator: keep that line
            f.lineno = f.decorator_list[0].lineno
        f.decorator_list = []
        if (
            f.name in routes and not serve
        ):  # the route as SGLang declares it (name, line, types); it answers before serving
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
    if serve:
        try:  # 0.5.23's routes answer through it; 0.5.11's return the model to FastAPI
            from sglang.srt.utils.json_response import model_json_response

            ns["model_json_response"] = model_json_response
        except ImportError:
            pass
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(http_server), "exec"), ns)
    app = FastAPI()
    app.add_exception_handler(RequestValidationError, ns["validation_exception_handler"])
    for name, route in routes.items():
        app.post(route, dependencies=[Depends(ns["validate_json_request"])])(ns[name])
    return app


def _call(app, path: str, headers: dict, body: bytes, out_headers: dict | None = None) -> tuple[int, bytes]:
    """One HTTP request through the ASGI app, in process (`out_headers`, when given, gets the response's)."""
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

    async def run():
        sent = (
            asyncio.Event()
        )  # a streaming response listens for the disconnect: it comes once the body is sent
        given = False

        async def receive():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            await sent.wait()
            return {"type": "http.disconnect"}

        async def send(msg):
            if msg["type"] == "http.response.start":
                out["status"] = msg["status"]
                if out_headers is not None:
                    out_headers.update((k.decode(), v.decode()) for k, v in msg.get("headers", []))
            elif msg["type"] == "http.response.body":
                out["body"] += msg.get("body", b"")
                if not msg.get("more_body"):
                    sent.set()

        await app(scope, receive, send)

    asyncio.run(run())
    return out["status"], out["body"]


# ------------------------------------------------------------------- the child: SGLang's OpenAI serving, stub engine


class _Fallback:
    """First on sys.meta_path while SGLang's serving modules load: an `sglang.*` module whose own code raises on
    import here (a GPU probe or a stubbed value at module level, e.g. `layers/attention/fla/utils.py`'s cuda
    assertion, `configs/deepseek_ocr.py`'s json.dumps of a stubbed value, `managers/io_struct.py`'s msgpack decoder
    typed with a stubbed class at its end) keeps what it defined before the failure and answers the rest as a stub.
    `failed` names each one and its error."""

    def __init__(self):
        self.failed: dict[str, str] = {}

    def find_spec(self, fullname, path, target=None):
        import importlib.machinery

        if not fullname.startswith("sglang."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _FallbackLoader(spec.loader, self.failed)
        return spec


class _FallbackLoader:
    def __init__(self, real, failed):
        self.real, self.failed = real, failed

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        import sglang_flags

        try:
            self.real.exec_module(module)
        except Exception as e:
            self.failed[module.__name__] = f"{type(e).__name__}: {e}"[:200]
            module.__class__ = sglang_flags._StubModule


class _Cfg:
    """A configuration bag: the values given, None for any other field (SGLang's defaults for what the serving
    path reads: no cache report, no default usage, no incremental output, no tool parser...)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _StubTokenizer:
    """What the serving classes' constructors probe (`encode("")`, `chat_template`); no chat template."""

    chat_template = None
    bos_token_id = None
    eos_token_id = None
    # 0.5.23 takes a logprob's `bytes` from the token id through the GPT-2 byte decoder when the tokenizer is
    # byte-level (Qwen's is), else from the token text's UTF-8; for whole-character tokens both are the same bytes
    is_byte_level = False

    def encode(self, text, **kw):
        return [1] * len(str(text).split())

    def decode(self, ids, **kw):
        return " ".join("w" for _ in ids)


class _StubTokenizerManager:
    """SGLang's TokenizerManager as the OpenAI serving classes use it, its engine replaced by a list of outputs.

    `generate_request` yields what `managers/tokenizer_manager.py::_handle_batch_output` + `_wait_one_response`
    (+ `_handle_batch_request` for n > 1) yield for a text request without incremental streaming output: per engine
    output, `{"text": <the index's text so far>, "output_ids": [...], "meta_info": {"id", "finish_reason",
    "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens", "completion_tokens", "cached_tokens"}}`
    plus `"index"` when n > 1, plus, for an output given `"logprobs"` (triples) and `"top"` (rows of triples), the
    index's `output_token_logprobs` (+ `_length`) and `output_top_logprobs` so far; finish_reason `{"type": "length", "length": n}` / `{"type": "stop", "matched": id}` on
    an index's last output. A request that does not stream gets the final output (a list of them, in index order,
    when n > 1)."""

    def __init__(self, cfg):
        self.server_args = cfg
        self.served_model_name = cfg.served_model_name
        self.model_path = cfg.model_path
        self.tokenizer = _StubTokenizer()
        self.model_config = _Cfg(
            is_multimodal=False,
            hf_config=_Cfg(model_type="qwen3_5", architectures=["Qwen3_5ForConditionalGeneration"]),
            get_default_sampling_params=lambda: {},
        )
        self.request_logger = _Cfg(log_requests=False, log_requests_level=0)
        self.outputs: list[dict] = []
        self.n = 1

    def config_value(self, name):
        return getattr(self.server_args, name)

    def create_abort_task(self, obj):
        return None

    def _dicts(self):
        text: dict[int, str] = {}
        lp: dict[int, list] = {}
        top: dict[int, list] = {}
        for o in self.outputs:
            i = o.get("index", 0)
            text[i] = text.get(i, "") + o["text"]
            meta = {
                "id": o["id"],
                "finish_reason": o.get("finish"),
                "prompt_tokens": o["prompt_tokens"],
                "weight_version": "default",
                "num_retractions": 0,
                "reasoning_tokens": o.get("reasoning_tokens", 0),
                "completion_tokens": o["completion_tokens"],
                "cached_tokens": o.get("cached_tokens", 0),
            }
            if "logprobs" in o:  # add_logprob_to_meta_info: the index's (logprob, id, text) triples so far
                lp.setdefault(i, []).extend(tuple(x) for x in o["logprobs"])
                meta["input_token_logprobs"] = []
                meta["output_token_logprobs"] = list(lp[i])
                meta["output_token_logprobs_length"] = len(lp[i])
                if "top" in o:  # only with top_logprobs_num > 0
                    top.setdefault(i, []).extend([tuple(x) for x in row] for row in o["top"])
                    meta["output_top_logprobs"] = list(top[i])
            d = {"text": text[i], "output_ids": [0] * o["completion_tokens"], "meta_info": meta}
            if self.n > 1:
                d["index"] = i
            yield d

    async def generate_request(self, obj, request=None):
        outs = list(self._dicts())
        if getattr(obj, "stream", False):
            for d in outs:
                yield d
            return
        last = {}
        for d in outs:
            last[d.get("index", 0)] = d
        yield last[0] if self.n == 1 else [last[i] for i in sorted(last)]


def _serving(target: str, protocol, reasoning_parser, context_length):
    """SGLang's OpenAIServingChat / OpenAIServingCompletion on the stub tokenizer manager, behind SGLang's own
    route functions (`openai_v1_chat_completions`, `openai_v1_completions`, bodies as written in http_server.py)."""
    import importlib

    sys.meta_path.insert(0, _Fallback())
    from sglang.srt.entrypoints.openai import serving_base, serving_chat, serving_completions

    cfg = _Cfg(
        stream_response_default_include_usage=False,
        enable_cache_report=False,
        incremental_streaming_output=False,
        allow_auto_truncate=False,
        context_length=context_length,
        reasoning_parser=reasoning_parser,
        weight_version="default",
        served_model_name="Qwen/Qwen3.6-27B",
        model_path="Qwen/Qwen3.6-27B",
    )
    # 0.5.20+ read the resolved configuration through runtime_context's accessors; ≤0.5.12 through server_args
    for name in ("sglang.srt.runtime_context", *(m.__name__ for m in (serving_base, serving_chat, serving_completions)),
                 "sglang.srt.entrypoints.openai.utils", "sglang.srt.entrypoints.openai.usage_processor"):  # fmt: skip
        try:
            mod = importlib.import_module(name)
        except ImportError:  # runtime_context is 0.5.20+
            continue
        for acc in ("get_serving", "get_model", "get_observability"):
            if hasattr(mod, acc):
                setattr(mod, acc, lambda: cfg)
    tm = _StubTokenizerManager(cfg)
    templates = _Cfg()
    chat = serving_chat.OpenAIServingChat(tm, templates)
    completion = serving_completions.OpenAIServingCompletion(tm, templates)
    GenerateReqInput = serving_base.GenerateReqInput

    def convert(request, raw_request=None):
        return GenerateReqInput(text="", stream=bool(request.stream)), request

    chat._convert_to_internal_request = convert
    completion._convert_to_internal_request = convert
    app = _validation_app(protocol, Path(target) / "sglang/srt/entrypoints/http_server.py", serve=True)
    app.state.openai_serving_chat = chat
    app.state.openai_serving_completion = completion
    return app, tm


def _serve(target: str, scripts: str) -> None:
    protocol, app = _load(target, scripts)
    servings: dict = {}
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "validate" in cmd:
            try:
                getattr(protocol, cmd["validate"]).model_validate(cmd["data"])
                out = {"ok": True}
            except Exception as e:  # pydantic's ValidationError, or a model SGLang does not have
                out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        elif "serve" in cmd:
            try:
                key = (cmd["reasoning_parser"], cmd["context_length"])
                if key not in servings:
                    servings[key] = _serving(target, protocol, *key)
                sapp, tm = servings[key]
                tm.outputs, tm.n = cmd["outputs"], cmd["body"].get("n", 1)
                hdrs: dict = {}
                raw = json.dumps(cmd["body"]).encode()
                status, body = _call(sapp, cmd["serve"], {"content-type": "application/json"}, raw, hdrs)
                out = {"status": status, "content_type": hdrs.get("content-type"), "body": body.decode()}
            except Exception:  # the test shows SGLang's traceback
                import traceback

                out = {"crash": traceback.format_exc()}
        else:
            status, body = _call(app, cmd["http"], cmd["headers"], cmd["body"].encode())
            out = {"status": status, "body": body.decode()}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--install"]:  # `make test`, before pytest starts: every version the tests use
        for v in sys.argv[2:] or VERSIONS:
            print(f"SGLang {v} protocol reference: {install(v)}")
    else:
        _serve(sys.argv[1], sys.argv[2])
