"""Small bridges between the node's asyncio loop and the threads that wait on it.

Rejected: ``asyncio.run_coroutine_threadsafe`` for replies and outgoing requests (it wraps the
coroutine in a task whose first step waits one loop iteration, and in a second future).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

__all__ = ["eager", "settle"]

_log = logging.getLogger(__name__)
T = TypeVar("T")


def settle(future: Future[T], value: T | None = None, error: BaseException | None = None) -> None:
    """Set ``future``'s result (or ``error``) unless it is already settled (cancelled)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]
    except InvalidStateError:
        pass


def eager(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on ``loop``'s thread now, up to its first suspension; a task for the rest.

    A reply's publish never suspends unless the client's buffer is full, so this saves the
    loop iteration a task's first step waits for (Python 3.12's eager tasks, on 3.11).
    """
    try:
        waiting = coro.send(None)
    except StopIteration:
        return
    except Exception:  # noqa: BLE001 -- as a task's exception: logged, never raised here
        _log.exception("cluster: a reply coroutine failed")
        return
    loop.create_task(_resume(coro, waiting))


async def _resume(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """Drive ``coro`` on from a suspension at ``waiting`` (a future, or None for a bare yield).

    Cancelled (the node leaves), it closes ``coro`` at once: its ``except``/``finally`` blocks
    run now, settling what it promised, not whenever the coroutine is collected.
    """
    try:
        while True:
            if waiting is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait([waiting])
            try:
                waiting = coro.send(None)
            except StopIteration:
                return
    except BaseException:
        coro.close()
        raise
