"""Worker threads that run agents: per-worker run queues, work stealing, and compensation.

An agent is runnable when its mailbox has messages; it is placed on one worker's queue and runs
on one worker at a time (a batch of messages, then back in line). An idle worker takes from its
own queue first, then steals the oldest runnable agent from the busiest other queue. Wasm runs
with the GIL released, so CPU-bound agents really run in parallel.

A worker whose agent is blocked in an ``ask`` is not doing work: while it waits, the scheduler
may start a compensating worker (up to ``max_workers``) so that the agent being asked can run
even when every regular worker is waiting. Without this, N agents asking N others would
deadlock N workers.

Light work stays on one worker. Only the guest's own code runs without the GIL; the rest of a
message (the runtime, the codec, host functions) is Python. An agent whose messages do little
guest work (its runnable says ``light``: the runtime's measure is fuel and wall time per
message; one that waits, for I/O or a sleep, is not light) gains nothing from a second worker,
which only adds a GIL handoff at every guest call: with 100 such agents, two workers handled
14-18k messages/s where one handled 25k. So a light agent made
runnable behind others (a backlog) while another worker is running light work does not wake
an idle worker; that worker gets to it, oldest first across the queues (a parked worker's queue
included). One queued alone starts at once (an ask's round trip: the wait is what it costs).
One idle worker watches: when a running message has gone on for ``PATIENCE`` (a long host
call, a sleep, a guest that ran longer than it used to), it joins, so a queued agent waits at
most about that long for a stuck worker. A heavy or new agent (or any runnable that does not
say) wakes an idle worker at once, as before, and heavy work runs on every worker.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from mighty._errors import BadInput

__all__ = ["PATIENCE", "Runnable", "Scheduler", "WorkerStats"]

_log = logging.getLogger(__name__)


class _Local(threading.local):
    # Which scheduler the current thread works for, and as which worker (set on its workers
    # only). A class-level default: ``getattr(local, name, None)`` of a missing name raises
    # and catches an AttributeError inside (0.6 us on every ask from a thread that is not a
    # worker).
    scheduler: Scheduler | None = None
    index: int | None = None


_LOCAL = _Local()

PATIENCE = 0.02
"""Seconds a running light message goes on before an idle worker joins in (see above). Four
of CPython's GIL switch intervals (5 ms): a thread that holds the GIL (a sender's loop) keeps a
light message waiting for about one interval, which is not a stuck message."""
_IDLE_WAIT = 0.5


class Runnable(Protocol):
    def run_batch(self) -> tuple[int, bool]:
        """Process some messages: (how many, whether the agent has more to do right away).

        Should not raise: a failure in a turn is the agent's to handle (the runtime makes it a
        crash). If it raises anyway, the worker logs it and goes on; the agent is dropped.

        A runnable may also have a ``light`` attribute: True when its recent messages did
        little work outside the GIL, so that running it beside other light work on a second
        worker would not pay (see the module note). Without one it counts as heavy. And a
        ``started`` one: when its current message began (``time.monotonic``).
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


def _light(agent: Runnable | None) -> bool:
    return agent is not None and getattr(agent, "light", False) is True


def _began(agent: Runnable | None, since: float) -> float:
    """When the runnable's current message began (its ``started``, if it has one and it is
    within this batch), else when its batch did."""
    started = getattr(agent, "started", None)
    return started if isinstance(started, float) and started > since else since


