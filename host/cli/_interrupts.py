"""Ctrl-C and SIGTERM while a command runs: an exception at a safe point, never a lost signal.

While ``mty`` runs a command (:func:`interruptible`), SIGINT raises ``KeyboardInterrupt`` and
SIGTERM raises :class:`Terminated`, and the command's error handling turns either into one line
and exit 130 or 143. Python runs the handler at the next bytecode boundary of the main thread,
which may lie inside a ``__del__``, a weakref callback (importlib's module locks have one) or a
``gc.callbacks`` entry. What those raise, CPython only reports to ``sys.unraisablehook``: by
default "Exception ignored in: ..." and a traceback, after which the code goes on as if no
signal had come.

So while a command runs, an unraisable-exception hook takes the exceptions the handler raised
(recognised by the handler's own frame at the tip of their traceback; every other one goes to
the previous hook unchanged) and *owes* their signal: a helper thread sends it again once the
main thread is out of the hook, and the handler raises it at the next boundary there (one more
such callback owes it again; ordinary code gets the exception). The finalizer or callback that
was interrupted stays cut short, as any code a signal interrupts does. A handler
that finds itself running inside the hook (a signal arriving while an unraisable is reported)
owes its signal the same way instead of raising there. Owing is an attribute write and a byte
written to a pipe: no lock, no thread started, nothing that could deadlock or recurse from a
handler. A command that is about to return while a signal is owed waits for it, so that it ends
with 130 or 143 and not with 0. One mechanism for every such place, ``__del__`` included.

CPython also drops some exceptions without reporting them at all: an unclosed file object's
finalizer calls its ``close()`` and clears whatever that raised (``iobase_finalize``, outside
development mode), and a cold run of the suite lost SIGTERMs with the handler last run inside an
import, no hook called. So each exception the handler raises carries a token (in its
``__dict__``): when the exception is freed while no other one of the handler's is alive, the
command still runs and did not end for a signal (:func:`exiting_for_signal`, which the command's
error handling calls), and nothing reported it to the hook, the exception was dropped, and its
token's finalizer owes the signal as the hook does. Wherever CPython drops it, the next safe
point raises it again.

Rejected:
- recognising finalizer frames by name (``__del__``) and re-sending from a timer there: weakref
  and GC callbacks have no recognisable frame, a command that finished within the timer's delay
  exited 0 with the signal lost, and starting a thread from a handler can deadlock on the locks
  of ``threading`` that the interrupted code holds;
- re-sending from the hook itself (``os.kill``): the handler runs at the very next check, inside
  the hook, and re-sending from there recurses;
- ``PyThreadState_SetAsyncExc`` from the hook: raised at the next check, wherever that is, the
  hook included.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import CodeType, FrameType
from typing import Any

__all__ = ["Terminated", "exiting_for_signal", "interruptible", "signal_behind"]

# How long a command that is about to return waits for an owed signal, at most; then it
# raises the signal's exception itself (the helper thread is gone, which should not happen).
_SETTLE_SECONDS = 2.0
_POLL_SECONDS = 0.001


class Terminated(BaseException):
    """SIGTERM arrived: raised by the handler ``mty`` installs, to end like Ctrl-C does."""


class _State:
    """The process's interrupt state while a command runs (written by the main thread)."""

    depth = 0  # nested interruptible() blocks; the outermost installs and restores
    handlers: dict[int, Any] = {}  # noqa: RUF012 - one mutable state object by design
    previous_hook: Any = None
    owed: int | None = None  # a signal whose exception was swallowed, to be raised again
    owes = 0  # how many times a signal was owed: the helper's "something new" counter
    in_hook = 0  # >0 while the main thread runs the hook (a hint for the helper)
    wake: int | None = None  # write end of the helper's pipe
    helper: threading.Thread | None = None
    # Where the handler last ran (its caller and up to eleven more frames, innermost first):
    # evidence for a lost signal (tests/budget/test_signals.py prints it). Written only when a
    # signal comes.
    last_ran: str = ""
    live = 0  # exceptions the handler raised that are still alive (their tokens)
    exiting = False  # the command is ending for a signal: nothing is owed any more
    command = 0  # counts installs: a token outliving its command (kept by a test) owes nothing


