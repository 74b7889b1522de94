"""Code mode: run untrusted Python in a fresh wasm interpreter per run.

``Sandbox.run`` takes an instance of the interpreter component that has never run user code,
calls its ``run`` export once under the run's budget, and closes it: nothing a run does (globals,
modules it patched, files it wrote in memory, a crash) can be seen by the next one. An instance
starts from the interpreter's memory image copy-on-write (under a millisecond), and each sandbox
keeps a ``pool`` of instances made and warmed ahead of time on a background thread (see
``_Pool``; after the first, they start from its warmed memory, and each draws its own
``random`` state): a run takes one, the thread makes the next and frees the used one. A
``Session`` is the explicit opposite: one instance whose globals persist across runs, for REPL
use.

How each way a run can end is reported (``RunResult.error.kind``):
- the guest's own report: ``exception`` (an uncaught exception, ``SystemExit`` included),
  ``tool_error`` (an uncaught ``ToolError``), ``out_of_memory`` (an uncaught ``MemoryError``) and
  ``output_limit`` (a result over the limit). User code runs in the same interpreter as the code
  that reports, so any other kind the guest claims is treated as ``exception``, and the host
  re-checks the value's size and JSON itself;
- the budget's typed errors: ``out_of_fuel``, ``out_of_memory``, ``deadline_exceeded``,
  ``cancelled``;
- a host function that stopped the guest on purpose (``StopRun``): ``output_limit`` (the output
  sink, as soon as the limit is passed, so a print flood ends at once rather than at its
  deadline), ``tool_limit``, ``not_allowed``;
- anything else that ends the interpreter (``os._exit``, a stack overflow, a crash) is
  ``exception`` with a message saying so.

Everything the guest reports is bounded and checked before it counts: the value must be strict
UTF-8 JSON data (finite numbers, no lone surrogates) within ``Limits.output``; the message and
traceback are cut to ``MAX_ERROR_TEXT`` each (and ``Limits.output`` together, see
``_error_text_limit``). Runs started from inside a tool nest at most ``MAX_NESTED_RUNS`` deep.

Every run has a ``mighty.budget.RunContext`` (``RunContext.top("run")``): the child of the
caller's current context when there is one (a run started by a tool is cancelled with the
tool's run and ends by its deadline), its cancel scope the run's. ``Sandbox.start`` returns a
``RunHandle`` on it (id, status, cancel, result).

Rejected: checking the output limit after the run (a flood would run to its deadline), and one
instance reset between runs (CPython state cannot be reset reliably from inside).
"""

from __future__ import annotations

import asyncio
import codecs
import contextvars
import functools
import hashlib
import json
import logging
import math
import os
import random
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mighty._errors import (
    BadInput,
    Cancelled,
    Closed,
    DeadlineExceeded,
    GuestError,
    GuestExit,
    GuestTrap,
    HostError,
    OutOfFuel,
    OutOfMemory,
    WrongType,
)
from mighty.budget import Budget, CancelScope, RunContext, Usage, using_context
from mighty.budget import Progress as RunProgress
from mighty.engine import Component, MemoryState, state_from_pages
from mighty.gate import CallHook, Gate
from mighty.instance import Instance
from mighty.sandbox._interpreter import Progress, interpreter_component
from mighty.sandbox._packages import interpreter_with_packages
from mighty.sandbox._snapshot import (
    SnapshotCorrupt,
    SnapshotError,
    SnapshotMismatch,
    decode_snapshot,
    encode_snapshot,
)
from mighty.sandbox._tools import (
    MAX_CONCURRENT_CALLS,
    MAX_CONCURRENT_CALLS_LIMIT,
    MAX_NESTED_RUNS,
    TOOL_HOST,
    Tool,
    ToolHost,
    ToolsProvider,
    cut_text,
    describe_tools,
    json_problem,
    nesting_depth,
    tools_from,
)
from mighty.trace import Recorder
from mighty.wasi import (
    STDERR_SINK,
    STDOUT_SINK,
    DirGrant,
    MemoryDir,
    OutputPolicy,
    Policy,
    WasiProvider,
)

__all__ = [
    "ERROR_KINDS",
    "MAX_ERROR_TEXT",
    "MAX_STARTED_RUNS",
    "Artifact",
    "Busy",
    "Limits",
    "OutputListener",
    "RunError",
    "RunHandle",
    "RunResult",
    "RunUsage",
    "Sandbox",
    "Session",
]

ERROR_KINDS = frozenset(
    {
        "exception",
        "out_of_fuel",
        "out_of_memory",
        "deadline_exceeded",
        "cancelled",
        "output_limit",
        "tool_error",
        "tool_limit",
        "not_allowed",
    }
)
_GUEST_REPORTED = frozenset({"exception", "tool_error", "out_of_memory", "output_limit"})
_MIN_MEMORY = 32 << 20
MAX_ERROR_TEXT = 64 << 10
"""Most UTF-8 bytes of a run error's message, and of its traceback (plus a short note)."""
_MIN_ERROR_TEXT = 512
_INSTANTIATE = Budget(fuel=2_000_000_000, timeout=30.0)
"""Instantiating runs the interpreter's start-up, not user code: its own fuel and time."""
_log = logging.getLogger("mighty.sandbox")

OutputListener = Callable[[str, str], None]
"""``on_output(stream, text)``: ``stream`` is ``"stdout"`` or ``"stderr"``, ``text`` what the code
just wrote to it (decoded as UTF-8, a character split across writes is delivered whole with the
next one, invalid bytes as U+FFFD); or ``"progress"``, a line a tool reported with
``ctx.progress(...)`` (``message`` or ``message (done/total)``, and a newline)."""
MAX_STARTED_RUNS = 64
"""Most runs of one sandbox started with ``Sandbox.start`` and not yet finished."""


class Busy(HostError):
    """Too many runs of this sandbox were started and are still running."""

    kind = "busy"


def _progress_to(on_output: OutputListener | None) -> Callable[[RunProgress], None] | None:
    """A tool's ``ctx.progress`` as the run's ``"progress"`` output stream."""
    if on_output is None:
        return None
    listener = on_output

    def tell(report: RunProgress) -> None:
        text = report.message
        if report.done is not None:
            count = (
                f"{report.done:g}" if report.total is None else f"{report.done:g}/{report.total:g}"
            )
            text = f"{text} ({count})"
        listener("progress", text + "\n")

    return tell


