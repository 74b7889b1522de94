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
import contextvars
import functools
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mighty._errors import BadInput, Closed, HostError
from mighty.budget import CancelScope, RunContext
from mighty.budget import Progress as RunProgress
from mighty.engine import state_from_pages
from mighty.gate import CallHook
from mighty.sandbox._interpreter import Progress, interpreter_component
from mighty.sandbox._packages import interpreter_with_packages
from mighty.sandbox._pool import _MAX_POOL, _Config, _HandBack, _Live, _Pool
from mighty.sandbox._results import (
    Limits,
    OutputListener,
    RunResult,
    _check_nesting,
    _check_run_limits,
    _encode_inputs,
)
from mighty.sandbox._sessions import Session, _Spares
from mighty.sandbox._snapshot import SnapshotCorrupt, SnapshotMismatch, decode_snapshot
from mighty.sandbox._tools import Tool, describe_tools, tools_from
from mighty.trace import Recorder
from mighty.wasi import DirGrant, MemoryDir

__all__ = ["MAX_STARTED_RUNS", "Busy", "RunHandle", "Sandbox"]
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
        return Session(self, _start=(state, snap.holdings))  # which asks for spares of it

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
