"""Sessions: one interpreter instance whose globals persist across runs (a REPL), and the
spare instances that make ``fork()`` and ``restore()`` cheap.

A :class:`Session` freezes its memory to fork (a layer over the state it last held when it can;
on the spares thread soon after the fork, or by whichever needs it first: ``_Freeze``),
snapshots it to bytes and restores from them; spares (``_Spares``) are made and mapped ahead on
a thread for the states forked most recently. docs/sandbox.md ("Snapshots and forks") says
what each costs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import threading
import time
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput, GuestError, HostError
from mighty.budget import CancelScope, RunContext
from mighty.engine import MemoryState, state_from_pages
from mighty.sandbox._pool import _Config, _Live
from mighty.sandbox._results import RunResult, _check_nesting, _encode_inputs
from mighty.sandbox._snapshot import SnapshotError, SnapshotMismatch, encode_snapshot

if TYPE_CHECKING:
    from mighty.sandbox._api import Sandbox

__all__ = [
    "Session",
]


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

_Held = frozenset[tuple[str, int]]


class _Freeze:
    """A session's memory as of a fork, frozen once: by the spares thread soon after the fork
    (``_Spares.freeze``), or by whichever needs it first, the session before its instance
    changes again (``Session._settle``) or the fork at its first use (``result``).

    Until it is frozen, the session's memory must not change: every use of the session's
    instance settles it first, under the session's lock. The session holds it only weakly:
    when every fork that holds it is closed or dropped unused, nothing is frozen at all.
    Before, ``fork()`` froze on the caller's thread (1.7-3.5 ms a fork after a run, most of
    it); now the caller pays that only when it uses the session or the fork again before the
    thread is done (the same work, in the same order), and a fork discarded unused pays none.
    """

    __slots__ = ("__weakref__", "_claim", "_done", "_error", "_live", "_spares", "_state")

    def __init__(self, live: _Live | None, state: MemoryState | None = None) -> None:
        self._claim = threading.Lock()
        self._live = live
        """The instance to freeze, until someone claims it (then None)."""
        self._state = state
        self._error: Exception | None = None
        self._done = threading.Event()
        self._spares: _Spares | None = None
        """Told of the state once it is frozen (a spare mapped ahead for the fork)."""
        if state is not None:
            self._done.set()

    def run(self) -> None:
        """Freeze now, unless it is (or was) being frozen elsewhere; never raises (an error is
        kept for ``result``)."""
        with self._claim:
            live, self._live = self._live, None
        if live is None:
            return
        try:
            self._state = live.instance.capture_memory()
        except Exception as exc:  # noqa: BLE001 - kept for the fork's first use
            self._error = exc
        finally:
            self._done.set()
        if self._state is not None and self._spares is not None:
            with contextlib.suppress(OSError):  # no memfd for it: the fork maps its own
                self._spares.want(self._state)

    def result(self) -> MemoryState:
        """The frozen state: frozen here if no one has started, else waited for. Raises
        HostError if it could not be frozen (each time: the session has moved on since)."""
        self.run()
        self._done.wait()
        if self._state is None:
            raise HostError(f"the fork's memory could not be frozen: {self._error}") from (
                self._error
            )
        return self._state


_Start = tuple[MemoryState | _Freeze, _Held]


class _Spare:
    """A started session instance waiting in :class:`_Spares`, and the state it holds."""

    __slots__ = ("held", "holds", "live", "populated")

    def __init__(self, live: _Live, held: _Held) -> None:
        self.live = live
        self.held = held
        self.holds: weakref.ref[MemoryState] | None = None
        """The state mapped into it (``restore_memory``), or None: the fresh image."""
        self.populated: weakref.ref[MemoryState] | None = None
        """The state whose pages were last copied in (``_populate``), or None."""


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
        self._mapping: set[int] = set()
        """Sizes whose spare the thread is making, mapping or populating now (out of
        ``_ready``): ``take`` waits for it, and a populating thread stops early (``_hurry``)."""
        self._hurry: set[int] = set()
        self._unmappable: set[int] = set()
        """Sizes whose spares could not be mapped ahead (left to the fork, which reports why)."""
        self._freezes: collections.deque[weakref.ref[_Freeze]] = collections.deque()
        """Forks' states to freeze, oldest first (before any spare is made or mapped)."""
        self._busy = False
        """Whether the thread is at a job now (for ``idle``)."""
        self._thread: threading.Thread | None = None
        self._closed = False

    def take(self, state: MemoryState) -> tuple[_Live, _Held, bool] | None:
        """A spare of ``state``'s size, its holdings, and whether it holds ``state`` already.
        While the thread makes or maps the spare of that size (a fork used right after it, or
        forks of one state run one after another), that is waited for: making another
        instance beside it on the caller's thread took longer on 2 cores (the two contend)
        than waiting for the one under way."""
        with self._cond:
            deadline = time.monotonic() + _TAKE_WAIT
            while state.size in self._mapping and not self._closed:
                self._hurry.add(state.size)
                left = deadline - time.monotonic()
                if left <= 0:
                    break  # the thread is slow (a starved machine): make one here
                self._cond.wait(left)
            self._hurry.discard(state.size)
            spare = self._ready.pop(state.size, None)
            if spare is None:
                return None
            # No wake-up of the spares thread here: the fork or restore that takes it says
            # what it wants next (``want``) once it has mapped its state. Made meanwhile, the
            # next spare's mappings contended with that one's for the process's memory map
            # (a 0.13 ms page-map read took up to 3.6 ms beside it).
        return spare.live, spare.held, spare.holds is not None and spare.holds() is state

    def freeze(self, job: _Freeze) -> bool:
        """Freeze a fork's state on the thread, soon (False once closed: the caller freezes it).
        Held weakly: a fork closed or dropped before the thread gets to it costs nothing."""
        with self._cond:
            if self._closed:
                return False
            job._spares = self
            self._freezes.append(weakref.ref(job))
            self._start()
            self._cond.notify_all()
        return True

    def idle(self) -> bool:
        """Whether the thread has nothing to do now (for tests and benchmarks)."""
        with self._cond:
            return not self._busy and not self._freezes and self._next(take=False) is None

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
            self._start()
            self._cond.notify_all()
        for spare in evicted:
            spare.live.close()

    def _start(self) -> None:
        """(Under the lock) the thread, started if it is not yet."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._fill, name="mighty-sandbox-spares", daemon=True
            )
            self._thread.start()

    def _fill(self) -> None:
        while True:
            job: _Freeze | None = None
            work: tuple[int, MemoryState, _Spare | None] | None = None
            with self._cond:
                while not self._closed:
                    if self._freezes:  # first: a fork's first use may be waiting for it
                        job = self._freezes.popleft()()
                        if job is not None:
                            break
                    elif (work := self._next()) is not None:
                        break
                    else:
                        self._busy = False
                        self._cond.wait()
                if self._closed:
                    return
                self._busy = True
            if job is not None:
                job.run()  # then ``want``s its state: a spare mapped for it next
            elif work is not None:
                self._serve(work)

    def _serve(self, work: tuple[int, MemoryState, _Spare | None]) -> None:
        """(On the thread) one job of ``_next``: make, map or populate a spare."""
        with self._cond:
            size, like, spare = work
            target = None if size in self._unmappable else self._newest.get(size)
            state = target() if target is not None else None
            self._mapping.add(size)  # made, mapped or populated: ``take`` waits
        try:
            holds = spare.holds() if spare is not None and spare.holds is not None else None
            if spare is not None and state is not None and holds is state:
                self._populate(size, spare, state)
                state = None  # mapped already: back among the ready as it is
            self._make_ready(size, like, spare, state)
        finally:
            with self._cond:
                self._mapping.discard(size)
                self._cond.notify_all()

    def _make_ready(
        self, size: int, like: MemoryState, spare: _Spare | None, state: MemoryState | None
    ) -> None:
        """(On the thread) make or map the spare of ``size`` and put it among the ready."""
        if spare is None:
            try:
                live, held = _started(self._config, like)
            except Exception:  # noqa: BLE001 - a fork then starts its own and reports it
                with self._cond:
                    self._failed.add(size)
                    self._wanted.pop(size, None)
                    self._newest.pop(size, None)
                return
            spare = _Spare(live, held)
        if state is not None and not self._map(spare, state):
            return
        with self._cond:
            if not self._closed and size in self._wanted and size not in self._ready:
                self._ready[size] = spare
                return
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

    def _next(self, *, take: bool = True) -> tuple[int, MemoryState, _Spare | None] | None:
        """(Under the lock) the next job: a size with no spare (to make), a spare holding
        another state than the newest one wanted of its size (taken out, to map again), or
        one holding it whose pages are not copied in yet (taken out, to populate; left in
        without ``take``)."""
        for size, like in self._wanted.items():
            if size not in self._ready:
                return size, like, None
        for size, spare in self._ready.items():
            target = None if size in self._unmappable else self._newest.get(size)
            state = target() if target is not None else None
            if state is not None and (
                spare.holds is None
                or spare.holds() is not state
                or spare.populated is None
                or spare.populated() is not state
            ):
                if take:
                    del self._ready[size]
                return size, self._wanted[size], spare
        return None

    def _populate(self, size: int, spare: _Spare, state: MemoryState) -> None:
        """(On the thread) copy the pages of ``state`` into ``spare`` (which holds it) now, so
        that the first run of the fork that takes it does not fault them in one by one: a
        chunk of ranges at a time, stopping early when a fork wants the spare meanwhile."""
        done = spare.populated() if spare.populated is not None else None
        if state.base is not None and state.base is done:
            # Over the state populated before (only the layer's pages were read in anew):
            # only those are still to copy.
            ranges = [(offset, length) for offset, length, _at in state.ranges]
        else:
            ranges = [(offset, length) for offset, length, _fd, _at in state.mapping]
        spare.populated = weakref.ref(state)  # once, even if stopped: the rest faults as before
        for start in range(0, len(ranges), _POPULATE_CHUNK):
            with self._cond:
                if size in self._hurry or self._closed:
                    return
            try:
                spare.live.instance.populate_memory(ranges[start : start + _POPULATE_CHUNK])
            except (OSError, BadInput):  # never seen: the pages then fault in as before
                return

    def close(self) -> None:
        with self._cond:
            self._closed = True
            left = list(self._ready.values())
            self._freezes.clear()  # each frozen by the session or fork that needs it
            self._ready.clear()
            self._wanted.clear()
            self._newest.clear()
            self._cond.notify_all()
        for spare in left:
            spare.live.close()


_SPARE_SIZES = 4
_TAKE_WAIT = 2.0
"""Seconds a fork's first use waits for the spare under way before making its own instance
(a spare takes ~10 ms to make; this only bounds a thread starved or stuck)."""
_POPULATE_CHUNK = 16
"""Ranges a spare's populate copies between checks for a fork waiting for it (~80 ranges, a
few MB, for a small session's state)."""


