"""`mty debug`: step through a replay of a run, across its agents, forwards and back.

The debugger really replays: every instance of the run runs again on its own worker thread,
and the replay observer stops the run at every event (an export about to be called, an import
answered from the trace, an export returned) until the person at the prompt says how far to go.
The instances pass their events in the order the trace recorded them across the run
(``replay_trace(order="recorded")``): when one agent asks another, ``step`` goes from the
asker's call into the callee's handling of the message and back to the asker's ``ask``. So what
you step through is what the guests did, checked against the trace as it goes; a divergence
shows up at the point it happens.

Commands: see :data:`HELP` (what ``help`` prints, plain text). ``next`` stops at the next export
call *or* breakpoint, whichever comes first, as a debugger's "step over" does.

``peek AGENT`` (an address, a registered name or an instance number) shows what the agent was
at the current event: its state, decoded, from the recorded component's ``snapshot`` export
called on a *second*, fresh instance that replays the agent's export calls finished by then
(``state_at``); the messages it handled last and the ones it handles next, bodies decoded from
CBOR. ``bt`` shows the ask chain into the current agent (who asked it, who asked them) and its
supervision path (who started it, the instances it crashed out of). ``back``/``goto N`` start
the replay again on fresh instances and run it to event N without stopping: replay is
deterministic, so event N is the same event with the same state every time.

Rejected designs: calling ``snapshot`` on the instance being stepped (guest code the recording
never ran: its fuel and its heap differ afterwards, so the rest of the replay would diverge);
keeping snapshots of every instance at every event to go back (memory in proportion to the
run, and a snapshot is not a whole instance: a replay cannot resume from it); reversing wasm
execution (nothing in wasmtime to do it).

``fork [N] -o FILE`` runs the instance of event N again on a fresh instance, its imports
recorded before that event answered from the trace and the rest live, recorded to a new trace
(:func:`fork_trace`, ``_fork.py``).

Not done (issue 35): Python source positions per import.

The component is compiled before the first event when the cache does not hold it (a minute for
a large one): ``progress`` hears about it, default to stderr (:func:`replay_trace`).
"""

from __future__ import annotations

import json
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import HostError, MightyError
from mighty.trace._fork import fork_trace
from mighty.trace._model import RunModel, body_text, decoded, message_text, result_text
from mighty.trace._replay import (
    DEFAULT_REPLAY_LIMITS,
    ReplayAborted,
    ReplayEvent,
    ReplayLimits,
    ReplayReport,
    StateAt,
    replay_trace,
    state_at,
)

__all__ = ["DEBUG_TIMEOUT", "HELP", "Debugger", "describe", "source_text"]

_HISTORY = 200
_RECENT = 5
_STATE_CHARS = 600
_BYTES_SHOWN = 32

DEBUG_TIMEOUT = 24 * 3600.0
"""Seconds a replayed call may take under the debugger (the recorded deadline does not apply:
a call stays stopped at the prompt for as long as a person reads)."""

