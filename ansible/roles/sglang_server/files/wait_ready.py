#!/usr/bin/env python3
"""Wait until an SGLang server's /health answers 200, bounded in time, failing at once if the server exits; then
read /model_info, /server_info and /v1/models.

Run on the server's host by the sglang_server role (stdlib only; one task instead of four keeps a restart quick).
Prints one JSON object: how long /model_info (liveness, answers before warmup) and /health (ready) took, and the
three documents. The API key, if any, comes from the environment (SERVESWEEP_API_KEY), never from the command line.
Exit 0 ready, 3 the server exited, 4 timed out, 5 an info endpoint failed.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request


def _request(url):
    key = os.environ.get("SERVESWEEP_API_KEY")
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
    args = p.parse_args()
    t0 = time.monotonic()
    out = {"model_info_after_s": None, "health_after_s": None, "polls": 0}
    while True:
        out["polls"] += 1
        if out["model_info_after_s"] is None and status(args.url + "/model_info") == 200:
            out["model_info_after_s"] = round(time.monotonic() - t0, 3)
        if status(args.url + "/health") == 200:
            out["health_after_s"] = round(time.monotonic() - t0, 3)
            try:
                for key, path in (("model_info", "/model_info"), ("server_info", "/server_info"), ("models", "/v1/models")):
                    out[key] = get_json(args.url + path)
            except (OSError, ValueError) as e:
                out["error"] = f"{path} failed after /health answered 200: {e}"
                print(json.dumps(out))
                return 5
            print(json.dumps(out))
            return 0
        if not alive(args):
            out["error"] = "the server process exited before /health answered 200"
            print(json.dumps(out))
            return 3
        if time.monotonic() - t0 > args.timeout:
            out["error"] = f"/health did not answer 200 within {args.timeout:g} s"
            print(json.dumps(out))
            return 4
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
