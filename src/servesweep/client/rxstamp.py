"""Kernel receive timestamps for the stream reader: when the bytes reached this host, not when Python got to them.

One Locust process drains its sockets one after another, so with 100 streams a reader reaches the last socket of a
burst milliseconds after its bytes arrived; a `time.monotonic_ns()` taken after the read carries that delay. Linux
stamps every received packet; with `SO_TIMESTAMPNS` on, `recvmsg` returns the stamp of the last segment the read
consumed as an `SCM_TIMESTAMPNS` control message (a `struct timespec` on CLOCK_REALTIME). Caveat: segments that
queue on one socket before a read are coalesced and the read carries the LATEST one's stamp, so two chunks of one
stream found by one late read both get the second's time (never later than a user-space stamp would be).

`stamp_socket` swaps a pooled gevent socket's class for a subclass whose `recv` (the only call geventhttpclient's
response reader makes) reads with `recvmsg` and leaves the stamp, on the monotonic clock, in an `RxClock`. Each
Locust user has its own clock and its own connection pool with one stream at a time, so no two reads share a clock.
Where kernel stamps are not to be had (not Linux, TLS sockets) the subclass stamps in user space after the read,
and the clock says so.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

from greenlet import getcurrent  # gevent's own greenlets; importing it patches nothing

# Python 3.11's socket module does not export SO_TIMESTAMPNS; on Linux it is 35 (x86, arm, riscv: every
# architecture but alpha, mips, parisc, sparc). The control message type equals the option.
_LINUX = sys.platform.startswith("linux")
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if _LINUX else None)
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # one struct timespec
_TIMESPEC = struct.Struct("@ll")  # time_t, long: 16 bytes on 64-bit Linux


def _keep_stamping_on() -> socket.socket | None:
    """Linux stamps packets only while some socket wants stamps, and the first such socket switches stamping on
    through a deferred kernel work item: a response arriving right after a process's first setsockopt may carry
    no stamp (seen: a Locust process's first requests fell back to 'user'). One idle UDP socket with the option,
    opened at import (Locust start-up, long before the first request) and held for the process's life, keeps it on."""
    if SO_TIMESTAMPNS is None:
        return None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return s
    except OSError:
        return None


_KEEPER = _keep_stamping_on()


class RxClock:
    """Where one user's socket reads leave their stamps. `ns` is the monotonic time of the last read (the kernel's
    arrival stamp when there is one); `lag_ns` the largest (read time − arrival) since `reset`; `user_reads` the
    reads since `reset` that carried data but no kernel stamp."""

    __slots__ = ("ns", "lag_ns", "user_reads", "drained", "_classes", "_timers")

    def __init__(self) -> None:
        self.ns = 0
        self.lag_ns = 0
        self.user_reads = 0
        self.drained = True  # the last read returned less than it asked for: wait before the next one
        # socket class -> its stamping subclass, built at run time (class attributes _rx_clock, _rx_kernel)
        self._classes: dict[type, Any] = {}
        self._timers: dict[float, Any] = {}  # socket timeout (s) -> gevent loop timer (repeat = timeout)

    def wait_readable(self, sock, timeout: float | None) -> None:
        """Block this greenlet until `sock` (a gevent socket) is readable; TimeoutError after `timeout` seconds
        (None: no limit).

        gevent's own wait builds, starts and closes a `gevent.Timeout` object per wait (~6 % of the reader's CPU at
        256 streams, py-spy); a user waits once per chunk with one of two timeouts (first token, stall), so it keeps
        one loop timer per timeout value and re-arms it for each wait.

        Re-armed with `again()` on a timer whose `repeat` is the timeout, never with `start()`: libev's
        `ev_timer_stop` keeps a stopped timer's *remaining* time and `ev_timer_start` counts down from it, so a
        restarted timer gives each wait only what the earlier waits left over (after ~2 minutes of streaming
        every wait of a 120 s stall timer would "time out" at once). `ev_timer_again` on a stopped timer sets
        it to `repeat` from now (after `update=True` refreshes the loop's clock); libuv's `again` on a stopped timer
        is a plain `uv_timer_start(after)`. Either way: the full timeout from the start of THIS wait. The repeat
        never fires twice: the wait stops the timer as soon as it ends, by data or by the timeout."""
        if timeout is None:
            sock.hub.wait(sock._read_event)
            return
        timer = self._timers.get(timeout)
        if timer is None:
            timer = self._timers[timeout] = sock.hub.loop.timer(timeout, timeout)
        timer.again(_time_out, getcurrent(), update=True)
        try:
            sock.hub.wait(sock._read_event)
        finally:
            timer.stop()

    def reset(self) -> None:
        """Call before each request: the request's reads start here."""
        self.ns = 0
        self.lag_ns = 0
        self.user_reads = 0
        self.drained = True  # a request was just sent: its answer is not there yet

    def rx_clock(self) -> str | None:
        """'kernel' when every data read of the request carried a kernel stamp, 'user' when any did not, None when
        nothing was read."""
        if not self.ns:
            return None
        return "user" if self.user_reads else "kernel"

    def read_lag_ns(self) -> int | None:
        """How long the request's bytes waited in the kernel before the client read them (max over its reads);
        None unless every read was kernel-stamped."""
        return self.lag_ns if self.ns and not self.user_reads else None


def kernel_stamps_supported(sock: socket.socket) -> bool:
    """Whether `sock` can deliver kernel receive stamps: Linux, a plain (not TLS) socket with `recvmsg`."""
    return (
        SO_TIMESTAMPNS is not None
        and _ANC_SIZE > 0
        and hasattr(sock, "recvmsg")
        # an SSL socket refuses recvmsg (and the kernel's bytes are ciphertext)
        and not hasattr(sock, "getpeercert")
    )


def stamp_socket(sock: socket.socket, clock: RxClock) -> bool:
    """Make every `recv` on `sock` stamp `clock`. Idempotent (pooled sockets come back); returns True when the
    stamps come from the kernel."""
    base: Any = type(sock)  # one of ours carries _rx_clock and _rx_kernel
    if getattr(base, "_rx_clock", None) is clock:  # already ours (the pool handed it out before)
        return base._rx_kernel
    cls = clock._classes.get(base)
    if cls is None:
        kernel = kernel_stamps_supported(sock)
        cls = _kernel_class(base, clock) if kernel else _user_class(base, clock)
        clock._classes[base] = cls
    if cls._rx_kernel:
        assert SO_TIMESTAMPNS is not None  # kernel_stamps_supported
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            cls = _user_class(base, clock)  # rare (a sandbox refusing the option): stamp in user space
    sock.__class__ = cls  # same layout (no new slots), so only the methods change
    return cls._rx_kernel


def _kernel_class(base: type[socket.socket], clock: RxClock) -> Any:
    mono = time.monotonic_ns
    wall = time.time_ns
    unpack = _TIMESPEC.unpack_from
    anc_size = _ANC_SIZE
    scm = SO_TIMESTAMPNS
    gevent_socket = hasattr(base, "_wait") and hasattr(base, "_read_event")  # the Locust user's
    recvmsg = socket.socket.recvmsg  # a blocking stdlib socket (tests, tools)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if gevent_socket:
            # gevent's recv loop, inlined (one Python frame per read): a non-blocking read of the OS socket; on
            # EAGAIN wait on the hub, with the socket's timeout, and retry. One change, libuv's rule: after a read
            # that returned less than it asked for (the socket was drained), wait for readiness BEFORE reading;
            # at one chunk per read that saves a failing recvmsg and its exception (~2 µs) per chunk.
            timeout = self.timeout
            wait = clock.drained and timeout != 0.0
            while True:
                if wait:
                    clock.wait_readable(self, timeout)
                try:
                    data, anc, _flags, _addr = self._sock.recvmsg(bufsize, anc_size, flags)
                    break
                except BlockingIOError:
                    if timeout == 0.0:
                        raise
                    wait = True
            clock.drained = len(data) < bufsize
        else:
            data, anc, _flags, _addr = recvmsg(self, bufsize, anc_size, flags)
        for _level, kind, payload in anc:
            if kind == scm:
                sec, nsec = unpack(payload)
                # CLOCK_REALTIME → CLOCK_MONOTONIC with the offset of this very moment: an NTP step or slew
                # between reads cannot leak into the stamps (two vDSO calls, ~130 ns). The wall clock is read
                # FIRST: a preemption between the two calls then makes the offset smaller and the stamp later,
                # never earlier than the arrival (read the other way round, a descheduled reader stamped bytes
                # before the server wrote them).
                w = wall()
                u = mono()
                k = sec * 1_000_000_000 + nsec - (w - u)
                clock.ns = k
                if u - k > clock.lag_ns:
                    clock.lag_ns = u - k
                return data
        clock.ns = mono()
        if data:
            clock.user_reads += 1
        return data

    return type(
        base.__name__, (base,), {"__slots__": (), "recv": recv, "_rx_clock": clock, "_rx_kernel": True}
    )


def _user_class(base: type[socket.socket], clock: RxClock) -> Any:
    base_recv = base.recv
    mono = time.monotonic_ns

    def recv(self, *args) -> bytes:
        data = base_recv(self, *args)
        clock.ns = mono()
        if data:
            clock.user_reads += 1
        return data

    return type(
        base.__name__, (base,), {"__slots__": (), "recv": recv, "_rx_clock": clock, "_rx_kernel": False}
    )


def _time_out(greenlet) -> None:
    """A read wait's timer fired: raise in the waiting greenlet what gevent's socket raises (a fresh exception, so
    no traceback of an earlier timeout rides along)."""
    greenlet.throw(TimeoutError("timed out"))


def idle_socket_alive(sock) -> bool:
    """geventhttpclient's check of a pooled keep-alive socket before reuse (closed, or readable while idle: a FIN or
    stray bytes), without a yield: gevent's `select.select(..., 0)` switches to the hub, so the user that just
    stamped `sent_ns` would write its request only after every other runnable user had its turn (measured: 6-17 ms
    at 10 streams, from a packet capture)."""
    if sock is None:
        return False
    try:
        if sock.fileno() < 0:
            return False
        return not _select([sock], [], [], 0.0)[0]
    except (OSError, ValueError):
        return False


def _original_select():
    """The blocking-module `select.select`, even in a process gevent has patched (no gevent import here: the test
    process must stay unpatched)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None:
        return monkey.get_original("select", "select")
    import select  # not patched yet: this function object stays the original after patching

    return select.select


_select = _original_select()
