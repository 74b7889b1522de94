"""Progress of long waits: one printer at a time, and the sandbox's even without a terminal."""

from __future__ import annotations

import threading
import time

import pytest

from mighty.cli import _progress
from mighty.cli._progress import Waits


def test_library_ticks_silence_the_ticker(capsys: pytest.CaptureFixture[str]) -> None:
    """While the build ticks by itself, only its lines are shown: no '... still' line beside."""
    with Waits(tick=1.0) as show:
        show("building handler.py with componentize-py 0.25.1 ...")
        started = time.monotonic()
        # The build's own tick, as often as this thread runs (every second in a real one), for
        # 2.5 of the ticker's ticks: the ticker wakes twice while the step is open, and the gap
        # between two of these is a scheduling delay, far below its 1 s however loaded the
        # machine (a 0.3 s sleep here could oversleep the whole tick).
        while time.monotonic() - started < 2.5:
            show(f"building handler.py: {time.monotonic() - started:.0f} s")
            time.sleep(0.005)
        show("done in 2.7 s")
    err = capsys.readouterr().err
    assert "still" not in err, err
    assert "mty: building handler.py: " in err
    assert err.splitlines()[0] == "mty: building handler.py with componentize-py 0.25.1 ..."
    assert err.splitlines()[-1] == "mty: done in 2.7 s"


def test_a_silent_step_gets_the_tickers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that says nothing more (a compile) still gets '... still compiling x, N s'."""
    lines: list[str] = []
    seen = threading.Event()

    def echo(message: str) -> None:
        lines.append(message)
        if message.startswith("... still"):
            seen.set()

    monkeypatch.setattr(_progress, "_echo", echo)
    with Waits(tick=0.1) as show:
        show("compiling x.wasm (20.0 MB); cached after this run")
        assert seen.wait(60)
    assert lines[0] == "compiling x.wasm (20.0 MB); cached after this run"
    assert lines[1].startswith("... still compiling x.wasm, ")


def test_sandbox_default_progress_without_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """The first Sandbox()'s build is reported on a stderr that is not a terminal: start, a
    tick at most every 10 s, and the end."""
    from mighty.sandbox import _interpreter

    assert not __import__("sys").stderr.isatty()
    _interpreter._last_tick[0] = 0.0
    _interpreter._default_progress("building interpreter.py with componentize-py 0.25.1 ...")
    for second in range(1, 6):
        _interpreter._default_progress(f"building interpreter.py: {second} s")
    _interpreter._default_progress("done in 5.0 s: the interpreter is ready")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "mighty.sandbox: building interpreter.py with componentize-py 0.25.1 ...",
        "mighty.sandbox: building interpreter.py: 1 s",
        "mighty.sandbox: done in 5.0 s: the interpreter is ready",
    ]
