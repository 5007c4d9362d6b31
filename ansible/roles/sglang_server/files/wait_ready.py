#!/usr/bin/env python3
"""Wait until a server's health path (/health) answers 200, bounded in time, failing at once if the server exits;
then read its info documents (SGLang: /model_info, /server_info and /v1/models; a generic server: what it is given).

Run on the server's host by the sglang_server role (one task instead of four keeps a restart quick). Stdlib only, with
its own wait: nothing of servesweep is installed there, so servesweep.target.http (the parent's one HTTP helper) is
out of reach.
Prints one JSON object: how long the liveness path (SGLang's /model_info, answers before warmup) and the health path
(ready) took, and the documents by name under "info". The API key, if any, comes from the environment
(SERVESWEEP_API_KEY) or a 0600 file (--api-key-file), never from the command line.
Exit 0 ready, 3 the server exited, 4 timed out, 5 a required info document failed (--info-required; without it a
failing document is recorded as {"error": ...}: a generic server's /v1/models may answer 500).
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

API_KEY = os.environ.get("SERVESWEEP_API_KEY")


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
    args = p.parse_args()
    if args.api_key_file:
        global API_KEY
        with open(args.api_key_file) as f:
            API_KEY = f.read().rstrip("\n")  # as the shell's "$(cat secret.key)" read it
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
                        print(json.dumps(out))
                        return 5
                    out["info"][key] = {"error": f"{path}: {e}"}
            print(json.dumps(out))
            return 0
        if not alive(args):
            out["error"] = f"the server process exited before {args.health_path} answered 200"
            print(json.dumps(out))
            return 3
        if time.monotonic() - t0 > args.timeout:
            out["error"] = f"{args.health_path} did not answer 200 within {args.timeout:g} s"
            print(json.dumps(out))
            return 4
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