class RunHandle:
    """A run started by :meth:`Sandbox.start`: ``id``, ``status``, ``cancel()``, ``result()``.

    ``status`` is ``"running"`` until the run ends, then ``"ok"``, ``"cancelled"`` or
    ``"failed"`` (the result's error kind says how)."""

    __slots__ = ("_done", "_error", "_result", "context")

    def __init__(self, context: RunContext) -> None:
        self.context = context
        self._done = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None

    @property
    def id(self) -> str:
        return self.context.id

    @property
    def status(self) -> str:
        if not self._done.is_set():
            return "running"
        result = self._result
        if result is None:
            return "failed"
        if result.ok:
            return "ok"
        return (
            "cancelled"
            if result.error is not None and result.error.kind == "cancelled"
            else "failed"
        )

    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self, reason: str = "cancelled by its handle") -> None:
        """Stop the run (and the tools and runs it started); any thread, any time."""
        self.context.stop(reason)

    def result(self, timeout: float | None = None) -> RunResult:
        """Wait for the run's result; ``TimeoutError`` if it is not done within ``timeout``.
        A host failure of the run (not a failure of the code) is raised here."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.id} is still running")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _run(self, work: Callable[[], RunResult], then: Callable[[], None]) -> None:
        try:
            self._result = work()
        except BaseException as exc:  # noqa: BLE001 -- handed to whoever asks for the result
            self._error = exc
        finally:
            then()
            self._done.set()

    def __repr__(self) -> str:
        return f"RunHandle({self.id}, {self.status})"


@dataclass(frozen=True, slots=True)
class Limits:
    """What one run may use. Frozen; ``replace`` returns a changed copy.

    - ``fuel``: wasm fuel (10**10 is about 1 s of pure-Python work in the interpreter);
    - ``memory``: bytes of linear memory, the interpreter included (it needs about 16 MiB);
    - ``timeout``: wall-clock seconds for the run, not counting time spent inside tools;
    - ``output``: bytes of stdout and stderr together shown in ``RunResult.stdout`` and
      ``stderr`` (the view a model reads), and of the result's JSON;
    - ``artifact``: bytes of stdout and stderr together kept whole: output past ``output`` is
      cut from the view but kept, up to this, in ``RunResult.artifacts``; passing it (or
      ``output``, whichever is larger) ends the run with ``output_limit``. The default stays
      below what wasmtime copies in one host call (``LIFT_LIMIT``, ~2.7 MB), so any one write
      under it is whole; ``artifact <= output`` means no artifacts;
    - ``tool_calls``: tool calls per run;
    - ``tool_timeout``: seconds one tool call may take (a ``Tool`` may override it);
    - ``tool_concurrency``: tool calls of the run's async code in flight at once (more wait).
    """

    fuel: int = 10_000_000_000
    memory: int = 128 << 20
    timeout: float = 5.0
    output: int = 1 << 20
    tool_calls: int = 100
    tool_timeout: float = 30.0
    tool_concurrency: int = MAX_CONCURRENT_CALLS
    artifact: int = 2 << 20

    def __post_init__(self) -> None:
        for name in ("fuel", "memory", "output", "tool_calls", "tool_concurrency", "artifact"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WrongType(f"Limits.{name} must be an int, got {type(value).__name__}")
        for name in ("timeout", "tool_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WrongType(f"Limits.{name} must be a number, got {type(value).__name__}")
            if not (value > 0 and math.isfinite(value)):
                raise BadInput(f"Limits.{name} must be a positive number of seconds")
        if self.fuel <= 0:
            raise BadInput(f"Limits.fuel must be positive, got {self.fuel}")
        if self.memory < _MIN_MEMORY:
            raise BadInput(
                f"Limits.memory must be at least {_MIN_MEMORY} bytes (the interpreter alone "
                f"needs about 16 MiB), got {self.memory}"
            )
        if self.output < 0 or self.tool_calls < 0 or self.artifact < 0:
            raise BadInput("Limits.output, Limits.artifact and Limits.tool_calls must be >= 0")
        if not 1 <= self.tool_concurrency <= MAX_CONCURRENT_CALLS_LIMIT:
            raise BadInput(
                f"Limits.tool_concurrency must be in 1..{MAX_CONCURRENT_CALLS_LIMIT}, "
                f"got {self.tool_concurrency}"
            )

    def replace(self, **changes: Any) -> Limits:
        """A copy with the given fields changed (validated like the original)."""
        return replace(self, **changes)

    def budget(self) -> Budget:
        return Budget(fuel=self.fuel, memory=self.memory, timeout=self.timeout)


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: ``kind`` (one of :data:`ERROR_KINDS`), a message, and for exceptions
    the traceback of the user's own frames."""

    kind: str
    message: str
    traceback: str = ""

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message, "traceback": self.traceback}


@dataclass(frozen=True, slots=True)
class RunUsage:
    """What a run used. ``wall_time`` includes ``tool_time`` (which the deadline does not)."""

    fuel: int = 0
    memory_peak: int = 0
    wall_time: float = 0.0
    tool_calls: int = 0
    tool_time: float = 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "fuel": self.fuel,
            "memory_peak": self.memory_peak,
            "wall_ms": round(self.wall_time * 1000, 3),
            "tool_calls": self.tool_calls,
            "tool_ms": round(self.tool_time * 1000, 3),
        }


@dataclass(frozen=True, slots=True)
class Artifact:
    """One output stream kept whole because it went past ``Limits.output``.

    ``name`` is ``"stdout"`` or ``"stderr"``; ``data`` every byte the code wrote to it (up to
    ``Limits.artifact`` for both streams together). ``RunResult.to_json`` refers to it by name,
    size and SHA-256 only: the bytes stay with the host.
    """

    name: str
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def text(self) -> str:
        """The bytes as UTF-8 (invalid sequences as U+FFFD)."""
        return self.data.decode("utf-8", "replace")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended. ``value`` is JSON-compatible data (``None`` on failure).

    ``stdout`` and ``stderr`` show at most ``Limits.output`` bytes together; a stream cut there
    is in ``artifacts`` whole (see :class:`Artifact`).
    """

    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error: RunError | None = None
    usage: RunUsage = field(default_factory=RunUsage)
    artifacts: tuple[Artifact, ...] = ()

    def artifact(self, name: str) -> Artifact | None:
        """The artifact of stream ``name``, if that stream was cut."""
        return next((a for a in self.artifacts if a.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``mty exec --json`` prints (artifacts by reference)."""
        return {
            "ok": self.ok,
            "value": self.value,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": None if self.error is None else self.error.to_json(),
            "usage": self.usage.to_json(),
            "artifacts": [artifact.to_json() for artifact in self.artifacts],
        }


# -- one instance ---------------------------------------------------------------------------


class _Output:
    """The run's stdout and stderr: a view up to ``Limits.output``, the whole up to
    ``Limits.artifact``; passing the larger of the two ends the run.

    ``to_stdout`` and ``to_stderr`` are the policy's sinks, limited sinks in the sense of
    mighty.wasi's capture (``LimitedSink``): the capture asks them how much room is left and
    never grants a write more than one byte past it, so a write that passes the limit arrives
    (and ends the run with ``output_limit``) instead of being cut short by the guest, unseen.

    The view of each stream is a prefix of what is kept of it (the first ``limit`` bytes of the
    two together, in write order), so only the whole is stored. ``listener`` (the run's
    ``on_output``) hears every kept chunk as it is written, on the run's thread, inside the
    guest's write: its time counts against the run's timeout. An exception it raises is logged
    once (``mighty.sandbox``, a warning with its traceback), the listener is not called again
    in that run, and the run goes on: what the code sees and what the trace records do not
    depend on the listener.
    """

    def __init__(self, limit: int, keep: int, host: ToolHost) -> None:
        self.limit = limit
        self.keep = max(limit, keep)
        self.host = host
        self.kept = {"stdout": bytearray(), "stderr": bytearray()}
        self.shown = {"stdout": 0, "stderr": 0}
        self.total = 0
        self.listener: OutputListener | None = None
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self.to_stdout = _Output.Sink(self, "stdout")
        self.to_stderr = _Output.Sink(self, "stderr")

    def reset(
        self,
        listener: OutputListener | None = None,
        limits: tuple[int, int] | None = None,
    ) -> None:
        """Empty for a run; ``limits`` (output, artifact) lower this run's (never raise them:
        the capture under the sinks was sized for the instance's)."""
        if limits is not None:
            self.limit = limits[0]
            self.keep = max(limits)
        self.kept = {"stdout": bytearray(), "stderr": bytearray()}
        self.shown = {"stdout": 0, "stderr": 0}
        self.total = 0
        self.listener = listener
        self._decoders = {}

    def room(self) -> int:
        """Bytes either stream may still write before the run ends."""
        return max(0, self.keep - self.total)

    def write(self, stream: str, chunk: bytes) -> None:
        room = self.keep - self.total
        if room > 0:
            piece = chunk[:room]
            self.kept[stream] += piece
            shown = self.limit - self.shown["stdout"] - self.shown["stderr"]
            if shown > 0:
                self.shown[stream] += min(shown, len(piece))
            if self.listener is not None and piece:
                self._tell(stream, bytes(piece), final=False)
        self.total += len(chunk)
        if self.total > self.keep:
            raise self.host.stop(
                "output_limit",
                f"the code wrote more than {self.keep} bytes to stdout and stderr",
            )

    def finish(self) -> None:
        """Hand the listener what its decoders still hold (a character cut at the end)."""
        if self.listener is not None:
            for stream in list(self._decoders):
                self._tell(stream, b"", final=True)
        self.listener = None

    def _tell(self, stream: str, data: bytes, *, final: bool) -> None:
        listener = self.listener
        if listener is None:
            return
        try:
            decoder = self._decoders.get(stream)
            if decoder is None:
                decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
            text = decoder.decode(data, final)
            if text:
                listener(stream, text)
        except BaseException:  # noqa: BLE001 - a listener's failure must not reach the guest
            # Signals cannot raise here (the call runs under a SignalShield): this is the
            # listener's own exception, and the run does not depend on the listener.
            self.listener = None
            _log.warning("on_output raised; not called again in this run", exc_info=True)

    def view(self, stream: str) -> str:
        return bytes(self.kept[stream][: self.shown[stream]]).decode("utf-8", "replace")

    def artifacts(self) -> tuple[Artifact, ...]:
        return tuple(
            Artifact(stream, bytes(data))
            for stream, data in self.kept.items()
            if len(data) > self.shown[stream]
        )

    class Sink:
        """One stream's sink into the output (a ``LimitedSink``: it reports its room)."""

        def __init__(self, output: _Output, stream: str) -> None:
            self.output = output
            self.stream = stream

        def __call__(self, chunk: bytes, /) -> None:
            self.output.write(self.stream, chunk)

        def room(self) -> int:
            """What the shared limit still allows."""
            return self.output.room()


