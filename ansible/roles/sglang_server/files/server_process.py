#!/usr/bin/env python3
"""Find, stop and start the process launcher's server: one task of the sglang_server role instead of nine (each
module task costs about half a second of CPU; a matrix pays them at every restart).

The server is the process group servesweep started and recorded in <workdir>/server.pid (setsid made the pid the
group's id); it is never found by its command line. Stdlib only: nothing of servesweep is installed on the host.

  --state stopped: stop the recorded server if it is alive.
  --state started: keep the recorded server when it is alive and --restart is not given; otherwise stop it, check
                   that nothing else holds the port and start <workdir>/launch.sh in its own session.
Stop = SIGTERM to the group, wait until the port is free and, where nvidia-smi exists, until no process of the group
holds GPU memory (each bounded by --stop-timeout), SIGKILL whatever is left of the group, check the port is free,
remove the pidfile. --check reports what would be done and does nothing.
Prints one JSON object: changed, pid (the server's, "" when none), actions; exit 1 with "error" when a step failed.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_port_free(port, timeout):
    end = time.monotonic() + timeout
    while port_open(port):
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


def recorded_pid(pidfile):
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_on_gpus(pgid):
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                       capture_output=True, text=True, check=False, timeout=60)
    for word in r.stdout.split():
        try:
            if os.getpgid(int(word)) == pgid:
                return True
        except (OSError, ValueError):
            pass
    return False


def stop(pgid, a, actions):
    try:
        os.killpg(pgid, signal.SIGTERM)
        actions.append("sigterm")
    except OSError:
        pass
    wait_port_free(a.port, a.stop_timeout)  # a graceful stop that overruns ends in SIGKILL below
    if shutil.which("nvidia-smi"):
        end = time.monotonic() + a.stop_timeout
        while group_on_gpus(pgid) and time.monotonic() < end:
            time.sleep(2)
    if group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        actions.append("sigkill")
    if not wait_port_free(a.port, 15):
        raise Failure(f"port {a.port} is still held after the server's process group {pgid} was stopped")
    try:
        os.unlink(os.path.join(a.workdir, "server.pid"))
    except FileNotFoundError:
        pass
    actions.append("stopped")


def start(a, actions):
    if not wait_port_free(a.port, 5):
        raise Failure(
            f"port {a.port} on {a.host} is held by a process this role did not start (no live pidfile in "
            f"{a.workdir}); stop it or choose another port")
    # 0600: SGLang logs its server args at start, the API key among them (0.5.23 redacts only watermark keys)
    log_path = os.path.join(a.workdir, "server.log")
    if os.path.exists(log_path):
        os.chmod(log_path, 0o600)  # an older run's log, created with the default mode
    with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as log:
        # its own session (the pid is the group's id, what stop signals); SIGHUP ignored as under nohup
        p = subprocess.Popen(["nohup", "sh", os.path.join(a.workdir, "launch.sh")], cwd=a.workdir,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with open(os.path.join(a.workdir, "server.pid"), "w") as f:
        f.write(f"{p.pid}\n")
    actions.append("start")
    return p.pid


class Failure(Exception):
    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--state", choices=["started", "stopped"], required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="this host", help="for messages")
    p.add_argument("--stop-timeout", type=float, default=120)
    p.add_argument("--restart", action="store_true", help="restart a running server (changed launch, forced)")
    p.add_argument("--check", action="store_true")
    a = p.parse_args()
    pid = recorded_pid(os.path.join(a.workdir, "server.pid"))
    out = {"changed": False, "pid": str(pid or ""), "actions": []}
    keep = pid is not None and a.state == "started" and not a.restart
    try:
        if a.check:
            out["changed"] = not keep and (pid is not None or a.state == "started")
        elif not keep:
            if pid is not None:
                stop(pid, a, out["actions"])
                out["pid"] = ""
            if a.state == "started":
                out["pid"] = str(start(a, out["actions"]))
            out["changed"] = bool(out["actions"])
    except (Failure, OSError) as e:
        out["error"] = str(e)
        print(json.dumps(out))
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
