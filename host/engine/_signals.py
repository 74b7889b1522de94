"""Signals while wasmtime runs Python callbacks: handlers run, their exceptions wait.

Python runs a signal's handler in the main thread at the next bytecode boundary. While the main
thread is inside a guest call, the next bytecode is a ctypes callback that wasmtime entered (the
epoch check, a host function, the memory creator). A handler that raises there, as the default
SIGINT handler does with ``KeyboardInterrupt``, makes the exception escape the callback: ctypes
prints "Exception ignored", hands wasmtime an uninitialised return value, and wasmtime frees
a garbage pointer (glibc's "double free or corruption", exit 134).

So while a guest call runs on the main thread, :class:`SignalShield` wraps every Python-level
signal handler in one that runs the original, catches whatever it raises, keeps the first such
exception and tells the shield's listener (the budget layer cancels the call at its next epoch
tick). A listener that joins after a handler raised in the same outermost block hears of it as it
joins: Instance.call is shielded as a whole, and a signal that came while its Python prepared the
call (the first call's codecs take milliseconds) was kept but heard by no one, so the guest call
then ran to its deadline before the kept exception came out (`mty exec` lost about one SIGTERM in
20-40 at load). A handler that does not raise behaves exactly as before. When the outermost
shield closes, the original handlers are back and the kept exception is the caller's to raise,
outside every callback.

Rejected:
- catching ``BaseException`` in every callback alone: the exception would still be raised
  in the middle of a host function (a trace record half written, a WASI stream half updated);
  the callbacks catch it anyway, as the last line of defence;
- installing the wrappers once for the life of the process: ``signal.getsignal`` would lie to
  everyone else (asyncio installs its own Ctrl-C handling only when it sees the default one);
- blocking signals with ``pthread_sigmask``: Python handlers would not run at all during a long
  call, so nothing would notice the Ctrl-C until the call ended.
"""

from __future__ import annotations

# The C module under `signal`: `signal.signal` converts to and from enums on every call
# (4 us; 0.2 us here), and a guest call swaps handlers twice.
import _signal  # type: ignore[import-not-found]  # no stubs: same functions as `signal`
import contextlib
import functools
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, ParamSpec, TypeVar

