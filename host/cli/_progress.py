"""Progress of slow steps on stderr, with or without a terminal.

A step starts when the library reports it (``progress("compiling x.wasm ...")``) and ends at the
next report or when the command's wait is over. Its line is printed as it starts; while it lasts a
``... still going, N s`` line follows every ``tick`` seconds; when it ends after more than a
second, ``done in N s``. So a log of a CI job shows what a minute went on, and a quick cached
step prints nothing at all. Rejected: a spinner redrawn in place (meaningless without a
terminal, and a log full of carriage returns with one).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import suppress
from types import TracebackType
from typing import Any

import click

__all__ = ["Waits"]

_TICK = 10.0
_SHOW_DONE_AFTER = 1.0


def _tick() -> float:
    # MTY_PROGRESS_TICK lets a test see the periodic line without waiting ten seconds.
    try:
        return max(0.05, float(os.environ.get("MTY_PROGRESS_TICK", _TICK)))
    except ValueError:
        return _TICK


class Waits:
    """The progress callback of one command: call it with each step's message.

    Disabled (``enabled=False``, the command's ``--quiet``) it prints nothing. Use as a context
    manager, so that the last step is reported and the ticker thread stops.
    """

    def __init__(self, enabled: bool = True, *, tick: float | None = None) -> None:
        self.enabled = enabled
        self.tick = _tick() if tick is None else tick
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # [message, started, announced, last line printed, last report from the library]
        self._step: list[Any] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def __call__(self, message: str) -> None:
        """A new step begins (and the one before, if any, ends): its line is printed now."""
        self._begin(message, announce=True)

    def wait(self, message: str) -> None:
        """A wait begins that may be short: its line is printed only once it lasted a second."""
        self._begin(message, announce=False)

    def _begin(self, message: str, *, announce: bool) -> None:
        if not self.enabled:
            return
        with self._lock:
            step = self._step
            if step is not None and message.startswith("done"):
                # The library timed the step itself ("done in 12.2 s"): ours would repeat it.
                self._step = None
                _echo(message)
                return
            if step is not None and _subject(message) == _subject(step[0]):
                # The library's own tick of the step under way ("building x.py: 3 s"): not a
                # new step. Shown at the ticker's pace, not every second.
                now = time.monotonic()
                step[4] = now
                if announce and now - step[3] >= self.tick:
                    step[3] = now
                    _echo(message)
                return
        self.done()
        if announce:
            _echo(message)
        with self._lock:
            now = time.monotonic()
            self._step = [message, now, announce, now, 0.0]
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._ticker, name="mty-progress", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def done(self) -> None:
        """The open step (if any) is over: say how long it took, when that was over a second."""
        with self._lock:
            step, self._step = self._step, None
            self._wake.notify_all()
        if step is not None:
            elapsed = time.monotonic() - step[1]
            if elapsed >= _SHOW_DONE_AFTER:
                _echo(f"done in {elapsed:.1f} s")

    def _ticker(self) -> None:
        with self._lock:
            while not self._closed:
                step = self._step
                if step is None:
                    self._wake.wait()
                    continue
                message, started, announced = step[0], step[1], step[2]
                if announced:
                    passed = int((time.monotonic() - started) / self.tick)
                    wake = started + self.tick * (1 + passed)
                else:
                    wake = started + _SHOW_DONE_AFTER
                self._wake.wait(max(0.0, wake - time.monotonic()))
                if self._step is not step or self._closed or time.monotonic() < wake:
                    continue
                if time.monotonic() - step[4] < self.tick:
                    # The library ticks this step itself ("building x.py: 80 s"), shown at our
                    # pace: a line of ours too would be a second printer ("... still building
                    # x.py, 80 s" beside "building x.py: 91 s").
                    continue
                elapsed = time.monotonic() - started
                step[3] = time.monotonic()
                if announced:
                    _echo(f"... still {_short(message)}, {elapsed:.0f} s")
                else:
                    step[2] = True
                    _echo(f"{message} ({elapsed:.0f} s so far)")

    def close(self) -> None:
        """End the open step and stop the ticker."""
        self.done()
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)

    def __enter__(self) -> Waits:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        else:  # failing: the error line says what happened, not "done in"
            with self._lock:
                self._step = None
            self.close()


def _subject(message: str) -> tuple[str, ...]:
    # "building x.py with componentize-py ..." and "building x.py: 3 s" are one step.
    return tuple(message.replace(":", " ").split()[:2])


def _short(message: str) -> str:
    # "compiling x.wasm (20.1 MB); cached after this run" -> "compiling x.wasm"
    return " ".join(_subject(message))


def _echo(message: str) -> None:
    with suppress(OSError, ValueError):  # stderr closed: progress is not worth failing for
        click.echo(f"mty: {message}", err=True)
