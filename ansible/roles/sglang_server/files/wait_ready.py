#!/usr/bin/env python3
"""Wait until a server's health path (/health) answers 200, bounded in time, failing at once if the server exits;
then read its info documents (SGLang: /model_info, /server_info and /v1/models; a generic server: what it is given).

Run on the server's host by the sglang_server role (one task instead of four keeps a restart quick). Stdlib only, with
its own wait: nothing of servesweep is installed there, so servesweep.target.http (the parent's one HTTP helper) is
out of reach.
Prints one JSON object: how long the liveness path (SGLang's /model_info, answers before warmup) and the health path
(ready) took, the documents by name under "info" and, with --log-lines N, the last N lines of the server's log under
"log" (its file, journal or container log), so the role needs no task of its own to bring the log back, and with
--facts the host's facts for the run manifest under "facts" (hostname, OS, kernel, CPUs, memory, GPUs from nvidia-smi
where it exists): stdlib reads of /etc and /proc instead of Ansible's setup module and a shell task (two module runs,
about 2 s of CPU per run's first start). The API key,
if any, comes from the environment (SERVESWEEP_API_KEY) or a 0600 file (--api-key-file), never from the command line,
and is replaced by "<redacted>" wherever it appears in what is printed: SGLang 0.5.23 shows its api_key in
/server_info and logs it among its server_args at start. --log-only prints only the log (after a crash, a failed start).
Exit 0 ready, 3 the server exited, 4 timed out, 5 a required info document failed (--info-required; without it a
failing document is recorded as {"error": ...}: a generic server's /v1/models may answer 500).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

API_KEY = os.environ.get("SERVESWEEP_API_KEY")
REDACTED = "<redacted>"
LOG_MAX_BYTES = 1 << 20  # the lines kept are the last ones; a chatty server's startup log stays bounded


def scrub(value, secret):
    """The value with every occurrence of the secret replaced, in every string of a JSON document."""
    if not secret:
        return value
    if isinstance(value, str):
        return value.replace(secret, REDACTED)
    if isinstance(value, list):
        return [scrub(v, secret) for v in value]
    if isinstance(value, dict):
        return {scrub(k, secret): scrub(v, secret) for k, v in value.items()}
    return value


def tail_lines(data, n, cut):
    """The last n whole lines of data (bytes), from its last LOG_MAX_BYTES only: when that cut a line in two (cut:
    data is the end of something longer), its first part is dropped, so no line comes back broken (a broken line
    could hold a fragment of the API key that the redaction does not recognise)."""
    if len(data) > LOG_MAX_BYTES:
        data, cut = data[-LOG_MAX_BYTES:], True
    if cut:
        _, sep, rest = data.partition(b"\n")
        data = rest if sep else b""
        if not data:
            return f"(the log's last line is longer than {LOG_MAX_BYTES} bytes: not brought back)\n"
    lines = data.splitlines(keepends=True)[-n:] if n > 0 else []
    return b"".join(lines).decode("utf-8", "replace")


def read_log(args):
    """The last --log-lines lines of the server's log: its file (process launcher), journal or container log."""
    n = args.log_lines
    if args.systemd_unit:
        cmd = ["journalctl", "-u", args.systemd_unit, "-n", str(n), "--no-pager"]
    elif args.docker_container:
        cmd = ["docker", "logs", "--tail", str(n), args.docker_container]
    else:
        try:
            with open(args.log_file, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - LOG_MAX_BYTES))
                return tail_lines(f.read(LOG_MAX_BYTES), n, size > LOG_MAX_BYTES)
        except OSError as e:
            return f"(no server log: {e})"
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no server log: {' '.join(cmd)}: {e})"
    return tail_lines(r.stdout + r.stderr, n, False)


def emit(out, args):
    if args.log_lines > 0:
        out["log"] = read_log(args)
    print(json.dumps(scrub(out, API_KEY)))


