"""Long polls of a waiting reservation: the handler awaits a future that the engine's granter
resolves when the request leaves its line, so a poll holds no thread while it waits."""

from __future__ import annotations

import asyncio
import contextlib

from starlette.concurrency import run_in_threadpool

from quota_ledger.engine import QuotaEngine
from quota_ledger.model.values import Reservation

#: the longest long poll, seconds
MAX_WAIT = 60.0


async def until_it_leaves(engine: QuotaEngine, current: Reservation, wait: float) -> Reservation:
    """``current`` (waiting) once it leaves its line, or as it is when ``wait`` seconds ran out."""
    loop = asyncio.get_running_loop()
    left: asyncio.Future[Reservation] = loop.create_future()

    def done(reservation: Reservation) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, left, reservation)

    stop = engine.granter.watch(current.id, current.partition, done)
    try:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(left, timeout=wait)
    finally:
        stop()
    return await run_in_threadpool(engine.get, current.id)


def _settle(future: asyncio.Future[Reservation], reservation: Reservation) -> None:
    if not future.done():
        future.set_result(reservation)