HELP = (
    "step (s)          the next event in recorded order: an export call, an import, a return",
    "next (n)          the next export call, or a breakpoint before it",
    "continue (c)      run to a breakpoint or the end",
    "back [K] (b-)     go back K events (default 1): replays again to that event",
    "goto N (g)        go to event N (forwards or back)",
    "fork [N] -o FILE  run this event's instance again: imports before event N (default: this",
    "                  one) from the trace, the rest live; record it to FILE (a new trace)",
    "break X (b)       stop at agent X (address or name), instance X, interface X, function X",
    "                  or interface#function",
    "break             list the breakpoints",
    "delete X (d)      remove breakpoint X",
    "print (p)         the event in flight, in full, bodies decoded",
    "bt                the ask chain into this agent and its supervision path",
    "list (l)          the events around this one, across agents, in recorded order",
    "peek X            agent X (address, name or instance): state, messages handled, mailbox",
    "agents            the agents and instances of the run",
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
    calls: deque[ReplayEvent] = field(default_factory=lambda: deque(maxlen=_RECENT))
    imports: deque[ReplayEvent] = field(default_factory=lambda: deque(maxlen=_RECENT))
    agent_imports: deque[ReplayEvent] = field(default_factory=lambda: deque(maxlen=_RECENT))
    open_call: ReplayEvent | None = None


def _short(value: Any, limit: int = 80) -> str:
    if isinstance(value, bytes | bytearray) and len(value) > _BYTES_SHOWN:
        return f"<{len(value)} bytes {bytes(value[:8]).hex()}...>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and "name" in value and "body" in value


def _args_text(args: Any) -> str:
    if not isinstance(args, list | tuple):
        return _short(args)
    shown = [message_text(a, 60) if _is_message(a) else _short(a, 60) for a in args]
    return "(" + ", ".join(shown) + ")"


def _call_text(event: ReplayEvent) -> str:
    """``handle NAME {body} from SENDER`` for a message, else ``function(args)``."""
    args = event.args
    if (
        event.function == "handle"
        and isinstance(args, list)
        and len(args) == 2
        and _is_message(args[1])
    ):
        return f"handle {message_text(args[1])} from {args[0]}"
    return f"{event.function}{_short(tuple(args))}"


def describe(event: ReplayEvent) -> str:
    """One line a person can follow: which event, which agent, what, and what came back."""
    where = f"#{event.index} instance {event.instance} step {event.step}"
    if event.agent is not None:
        where += f" [{event.agent}]"
    handle = event.function == "handle" and isinstance(event.args, list) and len(event.args) == 2
    if event.kind == "call":
        if handle and _is_message(event.args[1]):
            return f"{where}: {_call_text(event)}"
        if event.agent is not None and event.function == "init" and len(event.args) == 1:
            shown = body_text(event.args[0]) if event.args[0] else "(no arguments)"
            return f"{where}: init {shown}"
        return f"{where}: call {event.function}{_short(tuple(event.args))}"
    if event.kind == "export":
        if handle:
            return f"{where}: handle returned {result_text(event.result)} (fuel {event.fuel})"
        return f"{where}: {event.function} returned {_short(event.result)} (fuel {event.fuel})"
    at = "" if event.source is None else f"  at {source_text(event.source)}"
    if event.interface.startswith("mighty:agent/"):
        args = _args_text(event.args)
        shown = f"{event.interface}#{event.function}{args} -> {result_text(event.result)}"
        return f"{where}: {shown}{at}"
    args = _short(tuple(event.args))
    return f"{where}: {event.interface}#{event.function}{args} -> {_short(event.result)}{at}"


def source_text(source: tuple[str, int, str]) -> str:
    """``file:line in function``, the file by its base name (``print`` shows it whole)."""
    file, line, function = source
    return f"{file.rpartition('/')[2]}:{line} in {function}"


class _Session:
    """One replay on its worker thread, stopped at every event until told to go on."""

    def __init__(
        self,
        trace: Path,
        instance: int | None,
        agent: str | Sequence[str] | None,
        limits: ReplayLimits,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.events: queue.Queue[ReplayEvent | _Finished] = queue.Queue()
        self.go = threading.Semaphore(0)
        self.abort = False
        self.stopped = False  # the replay is stopped at an event, waiting for ``go``
        self.thread = threading.Thread(
            target=self._run,
            args=(trace, instance, agent, limits, progress),
            name="mighty-debug",
            daemon=True,
        )
        self.thread.start()

    def _run(
        self,
        trace: Path,
        instance: int | None,
        agent: str | Sequence[str] | None,
        limits: ReplayLimits,
        progress: Callable[[str], None] | None,
    ) -> None:
        try:
            report = replay_trace(
                trace,
                instance=instance,
                agent=agent,
                observer=self._observe,
                limits=limits,
                progress=progress,
                order="recorded",
            )
            self.events.put(_Finished(report=report))
        except BaseException as exc:  # noqa: BLE001 - reported at the prompt
            self.events.put(_Finished(error=exc))

    def _observe(self, event: ReplayEvent) -> None:
        if self.abort:
            raise ReplayAborted
        self.events.put(event)
        self.go.acquire()
        if self.abort:
            raise ReplayAborted

    def next(self) -> ReplayEvent | _Finished:
        """Let the replay go on from where it stopped; the next event (or the end)."""
        if self.stopped:
            self.go.release()
        item = self.events.get()
        self.stopped = isinstance(item, ReplayEvent)
        return item

    def close(self) -> None:
        self.abort = True
        if self.stopped:
            self.stopped = False
            self.go.release()
        self.thread.join(timeout=30)


class Debugger:
    """A replay under control. Feed it commands; it returns what to print."""

    def __init__(
        self,
        trace: str | Path,
        *,
        instance: int | None = None,
        agent: str | Sequence[str] | None = None,
        limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """``instance`` or ``agent`` (an address such as ``kv:3``, a registered name, or a list
        of them: a sub-graph, as :func:`replay_trace` takes) limits the replay to those agents.
        ``progress`` hears about a compile before the first event (default: to stderr). The
        recorded per-call deadline does not apply under the debugger (``DEBUG_TIMEOUT``)."""
        self._progress = progress
        self._given_limits = limits
        self.trace = Path(trace)
        self.limits = ReplayLimits(
            fuel=limits.fuel,
            memory=limits.memory,
            timeout=DEBUG_TIMEOUT,
            component_bytes=limits.component_bytes,
            timeout_from_trace=False,
        )
        self._instance = instance
        self._agent = agent
        self.breakpoints: set[str] = set()
        self.history: deque[ReplayEvent] = deque(maxlen=_HISTORY)
        self.current: ReplayEvent | None = None
        self.finished: _Finished | None = None
        self._model: RunModel | None = None
        self._states: dict[tuple[int, int], StateAt] = {}
        self._views: dict[int, _InstanceView] = {}
        self._session = self._new_session()

    def _new_session(self) -> _Session:
        return _Session(self.trace, self._instance, self._agent, self.limits, self._progress)

    @property
    def _thread(self) -> threading.Thread:
        """The thread the current replay runs on."""
        return self._session.thread

    @property
    def model(self) -> RunModel:
        """The trace read as agents and messages (read at the first question needing it)."""
        if self._model is None:
            self._model = RunModel(self.trace)
        return self._model

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
            return self._guarded(self._backtrace), False
        if verb in ("l", "list"):
            return self._list(), False
        if verb == "peek":
            return self._guarded(lambda: self._peek(rest)), False
        if verb == "agents":
            return self._guarded(self._agents), False
        if verb in ("back", "b-"):
            return self._back(rest), False
        if verb in ("g", "goto"):
            return self._goto_command(rest), False
        if verb == "fork":
            return self._guarded(lambda: self._fork(rest)), False
        if self.finished is not None and verb in ("s", "step", "n", "next", "c", "continue"):
            return ["the replay has finished", *self._summary()], False
        if verb in ("s", "step"):
            return self._advance(lambda _e: True), False
        if verb in ("n", "next"):
            return self._advance(lambda e: e.kind == "call" or self._hits_breakpoint(e)), False
        if verb in ("c", "continue"):
            return self._advance(self._hits_breakpoint), False
        return [f"unknown command {verb!r} (try help)"], False

    def _guarded(self, answer: Callable[[], list[str]]) -> list[str]:
        try:
            return answer()
        except MightyError as exc:
            return [f"{type(exc).__name__}: {exc.message}"]

    def _hits_breakpoint(self, event: ReplayEvent) -> bool:
        names = {str(event.instance), event.interface, event.function}
        if event.kind == "call" and event.function == "handle" and isinstance(event.args, list):
            # A message's name: `break crash` stops where an agent starts handling "crash".
            names.update(a["name"] for a in event.args if _is_message(a))
        if event.interface:
            names.add(f"{event.interface}#{event.function}")
        if event.agent is not None:
            names.add(event.agent)
            if any(not b.isdigit() for b in self.breakpoints):  # a name may be meant
                info = self.model.instances.get(event.instance)
                if info is not None and info.name:
                    names.add(info.name)
        return bool(names & self.breakpoints)

    def _advance(self, stop: Callable[[ReplayEvent], bool]) -> list[str]:
        while True:
            item = self._session.next()
            if isinstance(item, _Finished):
                self.finished = item
                self.current = None
                return self._summary()
            self.history.append(item)
            self._record(item)
            if stop(item):
                self.current = item
                return [describe(item)]

    def _record(self, event: ReplayEvent) -> None:
        view = self._views.setdefault(event.instance, _InstanceView())
        if event.kind == "call":
            view.open_call = event
            view.calls.append(event)
        elif event.kind == "export":
            view.open_call = None
            view.calls.append(event)
        else:
            view.imports.append(event)
            if event.interface.startswith("mighty:"):
                view.agent_imports.append(event)

    def _back(self, rest: list[str]) -> list[str]:
        if len(rest) > 1 or (rest and not rest[0].isdigit()):
            return ["usage: back [K]"]
        here = self._position()
        return self._goto(max(1, here - (int(rest[0]) if rest else 1)))

    def _goto_command(self, rest: list[str]) -> list[str]:
        if len(rest) != 1 or not rest[0].isdigit() or int(rest[0]) < 1:
            return ["usage: goto N (an event number, 1 the first)"]
        return self._goto(int(rest[0]))

    def _position(self) -> int:
        """The number of the current event (after the end: one past the last)."""
        if self.current is not None:
            return self.current.index
        return (self.history[-1].index + 1) if self.history else 1

    def _goto(self, target: int) -> list[str]:
        """Event ``target``: forwards by going on, backwards by replaying again from the top."""
        if self.current is not None and target == self.current.index:
            return [describe(self.current)]
        if self.current is not None and target > self.current.index:
            return self._advance(lambda e: e.index >= target)
        self._session.close()
        self.history.clear()
        self._views.clear()
        self.current = None
        self.finished = None
        self._session = self._new_session()
        return self._advance(lambda e: e.index >= target)

    def _fork(self, rest: list[str]) -> list[str]:
        words = [w for w in rest if w != "--live"]  # past the fork point is always live
        out: str | None = None
        if "-o" in words and words.index("-o") + 1 < len(words):
            at = words.index("-o")
            out = words[at + 1]
            words = words[:at] + words[at + 2 :]
        if out is None or len(words) > 1 or (words and not words[0].isdigit()):
            return ["usage: fork [N] -o NEW.trace"]
        lines = self._goto(int(words[0])) if words else []
        event = self.current
        if event is None or event.offset < 0:
            return [*lines, "nothing in flight to fork at (goto N first)"]
        report = fork_trace(
            self.trace,
            event.instance,
            event.offset,
            out,
            limits=self._given_limits,
            progress=self._progress,
        )
        return [*lines, *report.lines()]

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
        lines = [
            describe(event),
            f"  kind:      {event.kind}",
            f"  agent:     {event.agent or '(none)'}",
            f"  interface: {event.interface or '(export)'}",
            f"  function:  {event.function}",
            f"  args:      {event.args!r}",
            f"  result:    {event.result!r}",
            f"  fuel:      {event.fuel}",
            f"  record:    at byte {event.offset}",
        ]
        if event.source is not None:
            file, line, function = event.source
            lines.insert(6, f"  source:    {file}:{line} in {function}")
        for n, arg in enumerate(event.args if isinstance(event.args, list) else []):
            if _is_message(arg):
                lines.append(f"  args[{n}] body: {body_text(arg['body'], 400)}")
        if event.result is not None:
            lines.append(f"  result, decoded: {result_text(event.result, 400)}")
        return lines

    def _backtrace(self) -> list[str]:
        event = self.current
        if event is None:
            return ["nothing in flight"]
        # Within the instance (as before agents): instance -> export call -> import.
        lines = [f"instance {event.instance}"]
        view = self._views.get(event.instance)
        if view is not None and view.open_call is not None:
            lines.append(f"  export {_call_text(view.open_call)}")
        if event.kind == "import":
            lines.append(f"    import {event.interface}#{event.function}")
        if event.agent is None or event.offset < 0:
            return lines
        # Across agents: who asked this one, who asked them; then who started it.
        chain = self.model.backtrace(event.instance, event.offset)
        return lines + ["ask chain:"] + [f"  {line}" for line in chain]

    def _list(self) -> list[str]:
        if not self.history:
            return ["no events yet"]
        events: Iterable[ReplayEvent] = list(self.history)[-8:]
        return [("=> " if e is self.current else "   ") + describe(e) for e in events]

    def _agents(self) -> list[str]:
        lines = []
        for info in self.model.instances.values():
            handled = len(info.messages)
            lines.append(f"{info.label}: {handled} message(s) handled")
        return lines

    def _at(self) -> int:
        """The offset of the current point of the run (the end, after the last event)."""
        if self.current is not None and self.current.offset >= 0:
            return self.current.offset
        if self.finished is not None and self.model.offsets:
            return self.model.offsets[-1] + 1
        return 0

    def _peek(self, rest: list[str]) -> list[str]:
        if len(rest) != 1:
            return ["usage: peek AGENT (an address, a registered name or an instance number)"]
        at = self._at()
        info = self.model.instance_at(rest[0], at)
        lines = [
            f"{info.label}, at {'the end' if self.current is None else f'#{self._position()}'}:"
        ]
        if info.offsets[0] > at:
            lines.append("  not started yet")
        call = info.open_call(at)
        if call is not None:
            if call.get("fn") == "handle" and len(call["args"]) == 2:
                lines.append(
                    f"  running: handle {message_text(call['args'][1])} from {call['args'][0]}"
                )
            else:
                lines.append(f"  running: {call['fn']}")
        lines.append("  state: " + self._state_line(info.instance, at, call is not None))
        view = self._views.get(info.instance)
        if view is not None and info.agent is None:
            lines += ["  recent calls:"] + [f"    {describe(e)}" for e in view.calls]
            lines += ["  recent imports:"] + [f"    {describe(e)}" for e in view.imports]
        elif view is not None and view.agent_imports:
            # An agent's messages are below; of its imports, those of the agent interfaces.
            lines.append("  recent agent imports:")
            lines += [f"    {describe(e)}" for e in view.agent_imports]
        done = [m for m in info.messages if m.offset <= at]
        later = [m for m in info.messages if m.offset > at]
        lines.append(f"  last messages ({len(done)} handled by this instance):")
        lines += [f"    {m.line(at)}" for m in done[-_RECENT:]] or ["    (none)"]
        lines.append(f"  mailbox, as recorded (the next it handles, {len(later)} in all):")
        lines += [f"    {m.head} from {m.sender}" for m in later[:_RECENT]] or ["    (none)"]
        return lines

    def _state_line(self, instance: int, at: int, running: bool) -> str:
        info = self.model.instances[instance]
        finished = sum(1 for r in info.records[: info.at(at)] if r["k"] == "export")
        key = (instance, finished)
        found = self._states.get(key)
        if found is None:
            try:
                found = state_at(
                    self.trace, instance, at, limits=self.limits, progress=self._progress
                )
            except HostError as exc:
                return f"unknown ({exc.message})"
            self._states[key] = found
        if found.state is None:
            return f"unknown ({found.why})"
        when = f"after {found.exports} export call(s)"
        if running:
            when += ", not counting the call in flight"
        return f"{_state_text(found.state)} ({when})"

    def close(self) -> None:
        """Stop the replay thread (it is aborted at its next event)."""
        self._session.close()


def _state_text(state: bytes) -> str:
    """The SDK's snapshot is ``{"schema": hash, "state": {...}}``: show the state; any other
    snapshot as it decodes."""
    value = decoded(state)
    if isinstance(value, dict) and set(value) == {"schema", "state"}:
        value = value["state"]
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= _STATE_CHARS else text[: _STATE_CHARS - 3] + "..."
