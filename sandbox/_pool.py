"""The interpreter instances a sandbox runs code in: one :class:`_Live` instance (made, warmed
or reseeded, run, then rewound or closed) and the :class:`_Pool` that keeps them ready on its
own thread.

The first instance is warmed in full and its memory, captured before it serves a run, becomes
the pool's warmed state; every later one is made from that state copy-on-write and reseeded.
After a run an instance is rewound to its state (``Instance.rewind``) when nothing of the run
can be left in it, else closed; each retires after a drawn number of runs. docs/sandbox.md
("Isolation and sessions") and benchmarks/README.md ("Code mode") give the measurements.

Rejected: one instance reset between runs by code run inside it (CPython's state cannot be
reset reliably from within); see ``_api.py``.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import random
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mighty._errors import (
    Cancelled,
    DeadlineExceeded,
    GuestError,
    GuestExit,
    GuestTrap,
    HostError,
    OutOfFuel,
    OutOfMemory,
)
from mighty.budget import Budget, RunContext, Usage, using_context
from mighty.engine import Component, MemoryState
from mighty.gate import CallHook, Gate
from mighty.instance import Instance
from mighty.sandbox._data import cut_text
from mighty.sandbox._results import (
    _GUEST_REPORTED,
    MAX_ERROR_TEXT,
    Artifact,
    Limits,
    OutputListener,
    RunError,
    RunResult,
    RunUsage,
    _encode_inputs,
    _error_text_limit,
    check_result,
)
from mighty.sandbox._tools import TOOL_HOST, Tool, ToolHost, ToolsProvider
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

__all__: list[str] = []
_INSTANTIATE = Budget(fuel=2_000_000_000, timeout=30.0)
"""Instantiating runs the interpreter's start-up, not user code: its own fuel and time."""
_log = logging.getLogger("mighty.sandbox")


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
