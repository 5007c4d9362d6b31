"""Network helpers: `free_port`, the one way servesweep picks a port nothing listens on (an emulator's, a CPU
SGLang server's, a packed lane's, a dry run's, a Locust master's). Imports nothing of servesweep: every layer may
use it.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` that was free a moment ago: the kernel picks one for a socket bound to port 0, which
    is closed again before this returns (the caller's server binds it next; another process may take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
