"""SIGINT and SIGTERM that land where CPython only reports exceptions still end `mty` with 130/143.

Each test runs the `mty` group (``mighty.cli.main``) in a fresh Python with one extra command,
which makes the process signal itself from inside a weakref callback, a ``__del__``, a GC
callback, an unraisable-exception hook or the ``close()`` an unclosed file object's finalizer
calls, goes on working there, and then returns at once. Without the interrupt hook the handler's
exception was printed ("Exception ignored in: ...") and the command exited 0; without the tokens
the handler's exceptions carry, the one raised in ``close()`` vanished (CPython clears it) and
the command exited 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# argv: place, signal number, iterations of work after the signal was sent.
_SCRIPT = r"""
import gc, io, os, signal, sys, weakref

import click

from mighty.cli import main

place, signum, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def land():
    os.kill(os.getpid(), signum)  # the handler runs at the next bytecode boundary: in here
    total = 0
    for i in range(work):
        total += i


class Thing:
    pass


class Doomed:
    def __del__(self):
        land()


def reporting(unraisable):
    land()
    print("reported", type(unraisable.exc_value).__name__, file=sys.stderr)


def fail(_ref):
    raise ValueError("a callback's own failure")


@main.command("land")
def land_command():
    if place == "weakref":
        thing = Thing()
        ref = weakref.ref(thing, lambda _ref: land())
        del thing
    elif place == "del":
        Doomed()
    elif place == "gc":
        def callback(phase, _info):
            if phase == "start":
                gc.callbacks.remove(callback)
                land()
        gc.callbacks.append(callback)
        gc.collect()
    elif place == "hook":
        thing = Thing()
        ref = weakref.ref(thing, fail)
        del thing
    elif place == "set_name":
        # Python 3.11 wraps what __set_name__ raises in a RuntimeError (a dataclass field's
        # descriptor, while a module is imported): the signal's exception is its cause.
        class Landing:
            def __set_name__(self, owner, name):
                land()

        class Owner:
            field = Landing()
    elif place == "io_close":
        # The finalizer of an unclosed file object calls its close() and clears what that
        # raised, reporting nothing (CPython's iobase_finalize outside development mode).
        class Closing(io.RawIOBase):
            def close(self):
                land()
                super().close()

        Closing()
    click.echo("carried on")


if place == "hook":
    # The signal lands while the hook `mty` found reports a callback's own failure.
    sys.unraisablehook = reporting
main(["land"], prog_name="mty")
"""

_SIGNALS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python; a hung run fails the test instead of blocking it."""
    argv = [sys.executable, "-c", code, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@settings(max_examples=15)
@given(
    place=st.sampled_from(["weakref", "del", "gc", "hook", "set_name", "io_close"]),
    signum=st.sampled_from(sorted(_SIGNALS)),
    work=st.integers(0, 20_000),
)
@example(place="io_close", signum=signal.SIGTERM, work=0)
@example(place="io_close", signum=signal.SIGINT, work=5_000)
def test_a_signal_in_an_unraisable_context_is_not_lost(place: str, signum: int, work: int) -> None:
    """Wherever the handler lands, the command exits 128+N with one line and no traceback."""
    proc = _python(_SCRIPT, place, str(int(signum)), str(work))
    err = proc.stderr
    assert proc.returncode == 128 + signum, proc
    assert "Exception ignored" not in err, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == f"mty: error: {_SIGNALS[signum]}", err
    if place == "hook":
        # The exception being reported when the signal came still reached the previous hook.
        assert "reported ValueError" in err, err


_OTHERS = r"""
import sys, weakref

import click

from mighty.cli import main


class Thing:
    pass


def fail(_ref):
    raise {exception}("raised by the callback itself")


@main.command("other")
def other_command():
    thing = Thing()
    ref = weakref.ref(thing, fail)
    del thing
    click.echo("carried on")


main(["other"], prog_name="mty")
"""


@pytest.mark.parametrize("exception", ["ValueError", "KeyboardInterrupt"])
def test_other_unraisable_exceptions_are_reported_as_before(exception: str) -> None:
    """What no signal handler raised (a `raise KeyboardInterrupt` included) is still printed."""
    proc = _python(_OTHERS.format(exception=exception))
    assert proc.returncode == 0, proc
    assert proc.stdout == "carried on\n"
    assert "Exception ignored in: <function fail" in proc.stderr, proc.stderr
    assert f"{exception}: raised by the callback itself" in proc.stderr, proc.stderr


_RESTORED = r"""
import signal, sys

import click

from mighty.cli import main

signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job
hook = sys.unraisablehook


@main.command("look")
def look_command():
    print("during", signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
          signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, sys.unraisablehook is not hook)


main(["look"], prog_name="mty", standalone_mode=False)
print("after", signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
      signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, sys.unraisablehook is hook)
"""


def test_handlers_and_hook_are_put_back_after_the_command() -> None:
    """An ignored SIGINT stays ignored; SIGTERM and the hook are `mty`'s only while it runs."""
    proc = _python(_RESTORED)
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines() == ["during True True True", "after True True True"]


_OUTLIVED = r"""
import os, signal

import click

from mighty.cli import main
from mighty.cli._interrupts import Terminated

kept = []


@main.command("first")
def first_command():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10**7):
            pass
    except Terminated as exc:
        kept.append(exc)  # the command handles its signal, and the exception outlives it
    click.echo("first handled it")


@main.command("second")
def second_command():
    kept.clear()  # freed while another command runs: not a signal of this one
    for _ in range(10**5):
        pass
    click.echo("second ran")


main(["first"], prog_name="mty", standalone_mode=False)
main(["second"], prog_name="mty", standalone_mode=False)
"""


def test_a_signal_exception_freed_after_its_command_owes_nothing() -> None:
    """An exception the handler raised in one command and freed in the next ends neither."""
    proc = _python(_OUTLIVED)
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines() == ["first handled it", "second ran"], proc
