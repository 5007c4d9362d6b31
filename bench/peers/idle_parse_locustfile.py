"""EXPERIMENT for the proposed hot-path change (bench only; src/servesweep/client/user.py is not edited here).

servesweep's user parses a finished stream (`parse_stream`: one json.loads per SSE line) right after its last
chunk, on the same event loop that timestamps every other stream. In a closed loop many streams finish in the same
step, so the parses run back to back and every chunk arriving meanwhile is stamped late (seen: 0.4-1 s at 256
streams). The proposal: wait for `gevent.idle()` (libev idle watcher: runs only when no socket is ready) before
parsing. This file applies exactly that by wrapping `servesweep.client.user.parse_stream`, then loads the real locustfile.
"""

import gevent

import servesweep.client.user as _user

_parse = _user.parse_stream


def _parse_when_idle(lines, times, rec):
    gevent.idle()  # the request's own stamps are taken; let ready sockets be read first
    _parse(lines, times, rec)


_user.parse_stream = _parse_when_idle

from servesweep.client.locustfile import *  # noqa: E402, F403  (the real user class and event listeners)
from servesweep.client.locustfile import LLMUser  # noqa: E402, F401