def os_release(path="/etc/os-release"):
    """'Debian GNU/Linux 12 (bookworm)': the PRETTY_NAME of os-release(5), or NAME VERSION_ID; '' where absent."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.strip().partition("=")
                if sep:
                    fields[key] = value.strip().strip('"').strip("'")
    except OSError:
        return ""
    return fields.get("PRETTY_NAME") or " ".join(v for v in (fields.get("NAME"), fields.get("VERSION_ID")) if v)


def memtotal_mb(path="/proc/meminfo"):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def gpu_lines():
    """nvidia-smi's name, memory and driver per GPU (one CSV line each); [] where it is absent or fails."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in r.stdout.splitlines() if line.strip()] if r.returncode == 0 else []


def host_facts():
    return {
        "hostname": socket.gethostname().split(".")[0],
        "os": os_release(),
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "memtotal_mb": memtotal_mb(),
        "gpus": gpu_lines(),
    }


def _request(url):
    key = API_KEY
    return urllib.request.Request(url, headers={"Authorization": "Bearer " + key} if key else {})


def get_json(url):
    with urllib.request.urlopen(_request(url), timeout=30) as r:
        return json.loads(r.read())


def status(url):
    try:
        with urllib.request.urlopen(_request(url), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return -1


def alive(args):
    if args.pid:
        try:
            os.kill(args.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # a zombie is dead for our purpose
        try:
            with open(f"/proc/{args.pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return True
    if args.systemd_unit:
        r = subprocess.run(["systemctl", "is-active", "--quiet", args.systemd_unit], check=False)
        return r.returncode == 0 or _activating(args.systemd_unit)
    if args.docker_container:
        r = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Running}}", args.docker_container],
            capture_output=True, text=True, check=False,
        )
        return r.stdout.strip() == "true"
    return True


def _activating(unit):
    r = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    return r.stdout.strip() in ("activating", "reloading")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--pid", type=int)
    p.add_argument("--systemd-unit")
    p.add_argument("--docker-container")
    p.add_argument("--health-path", default="/health")
    p.add_argument("--liveness-path", default="", help="answers before the server is ready (SGLang: /model_info)")
    p.add_argument("--info", action="append", default=[], metavar="NAME=PATH", help="a document to read once ready")
    p.add_argument("--info-required", action="store_true", help="a failing document fails the probe (exit 5)")
    p.add_argument("--api-key-file", help="the bare API key (the role's 0600 secret.key)")
    p.add_argument("--log-lines", type=int, default=0, help="bring back the last N lines of the server's log")
    p.add_argument("--log-file", default="server.log", help="the process launcher's log (relative to the cwd)")
    p.add_argument("--log-only", action="store_true", help="only read the log (no readiness wait)")
    p.add_argument("--facts", action="store_true", help="add the host's facts once ready (for the run manifest)")
    args = p.parse_args()
    if args.api_key_file:
        global API_KEY
        with open(args.api_key_file) as f:
            API_KEY = f.read().rstrip("\n")  # as the shell's "$(cat secret.key)" read it
    if args.log_only:
        emit({}, args)
        return 0
    info_paths = [tuple(x.split("=", 1)) for x in args.info]
    t0 = time.monotonic()
    out = {"liveness_after_s": None, "health_after_s": None, "polls": 0, "info": {}}
    while True:
        out["polls"] += 1
        if args.liveness_path and out["liveness_after_s"] is None and status(args.url + args.liveness_path) == 200:
            out["liveness_after_s"] = round(time.monotonic() - t0, 3)
        if status(args.url + args.health_path) == 200:
            out["health_after_s"] = round(time.monotonic() - t0, 3)
            for key, path in info_paths:
                try:
                    out["info"][key] = get_json(args.url + path)
                except (OSError, ValueError) as e:
                    if args.info_required:
                        out["error"] = f"{path} failed after {args.health_path} answered 200: {e}"
                        emit(out, args)
                        return 5
                    out["info"][key] = {"error": f"{path}: {e}"}
            if args.facts:
                out["facts"] = host_facts()
            emit(out, args)
            return 0
        if not alive(args):
            out["error"] = f"the server process exited before {args.health_path} answered 200"
            emit(out, args)
            return 3
        if time.monotonic() - t0 > args.timeout:
            out["error"] = f"{args.health_path} did not answer 200 within {args.timeout:g} s"
            emit(out, args)
            return 4
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
