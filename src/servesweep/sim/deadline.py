"""Wake-ups at an exact `time.monotonic()` instant on an asyncio loop, through a Linux timerfd.

Loop timers are millisecond-grained (libuv rounds its poll timeout to whole milliseconds), so a step that must end
at t would wake up to ~1 ms early or late; waking early and spinning on `call_soon` until t costs a core's worth of
CPU for that stretch. A timerfd armed at the absolute instant (CLOCK_MONOTONIC, the clock of `time.monotonic()`)
makes its descriptor readable at t, to the microsecond, and the loop sleeps until then. `DeadlineTimer.create`
returns None where timerfd is not available (not Linux, no libc symbol); the engine then uses loop timers.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

CLOCK_MONOTONIC = 1
TFD_TIMER_ABSTIME = 1
PR_SET_TIMERSLACK = 29
TFD_NONBLOCK = os.O_NONBLOCK
TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.timerfd_settime.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    except (OSError, AttributeError):
        return None
    return libc


class DeadlineTimer:
    """One re-armable one-shot timer: `arm(t, callback)` runs callback() on the loop once time.monotonic() >= t."""

    __slots__ = ("loop", "fd", "_libc", "_spec", "_ref", "_cb", "_armed")

    def __init__(self, loop: asyncio.AbstractEventLoop, libc, fd: int):
        self.loop = loop
        self.fd = fd
        self._libc = libc
        self._spec = _Itimerspec()  # reused: arming allocates nothing
        self._ref = ctypes.byref(self._spec)
        self._cb: Callable[[], None] | None = None
        self._armed = False
        loop.add_reader(fd, self._ready)

    @classmethod
    def create(cls, loop: asyncio.AbstractEventLoop) -> DeadlineTimer | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            return None
        # The kernel may defer a timer of this thread by its timer slack (50 µs by default) to batch wake-ups;
        # the loop's thread asks for 1 ns (PR_SET_TIMERSLACK): its steps end when the engine says.
        libc.prctl(
            PR_SET_TIMERSLACK, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
        )
        try:
            return cls(loop, libc, fd)
        except (NotImplementedError, OSError):  # a loop without add_reader
            os.close(fd)
            return None

    def arm(self, when: float, callback: Callable[[], None]) -> None:
        """Run `callback` at monotonic time `when` (seconds); replaces any armed deadline."""
        ns = int(when * 1e9)
        if ns <= 0:
            ns = 1  # an all-zero it_value would disarm
        v = self._spec.it_value
        v.tv_sec, v.tv_nsec = divmod(ns, 1_000_000_000)
        if self._libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, self._ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")
        self._cb = callback
        self._armed = True

    def cancel(self) -> None:
        if self._armed:
            v = self._spec.it_value
            v.tv_sec = v.tv_nsec = 0
            self._libc.timerfd_settime(self.fd, 0, self._ref, None)
            self._armed = False
            self._cb = None

    def close(self) -> None:
        self.cancel()
        self.loop.remove_reader(self.fd)
        os.close(self.fd)

    def _ready(self) -> None:
        try:
            os.read(self.fd, 8)  # the expiration count; reading re-arms readiness
        except BlockingIOError:
            return  # cancelled or re-armed after it fired
        cb = self._cb
        if not self._armed or cb is None:
            return
        self._armed = False
        self._cb = None
        cb()