class Session:
    """One interpreter whose globals persist from run to run (explicitly not isolated).

    A run that ends the interpreter (any kind but ``exception`` and ``tool_error``) loses the
    state: the next run starts in a fresh interpreter, and ``restarts`` counts how often.
    ``snapshot()`` saves the state as bytes (``Sandbox.restore`` continues from them, in any
    process with the same interpreter build) and ``fork()`` makes an independent copy.
    """

    def __init__(
        self, sandbox: Sandbox, *, _start: _Start | None = None, _lazy: bool = False
    ) -> None:
        self._sandbox = sandbox
        self._live: _Live | None = None
        self._pending: _Start | None = None
        """A fork's state, until its interpreter is first needed (``_now``)."""
        self._lock = threading.Lock()
        self.restarts = 0
        self._held: frozenset[tuple[str, int]] = frozenset()
        """The host resources the guest held after its start-up."""
        self._frozen: MemoryState | None = None
        """The memory as of the last snapshot or fork, while no run has changed it."""
        self._frozen_exact = False
        self._freezing: weakref.ref[_Freeze] | None = None
        """The state the last fork is waiting for, while no use of the instance has settled
        it (``_settle``); held weakly (by the forks that want it)."""
        if _start is not None and _lazy:
            self._pending = _start
        elif _start is not None:
            self._live = self._begin(_start)

    def _now(self) -> _Live:
        """(Under the lock) the session's interpreter, made now if it has none: from the
        fork's state while it has not started, else fresh. The state stays pending if that
        fails (the error is the caller's; nothing of the fork is lost)."""
        if self._live is None:
            self._live = self._begin(self._pending)
            self._pending = None
        return self._live

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
        frozen, held = start
        state = frozen.result() if isinstance(frozen, _Freeze) else frozen
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
        if sandbox._spares is not None:
            # Said after this one's mappings are made (see ``_Spares.take``): a spare for the
            # next fork or restore of this state, the one taken made again.
            sandbox._spares.want(state)
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
        copy-on-write into the new session's instance when it first needs one (its first run,
        snapshot or reset; a spare instance mapped ahead on the spares thread when the
        sandbox has a pool): pages neither session writes stay shared. With a pool the spares
        thread freezes it soon after this returns, or whichever of the two sessions is used
        first does (``_Freeze``); without one it is frozen here. A fork kept as a checkpoint
        and never run costs no instance; one closed before its state was frozen costs
        nothing. An error mapping the state (out of memory, say) is raised by that first use,
        which may be tried again; an error freezing it, by every use of the fork (a
        HostError), or here without a pool.
        """
        spares = self._sandbox._spares
        with self._lock:
            if self._live is None and self._pending is not None:
                start = self._pending  # not started: the new one starts where this one would
            else:
                live = self._now()
                self._check_held(live)
                job = self._freezing() if self._freezing is not None else None
                if self._frozen is not None:
                    start = (self._frozen, self._held)  # nothing ran since: that state still
                elif job is not None:
                    start = (job, self._held)  # forked again, not frozen yet: the same one
                else:
                    job = _Freeze(live)
                    self._freezing = weakref.ref(job)
                    start = (job, self._held)
                    if spares is None or not spares.freeze(job):
                        self._settle()  # no thread to freeze it ahead: now
                        start = (job.result(), self._held)
        child = Session(self._sandbox, _start=start, _lazy=True)
        if spares is not None and isinstance(start[0], MemoryState):
            spares.want(start[0])  # mapped ahead for the child's first use
        return child

    def _settle(self) -> None:
        """(Under the lock) before the instance is used or its memory changes: the state a
        fork is waiting for, frozen now (or waited for, if the spares thread is at it). An
        error freezing it is the fork's to report, at its first use; this session goes on."""
        ref, self._freezing = self._freezing, None
        job = ref() if ref is not None else None
        if job is None:
            return  # none, or every fork that wanted it is gone: nothing to freeze
        with contextlib.suppress(HostError):
            self._frozen = job.result()
            self._frozen_exact = False

    def _check_held(self, live: _Live) -> None:
        held = live.instance.holdings()
        if held != self._held:
            extra = sorted({name for name, _rep in held ^ self._held})
            raise SnapshotError(
                "the session's code holds host resources a new interpreter would not have "
                f"({', '.join(extra)}): close open files and streams before a snapshot or fork"
            )

    def _freeze(self, *, exact: bool = False) -> MemoryState:
        live = self._now()
        self._settle()
        self._check_held(live)
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
            live = self._now()
            self._settle()
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
            self._settle()
            self._frozen = None
            if self._pending is not None:
                self._now()  # a fork not started yet: its globals are the ones to forget
            if self._live is not None:
                try:
                    self._live.instance.call("reset")
                except GuestError:
                    self._live.close()
                    self._live = None

    def close(self) -> None:
        """Free the interpreter. Idempotent."""
        with self._lock:
            self._pending = None
            self._settle()  # a fork made before may still want this memory
            if self._live is not None:
                self._live.close()
                self._live = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