class Scheduler:
    """A pool of worker threads running :class:`Runnable` agents."""

    def __init__(self, workers: int, *, max_workers: int | None = None) -> None:
        if workers < 1:
            raise BadInput("a scheduler needs at least one worker")
        self.workers = workers
        self.max_workers = max_workers if max_workers is not None else workers * 8
        self._lock = threading.Condition()
        # Each entry is (order of arrival, runnable): the oldest head across queues goes first.
        self._queues: list[deque[tuple[int, Runnable]]] = []
        self._order = itertools.count()
        self._stats: list[WorkerStats] = []
        self._current: list[Runnable | None] = []
        # When each worker's batch began (None: not in one), and whether it waits in an ask.
        # Written by the worker itself without the lock (one store each); read under it.
        self._since: list[float | None] = []
        self._asking: list[bool] = []
        self._steals: dict[tuple[int, int], int] = {}
        self._threads: list[threading.Thread] = []
        self._idle = 0
        # Idle workers that know work is queued and look again within PATIENCE.
        self._watching = 0
        # Heavy runnables queued (a held-back worker looks for them past the light ones).
        self._heavy = 0
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
        self._since.append(None)
        self._asking.append(False)
        thread = threading.Thread(
            target=self._work, args=(index,), name=f"mighty-worker-{index}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def schedule(self, agent: Runnable) -> None:
        """Make ``agent`` runnable (callers ensure it is queued at most once)."""
        # The condition's own acquire and release (C): ``with`` adds two Python frames.
        lock = self._lock
        lock.acquire()
        try:
            if self._stopping:
                return
            queue = self._queues[self._next % len(self._queues)]
            self._next += 1
            queue.append((next(self._order), agent))
            light = getattr(agent, "light", False) is True
            if not light:
                self._heavy += 1
            self._maybe_compensate()
            # A worker waits: wake one (the others are busy, and will look), unless the agent
            # is light, queued behind others, and a worker running light work will get to it
            # (one watcher is enough).
            if self._idle and (
                not light
                or self._watching == 0
                or self._backlog() == 1
                or self._helps(-1, time.monotonic())
            ):
                lock.notify()
        finally:
            lock.release()

    def _backlog(self) -> int:
        """Runnables queued (lock held)."""
        return sum(map(len, self._queues))

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

    def _helps(self, index: int, now: float) -> bool:
        """Whether worker ``index`` (-1: an idle one) taking light work now would pay (lock
        held): no other worker runs light work that is moving on (a light agent whose current
        message, or batch, began less than PATIENCE ago)."""
        current = self._current
        asking = self._asking
        for i, since in enumerate(self._since):
            if i == index or since is None or asking[i]:
                continue
            agent = current[i]
            if _light(agent) and now - _began(agent, since) < PATIENCE:
                return False
        return True

    def _patience(self, index: int, now: float) -> float:
        """How long a watcher sleeps before it looks again (lock held)."""
        started = [
            _began(self._current[i], since)
            for i, since in enumerate(self._since)
            if i != index and since is not None and not self._asking[i] and _light(self._current[i])
        ]
        if not started:
            return PATIENCE
        return min(PATIENCE, max(PATIENCE / 8, max(started) + PATIENCE - now))

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
        index = _LOCAL.index if self.on_worker() else None
        with self._lock:
            self._blocked += 1
            if index is not None:
                self._asking[index] = True
            self._maybe_compensate()
            self._lock.notify_all()
        try:
            yield
        finally:
            with self._lock:
                self._blocked -= 1
                if index is not None:
                    self._asking[index] = False

    def _take(self, index: int) -> Runnable | None:
        """The next runnable for worker ``index`` (lock held), or None: nothing queued, or
        only a backlog of light work that a running worker will get to (a light agent queued
        alone starts at once: no backlog, so the wait, not the GIL, is what it would cost).

        The oldest head among its own queue and the queues of workers not running a batch
        (parked, idle, asking), else the oldest of the busiest other queue (a steal). When
        that one is light and held back, the oldest heavy one of any queue.
        """
        queues = self._queues
        if not any(queues):
            return None
        since = self._since
        best = queues[index] if queues[index] else None
        victim = index
        for i, queue in enumerate(queues):
            if (
                i != index
                and queue
                and (since[i] is None or self._asking[i])
                and (best is None or queue[0][0] < best[0][0])
            ):
                best, victim = queue, i
        if best is None:
            victim = max(range(len(queues)), key=lambda i: len(queues[i]))
            best = queues[victim]
            if not best:
                return None
        agent = best[0][1]
        light = getattr(agent, "light", False) is True
        if light and self._backlog() > 1 and not self._helps(index, time.monotonic()):
            # Held back; but the oldest heavy agent queued anywhere may run here.
            return self._take_heavy(index) if self._heavy else None
        best.popleft()
        if not light:
            self._heavy -= 1
        if victim != index:
            self._stats[index].steals += 1
            pair = (victim, index)
            self._steals[pair] = self._steals.get(pair, 0) + 1
        return agent

    def _take_heavy(self, index: int) -> Runnable | None:
        """Take the oldest heavy runnable of any queue (lock held; ``_heavy`` > 0)."""
        found: tuple[int, int, int] | None = None  # (order, queue, position)
        for i, queue in enumerate(self._queues):
            for position, (order, agent) in enumerate(queue):
                if not _light(agent):
                    if found is None or order < found[0]:
                        found = (order, i, position)
                    break  # the oldest heavy one of this queue
        if found is None:
            self._heavy = 0  # a runnable's lightness changed while it was queued
            return None
        _, victim, position = found
        queue = self._queues[victim]
        agent = queue[position][1]
        del queue[position]
        self._heavy -= 1
        if victim != index:
            self._stats[index].steals += 1
            pair = (victim, index)
            self._steals[pair] = self._steals.get(pair, 0) + 1
        return agent

    def _work(self, index: int) -> None:
        _LOCAL.scheduler = self
        _LOCAL.index = index
        queues = self._queues
        lock = self._lock  # its own acquire and release (C), not ``with`` (two frames)
        again: Runnable | None = None
        while True:
            lock.acquire()
            try:
                if again is not None:
                    queues[index].append((next(self._order), again))
                    if not _light(again):
                        self._heavy += 1
                agent = self._take(index)
                if agent is None:
                    # Running until now (between batches it still counts as running its last
                    # agent, so that a watcher does not take that gap for a free worker).
                    self._since[index] = None
                    self._current[index] = None
                while agent is None:
                    if self._stopping:
                        return
                    self._idle += 1
                    if any(queues):
                        # Held back: light work that a running worker gets to. Look again.
                        self._watching += 1
                        lock.wait(self._patience(index, time.monotonic()))
                        self._watching -= 1
                    else:
                        lock.wait(_IDLE_WAIT)
                    self._idle -= 1
                    agent = self._take(index)
            finally:
                lock.release()
            # Outside the lock (a sender's schedule may wait for it): between batches both
            # still name the last agent, so a watcher sees this worker running all along.
            self._current[index] = agent
            self._since[index] = time.monotonic()
            again = None
            try:
                handled, more = agent.run_batch()
            except Exception:  # noqa: BLE001 -- a worker outlives any one agent's bug
                _log.exception("worker %d: a turn raised; the agent was dropped", index)
                continue
            stats = self._stats[index]
            stats.batches += 1
            stats.messages += handled
            if more:
                again = agent  # back in line (under the lock the next take holds)

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
            self._heavy = 0
            self._lock.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))


Callback = Callable[[], None]
