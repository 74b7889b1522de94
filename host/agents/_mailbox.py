"""The mailbox of one agent: a bounded, thread-safe FIFO of envelopes.

One queue per agent, so messages leave in the order they arrived. That gives Erlang's guarantee
(order is kept per sender) and a little more: the order is kept across senders too. Everything
accepted is delivered exactly once by ``get`` unless ``drain`` takes it, and ``drain`` returns it.

What happens when the mailbox is full is a policy chosen at construction:
``"block"`` waits for space up to a timeout and then raises ``MailboxFull``; ``"drop"`` refuses the
envelope, counts it, and returns False; ``"fail"`` raises ``MailboxFull`` at once.

``pause`` holds consumers back while a hot swap replaces the agent's code; producers keep
sending (within capacity), so nothing sent during the swap is lost. A ``hold`` (a check given by
the layer above, read each time an envelope could be handed out) holds consumers back the same
way without a call at the moment it starts: a cluster node's lease that has gone stale holds
every agent of the node from that instant, whether or not a thread noticed (mighty.cluster's
fence). Whoever lifts it calls ``poke`` so that consumers waiting look again.

The mailbox errors are ``HostError``: the guest did nothing wrong when its mailbox fills up or
closes; the host could not deliver or fetch.

Rejected designs: ``queue.Queue`` (no close, no pause, no drain that leaves the waiting threads
in a defined state); one lock plus polling (busy waiting, and timeouts that depend on the poll
interval).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

from mighty._errors import BadInput, HostError

__all__ = [
    "Mailbox",
    "MailboxClosed",
    "MailboxEmpty",
    "MailboxError",
    "MailboxFull",
    "OnFull",
]

T = TypeVar("T")

OnFull = Literal["block", "drop", "fail"]
"""What ``Mailbox.put`` does when the mailbox is full."""

_POLICIES: tuple[OnFull, ...] = ("block", "drop", "fail")


class MailboxError(HostError):
    """A mailbox could not take or give an envelope."""

    kind = "mailbox_error"


class MailboxFull(MailboxError):
    """The mailbox is at capacity and its policy refused the envelope."""

    kind = "mailbox_full"

    def __init__(self, message: str, *, capacity: int) -> None:
        super().__init__(message)
        self.capacity = capacity


class MailboxEmpty(MailboxError):
    """Nothing arrived (or the mailbox stayed paused) before the timeout."""

    kind = "mailbox_empty"


class MailboxClosed(MailboxError):
    """The mailbox is closed: it takes nothing, and has nothing left to give."""

    kind = "mailbox_closed"


class Mailbox(Generic[T]):
    """A bounded FIFO of envelopes for one agent; every method may be called from any thread.

    ``clock`` measures how much of a timeout is left after a wake-up that did not help (another
    producer took the space first); the wait itself is ``threading.Condition.wait``, so each wait
    is bounded by real time even with a clock that does not move.
    """

    def __init__(
        self,
        capacity: int,
        on_full: OnFull = "block",
        block_timeout: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        hold: Callable[[], bool] | None = None,
    ) -> None:
        if capacity < 1:
            raise BadInput(f"a mailbox needs a capacity of at least 1, not {capacity}")
        if on_full not in _POLICIES:
            raise BadInput(f"on_full must be one of {', '.join(_POLICIES)}, not {on_full!r}")
        if block_timeout < 0:
            raise BadInput(f"block_timeout must be >= 0, not {block_timeout}")
        self._capacity = capacity
        self._on_full: OnFull = on_full
        self._block_timeout = block_timeout
        self._clock = clock
        self._items: deque[T] = deque()
        self._lock = threading.Lock()
        # Two conditions on one lock: producers wait for space, consumers for items, and each
        # side wakes only the other.
        self._not_full = threading.Condition(self._lock)
        self._not_empty = threading.Condition(self._lock)
        self._closed = False
        self._paused = False
        self._hold = hold
        # Threads waiting in put / get: a notify is only worth its cost when one is.
        self._producers = 0
        self._consumers = 0
        self._high_water = 0
        self._accepted = 0
        self._dropped = 0
        self._rejected = 0

    # -- producers ------------------------------------------------------------------------

    def put(self, item: T, *, timeout: float | None = None) -> bool:
        """Append ``item``; True when accepted, False when the ``"drop"`` policy dropped it.

        ``timeout`` applies to the ``"block"`` policy only (default: ``block_timeout``).
        Raises ``MailboxFull`` (``"block"`` after the timeout, ``"fail"`` at once) and
        ``MailboxClosed``.
        """
        with self._lock:
            self._check_open()
            if len(self._items) >= self._capacity:
                if self._on_full == "drop":
                    self._dropped += 1
                    return False
                if self._on_full == "fail":
                    self._rejected += 1
                    raise MailboxFull(
                        f"mailbox is full (capacity {self._capacity})", capacity=self._capacity
                    )
                self._wait_for_space(self._block_timeout if timeout is None else timeout)
            items = self._items
            items.append(item)
            self._accepted += 1
            self._high_water = max(self._high_water, len(items))
            if self._consumers:
                self._not_empty.notify()
            return True

    def _wait_for_space(self, timeout: float) -> None:
        """Wait (lock held) until there is room; raise on timeout or close."""
        deadline = self._clock() + timeout
        while len(self._items) >= self._capacity:
            remaining = deadline - self._clock()
            if remaining <= 0 or not self._wait_not_full(remaining):
                # A notify can land on a waiter that is timing out; taking the space here
                # keeps that wake-up from being lost.
                self._check_open()
                if len(self._items) < self._capacity:
                    break
                self._rejected += 1
                raise MailboxFull(
                    f"mailbox stayed full (capacity {self._capacity}) for {timeout}s",
                    capacity=self._capacity,
                )
            self._check_open()

    def _wait_not_full(self, timeout: float) -> bool:
        self._producers += 1
        try:
            return self._not_full.wait(timeout)
        finally:
            self._producers -= 1

    def _wait_not_empty(self, timeout: float | None) -> bool:
        self._consumers += 1
        try:
            return self._not_empty.wait(timeout)
        finally:
            self._consumers -= 1

    def _check_open(self) -> None:
        if self._closed:
            raise MailboxClosed("mailbox is closed")

    # -- consumers ------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> T:
        """Take the oldest envelope, waiting up to ``timeout`` seconds (None: until one comes).

        Raises ``MailboxEmpty`` on timeout and ``MailboxClosed`` once the mailbox is closed and
        empty. A paused mailbox gives nothing until resumed, unless it is closed: closing ends
        the pause so consumers can drain and stop.
        """
        with self._lock:
            deadline = None if timeout is None else self._clock() + timeout
            while not self._ready():
                if self._closed:
                    raise MailboxClosed("mailbox is closed")
                if deadline is None:
                    self._wait_not_empty(None)
                    continue
                remaining = deadline - self._clock()
                if remaining <= 0 or not self._wait_not_empty(remaining):
                    # One last look: the wake-up and the timeout may have crossed.
                    if self._ready():
                        break
                    if self._closed:
                        raise MailboxClosed("mailbox is closed")
                    state = "paused" if self._held() else "empty"
                    raise MailboxEmpty(f"mailbox stayed {state} for {timeout}s")
            item = self._items.popleft()
            if self._producers:
                self._not_full.notify()
            return item

    def take(self) -> T | None:
        """The oldest envelope if one can be handed out now (as ``get_nowait``), else None."""
        with self._lock:
            items = self._items
            if not items or (
                not self._closed and (self._paused or (self._hold is not None and self._hold()))
            ):
                return None
            item = items.popleft()
            if self._producers:
                self._not_full.notify()
            return item

    def ready(self) -> bool:
        """An envelope could be handed out now: some are held and the mailbox is not paused
        (or is closed, which ends the pause).

        Read without the lock: each of the three reads is atomic, and the answer is true of
        the mailbox at the moment ``_items`` was read (an empty one is not ready whatever
        follows; items that were there were ready unless a pause came first, and then the
        pause is read too). Like any answer it may be stale on return; its callers (an agent
        ending its turn, a wake) are made safe by the producer's wake after every put.
        """
        if not self._items:
            return False
        hold = self._hold  # inline, not _held(): this and take() run for every message
        return self._closed or not (self._paused or (hold is not None and hold()))

    def claim(self) -> bool:
        """Accept an envelope and hand it out at once, never queueing it: True (counted as
        accepted) when the mailbox is empty, open and not paused, so that the envelope is
        the next one out in every order a ``put`` would have given it; False (nothing done)
        otherwise, and the caller puts it as usual.

        For an ask whose asking thread runs the agent's turn itself: the caller holds the
        agent's lock that keeps any other consumer away until it has handled the envelope.
        """
        with self._lock:
            if self._items or self._closed or self._held():
                return False
            self._accepted += 1
            if not self._high_water:
                self._high_water = 1
            return True

    def claimable(self) -> bool:
        """Whether ``claim`` would accept now (empty, open, not paused); it may not by the time
        it is called (for a caller with work to do first, which then claims)."""
        with self._lock:
            return not (self._items or self._closed or self._held())

    def get_nowait(self) -> T:
        """Take the oldest envelope now, or raise ``MailboxEmpty`` / ``MailboxClosed``."""
        return self.get(timeout=0)

    def peek_only(self, item: T) -> bool:
        """Whether ``item`` is the one envelope held and could be taken now (not paused)."""
        with self._lock:
            items = self._items
            return len(items) == 1 and items[0] is item and (self._closed or not self._held())

    def _ready(self) -> bool:
        """An envelope can be handed out now (lock held)."""
        return bool(self._items) and (self._closed or not self._held())

    def _held(self) -> bool:
        """Consumers are held back: paused, or the hold is on."""
        hold = self._hold
        return self._paused or (hold is not None and hold())

    def waiting(self) -> list[T]:
        """The envelopes held now, oldest first (a copy: for finding one, not for taking)."""
        with self._lock:
            return list(self._items)

    def drain(self) -> list[T]:
        """Take every envelope at once, oldest first, paused or closed (shutdown, hot swap)."""
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._not_full.notify_all()
            return items

    # -- control --------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse further puts; consumers drain what is left, then get ``MailboxClosed``.

        Idempotent. Producers waiting for space raise ``MailboxClosed``.
        """
        with self._lock:
            self._closed = True
            self._not_full.notify_all()
            self._not_empty.notify_all()

    def pause(self) -> None:
        """Hold consumers back; puts are still accepted up to capacity."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        """Let consumers take envelopes again."""
        with self._lock:
            self._paused = False
            self._not_empty.notify_all()

    def hold_while(self, hold: Callable[[], bool] | None) -> None:
        """Hold consumers back whenever ``hold()`` is true (None: no hold); see the module
        docstring. The check runs under the mailbox's lock: it must be quick and take no lock."""
        with self._lock:
            self._hold = hold
            self._not_empty.notify_all()

    def poke(self) -> None:
        """Consumers waiting look again (a hold was lifted)."""
        with self._lock:
            self._not_empty.notify_all()

    # -- state ----------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __repr__(self) -> str:
        with self._lock:
            return (
                f"Mailbox(len={len(self._items)}, capacity={self._capacity}, "
                f"on_full={self._on_full!r}, closed={self._closed}, paused={self._paused})"
            )

    @property
    def capacity(self) -> int:
        """The most envelopes the mailbox holds at once."""
        return self._capacity

    @property
    def on_full(self) -> OnFull:
        """The policy applied when a put finds the mailbox full."""
        return self._on_full

    @property
    def closed(self) -> bool:
        """``close`` was called."""
        with self._lock:
            return self._closed

    @property
    def paused(self) -> bool:
        """``pause`` was called without a ``resume`` yet."""
        with self._lock:
            return self._paused

    @property
    def held(self) -> bool:
        """Consumers are held back now: paused, or the hold is on."""
        with self._lock:
            return self._held()

    @property
    def high_water(self) -> int:
        """The greatest length the mailbox has reached."""
        with self._lock:
            return self._high_water

    @property
    def accepted(self) -> int:
        """Puts that were accepted."""
        with self._lock:
            return self._accepted

    @property
    def dropped(self) -> int:
        """Puts the ``"drop"`` policy refused."""
        with self._lock:
            return self._dropped

    @property
    def rejected(self) -> int:
        """Puts that raised ``MailboxFull`` (``"block"`` timeouts and ``"fail"``)."""
        with self._lock:
            return self._rejected
