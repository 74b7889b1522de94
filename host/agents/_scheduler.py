"""Worker threads that run agents: per-worker run queues, work stealing, and compensation.

An agent is runnable when its mailbox has messages; it is placed on one worker's queue and runs
on one worker at a time (a batch of messages, then back in line). An idle worker takes from its
own queue first, then steals the oldest runnable agent from the busiest other queue. Wasm runs
with the GIL released, so CPU-bound agents really run in parallel.

A worker whose agent is blocked in an ``ask`` is not doing work: while it waits, the scheduler
may start a compensating worker (up to ``max_workers``) so that the agent being asked can run
even when every regular worker is waiting. Without this, N agents asking N others would
deadlock N workers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from mighty._errors import BadInput

__all__ = ["Runnable", "Scheduler", "WorkerStats"]

_log = logging.getLogger(__name__)


class _Local(threading.local):
    # Which scheduler the current thread works for (set on its workers only). A class-level
    # default: ``getattr(local, name, None)`` of a missing name raises and catches an
    # AttributeError inside (0.6 us on every ask from a thread that is not a worker).
    scheduler: Scheduler | None = None


_LOCAL = _Local()


class Runnable(Protocol):
    def run_batch(self) -> tuple[int, bool]:
        """Process some messages: (how many, whether the agent has more to do right away).

        Should not raise: a failure in a turn is the agent's to handle (the runtime makes it a
        crash). If it raises anyway, the worker logs it and goes on; the agent is dropped.
        """


@dataclass
class WorkerStats:
    """Counters of one worker."""

    name: str
    batches: int = 0
    messages: int = 0
    steals: int = 0
    queued: int = 0
    """Agents waiting on this worker's own queue."""
    current: str | None = None
    """The address of the agent it runs now, if any."""


class Scheduler:
    """A pool of worker threads running :class:`Runnable` agents."""

    def __init__(self, workers: int, *, max_workers: int | None = None) -> None:
        if workers < 1:
            raise BadInput("a scheduler needs at least one worker")
        self.workers = workers
        self.max_workers = max_workers if max_workers is not None else workers * 8
        self._lock = threading.Condition()
        self._queues: list[deque[Runnable]] = []
        self._stats: list[WorkerStats] = []
        self._current: list[Runnable | None] = []
        self._steals: dict[tuple[int, int], int] = {}
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._blocked = 0
        # Idle workers whose turn a calling thread took (see borrow): they stay idle.
        self._borrowed = 0
        self._stopping = False
        self._next = 0
        for _ in range(workers):
            self._add_worker()

    def _add_worker(self) -> None:
        index = len(self._queues)
        self._queues.append(deque())
        self._stats.append(WorkerStats(f"worker-{index}"))
        self._current.append(None)
        thread = threading.Thread(
            target=self._work, args=(index,), name=f"mighty-worker-{index}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def schedule(self, agent: Runnable) -> None:
        """Make ``agent`` runnable (callers ensure it is queued at most once)."""
        with self._lock:
            if self._stopping:
                return
            queue = self._queues[self._next % len(self._queues)]
            self._next += 1
            queue.append(agent)
            self._maybe_compensate()
            if self._idle:  # a worker waits: wake one (the others are busy, and will look)
                self._lock.notify()

    def _maybe_compensate(self) -> None:
        # The cheap tests first: most calls find no worker blocked.
        if (
            self._blocked > 0
            and self._idle == 0
            and len(self._threads) - self._blocked < self.workers
            and len(self._threads) < self.max_workers
            and any(self._queues)
        ):
            self._add_worker()

    def on_worker(self) -> bool:
        """Whether the calling thread is one of this scheduler's workers."""
        return _LOCAL.scheduler is self

    def borrow(self) -> bool:
        """Claim an idle worker's turn for the calling thread (not a worker): True when one
        was idle and nothing is queued, so that running an agent here keeps no queued agent
        waiting and keeps the agents running at once within the pool's size. Give it back
        with :meth:`give_back`."""
        # The condition's acquire and release are its lock's own (C); ``with`` would add two
        # Python frames to every ask run in place.
        lock = self._lock
        lock.acquire()
        try:
            if self._stopping or self._idle <= self._borrowed or any(self._queues):
                return False
            self._borrowed += 1
            return True
        finally:
            lock.release()

    def give_back(self) -> None:
        lock = self._lock
        lock.acquire()
        try:
            self._borrowed -= 1
        finally:
            lock.release()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Mark the current worker as waiting (in an ask) for the duration of the block."""
        with self._lock:
            self._blocked += 1
            self._maybe_compensate()
            self._lock.notify_all()
        try:
            yield
        finally:
            with self._lock:
                self._blocked -= 1

    def _take(self, index: int) -> Runnable | None:
        own = self._queues[index]
        if own:
            return own.popleft()
        victim = max(range(len(self._queues)), key=lambda i: len(self._queues[i]))
        if self._queues[victim]:
            self._stats[index].steals += 1
            pair = (victim, index)
            self._steals[pair] = self._steals.get(pair, 0) + 1
            return self._queues[victim].popleft()
        return None

    def _work(self, index: int) -> None:
        _LOCAL.scheduler = self
        while True:
            with self._lock:
                agent = self._take(index)
                while agent is None:
                    if self._stopping:
                        return
                    self._idle += 1
                    self._lock.wait(timeout=0.5)
                    self._idle -= 1
                    agent = self._take(index)
            self._current[index] = agent
            try:
                handled, again = agent.run_batch()
            except Exception:  # noqa: BLE001 -- a worker outlives any one agent's bug
                _log.exception("worker %d: a turn raised; the agent was dropped", index)
                continue
            finally:
                self._current[index] = None
            stats = self._stats[index]
            stats.batches += 1
            stats.messages += handled
            if again:
                with self._lock:
                    self._queues[index].append(agent)

    def stats(self) -> list[WorkerStats]:
        with self._lock:
            return [
                WorkerStats(
                    s.name,
                    s.batches,
                    s.messages,
                    s.steals,
                    len(queue),
                    getattr(current, "address", None) if current is not None else None,
                )
                for s, queue, current in zip(self._stats, self._queues, self._current, strict=True)
            ]

    def steals(self) -> dict[tuple[str, str], int]:
        """Steals so far by (source worker, stealing worker), for ``worker.steals_total``."""
        with self._lock:
            return {
                (self._stats[src].name, self._stats[dst].name): n
                for (src, dst), n in self._steals.items()
            }

    @property
    def threads(self) -> int:
        return len(self._threads)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking work; wait up to ``timeout`` seconds in all for current batches to end.

        Workers are daemon threads: one still running a guest at the deadline is left to
        finish on its own.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            self._stopping = True
            for queue in self._queues:
                queue.clear()
            self._lock.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


Callback = Callable[[], None]
