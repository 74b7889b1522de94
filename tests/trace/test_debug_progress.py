"""`mty debug`: next stops at breakpoints, plain help; replays say when they compile."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.trace import Debugger, replay_trace
from mighty.trace._debug import HELP
from tests.trace.test_replay import random_sum, record


def test_next_stops_at_a_breakpoint_before_the_next_call(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """`next` from an export call stops at a breakpoint inside it, not at the next call."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,)), ("run", (1,))])
    debugger = Debugger(trace)
    try:
        assert debugger.start()[-1].startswith("#1 instance 1 step 1: call run(2,)")
        debugger.command("break get-random-u64")
        lines, done = debugger.command("next")
        assert not done
        assert lines == [lines[0]]
        assert lines[0].startswith("#2 instance 1 step 2: wasi:random/random#get-random-u64()")
        debugger.command("delete get-random-u64")
        lines, _ = debugger.command("next")
        assert lines[0].startswith("#5 instance 1 step 5: call run(1,)")
    finally:
        debugger.command("quit")


def test_help_is_plain_text(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """`help` lists every command as plain text, without reST backticks."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (1,))])
    result = CliRunner().invoke(main, ["debug", str(trace)], input="help\nquit\n")
    assert result.exit_code == 0, result.output
    assert "`" not in result.stdout
    for line in HELP:
        assert line in result.stdout
    for verb in ("step", "next", "continue", "break", "delete", "print", "bt", "list", "peek"):
        assert any(line.startswith(verb) for line in HELP)


def test_replay_reports_the_compile_it_waits_for(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay whose component is not compiled yet says so (with the file) and when it is done."""
    trace = tmp_path / "t.bin"
    guest = random_sum(wat, tmp_path, "v1")
    record(trace, guest, [("run", (2,))])
    changed = random_sum(wat, tmp_path, "v1-copy")
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cold-cache"))
    messages: list[str] = []
    replay_trace(trace, substitute=changed, progress=messages.append)
    assert messages[0].startswith(f"compiling {changed} (")
    assert messages[-1].startswith("done in ")
    again: list[str] = []
    replay_trace(trace, substitute=changed, progress=again.append)
    assert again == []  # compiled now: nothing to wait for, nothing said


def test_replay_reports_on_stderr_by_default(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a progress callback (as `mty replay` and `mty debug` call it), stderr hears it."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (1,))])
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cold-cache"))
    result = CliRunner().invoke(main, ["debug", str(trace)], input="continue\nquit\n")
    assert result.exit_code == 0, result.output
    assert "mighty.trace: compiling " in result.stderr
    assert "mighty.trace: done in " in result.stderr
    assert "replay finished: ok" in result.stdout
