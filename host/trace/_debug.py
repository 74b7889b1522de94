"""`mty debug`: step through a replay, one import or one export call at a time.

The debugger really replays: the guest runs again on a worker thread, and the replay observer
stops it at every event (an export about to be called, an import answered from the trace, an
export returned) until the person at the prompt says how far to go. So what you step through
is what the guest does, checked against the trace as it goes; a divergence shows up at the
point it happens.

Commands: see :data:`HELP` (what ``help`` prints, plain text: it used to print the lines of
this docstring, reST backticks and all). ``next`` stops at the next export call *or* breakpoint,
whichever comes first, as a debugger's "step over" does (it used to run past breakpoints to the
end of the replay).

The component is compiled before the first event when the cache does not hold it (a minute for
a large one): ``progress`` hears about it, default to stderr (:func:`replay_trace`).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import MightyError
from mighty.trace._replay import (
    DEFAULT_REPLAY_LIMITS,
    ReplayAborted,
    ReplayEvent,
    ReplayLimits,
    ReplayReport,
    replay_trace,
)

__all__ = ["HELP", "Debugger"]

_HISTORY = 200

HELP = (
    "step (s)          the next event: an export call, an import answered, an export return",
    "next (n)          the next export call, or a breakpoint before it",
    "continue (c)      run to a breakpoint or the end",
    "break X (b)       stop at instance X, interface X, function X or interface#function",
    "break             list the breakpoints",
    "delete X (d)      remove breakpoint X",
    "print (p)         the event in flight, in full",
    "bt                instance -> export call -> import",
    "list (l)          the events around this one",
    "peek N            what is known of instance N: its latest calls and imports",
    "help (h)          this text",
    "quit (q)          end the session",
)
"""What ``help`` prints, one command a line."""


@dataclass
class _Finished:
    report: ReplayReport | None = None
    error: BaseException | None = None


@dataclass
class _InstanceView:
    calls: deque[ReplayEvent] = field(default_factory=lambda: deque(maxlen=5))
    imports: deque[ReplayEvent] = field(default_factory=lambda: deque(maxlen=5))
    open_call: ReplayEvent | None = None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(event: ReplayEvent) -> str:
    """One line a person can follow: where, what, and what came back."""
    where = f"#{event.index} instance {event.instance} step {event.step}"
    if event.kind == "call":
        return f"{where}: call {event.function}{_short(tuple(event.args))}"
    if event.kind == "export":
        return f"{where}: {event.function} returned {_short(event.result)} (fuel {event.fuel})"
    args = _short(tuple(event.args))
    return f"{where}: {event.interface}#{event.function}{args} -> {_short(event.result)}"


class Debugger:
    """A replay under control. Feed it commands; it returns what to print."""

    def __init__(
        self,
        trace: str | Path,
        *,
        instance: int | None = None,
        agent: str | None = None,
        limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """``instance`` or ``agent`` (an address such as ``kv:3`` or a registered name, as
        :func:`replay_trace` takes) limits the replay to one agent. ``progress`` hears about a
        compile before the first event (default: to stderr)."""
        self._progress = progress
        self.trace = Path(trace)
        self.limits = limits
        self._agent = agent
        self._events: queue.Queue[ReplayEvent | _Finished] = queue.Queue()
        self._go = threading.Semaphore(0)
        self._abort = False
        self.breakpoints: set[str] = set()
        self.history: deque[ReplayEvent] = deque(maxlen=_HISTORY)
        self.current: ReplayEvent | None = None
        self.finished: _Finished | None = None
        self._views: dict[int, _InstanceView] = {}
        self._thread = threading.Thread(
            target=self._run, args=(instance,), name="mighty-debug", daemon=True
        )
        self._thread.start()

    # -- the replay side -------------------------------------------------------------------

    def _run(self, instance: int | None) -> None:
        try:
            report = replay_trace(
                self.trace,
                instance=instance,
                agent=self._agent,
                observer=self._observe,
                limits=self.limits,
                progress=self._progress,
            )
            self._events.put(_Finished(report=report))
        except BaseException as exc:  # noqa: BLE001 - reported at the prompt
            self._events.put(_Finished(error=exc))

    def _observe(self, event: ReplayEvent) -> None:
        self._events.put(event)
        self._go.acquire()
        if self._abort:
            raise ReplayAborted

    # -- the prompt side ---------------------------------------------------------------------

    def start(self) -> list[str]:
        """Wait for the first event; the lines to print."""
        return [f"replaying {self.trace}", *self._advance(lambda _e: True)]

    def command(self, line: str) -> tuple[list[str], bool]:
        """Run one command; return (lines to print, whether the session is over)."""
        words = line.split()
        if not words:
            return [], False
        verb, rest = words[0], words[1:]
        if verb in ("q", "quit", "exit"):
            self.close()
            return ["bye"], True
        if verb in ("h", "help"):
            return list(HELP), False
        if verb in ("b", "break"):
            if not rest:
                return [f"breakpoint: {b}" for b in sorted(self.breakpoints)] or [
                    "no breakpoints"
                ], False
            self.breakpoints.update(rest)
            return [f"breakpoint set: {b}" for b in rest], False
        if verb in ("d", "delete"):
            self.breakpoints.difference_update(rest)
            return [f"breakpoint deleted: {b}" for b in rest], False
        if verb in ("p", "print"):
            return self._print(), False
        if verb == "bt":
            return self._backtrace(), False
        if verb in ("l", "list"):
            return self._list(), False
        if verb == "peek":
            return self._peek(rest), False
        if self.finished is not None and verb in ("s", "step", "n", "next", "c", "continue"):
            return ["the replay has finished", *self._summary()], False
        if verb in ("s", "step"):
            return self._advance(lambda _e: True), False
        if verb in ("n", "next"):
            return self._advance(lambda e: e.kind == "call" or self._hits_breakpoint(e)), False
        if verb in ("c", "continue"):
            return self._advance(self._hits_breakpoint), False
        return [f"unknown command {verb!r} (try help)"], False

    def _hits_breakpoint(self, event: ReplayEvent) -> bool:
        names = {str(event.instance), event.interface, event.function}
        if event.interface:
            names.add(f"{event.interface}#{event.function}")
        return bool(names & self.breakpoints)

    def _advance(self, stop: Callable[[ReplayEvent], bool]) -> list[str]:
        if self.current is not None:
            self._go.release()  # let the guest go on from where it was stopped
        while True:
            item = self._events.get()
            if isinstance(item, _Finished):
                self.finished = item
                self.current = None
                return self._summary()
            self._record(item)
            if stop(item):
                self.current = item
                return [describe(item)]
            self._go.release()

    def _record(self, event: ReplayEvent) -> None:
        self.history.append(event)
        view = self._views.setdefault(event.instance, _InstanceView())
        if event.kind == "call":
            view.open_call = event
            view.calls.append(event)
        elif event.kind == "export":
            view.open_call = None
            view.calls.append(event)
        else:
            view.imports.append(event)

    def _summary(self) -> list[str]:
        assert self.finished is not None
        if self.finished.error is not None:
            error = self.finished.error
            kind = type(error).__name__
            text = error.message if isinstance(error, MightyError) else str(error)
            return [f"replay stopped: {kind}: {text}"]
        report = self.finished.report
        assert report is not None
        return [f"replay finished: ok, digest {report.digest}"]

    def _print(self) -> list[str]:
        event = self.current
        if event is None:
            return ["nothing in flight"]
        return [
            describe(event),
            f"  kind:      {event.kind}",
            f"  interface: {event.interface or '(export)'}",
            f"  function:  {event.function}",
            f"  args:      {event.args!r}",
            f"  result:    {event.result!r}",
            f"  fuel:      {event.fuel}",
        ]

    def _backtrace(self) -> list[str]:
        event = self.current
        if event is None:
            return ["nothing in flight"]
        view = self._views[event.instance]
        lines = [f"instance {event.instance}"]
        if view.open_call is not None:
            lines.append(f"  export {view.open_call.function}{_short(tuple(view.open_call.args))}")
        if event.kind == "import":
            lines.append(f"    import {event.interface}#{event.function}")
        return lines

    def _list(self) -> list[str]:
        if not self.history:
            return ["no events yet"]
        events: Iterable[ReplayEvent] = list(self.history)[-8:]
        return [("=> " if e is self.current else "   ") + describe(e) for e in events]

    def _peek(self, rest: list[str]) -> list[str]:
        if not rest or not rest[0].isdigit():
            return ["usage: peek INSTANCE"]
        view = self._views.get(int(rest[0]))
        if view is None:
            return [f"instance {rest[0]} has not run yet"]
        lines = [f"instance {rest[0]}:"]
        if view.open_call is not None:
            lines.append(f"  running {view.open_call.function}")
        lines += ["  recent calls:"] + [f"    {describe(e)}" for e in view.calls]
        lines += ["  recent imports:"] + [f"    {describe(e)}" for e in view.imports]
        lines.append("  snapshot: this component exports none")
        return lines

    def close(self) -> None:
        """Stop the replay thread (it is aborted at its next event)."""
        self._abort = True
        if self.current is not None and self.finished is None:
            self._go.release()
        self._thread.join(timeout=5)
