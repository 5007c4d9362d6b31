"""Print the state of the Locust workers in one folder as JSON and keep it in FOLDER/state.json (stdlib only;
the role runs it on the host as `python -c <this file> FOLDER`).

Per worker index I the launch script leaves I.pgid (its process group), I.pid (the Locust process), I.rc (its
exit status, when it ended by itself), I.stopped (when the role had to stop it), I.status.json (its counters).
"""

from __future__ import annotations

import json
import os
import socket
import sys


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _alive(pid: str | None) -> bool:
    if not pid or not pid.isdigit():
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def main(folder: str) -> None:
    workers = []
    names = os.listdir(folder) if os.path.isdir(folder) else []
    for idx in sorted((n[:-5] for n in names if n.endswith(".pgid")), key=lambda s: (len(s), s)):
        base = os.path.join(folder, idx)
        pid = _read(base + ".pid")
        rc = _read(base + ".rc")
        try:
            status = json.loads(_read(base + ".status.json") or "null")
        except ValueError:
            status = None
        workers.append(
            {
                "index": int(idx) if idx.isdigit() else idx,
                "pid": int(pid) if pid and pid.isdigit() else None,
                "pgid": int(_read(base + ".pgid") or 0) or None,
                "alive": _alive(pid),
                "exit_code": int(rc) if rc and rc.lstrip("-").isdigit() else None,
                "stopped_by_role": os.path.exists(base + ".stopped"),
                "status": status,
                "log": base + ".log",
            }
        )
    text = json.dumps({"hostname": socket.gethostname(), "folder": folder, "workers": workers})
    if os.path.isdir(folder):
        with open(os.path.join(folder, "state.json"), "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main(sys.argv[1])