__all__ = ["SignalShield", "shielded"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# Signals whose Python handlers commonly raise to stop a program. Others keep their handlers.
_CANDIDATES: tuple[int, ...] = tuple(
    int(getattr(signal, name))
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGALRM", "SIGUSR1", "SIGUSR2")
    if hasattr(signal, name)
)
_MAIN = threading.main_thread()
# Compared with ``_thread.get_ident()`` (a C call) on every guest call; ``threading``'s own
# ``current_thread()`` and ``Thread.ident`` are Python frames. A fork's child gets its own.
_MAIN_IDENT = threading.get_ident() if _MAIN is threading.current_thread() else _MAIN.ident
_Handler = Callable[[int, FrameType | None], Any]
_Listener = Callable[[int], None]


class _State:
    """The main thread's shield state (only the main thread ever touches it)."""

    depth = 0
    saved: dict[int, _Handler] = {}  # noqa: RUF012 - one mutable state object by design
    listeners: list[_Listener] = []  # noqa: RUF012
    pending: BaseException | None = None
    signum: int | None = None


def _after_fork() -> None:
    # A child forked by the main thread keeps it (threading gives it the child's ident); one
    # forked by another thread has a new main thread, which shields leave alone, as
    # ``threading.current_thread() is _MAIN`` did.
    global _MAIN_IDENT  # noqa: PLW0603 - one per process
    _MAIN_IDENT = _get_ident() if threading.main_thread() is _MAIN else -1


_get_ident = threading.get_ident
os.register_at_fork(after_in_child=_after_fork)


def _deferring(signum: int, frame: FrameType | None) -> None:
    original = _State.saved.get(signum)
    try:
        if original is signal.default_int_handler:
            raise KeyboardInterrupt
        if original is not None:
            original(signum, frame)
    except BaseException as exc:  # noqa: BLE001 - kept and raised once outside the callbacks
        if _State.pending is None:
            _State.pending = exc
            _State.signum = signum
        for listener in list(_State.listeners):
            # A listener must not undo the deferral by raising in its turn.
            with contextlib.suppress(BaseException):
                listener(signum)


class SignalShield:
    """While open on the main thread, signal handlers cannot raise into a ctypes callback.

    ``with SignalShield(on_signal) as shield: ...``: ``on_signal(signum)`` is called (inside
    whatever callback was running) when a handler raised, or on entry when one raised earlier
    in an enclosing shield's block (that exception is still kept, so what this block guards
    must stop too); after the block, ``shield.pending`` holds that exception (the first one,
    if several came) and ``shield.signum`` its signal, for the caller to raise. Off the main
    thread the shield does nothing: Python runs handlers only in the main thread. Shields nest;
    the outermost restores the handlers.
    """

    __slots__ = ("_active", "_listener", "pending", "signum")

    def __init__(self, on_signal: _Listener | None = None) -> None:
        self._listener = on_signal
        self._active = False
        self.pending: BaseException | None = None
        self.signum: int | None = None

    def run(self, fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """``fn(*args, **kwargs)`` under this shield; then what a signal's handler raised.

        When ``fn`` itself stopped because of the signal (a call ``Cancelled`` with reason
        ``"interrupted"``), that is what comes out for Ctrl-C; otherwise the handler's own
        exception does (a ``SystemExit`` from a SIGTERM handler), with ``fn``'s failure as its
        context. A signal that came after ``fn``'s last check still counts: it is raised after
        ``fn`` returned.
        """
        if _get_ident() != _MAIN_IDENT:
            return fn(*args, **kwargs)  # Python runs handlers on the main thread only
        listener = self._listener
        if _State.depth:
            # Nested: the outermost shield defers the handlers and keeps what they raise; this
            # one only adds its listener for the while (what __enter__/__exit__ do, inline).
            if listener is None:
                return fn(*args, **kwargs)
            listeners = _State.listeners
            listeners.append(listener)
            _State.depth += 1
            if _State.signum is not None:
                _tell_late(listener, _State.signum)
            try:
                return fn(*args, **kwargs)
            finally:
                _State.depth -= 1
                listeners.remove(listener)
        try:
            with self:
                result = fn(*args, **kwargs)
        except BaseException as error:
            pending = self.pending
            if pending is None:
                raise
            if isinstance(pending, KeyboardInterrupt) and getattr(error, "reason", None) == (
                "interrupted"
            ):
                # The cancellation stands for the Ctrl-C, and keeps it as its cause (`mty` tells
                # a dropped signal exception by its end: mighty.cli._interrupts).
                if error.__cause__ is None:
                    error.__cause__ = pending
                raise
            raise pending from error
        if self.pending is not None:
            raise self.pending
        return result

    def __enter__(self) -> SignalShield:
        if _get_ident() != _MAIN_IDENT:
            return self
        self._active = True
        if self._listener is not None:
            _State.listeners.append(self._listener)
        if _State.depth == 0:
            _State.pending = None
            _State.signum = None
            for signum in _CANDIDATES:
                current = _signal.getsignal(signum)
                if callable(current) and current is not _deferring:
                    _State.saved[signum] = current
                    _signal.signal(signum, _deferring)
        _State.depth += 1
        if self._listener is not None and _State.signum is not None:
            _tell_late(self._listener, _State.signum)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        self._active = False
        if self._listener is not None:
            _State.listeners.remove(self._listener)
        _State.depth -= 1
        if _State.depth == 0:
            for signum, handler in _State.saved.items():
                # Only put back what we replaced: the guarded code may have installed its own.
                if _signal.getsignal(signum) is _deferring:
                    _signal.signal(signum, handler)
            _State.saved = {}
            self.pending, _State.pending = _State.pending, None
            self.signum, _State.signum = _State.signum, None
        # An inner shield leaves the exception to the outermost: it is raised once.


def _tell_late(listener: _Listener, signum: int) -> None:
    """A listener whose block begins after a handler raised (in the outermost shield's block,
    which keeps the exception until it closes) hears of it at once: what it guards (a guest call
    that starts after the signal came) is stopped like one the signal interrupted, instead of
    running to its end while the kept exception waits."""
    with contextlib.suppress(BaseException):  # as in _deferring: a listener must not raise
        listener(signum)


def shielded(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` under its own :class:`SignalShield` (see :meth:`SignalShield.run`).

    For whole operations that create and drop wasmtime objects (loading a component, making an
    instance, a call): a handler that raised inside one of their finalizers (``__del__``)
    would be printed as "Exception ignored" and lost, and a Ctrl-C with it.
    """

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if _get_ident() != _MAIN_IDENT or _State.depth:
            return fn(*args, **kwargs)  # no shield to open (see SignalShield.run)
        return SignalShield().run(fn, *args, **kwargs)

    return wrapper
