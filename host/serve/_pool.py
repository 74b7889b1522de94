"""Instances made ahead of the requests that will use them, and used ones closed, off the
request's path: the server's pool of fresh copy-on-write instances.

Each instance still serves exactly one request (nothing of one request can reach the next);
the pool only moves the ~1 ms of instantiation and the ~0.3 ms of closing to a background
thread, as the code-mode sandbox's pool does. An instance is made of the component current
when it is made; after :meth:`InstancePool.swap` the ready ones of the old component are
closed and new ones made, so a request taken after the swap never runs the old code.

Rejected: reusing an instance for several requests (state and secrets would leak between
them); a pool per connection (idle connections would hold instances); making instances with
the request's cancel scope (a pooled instance has none yet: the call gets the request's).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from mighty.engine import Component
from mighty.instance import Instance

__all__ = ["InstancePool"]


class InstancePool:
    """Up to ``size`` ready instances of the current component, made by ``make`` on a
    background thread; :meth:`take` gives one or None (the caller makes its own)."""

    def __init__(
        self,
        component: Component,
        make: Callable[[Component], Instance],
        size: int,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._component = component
        self._make = make
        self._size = size
        self._log = log or (lambda _line: None)
        self._ready: deque[tuple[Component, Instance]] = deque()
        self._used: deque[Instance] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._failures = 0
        self._thread: threading.Thread | None = None
        if size > 0:
            self._thread = threading.Thread(target=self._fill, name="mty-serve-pool", daemon=True)
            self._thread.start()

    @property
    def ready(self) -> int:
        """Instances ready now."""
        with self._cond:
            return len(self._ready)

    def take(self, component: Component) -> Instance | None:
        """A ready instance of ``component``, or None."""
        with self._cond:
            while self._ready:
                made_of, instance = self._ready.pop()
                self._cond.notify_all()
                if made_of is component:
                    return instance
                self._used.append(instance)  # of a component swapped out since
            return None

    def release(self, instance: Instance) -> None:
        """An instance after its one request: closed in the background (inline without a
        background thread)."""
        if self._thread is None:
            instance.close()
            return
        with self._cond:
            self._used.append(instance)
            self._cond.notify_all()

    def swap(self, component: Component) -> None:
        """Make instances of ``component`` from now on; the ready ones of the old are closed."""
        with self._cond:
            self._component = component
            while self._ready:
                self._used.append(self._ready.pop()[1])
            self._cond.notify_all()

    def close(self) -> None:
        """Stop filling; close every instance the pool holds."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            left = [i for _, i in self._ready] + list(self._used)
            self._ready.clear()
            self._used.clear()
        for instance in left:
            instance.close()

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._used and len(self._ready) >= self._size:
                    self._cond.wait()
                if self._closed:
                    return
                used = self._used.popleft() if self._used else None
                component = self._component
            if used is not None:
                used.close()
                continue
            try:
                instance = self._make(component)
            except Exception as exc:  # noqa: BLE001 - the request path makes its own and reports
                self._failures += 1
                self._log(f"  the pool could not make an instance: {type(exc).__name__}")
                with self._cond:
                    # Stop trying after repeated failures: each request then makes its own
                    # instance and its failure is answered as any other.
                    if self._failures >= 3:
                        self._size = 0
                continue
            with self._cond:
                if self._closed or component is not self._component:
                    self._used.append(instance)
                else:
                    self._ready.append((component, instance))