_GATE: Gate | None = None
_GATE_LOCK = threading.Lock()


def _gate() -> Gate:
    # One gate for every sandbox of the process: the tools provider keeps no state of its own
    # (each instance's tools are in its context), so one linker serves them all.
    global _GATE  # noqa: PLW0603
    with _GATE_LOCK:
        if _GATE is None:
            _GATE = Gate([WasiProvider(), ToolsProvider()])
        return _GATE


@dataclass(frozen=True)
class _Config:
    component: Component
    limits: Limits
    tools: Mapping[str, Tool]
    files: tuple[DirGrant | MemoryDir, ...]
    background_loop: Callable[[], asyncio.AbstractEventLoop]


class _Live:
    """One interpreter instance with its tool host and output capture."""

    def __init__(
        self,
        config: _Config,
        recorder: Recorder | None = None,
        hooks: Sequence[CallHook] = (),
        *,
        memory: MemoryState | None = None,
    ) -> None:
        limits = config.limits
        self.limits = limits
        self.host = ToolHost(
            config.tools,
            max_calls=limits.tool_calls,
            timeout=limits.tool_timeout,
            background_loop=config.background_loop,
            concurrency=limits.tool_concurrency,
        )
        self.run_limits = limits
        self.output = _Output(limits.output, limits.artifact, self.host)
        # The capture keeps what the output keeps: a trace's close record holds the capture's
        # bytes, and replay checks them against every byte the replayed run writes.
        keep = self.output.keep
        policy = Policy(
            stdout=OutputPolicy(cap=keep), stderr=OutputPolicy(cap=keep), dirs=config.files
        )
        self.instance = Instance(
            config.component,
            budget=_INSTANTIATE.replace(memory=limits.memory),
            policy=policy,
            gate=_gate(),
            record=recorder,
            hooks=hooks,
            # A code-mode instance works at once: copy the pages a run writes in one go.
            prefault=True,
            memory=memory,
            slots=[STDOUT_SINK.of(self.output.to_stdout), STDERR_SINK.of(self.output.to_stderr)],
        )
        self.instance.context.put(TOOL_HOST, self.host)
        self.made_from = memory
        """The state the instance was made from (None: fresh from the image)."""
        self.lives = 1
        """How many runs' lives it has had (the pool rewinds it between them)."""
        self.max_lives = _MAX_LIVES + _stagger.randrange(_MAX_LIVES)
        """Lives after which the pool closes it: drawn per instance, so that a pool's instances,
        which serve turn about, do not all retire (and need replacing) at once."""
        self.out = False
        """Taken from its pool and not yet released."""

    @property
    def dead(self) -> bool:
        return self.instance.poisoned is not None

    def close(self) -> None:
        self.instance.close()
        self.host.close()

    def warm(self) -> None:
        """Run the interpreter's start-up and one constant run now, off any caller's path."""
        # The first export call runs the start-up; the run's own work writes its pages.
        result = self.execute(_WARM_CODE, _WARM_INPUTS, None, None)
        if not result.ok:
            raise HostError(f"the interpreter failed to warm up: {result.error}")
        # The first warmed instance teaches the image which pages a run writes (once).
        self.instance.learn_hot_pages()

    def reseed(self) -> None:
        """For an instance made from a warmed state: draw its own entropy now (the state holds
        the ``random`` state of the instance it was captured from), before any user code."""
        result = self.execute(_RESEED_CODE, _WARM_INPUTS, None, None)
        if not result.ok:
            raise HostError(f"the interpreter failed to reseed: {result.error}")

    def execute(
        self,
        code: str,
        payload: bytes,
        context: RunContext | None,
        loop: asyncio.AbstractEventLoop | None,
        on_output: OutputListener | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        """One run in ``context`` (its cancel scope stops the run; its tools' contexts are
        children of it); ``limits`` (at most the instance's, see ``_check_run_limits``) are
        this run's, else the instance's."""
        if context is None:
            context = RunContext.top("run")
        self.host.begin(loop, context)
        limits = limits or self.limits
        self.run_limits = limits
        # Set for every run: a pooled instance's previous run may have had lower ones.
        self.host.max_calls = limits.tool_calls
        self.host.timeout = limits.tool_timeout
        self.host.concurrency = limits.tool_concurrency
        self.output.reset(on_output, (limits.output, limits.artifact))
        try:
            with using_context(context):
                outcome, usage = self.instance.call_with_usage(
                    "run", code, payload, budget=limits.budget(), cancel=context.cancel
                )
        except GuestError as exc:
            self.host.end()
            self.output.finish()
            if isinstance(exc, Cancelled) and exc.signal is not None:
                # A signal (Ctrl-C) is the host's, not something the code did: the run stopped
                # cleanly, and the caller gets the signal, as from Instance.call.
                raise
            kind, message = self._failure(exc)
            return self._result(False, None, RunError(kind, message), exc.usage)
        except BaseException:
            self.host.end()
            self.output.finish()
            raise
        self.host.end()  # calls the code started and never awaited are cancelled now
        self.output.finish()
        if not outcome["ok"]:
            kind = str(outcome["error-kind"])
            text_limit = _error_text_limit(limits.output)
            error = RunError(
                kind if kind in _GUEST_REPORTED else "exception",
                cut_text(str(outcome["message"]), text_limit),
                cut_text(str(outcome["traceback"]), text_limit),
            )
            del outcome  # the guest's texts may be large: drop them now
            return self._result(False, None, error, usage)
        data = bytes(outcome["value"])
        del outcome
        if len(data) > limits.output:
            error = RunError(
                "output_limit",
                f"the result is {len(data)} bytes of JSON, over the {limits.output}-byte limit",
            )
            return self._result(False, None, error, usage)
        checked = check_result(data)
        if isinstance(checked, RunError):
            return self._result(False, None, checked, usage)
        return self._result(True, checked[0], None, usage)

    def _failure(self, exc: GuestError) -> tuple[str, str]:
        stopped = self.host.stopped
        if stopped is not None:
            return stopped.kind, stopped.message
        if isinstance(exc, OutOfFuel):
            return "out_of_fuel", f"the code used all of its {exc.fuel_limit} fuel"
        if isinstance(exc, OutOfMemory):
            return "out_of_memory", (
                f"the code tried to use {exc.requested} bytes of memory; the limit is {exc.limit}"
            )
        if isinstance(exc, DeadlineExceeded):
            return "deadline_exceeded", f"the code ran past its {exc.timeout:g} s timeout"
        if isinstance(exc, Cancelled):
            return "cancelled", f"the run was cancelled: {exc.reason}"
        if isinstance(exc, GuestExit):
            return "exception", (
                f"the code ended the interpreter (os._exit or abort; exit status {exc.code})"
            )
        if isinstance(exc, GuestTrap) and exc.trap_code == "stack_overflow":
            return "exception", "RecursionError: the interpreter's stack overflowed"
        first = exc.message.splitlines()[0] if exc.message else type(exc).__name__
        return "exception", cut_text(f"the interpreter crashed: {first}", MAX_ERROR_TEXT)

    def _result(
        self, ok: bool, value: Any, error: RunError | None, usage: Usage | None
    ) -> RunResult:
        run_usage = RunUsage(
            fuel=usage.fuel if usage is not None else 0,
            memory_peak=usage.memory_peak if usage is not None else 0,
            wall_time=usage.wall_time if usage is not None else 0.0,
            tool_calls=min(self.host.calls, self.run_limits.tool_calls),
            tool_time=self.host.tool_time,
        )
        return RunResult(
            ok=ok,
            value=value,
            stdout=self.output.view("stdout"),
            stderr=self.output.view("stderr"),
            error=error,
            usage=run_usage,
            artifacts=self.output.artifacts(),
        )


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


def _error_text_limit(output: int) -> int:
    """Bytes for each of a run error's message and traceback: half the output limit, at most
    MAX_ERROR_TEXT, and never so few that the error cannot say what happened."""
    return max(_MIN_ERROR_TEXT, min(MAX_ERROR_TEXT, output // 2))


def check_result(data: bytes) -> tuple[Any] | RunError:
    """The value of a result's JSON bytes, or the ``exception`` error saying why they are not
    JSON data: strict UTF-8, JSON syntax, finite numbers, no lone surrogates."""
    try:
        text = data.decode("utf-8")  # strict: refuses encoded surrogates (json.loads does not)
    except UnicodeDecodeError as exc:
        return RunError(
            "exception", f"TypeError: the result is not UTF-8 (byte {exc.start} is invalid)"
        )
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        message = cut_text(str(exc), 1024)
        return RunError("exception", f"TypeError: the result is not JSON data: {message}")
    problem = json_problem(value, "the result")
    if problem is not None:
        return RunError("exception", f"TypeError: {problem}")
    return (value,)


def _encode_inputs(
    inputs: Mapping[str, Any] | None, *, keep: bool, max_value: int, seed: bool = False
) -> bytes:
    """The run's options for the guest: its inputs as globals, whether it keeps a session's
    globals, the result's limit, and with ``seed`` 256 bits from the host's secure random that
    the guest seeds an imported ``random`` with before the code runs (so a rewound instance,
    whose memory holds the same ``random`` state every time, never repeats a sequence)."""
    names = dict(inputs or {})
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            shown = repr(name[:100]) if isinstance(name, str) else type(name).__name__
            raise BadInput(f"input names must be Python identifiers, got {shown}")
    try:
        options: dict[str, Any] = {"globals": names, "keep": keep, "max-value": max_value}
        if seed:
            options["seed"] = os.urandom(32).hex()
        return json.dumps(
            options,
            allow_nan=False,
            separators=(",", ":"),
        ).encode()
    except (TypeError, ValueError) as exc:
        raise BadInput(f"inputs must be JSON-compatible data: {exc}") from None


_RUN_LIMIT_FIELDS = (
    "fuel",
    "memory",
    "timeout",
    "output",
    "tool_calls",
    "tool_timeout",
    "tool_concurrency",
)


def _check_run_limits(limits: Limits, ceiling: Limits) -> None:
    """A run's own limits may lower the sandbox's, never raise them (its pooled instances and
    their output captures were made for the sandbox's)."""
    if not isinstance(limits, Limits):
        raise BadInput(f"limits must be a Limits, got {type(limits).__name__}")
    over = [
        f"{name}={getattr(limits, name)!r} (the sandbox's is {getattr(ceiling, name)!r})"
        for name in _RUN_LIMIT_FIELDS
        if getattr(limits, name) > getattr(ceiling, name)
    ]
    if max(limits.output, limits.artifact) > max(ceiling.output, ceiling.artifact):
        over.append(
            f"artifact={limits.artifact} (the sandbox keeps at most "
            f"{max(ceiling.output, ceiling.artifact)} bytes of output)"
        )
    if over:
        raise BadInput("a run's limits may only be lower than its sandbox's: " + ", ".join(over))


def _check_nesting() -> None:
    depth = nesting_depth()
    if depth > MAX_NESTED_RUNS:
        raise BadInput(
            f"a sandbox run was started from inside a tool {depth} levels deep; runs nest "
            f"through tools at most {MAX_NESTED_RUNS} level(s)"
        )


# -- spares ---------------------------------------------------------------------------------


_WARM_CODE = (
    # The async path too (a tool loop, a timer): code using it then finds its pages written.
    'import asyncio\nawait asyncio.sleep(0)\nx = [1, 2.5, "a", {"b": None}]\nresult = x'
)
_WARM_INPUTS = _encode_inputs(None, keep=False, max_value=1 << 10)
_WARM_GAP = 256 << 10
"""The warmed state copies clean pages between changed ones up to this far apart: it then maps
in 4 ``mmap`` calls instead of ~90 (~0.6 ms less per instance here), for ~10 MB of shared
memory per sandbox instead of ~4 MB (only the pages a run writes are copied per instance)."""
_RESEED_CODE = (
    "import os, random\nrandom.seed(int.from_bytes(os.urandom(32)))\n"
    "os.write(1, b'')\nos.write(2, b'')\nresult = None"
)
"""Run on the pool thread in each instance made from the warmed state, and after each rewind:
seeds ``random`` with 256 bits from ``os.urandom`` (the host's secure random; ``seed()`` with
no argument draws 2,496 bytes, whose crossing into the guest costs ~0.1 ms more for no use:
Mersenne Twister is not a secure generator whatever its seed), and takes the stdout and stderr
streams (an empty write), so that every instance holds them under the same handles before any
user code runs: a rewound instance must hold what the state's instance held."""
_PROBE_CODE = "import os, random\nos.write(1, b'')\nresult = [random.random(), os.getcwd()]"
"""The rewind's one-time check (``_Pool._take_target``): ``os`` calls that go through the WASI
adapter's state, in memory the rewind rewrote."""
# Background threads making instances. One: with two, the runs' own thread and both makers
# share 2 cores, and neither back-to-back latency nor runs/s improved here (load 5-6).
_FILLERS = 1
_MAX_POOL = 64
"""At most this many ready instances per sandbox (each ~0.5 MB resident, see docs/sandbox.md)."""
_MAX_LIVES = 10_000
"""Runs one instance serves at least (rewound between them; at most twice as many, see
``_Live.max_lives``) before it is closed and replaced: whatever a long-lived wasmtime store
accumulates call after call stays bounded. None was seen: the process's resident memory stood
at 151 MiB from 5,000 to 45,000 runs of one instance, each with a tool call. A replacement
costs one run an instance made on its own thread (the pool's thread is making it, ~3 ms): at
1,000 lives that was one run in 250 in a tight loop."""
_stagger = random.Random()  # noqa: S311 - scheduling jitter, not a secret
"""Draws each instance's life limit (host scheduling only: nothing the guest sees)."""
_TAKE_WAIT = 0.002
"""Seconds a run waits for an instance being rewound before it makes its own (see take)."""


class _HandBack:
    """A pooled instance on its way back from a ``run_async`` worker to the pool: kept by the
    worker when its run ends, released by the awaiting task once it has woken (``close``), or
    at once by the worker if that task is already gone (a task destroyed with its loop)."""

    __slots__ = ("_live", "_lock", "_open", "_pool")

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._live: _Live | None = None
        self._open = True

    def keep(self, live: _Live) -> None:
        with self._lock:
            if self._open:
                self._live = live
                return
        self._pool.release(live)

    def close(self) -> None:
        with self._lock:
            self._open = False
            live, self._live = self._live, None
        if live is not None:
            self._pool.release(live)


class _Pool:
    """Fresh instances made and warmed ahead of time, and used ones freed, on a background thread.

    Warming runs the interpreter's one-time start-up (environment, arguments, hash and
    ``random`` seeds: 12 host imports) and one constant run (``_WARM_CODE``) that writes, once,
    the pages every run writes (each first write to a shared image page is a copy-on-write
    fault): the user's run then pays for neither. Warming is the same for every instance and
    involves no user code or data.

    It is done in full once per pool: the first instance's memory, right after warming and
    before it serves any run, is captured (``capture_memory``) as the pool's warmed state, and
    every later instance is instantiated from that state copy-on-write (its start-up and warm
    run already done), then makes one constant run on this thread, ``_RESEED_CODE``: it draws
    the instance's own ``random`` state from the host's secure random (the captured state holds
    the first instance's, which every instance would otherwise replay) and writes the pages a
    run writes, so the user's run takes few faults. The state holds no host resource (a warmed
    guest has opened no stream or directory: checked, else no state is kept) and is per pool,
    so per tools and grants: the guest caches the tool list.

    After its run, an instance made from the warmed state is rewound here, off the caller's
    path, instead of being closed: its linear memory is made to hold again, byte for byte, what
    the first instance made from the state held right after its reseed run (captured once, the
    rewind target), copying back only the pages the instance may have changed
    (``Instance.rewind``: its private pages, which stay private, so the next run takes no
    copy-on-write fault for them), and it is reseeded. What is not linear memory must then be
    as in a fresh instance, so an instance is rewound only when (else it is closed, as before):
    its run returned normally (a trap leaves the wasm stack pointer mid-call: the instance is
    poisoned); its memory did not grow (wasmtime's view of the size cannot shrink); its guest
    holds exactly the resources the target's instance held and was given no other since (the
    component's handle table is then as fresh: the adapter's state in memory names the stdout
    and stderr streams by handle); no tool call of the run still runs (``ToolHost.rewound``);
    the sandbox grants no files (a ``MemoryDir`` is the instance's own, and would keep what a
    run wrote); and it has served fewer runs than its life limit (``_Live.max_lives``). The
    wasm globals need no check: after a call returns they hold what they held before it,
    except the WASI adapter's pointer to its state, which the instance set in its own first
    (reseed) run, at the same address as the target's instance did (the same memory, the same
    deterministic allocation), and the target holds that state there. A rewind that goes wrong
    anyway is caught by the reseed run that follows it (the adapter checks its state's magic
    numbers): that instance is closed and the pool stops rewinding.

    Rejected: prefaulting the state's hot pages at instantiation (``MADV_POPULATE_WRITE``, as
    for the image): the reseed run writes them anyway, and together they cost as much as the
    faults (measured, load 7); reseeding inside the user's run (its faults would move back onto
    the caller's path); one process-wide state per interpreter build (the tool list and the
    granted directories' environment are in the guest's memory: the key would be every input);
    rewinding with ``restore_memory`` (maps the state anew: every page the next run writes
    faults again, which is what a new instance costs); tracking written pages with the kernel's
    soft-dirty bits (clearing them is process-wide: two pools rewinding at once would wipe
    each other's record, and a missed page is a leak between runs).
    """

    def __init__(self, config: _Config, size: int) -> None:
        self._config = config
        self._size = size
        self._ready: deque[_Live] = deque()
        self._used: deque[_Live] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._failed = False
        self._making = 0
        self._out = 0
        """Instances taken and not yet released: they come back to be rewound, so the pool
        does not make others for their places meanwhile (one a caller made on its own thread
        is not counted: it is rewound if there is room when it comes back, else freed)."""
        self._warmed: MemoryState | None = None
        """The memory of the first instance after warming, from which later ones start."""
        self._warm_state = True
        self._rewind_to: tuple[MemoryState, frozenset[tuple[str, int]], int] | None = None
        """The rewind target: the memory of the first instance made from the warmed state right
        after its reseed run, the resources its guest held then, and how many it had made."""
        self._rewind = not config.files
        self.rewinds = 0
        """How many times an instance was rewound to serve again (for tests and benchmarks)."""
        self.made_by_callers = 0
        """How many runs found no instance ready and made their own (for benchmarks)."""
        self._threads: list[threading.Thread] = []
        for index in range(min(size, _FILLERS)):
            thread = threading.Thread(
                target=self._fill, name=f"mighty-sandbox-pool-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def take(self) -> _Live | None:
        """A ready instance, or None (the caller makes its own) when none is ready.

        When none is ready but one is being rewound (or waits to be), the run waits for it,
        ``_TAKE_WAIT`` at most: a rewind takes a quarter of a millisecond, an instance made on
        the caller's thread several (and on a loaded machine the pool's thread falls behind
        the runs it serves: every run then paid for a new instance).
        """
        if self._size <= 0:
            return None
        with self._cond:
            if not self._ready and self._rewind_to is not None:
                self._cond.wait_for(self._ready_soon_or_not, _TAKE_WAIT)
            # The newest first: its pages are likelier still in the CPU's caches.
            live = self._ready.pop() if self._ready else None
            if live is None:
                self.made_by_callers += 1
            if live is not None:
                live.out = True
                self._out += 1
            self._cond.notify_all()
        return live

    def _ready_soon_or_not(self) -> bool:
        """(Under the lock) an instance is ready, or none is on its way back (rewound), or the
        pool is closing: stop waiting."""
        return bool(self._ready) or self._closed or not (self._used or self._making)

    def release(self, live: _Live) -> None:
        """An instance after its run (from :meth:`take` or :meth:`make_now`): rewound or freed
        in the background (freed inline if there is no background thread)."""
        with self._cond:
            if live.out:
                live.out = False
                self._out -= 1
            if self._threads and not self._closed and len(self._used) < _MAX_POOL:
                self._used.append(live)
                self._cond.notify_all()
                return
        live.close()

    def ready(self) -> int:
        """How many warmed instances are waiting."""
        with self._cond:
            return len(self._ready)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while (
                    not self._closed
                    and not self._used
                    and (self._failed or self._held() >= self._size)
                ):
                    self._cond.wait()
                if self._closed:
                    return
                used = self._used.popleft() if self._used else None
                room = self._held() < self._size
                make = room and (used is not None or not self._failed)
                if make:
                    self._making += 1
            live: _Live | None = None
            if used is not None:
                if make and self._rewound(used):
                    live = used
                else:
                    used.close()
            if make and live is None and used is None:
                try:
                    live = self._make()
                except Exception:  # noqa: BLE001 - a run makes its own and reports the failure
                    with self._cond:
                        self._making -= 1
                        self._failed = True
                    continue
            with self._cond:
                if make:
                    self._making -= 1
                if live is None:
                    continue
                if not self._closed:
                    self._ready.append(live)
                    self._cond.notify_all()  # a run may be waiting for it (take)
                    continue
            live.close()
            return

    def _held(self) -> int:
        """Instances ready, being made or rewound, and (while instances are rewound) out serving
        runs (under the lock). A pool that does not rewind makes a replacement as soon as one
        is taken, as the one taken will be closed."""
        out = self._out if self._rewind_to is not None else 0
        return len(self._ready) + self._making + out

    def _rewound(self, live: _Live) -> bool:
        """Rewind ``live`` after its run and reseed it, ready to serve again (see the class);
        False (the caller closes it) when it may not be rewound."""
        target = self._rewind_to
        if (
            target is None
            or live.made_from is None
            or live.made_from is not self._warmed
            or live.lives >= live.max_lives
            or live.dead
        ):
            return False
        state, held, made = target
        instance = live.instance
        if (
            instance.context.made != made
            or instance.holdings() != held
            or not live.host.rewound()
            or not instance.rewind(state)
        ):
            return False
        live.lives += 1
        self.rewinds += 1
        return True

    def _make(self) -> _Live:
        """A fresh instance ready for one run (on the pool thread).

        The first is instantiated from the interpreter's image and warmed (``_Live.warm``); its
        memory, before it serves any run, becomes the pool's warmed state. Every later one is
        instantiated from that state copy-on-write, then reseeded (``_Live.reseed``), which
        also writes now the pages a run writes.
        """
        state = self._warmed
        if state is not None:
            try:
                return self._from_state(state, target=True)
            except GuestError:
                # Never seen; should it happen, the pool goes on the slower way.
                _log.warning("a pooled instance failed from the warmed state", exc_info=True)
                self._warmed = None
        live = _Live(self._config)
        try:
            live.warm()
            if self._warm_state and self._warmed is None:
                self._warm_state = False  # taken once: a failure is not retried
                # Only memory is copied: a guest holding a host resource (a stream, a directory)
                # would hand every instance a handle it does not have.
                if not live.instance.holdings():
                    self._warmed = live.instance.capture_memory(gap=_WARM_GAP)
        except BaseException:
            live.close()
            raise
        return live

    def _from_state(self, state: MemoryState, *, target: bool = False) -> _Live:
        """An instance made from ``state`` and reseeded; with ``target`` (the pool thread), the
        first one's memory becomes the rewind target."""
        live = _Live(self._config, memory=state)
        try:
            live.reseed()
            if target and self._rewind and self._rewind_to is None:
                self._rewind = False  # taken once (on the pool thread): a failure is not retried
                if not self._take_target(live):
                    live.close()
                    return self._from_state(state)
        except BaseException:
            live.close()
            raise
        return live

    def _take_target(self, live: _Live) -> bool:
        """Capture ``live``'s memory (made from the warmed state and reseeded, before any
        user run) as the rewind target, and try it once: a run, a rewind, a run that goes
        through the WASI adapter's state (which the rewind must have kept where the instance
        looks for it). False when that fails: the pool then never rewinds, and ``live`` is
        the caller's to close. Else ``live`` serves afterwards as any rewound instance."""
        instance = live.instance
        target = (instance.capture_memory(exact=True), instance.holdings(), instance.context.made)
        self._rewind_to = target
        try:
            probe = live.execute(_PROBE_CODE, _WARM_INPUTS, None, None)
            if not probe.ok or not self._rewound(live):
                raise HostError(f"the rewind probe failed: {probe.error}")
            live.reseed()
            if not self._rewound(live):
                raise HostError("an instance could not be rewound after its reseed run")
        except (GuestError, HostError):
            self._rewind_to = None
            _log.warning("instances of this pool will not be rewound", exc_info=True)
            return False
        return True

    def make_now(self) -> _Live:
        """An instance for a run that found no ready one, made on the caller's thread: from the
        warmed state (reseeded first) once there is one, else fresh from the image (its
        start-up then runs in the user's call)."""
        state = self._warmed
        live = None
        if state is not None:
            try:
                live = self._from_state(state)
            except GuestError:
                _log.warning("an instance failed from the warmed state", exc_info=True)
        return live if live is not None else _Live(self._config)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._warmed = None  # its memfd goes once the last instance made from it does
            self._rewind_to = None
            left = [*self._ready, *self._used]
            self._ready.clear()
            self._used.clear()
            self._cond.notify_all()
        for live in left:
            live.close()
        # What a filler is making or rewinding is closed by it when it sees the pool closed:
        # wait for that (a make is bounded by its instantiation budget, a rewind is ~1 ms), so
        # that nothing of the pool outlives close().
        me = threading.current_thread()
        for thread in self._threads:
            if thread is not me:
                thread.join()


class _LoopThread:
    """An event loop on its own thread, for async tools called from a synchronous run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="mighty-sandbox-tools-loop", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            # Tool coroutines still running are cancelled (and may clean up) before it stops.
            asyncio.run_coroutine_threadsafe(_shutdown(loop), loop)
            thread.join(timeout=5)
            loop.close()


async def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=2)
    loop.stop()


# -- the public API -------------------------------------------------------------------------


class Sandbox:
    """Runs untrusted Python code, each run in a fresh interpreter instance.

    ``tools``: callables (or :class:`Tool`) the code may call, as a list or a name->callable
    dict. ``limits``: per run (safe defaults). ``files``: directories to grant
    (``DirGrant``, ``MemoryDir``; none by default). ``network``: must be ``None`` (no network).
    ``pool``: fresh instances kept ready, made and warmed on a background thread (0 to make
    each on demand, at most 64; each costs about half a megabyte). ``progress`` receives status
    lines while the interpreter is built on first use. ``packages``: pure-Python distributions
    (installed names or wheel paths) built into a variant of the interpreter, once per set
    (see ``mighty.sandbox._packages``; a ``PackageError`` for a native or missing one).

    Thread-safe: several threads (and ``run_async`` callers) may run code at once; the pool
    serves them all, and no instance ever serves two runs. Close it (or use ``with``) to free
    the pool.
    """

    def __init__(
        self,
        tools: Sequence[Callable[..., Any] | Tool]
        | Mapping[str, Callable[..., Any] | Tool]
        | None = None,
        *,
        limits: Limits | None = None,
        files: Sequence[DirGrant | MemoryDir] = (),
        network: None = None,
        pool: int = 4,
        progress: Progress | None = None,
        packages: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if network not in (None, False):
            raise BadInput("mighty.sandbox grants no network access; pass network=None")
        files = tuple(files)
        for grant in files:
            if not isinstance(grant, DirGrant | MemoryDir):
                raise BadInput(f"files must be DirGrant or MemoryDir, got {type(grant).__name__}")
        self.limits = limits or Limits()
        self.tools = tools_from(tools)
        self._loop = _LoopThread()
        self._config = _Config(
            component=(
                interpreter_with_packages(packages, progress)
                if packages
                else interpreter_component(progress)
            ),
            limits=self.limits,
            tools=self.tools,
            files=files,
            background_loop=self._loop.get,
        )
        if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool <= _MAX_POOL:
            raise BadInput(f"pool must be an int in 0..{_MAX_POOL}, got {pool!r}")
        self._pool = _Pool(self._config, pool)
        self._spares = _Spares(self._config) if pool > 0 else None
        # What a session's interpreter has cached of the tools: snapshots are stamped with it.
        spec = json.dumps([t.spec() for t in self.tools.values()])
        self._tools_digest = hashlib.sha256(spec.encode()).hexdigest()
        self._closed = False
        self._started = threading.BoundedSemaphore(MAX_STARTED_RUNS)
        weakref.finalize(self, _Pool.close, self._pool)
        if self._spares is not None:
            weakref.finalize(self, _Spares.close, self._spares)
        weakref.finalize(self, _LoopThread.close, self._loop)

    @property
    def pool_ready(self) -> int:
        """How many fresh instances are ready right now (the pool refills in the background)."""
        return self._pool.ready()

    def describe_tools(self) -> str:
        """A typed Python stub of every tool (signatures and docstrings) for a model's prompt."""
        return describe_tools(self.tools)

    def run(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        cancel: CancelScope | None = None,
        record: str | Path | None = None,
        on_output: OutputListener | None = None,
        limits: Limits | None = None,
        hooks: Sequence[CallHook] = (),
    ) -> RunResult:
        """Run ``code`` in a fresh interpreter; ``inputs`` become its global variables.

        The value is the ``result`` variable if the code sets one, else the value of its last
        expression. ``cancel`` stops the run from any thread. ``record`` writes a trace of the
        run (replay it with ``mty replay``). ``on_output(stream, text)`` hears stdout and
        stderr as the code writes them (see :data:`OutputListener`), on the run's thread; an
        exception it raises is logged and stops it being called, never the run. ``limits``
        are this run's instead of the sandbox's; each field at most the sandbox's
        (``BadInput`` otherwise): a run can be held tighter, never looser. ``hooks`` wrap
        every import of the run (gate call hooks; ``mighty.eval`` answers imports from a trace
        this way); like a recorded run, a run with hooks gets a fresh instance of its own, not
        a warmed one from the pool.
        """
        context = RunContext.top("run", cancel=cancel, on_progress=_progress_to(on_output))
        return self._run(
            code,
            inputs,
            context=context,
            record=record,
            loop=None,
            on_output=on_output,
            limits=limits,
            hooks=hooks,
        )

    async def run_async(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        cancel: CancelScope | None = None,
        record: str | Path | None = None,
        on_output: OutputListener | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        """``run`` for asyncio hosts: runs on a worker thread; async tools run on this loop.
        Cancelling the awaiting task cancels the run. ``on_output`` is called on the worker
        thread (hand its text to the loop with ``call_soon_threadsafe``)."""
        context = RunContext.top("run", cancel=cancel, on_progress=_progress_to(on_output))
        loop = asyncio.get_running_loop()
        hand_back = _HandBack(self._pool)
        work = functools.partial(
            self._run,
            code,
            inputs,
            context=context,
            record=record,
            loop=loop,
            on_output=on_output,
            limits=limits,
            hand_back=hand_back,
        )
        # The worker thread sees this context: a run from inside a tool knows its depth.
        future = loop.run_in_executor(None, contextvars.copy_context().run, work)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            context.stop("the awaiting task was cancelled")
            await asyncio.wait([future])
            raise
        finally:
            # The instance goes back to the pool now, once this task runs again: released on
            # the worker, its rewind (~0.3 ms on the pool's thread) ran while this loop waited
            # to wake, and the two threads' turns at the GIL delayed the wake by about as much.
            hand_back.close()

    def start(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        cancel: CancelScope | None = None,
        record: str | Path | None = None,
        on_output: OutputListener | None = None,
        limits: Limits | None = None,
    ) -> RunHandle:
        """Start ``run`` on a thread of its own and return its handle at once: ``handle.id``,
        ``handle.status``, ``handle.cancel()``, ``handle.result()``.

        The run is made in the caller's context (a run started by a tool is cancelled with
        the tool's run). At most :data:`MAX_STARTED_RUNS` started runs of one sandbox run at
        once; past it, ``Busy``."""
        if self._closed:
            raise Closed("sandbox is closed")
        if not isinstance(code, str):
            raise BadInput(f"code must be a str, got {type(code).__name__}")
        if not self._started.acquire(blocking=False):
            raise Busy(
                f"this sandbox already has {MAX_STARTED_RUNS} started runs in flight; "
                "wait for one (handle.result()) or cancel one"
            )
        context = RunContext.top("run", cancel=cancel, on_progress=_progress_to(on_output))
        handle = RunHandle(context)
        work = functools.partial(
            self._run,
            code,
            inputs,
            context=context,
            record=record,
            loop=None,
            on_output=on_output,
            limits=limits,
        )
        thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(handle._run, work, self._started.release),
            name=f"mighty-{context.id}",
            daemon=True,
        )
        try:
            thread.start()
        except BaseException:
            self._started.release()
            raise
        return handle

    def session(self) -> Session:
        """A REPL-style session: one interpreter whose globals persist across runs."""
        return Session(self)

    def restore(self, snapshot: bytes | bytearray | memoryview) -> Session:
        """A session that continues from ``snapshot`` (from :meth:`Session.snapshot`, in this
        process or another): the same globals, functions, classes and imported modules.

        The snapshot must come from the same interpreter build and a sandbox with the same
        tools, and its memory must fit this sandbox's ``Limits.memory``; otherwise, or when it
        is truncated or corrupted, :class:`SnapshotError` (``SnapshotMismatch``,
        ``SnapshotCorrupt``, ``SnapshotTooLarge``) says why.
        """
        if self._closed:
            raise Closed("sandbox is closed")
        component = self._config.component
        snap = decode_snapshot(
            snapshot,
            component=component.sha256,
            tools=self._tools_digest,
            memory_limit=self.limits.memory,
        )
        image = component.images[0] if len(component.images) == 1 else None
        if snap.image_length != (image.length if image is not None else 0):
            raise SnapshotMismatch(
                "the snapshot's memory image does not match this interpreter's (another build)"
            )
        try:
            state = state_from_pages(snap.memory_size, image, snap.ranges, snap.data)
        except ValueError as exc:
            raise SnapshotCorrupt(f"the snapshot's memory is not valid: {exc}") from None
        session = Session(self, _start=(state, snap.holdings))
        if self._spares is not None:
            self._spares.want(state)
        return session

    def _run(
        self,
        code: str,
        inputs: Mapping[str, Any] | None,
        *,
        context: RunContext,
        record: str | Path | None,
        loop: asyncio.AbstractEventLoop | None,
        on_output: OutputListener | None = None,
        limits: Limits | None = None,
        hooks: Sequence[CallHook] = (),
        hand_back: _HandBack | None = None,
    ) -> RunResult:
        if self._closed:
            raise Closed("sandbox is closed")
        if not isinstance(code, str):
            raise BadInput(f"code must be a str, got {type(code).__name__}")
        _check_nesting()
        if limits is not None:
            _check_run_limits(limits, self.limits)
        run_limits = limits or self.limits
        payload = _encode_inputs(inputs, keep=False, max_value=run_limits.output, seed=True)
        with self._instance(record, hooks, hand_back) as live:
            return live.execute(code, payload, context, loop, on_output, limits)

    @contextmanager
    def _instance(
        self,
        record: str | Path | None,
        hooks: Sequence[CallHook] = (),
        hand_back: _HandBack | None = None,
    ) -> Iterator[_Live]:
        recorder = Recorder(record) if record is not None else None
        own = recorder is not None or bool(hooks)
        try:
            live = None if own else self._pool.take()
            if live is None:
                live = _Live(self._config, recorder, hooks) if own else self._pool.make_now()
            try:
                yield live
            finally:
                if hand_back is not None and not own:
                    hand_back.keep(live)  # released by the awaiting task when it wakes
                elif not own:
                    self._pool.release(live)  # freed off the caller's path
                else:
                    live.close()  # the trace's close record is written now
        finally:
            if recorder is not None:
                recorder.close()

    def close(self) -> None:
        """Free the spare instances and the tools' event loop. Idempotent."""
        self._closed = True
        self._pool.close()
        if self._spares is not None:
            self._spares.close()
        self._loop.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SESSION_WARM = (
    "import os, sys\nsys.stdout.write(' ')\nsys.stdout.flush()\n"
    "sys.stderr.write(' ')\nsys.stderr.flush()\n"
    "try:\n    os.stat('/')\nexcept OSError:\n    pass\nresult = None"
)
"""A session's first call: the interpreter's start-up, one write to each output stream and one
path lookup (which opens the granted directories), so that the guest takes those handles now,
in this order, in every session instance (a snapshot's memory refers to them by handle number;
see ``Session._begin``)."""
_SESSION_WARM_INPUTS = _encode_inputs(None, keep=False, max_value=1 << 10)

_Start = tuple[MemoryState, frozenset[tuple[str, int]]]
_Held = frozenset[tuple[str, int]]


class _Spare:
    """A started session instance waiting in :class:`_Spares`, and the state it holds."""

    __slots__ = ("held", "holds", "live")

    def __init__(self, live: _Live, held: _Held) -> None:
        self.live = live
        self.held = held
        self.holds: weakref.ref[MemoryState] | None = None
        """The state mapped into it (``restore_memory``), or None: the fresh image."""


def _started(config: _Config, like: MemoryState | None) -> tuple[_Live, _Held]:
    """A session instance after its start-up call, and the host resources its guest holds.
    With ``like``, its memory has that state's size (holding the fresh image), ready for
    ``restore_memory(like)``."""
    blank = None if like is None else state_from_pages(like.size, like.image, (), b"")
    live = _Live(config, memory=blank)
    try:
        result = live.execute(_SESSION_WARM, _SESSION_WARM_INPUTS, None, None)
        if not result.ok:
            raise HostError(f"the interpreter failed to start: {result.error}")
        return live, live.instance.holdings()
    except BaseException:
        live.close()
        raise


class _Spares:
    """Session instances started ahead of time for forks and restores, on a background thread.

    A fork or restore needs an instance whose memory has the state's size and which has made
    the session start-up call (``_started``): about 3 ms, most of a fork. So, for the last
    ``_SPARE_SIZES`` memory sizes asked for, one such instance waits here; a fork takes it and
    only maps the state's pages. Made only for sandboxes with a ``pool``; each costs about
    half a megabyte. They run nothing but the constant start-up call.

    Mapping the state's pages (``restore_memory``: an ``mmap`` per changed range, ~70 for a
    small session, ~0.8 ms) is done here too, ahead of time, for the newest state wanted of
    each size while something else still holds it (a weak reference: a spare never keeps a
    state alive on its own): the next fork of that same state (forking one state several
    times, or restoring one snapshot again) takes a spare that already holds it. A spare
    mapped for an older state is mapped again (``restore_memory`` replaces the whole memory).
    """

    def __init__(self, config: _Config) -> None:
        self._config = config
        self._cond = threading.Condition()
        self._ready: dict[int, _Spare] = {}
        self._wanted: dict[int, MemoryState] = {}  # size -> a blank state of it, newest last
        self._newest: dict[int, weakref.ref[MemoryState]] = {}  # size -> the state to map
        self._failed: set[int] = set()
        self._unmappable: set[int] = set()
        """Sizes whose spares could not be mapped ahead (left to the fork, which reports why)."""
        self._thread: threading.Thread | None = None
        self._closed = False

    def take(self, state: MemoryState) -> tuple[_Live, _Held, bool] | None:
        """A spare of ``state``'s size, its holdings, and whether it holds ``state`` already."""
        with self._cond:
            spare = self._ready.pop(state.size, None)
            if spare is None:
                return None
            # No wake-up of the spares thread here: the fork or restore that takes it says
            # what it wants next (``want``) once it has mapped its state. Made meanwhile, the
            # next spare's mappings contended with that one's for the process's memory map
            # (a 0.13 ms page-map read took up to 3.6 ms beside it).
        return spare.live, spare.held, spare.holds is not None and spare.holds() is state

    def ready(self, size: int) -> bool:
        """Whether a spare of this memory size waits now."""
        with self._cond:
            return size in self._ready

    def mapped(self, state: MemoryState) -> bool:
        """Whether a spare that already holds ``state`` waits now (for tests and benchmarks)."""
        with self._cond:
            spare = self._ready.get(state.size)
            return spare is not None and spare.holds is not None and spare.holds() is state

    def want(self, like: MemoryState) -> None:
        """Keep a spare of ``like``'s memory size from now on, holding ``like`` while it lives
        (made and mapped in the background)."""
        evicted: list[_Spare] = []
        with self._cond:
            if self._closed or like.size in self._failed:
                return
            self._wanted.pop(like.size, None)
            # Only the size and image matter to make one: keep a blank state, and ``like``
            # itself only weakly (the session or its forks hold it while it is worth mapping).
            self._wanted[like.size] = state_from_pages(like.size, like.image, (), b"")
            self._newest[like.size] = weakref.ref(like)
            while len(self._wanted) > _SPARE_SIZES:
                oldest = next(iter(self._wanted))
                del self._wanted[oldest]
                self._newest.pop(oldest, None)
                spare = self._ready.pop(oldest, None)
                if spare is not None:
                    evicted.append(spare)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._fill, name="mighty-sandbox-spares", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        for spare in evicted:
            spare.live.close()

    def _fill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (work := self._next()) is None:
                    self._cond.wait()
                if self._closed or work is None:
                    return
                size, like, spare = work
                target = None if size in self._unmappable else self._newest.get(size)
                state = target() if target is not None else None
            if spare is None:
                try:
                    live, held = _started(self._config, like)
                except Exception:  # noqa: BLE001 - a fork then starts its own and reports it
                    with self._cond:
                        self._failed.add(size)
                        self._wanted.pop(size, None)
                        self._newest.pop(size, None)
                    continue
                spare = _Spare(live, held)
            if state is not None and not self._map(spare, state):
                continue
            with self._cond:
                if not self._closed and size in self._wanted and size not in self._ready:
                    self._ready[size] = spare
                    continue
            spare.live.close()

    def _map(self, spare: _Spare, state: MemoryState) -> bool:
        """Make ``spare`` hold ``state``; False (the spare closed, and spares of its size no
        longer mapped ahead) when it cannot."""
        try:
            spare.live.instance.restore_memory(state)
        except (ValueError, OSError, BadInput):
            # Its memory grew while starting, say: every spare of this size would fail alike.
            # The next is made unmapped; a fork maps it itself, and says why that fails.
            spare.live.close()
            with self._cond:
                self._unmappable.add(state.size)
            return False
        spare.holds = weakref.ref(state)
        return True

    def _next(self) -> tuple[int, MemoryState, _Spare | None] | None:
        """(Under the lock) the next job: a size with no spare (to make), or a spare holding
        another state than the newest one wanted of its size (taken out, to map again)."""
        for size, like in self._wanted.items():
            if size not in self._ready:
                return size, like, None
        for size, spare in self._ready.items():
            target = None if size in self._unmappable else self._newest.get(size)
            state = target() if target is not None else None
            if state is not None and (spare.holds is None or spare.holds() is not state):
                del self._ready[size]
                return size, self._wanted[size], spare
        return None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left = list(self._ready.values())
            self._ready.clear()
            self._wanted.clear()
            self._newest.clear()
            self._cond.notify_all()
        for spare in left:
            spare.live.close()


_SPARE_SIZES = 4


class Session:
    """One interpreter whose globals persist from run to run (explicitly not isolated).

    A run that ends the interpreter (any kind but ``exception`` and ``tool_error``) loses the
    state: the next run starts in a fresh interpreter, and ``restarts`` counts how often.
    ``snapshot()`` saves the state as bytes (``Sandbox.restore`` continues from them, in any
    process with the same interpreter build) and ``fork()`` makes an independent copy.
    """

    def __init__(self, sandbox: Sandbox, *, _start: _Start | None = None) -> None:
        self._sandbox = sandbox
        self._live: _Live | None = None
        self._lock = threading.Lock()
        self.restarts = 0
        self._held: frozenset[tuple[str, int]] = frozenset()
        """The host resources the guest held after its start-up."""
        self._frozen: MemoryState | None = None
        """The memory as of the last snapshot or fork, while no run has changed it."""
        self._frozen_exact = False
        if _start is not None:
            self._live = self._begin(_start)

    def _begin(self, start: _Start | None) -> _Live:
        """A started interpreter: fresh, or holding ``start``'s memory.

        The memory of a snapshot is only valid in an instance whose guest holds the same host
        resources under the same handles, and whose globals (stack pointers) are at rest: so a
        restored instance is made with a memory of the snapshot's size holding the fresh image,
        makes the same start-up call as every session instance (``_started``; a spare made
        ahead of time when there is one), is checked to hold what the snapshot's instance held,
        and only then gets the snapshot's pages, in place.
        """
        sandbox = self._sandbox
        if start is None:
            live, self._held = _started(sandbox._config, None)
            return live
        state, held = start
        spare = sandbox._spares.take(state) if sandbox._spares is not None else None
        if spare is not None:
            live, self._held, mapped = spare
        else:
            (live, self._held), mapped = _started(sandbox._config, state), False
        try:
            if self._held != held:
                raise SnapshotMismatch(
                    "the snapshot's interpreter held other host resources than a new one "
                    f"holds ({sorted(held)} vs {sorted(self._held)})"
                )
            try:
                if not mapped:  # a spare may hold the state already (see _Spares)
                    live.instance.restore_memory(state)
            except ValueError:
                raise SnapshotError(
                    "the interpreter grew its memory while starting; cannot restore"
                ) from None
            self._frozen = state
            self._frozen_exact = False
        except BaseException:
            live.close()
            raise
        return live

    def snapshot(self) -> bytes:
        """The interpreter's whole state as bytes, for :meth:`Sandbox.restore`.

        Taken between runs: the pages of the linear memory that differ from the interpreter's
        image (compressed), stamped with the interpreter build, the tools, and a format
        version, with a checksum. At most the session's memory in size (bounded by
        ``Limits.memory``). Raises :class:`SnapshotError` while the code holds host resources a
        new interpreter would not have (a file it opened and did not close).
        """
        with self._lock:
            state = self._freeze(exact=True)
            return encode_snapshot(
                component=self._sandbox._config.component.sha256,
                tools=self._sandbox._tools_digest,
                memory_size=state.size,
                image_length=state.image.length if state.image is not None else 0,
                holdings=self._held,
                pages=state.pages(),
            )

    def fork(self) -> Session:
        """A new session starting from this one's state; the two then go their own ways.

        The memory is frozen once (a sealed copy of the changed pages) and mapped
        copy-on-write into the new instance: pages neither session writes stay shared.
        """
        with self._lock:
            state = self._freeze()
            start = (state, self._held)
        child = Session(self._sandbox, _start=start)
        if self._sandbox._spares is not None:
            self._sandbox._spares.want(state)  # the next fork of this size finds one ready
        return child

    def _freeze(self, *, exact: bool = False) -> MemoryState:
        if self._live is None:
            self._live = self._begin(None)
        live = self._live
        held = live.instance.holdings()
        if held != self._held:
            extra = sorted({name for name, _rep in held ^ self._held})
            raise SnapshotError(
                "the session's code holds host resources a new interpreter would not have "
                f"({', '.join(extra)}): close open files and streams before a snapshot or fork"
            )
        if self._frozen is None or (exact and not self._frozen_exact):
            # A snapshot holds exactly the changed pages; a fork maps merged ranges.
            self._frozen = live.instance.capture_memory(exact=exact)
            self._frozen_exact = exact
        return self._frozen

    def run(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        cancel: CancelScope | None = None,
    ) -> RunResult:
        """Run ``code`` in the session's globals (``inputs`` are added to them)."""
        if not isinstance(code, str):
            raise BadInput(f"code must be a str, got {type(code).__name__}")
        _check_nesting()
        payload = _encode_inputs(inputs, keep=True, max_value=self._sandbox.limits.output)
        context = RunContext.top("run", cancel=cancel)
        with self._lock:
            if self._live is None:
                self._live = self._begin(None)
            live = self._live
            self._frozen = None
            result = live.execute(code, payload, context, None)
            if live.dead:
                live.close()
                self._live = None
                self.restarts += 1
            return result

    async def run_async(
        self,
        code: str,
        inputs: Mapping[str, Any] | None = None,
        *,
        cancel: CancelScope | None = None,
    ) -> RunResult:
        """``run`` on a worker thread; cancelling the awaiting task cancels the run."""
        scope = cancel or CancelScope()
        loop = asyncio.get_running_loop()
        work = functools.partial(self.run, code, inputs, cancel=scope)
        future = loop.run_in_executor(None, contextvars.copy_context().run, work)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            scope.cancel("the awaiting task was cancelled")
            await asyncio.wait([future])
            raise

    def reset(self) -> None:
        """Forget every global the session's runs defined."""
        with self._lock:
            self._frozen = None
            if self._live is not None:
                try:
                    self._live.instance.call("reset")
                except GuestError:
                    self._live.close()
                    self._live = None

    def close(self) -> None:
        """Free the interpreter. Idempotent."""
        with self._lock:
            if self._live is not None:
                self._live.close()
                self._live = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