class _Token:
    """Rides on each exception the handler raises: freed with it; if that exception did not end
    the command, it was dropped (see the module docstring) and its signal is owed."""

    __slots__ = ("command", "reported", "signum")

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.command = _State.command
        self.reported = False  # the hook took the exception (and owed the signal itself)
        _State.live += 1

    def __del__(self) -> None:
        if self.command != _State.command:
            return  # it outlived its command
        _State.live -= 1
        if self.reported or _State.live or _State.exiting or _State.wake is None:
            return
        _owe(self.signum)


_CARRIED = "_mty_signal_token"  # the key in the exception's __dict__


def _exception_for(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGINT raises KeyboardInterrupt, SIGTERM Terminated; inside the hook, the signal is owed."""
    # From the caller: the shield's deferring handler (engine._signals), or the interrupted code.
    _State.last_ran = f"{signum} in {_where(sys._getframe(1))}"
    if _within(frame, _unraisable.__code__):
        _owe(signum)
        return
    _State.owed = None
    # Not kept in a local: this frame is in the exception's traceback, and a local naming the
    # exception would make a cycle that only the cyclic collector frees (and its token with it).
    raise _carrying_token(signum)


def _carrying_token(signum: int) -> BaseException:
    exc = _exception_for(signum)
    exc.__dict__[_CARRIED] = _Token(signum)
    return exc


def exiting_for_signal() -> None:
    """The command is ending because of a signal (its exit status says so): from here on no
    freed exception of the handler's owes its signal again."""
    _State.exiting = True
    _State.owed = None


def _within(frame: FrameType | None, code: CodeType) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _where(frame: FrameType | None, depth: int = 12) -> str:
    """``frame`` and its callers, as ``function:line``, importlib's own frames left out (no
    references kept)."""
    names: list[str] = []
    while frame is not None and len(names) < depth:
        code = frame.f_code
        if not code.co_filename.startswith("<frozen importlib"):
            names.append(f"{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(names)


def _owe(signum: int) -> None:
    """Have ``signum`` sent again once the main thread is out of the hook. Never raises."""
    _State.owed = signum
    _State.owes += 1
    wake = _State.wake
    if wake is not None:
        with suppress(OSError):  # full (the helper has plenty to do) or closed (uninstalled)
            os.write(wake, bytes([signum]))


def _signal_of(exc: BaseException | None) -> int | None:
    """The signal whose handler raised ``exc``, or None when something else raised it."""
    if not isinstance(exc, KeyboardInterrupt | Terminated):
        return None
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_frame.f_code is not _on_interrupt.__code__:
        return None  # raised by other code (`raise KeyboardInterrupt` in a finalizer)
    return signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM


def signal_behind(exc: BaseException) -> int | None:
    """The signal whose handler raised what ``exc`` wraps (its ``__cause__``/``__context__``
    chain, a few links deep), or None. Python 3.11 turns what a ``__set_name__`` raises into a
    ``RuntimeError`` (a dataclass field's descriptor, while a module is imported), so a Ctrl-C
    landing there would come out as that error and a traceback."""
    seen: BaseException | None = exc
    for _ in range(8):
        seen = seen.__cause__ or seen.__context__ if seen is not None else None
        if seen is None:
            return None
        signum = _signal_of(seen)
        if signum is not None:
            return signum
    return None


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` while a command runs: the handler's exceptions are owed, silently."""
    # Counted on the main thread only, the one whose handlers run: `+=` from two threads at
    # once could lose a count and leave the helper waiting for good.
    main = threading.get_ident() == threading.main_thread().ident
    _State.in_hook += main
    try:
        signum = _signal_of(unraisable.exc_value)
        if signum is None:
            _State.previous_hook(unraisable)
        else:
            token = unraisable.exc_value.__dict__.get(_CARRIED)
            if isinstance(token, _Token):
                token.reported = True  # owed here; its end owes nothing more
            _owe(signum)
    finally:
        _State.in_hook -= main


def _helper(read_end: int) -> None:
    """Send the owed signal again for each byte in the pipe (one per owing), until EOF."""
    try:
        while os.read(read_end, 1):
            _send_owed()
    except OSError:
        pass
    finally:
        os.close(read_end)


def _send_owed() -> None:
    while _State.in_hook and _State.wake is not None:
        time.sleep(_POLL_SECONDS)
    owed = _State.owed
    if owed is None or _State.wake is None:
        return  # raised already (several bytes for one owing), or the command is over
    seen = _State.owes
    os.kill(os.getpid(), owed)
    # One send per owing: the handler either raises (nothing is owed any more) or is swallowed
    # again and owes anew, which the next byte in the pipe announces. Sending again before
    # that could raise a second exception while the first one is being reported.
    while _State.wake is not None and _State.owed is not None and _State.owes == seen:
        time.sleep(_POLL_SECONDS)


def _settle() -> None:
    """Before a command returns: an owed signal is raised here, at the latest."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    while _State.owed is not None and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)  # the helper's signal interrupts this; the handler raises
    signum = _State.owed
    if signum is not None:
        _State.owed = None
        raise _exception_for(signum)


def _install() -> bool:
    if threading.get_ident() != threading.main_thread().ident:
        return False  # click invoked from a test's thread: no handler to change
    try:
        _take_over()
    except BaseException:
        _restore()
        raise
    return True


def _take_over() -> None:
    _State.handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _on_interrupt)
    # Ctrl-C only where Python's own handler would raise: an ignored SIGINT (a background job)
    # or an embedding program's handler stays as it is.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _State.handlers[signal.SIGINT] = signal.signal(signal.SIGINT, _on_interrupt)
    _State.owed = None
    _State.exiting = False
    _State.command += 1
    _State.live = 0
    _State.previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    _State.wake = write_end
    helper = threading.Thread(target=_helper, args=(read_end,), name="mty-interrupts", daemon=True)
    try:
        helper.start()
    finally:
        if helper.ident is None:  # it never started: the read end is still ours
            os.close(read_end)
    _State.helper = helper


def _restore() -> None:
    # Only what is still ours: a command may have installed its own handlers (mty run), and a
    # signal's exit ignores further signals (a second Ctrl-C must not print a traceback).
    for signum, previous in _State.handlers.items():
        if signal.getsignal(signum) is _on_interrupt:
            signal.signal(signum, previous)
    _State.handlers = {}
    if sys.unraisablehook is _unraisable and _State.previous_hook is not None:
        sys.unraisablehook = _State.previous_hook
    _State.previous_hook = None
    wake, _State.wake = _State.wake, None
    if wake is not None:
        os.close(wake)  # the helper reads EOF and ends
    helper, _State.helper = _State.helper, None
    if helper is not None:
        helper.join()


@contextmanager
def interruptible() -> Iterator[None]:
    """While open (on the main thread): SIGINT and SIGTERM raise, and are never lost.

    ``KeyboardInterrupt`` or :class:`Terminated` comes out of the block, raised where the main
    thread was, or at the next safe point when that was a finalizer or a weakref or GC callback
    (see the module docstring). Off the main thread nothing changes. Blocks nest.
    """
    outermost = _State.depth == 0 and _install()
    _State.depth += outermost
    try:
        yield
    except SystemExit:
        # A command that exits (with its own status) while a signal is owed ends as the
        # signal says: the user asked it to stop.
        if outermost:
            _settle()
        raise
    else:
        if outermost:
            _settle()
    finally:
        if outermost:
            _State.depth -= 1
            _restore()
