"""The emulator's step wake-ups (timerfd): on a real uvloop loop, never before the deadline, cancel and re-arm work."""

from __future__ import annotations

import asyncio
import time

import uvloop

from servesweep.sim.deadline import DeadlineTimer


def test_fires_at_or_after_the_deadline_never_before():
    async def scenario():
        loop = asyncio.get_running_loop()
        t = DeadlineTimer.create(loop)
        assert t is not None, "timerfd is available on Linux"
        late = []
        try:
            for _ in range(30):
                fired = loop.create_future()
                deadline = time.monotonic() + 0.002
                t.arm(deadline, lambda f=fired: f.set_result(time.monotonic()))
                late.append(await asyncio.wait_for(fired, 5) - deadline)
        finally:
            t.close()
        return late

    late = uvloop.run(scenario())
    assert min(late) >= 0, f"woke {-min(late) * 1e6:.1f} µs before its deadline"
    # a loaded 2-core machine can delay a wake-up, but not by a timer tick's worth in the typical case
    assert sorted(late)[len(late) // 2] < 0.05


def test_cancel_and_rearm():
    async def scenario():
        loop = asyncio.get_running_loop()
        t = DeadlineTimer.create(loop)
        calls: list[str] = []
        try:
            t.arm(time.monotonic() + 0.01, lambda: calls.append("cancelled"))
            t.cancel()
            t.arm(time.monotonic() + 0.2, lambda: calls.append("replaced"))
            t.arm(time.monotonic() + 0.02, lambda: calls.append("rearmed"))  # replaces the 0.2 s one
            await asyncio.sleep(0.4)
        finally:
            t.close()
        return calls

    assert uvloop.run(scenario()) == ["rearmed"]
