"""The sandbox API: results, inputs, sessions, files, record and replay, cancellation, async, CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import mighty.sandbox
from mighty.sandbox import CancelScope, DirGrant, Limits, MemoryDir, RunResult, Sandbox
from tests.sandbox._helpers import assert_clean, failed, json_values


def test_public_names() -> None:
    """The public API is exactly these names."""
    assert sorted(mighty.sandbox.__all__) == sorted(
        [
            "ERROR_KINDS",
            "MAX_STARTED_RUNS",
            "Artifact",
            "Busy",
            "CancelScope",
            "DirGrant",
            "Limits",
            "MemoryDir",
            "OutputListener",
            "PackageError",
            "Progress",
            "RunContext",
            "RunError",
            "RunHandle",
            "RunResult",
            "RunUsage",
            "Sandbox",
            "Session",
            "SnapshotCorrupt",
            "SnapshotError",
            "SnapshotMismatch",
            "SnapshotTooLarge",
            "Tool",
            "ToolHost",
            "current_context",
            "interpreter_component",
        ]
    )


def test_limits_have_safe_defaults_and_validate() -> None:
    """Limits default to bounded values and refuse nonsense."""
    limits = Limits()
    assert limits.timeout <= 10 and limits.memory <= 256 << 20 and limits.output <= 1 << 20
    assert limits.replace(timeout=1.0).timeout == 1.0
    with pytest.raises(ValueError, match="memory"):
        Limits(memory=1 << 20)
    with pytest.raises(ValueError, match="timeout"):
        Limits(timeout=0)
    with pytest.raises(TypeError):
        Limits(fuel=1.5)  # type: ignore[arg-type]


def test_run_result_to_json_shape() -> None:
    """to_json has exactly the fields mty exec --json prints."""
    document = RunResult(ok=True, value=[1]).to_json()
    assert set(document) == {"ok", "value", "stdout", "stderr", "error", "usage", "artifacts"}
    assert document["artifacts"] == []
    assert set(document["usage"]) == {"fuel", "memory_peak", "wall_ms", "tool_calls", "tool_ms"}
    json.dumps(document)


@pytest.mark.slow
def test_result_variable_and_last_expression(sandbox: Sandbox) -> None:
    """The value is `result` when set, else the last expression, else None."""
    assert sandbox.run("result = 1 + 1").value == 2
    assert sandbox.run("x = 3\nx * 2").value == 6
    assert sandbox.run("result = 'r'\n5").value == "r"
    assert sandbox.run("x = 1").value is None
    assert sandbox.run("").ok


@pytest.mark.slow
def test_stdout_stderr_and_usage(sandbox: Sandbox) -> None:
    """Output is captured per run, and usage is reported."""
    result = sandbox.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert result.ok
    assert (result.stdout, result.stderr) == ("out\n", "err\n")
    assert result.usage.fuel > 0 and result.usage.memory_peak > 0 and result.usage.wall_time > 0


@pytest.mark.slow
def test_exception_traceback_shows_user_frames_only(sandbox: Sandbox) -> None:
    """An exception reports its type, message and a traceback of the user's frames only."""
    result = failed(sandbox.run("def f():\n    raise ValueError('no')\n\nf()"), "exception")
    assert result.error is not None
    assert result.error.message == "ValueError: no"
    assert 'File "<sandbox>", line 4, in <module>' in result.error.traceback
    assert "raise ValueError('no')" in result.error.traceback
    assert "interpreter.py" not in result.error.traceback


@pytest.mark.slow
def test_syntax_error(sandbox: Sandbox) -> None:
    """A syntax error is an exception pointing at the line."""
    result = failed(sandbox.run("x = (1,"), "exception")
    assert result.error is not None
    assert "SyntaxError" in result.error.message


@pytest.mark.slow
def test_inputs_become_globals(sandbox: Sandbox) -> None:
    """Inputs are injected as globals; non-JSON inputs are refused host-side."""
    assert sandbox.run("a + len(b)", {"a": 1, "b": [1, 2]}).value == 3
    with pytest.raises(ValueError, match="JSON"):
        sandbox.run("1", {"a": {1, 2}})
    with pytest.raises(ValueError, match="identifiers"):
        sandbox.run("1", {"not a name": 1})


@pytest.mark.slow
def test_runs_do_not_share_state(sandbox: Sandbox) -> None:
    """Sandbox.run starts every run fresh."""
    sandbox.run("x = 41")
    assert failed(sandbox.run("x + 1"), "exception").error.message.startswith("NameError")  # type: ignore[union-attr]


@pytest.mark.slow
def test_session_keeps_state_until_reset(sandbox: Sandbox) -> None:
    """A Session keeps globals across runs; reset forgets them; a fatal run restarts it."""
    with sandbox.session() as session:
        assert session.run("x = 41").ok
        assert session.run("x + 1").value == 42
        session.reset()
        failed(session.run("x"), "exception")
        session.run("y = 1")
        failed(session.run("y", cancel=_cancelled()), "cancelled")
        assert session.restarts == 0  # cancelled before it started: the state survives
        scope = CancelScope()
        threading.Timer(0.1, scope.cancel).start()
        failed(session.run("while True: pass", cancel=scope), "cancelled")
        assert session.restarts == 1
        failed(session.run("y"), "exception")
        assert session.run("1 + 1").value == 2


def _cancelled() -> CancelScope:
    scope = CancelScope()
    scope.cancel("test")
    return scope


@pytest.mark.timing
@pytest.mark.slow
def test_cancel_from_another_thread(sandbox: Sandbox) -> None:
    """A run is cancelled from another thread, well before its deadline or its fuel end it."""
    scope = CancelScope()
    timer = threading.Timer(0.2, scope.cancel, args=("stop",))
    timer.start()
    # "cancelled", not deadline_exceeded (5 s) nor out_of_fuel: the cancel ended it. Rejected:
    # a wall-clock bound on the whole run, which a loaded machine's late timer thread can break.
    result = failed(sandbox.run("while True: pass", cancel=scope), "cancelled")
    timer.join()
    assert result.error is not None and "stop" in result.error.message
    assert_clean(sandbox)


@pytest.mark.slow
def test_run_async(sandbox: Sandbox) -> None:
    """run_async works under asyncio, and cancelling the task cancels the run."""

    async def main() -> None:
        result = await sandbox.run_async("result = 6 * 7")
        assert result.value == 42
        task = asyncio.create_task(sandbox.run_async("while True: pass"))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert_clean(sandbox)


@pytest.mark.slow
def test_concurrent_runs(sandbox: Sandbox) -> None:
    """Several threads may run code in one sandbox at once."""
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(sandbox.run(f"{i} * 2").value))
        for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [0, 2, 4, 6, 8, 10]  # type: ignore[type-var]


@pytest.mark.slow
def test_no_files_by_default(sandbox: Sandbox) -> None:
    """Without grants there is no filesystem at all."""
    failed(sandbox.run("import os\nos.listdir('/')"), "exception")


@pytest.mark.slow
def test_read_only_directory(interpreter: object, tmp_path: Path) -> None:
    """A read-only grant can be read but not written."""
    (tmp_path / "data.txt").write_text("hello")
    with Sandbox(files=[DirGrant(tmp_path, "/data", readonly=True)]) as sandbox:
        assert sandbox.run("open('/data/data.txt').read()").value == "hello"
        result = failed(sandbox.run("open('/data/new.txt', 'w').write('x')"), "exception")
        assert result.error is not None and "Error" in result.error.message
    assert not (tmp_path / "new.txt").exists()


@pytest.mark.slow
def test_read_write_directory(interpreter: object, tmp_path: Path) -> None:
    """A read-write grant can be written, and escapes with .. are refused."""
    with Sandbox(files=[DirGrant(tmp_path, "/work", readonly=False)]) as sandbox:
        assert sandbox.run("open('/work/out.txt', 'w').write('abc')").value == 3
        failed(sandbox.run("open('/work/../../etc/passwd').read()"), "exception")
    assert (tmp_path / "out.txt").read_text() == "abc"


@pytest.mark.slow
def test_memory_directory(interpreter: object) -> None:
    """An in-memory directory is seeded per run and forgotten after it."""
    grant = MemoryDir("/mem", {"a.txt": b"seed"})
    with Sandbox(files=[grant]) as sandbox:
        code = "open('/mem/b.txt', 'w').write('new')\nresult = sorted(__import__('os').listdir('/mem'))"
        assert sandbox.run(code).value == ["a.txt", "b.txt"]
        assert sandbox.run("sorted(__import__('os').listdir('/mem'))").value == ["a.txt"]


def test_network_is_refused() -> None:
    """Asking for network access is an error at construction."""
    with pytest.raises(ValueError, match="network"):
        Sandbox(network=True)  # type: ignore[arg-type]


@pytest.mark.slow
def test_record_and_replay(interpreter: object, tmp_path: Path) -> None:
    """A recorded run (with a tool call and output) replays exactly, also with mty replay."""
    from mighty.trace import replay_trace

    def add(a: int, b: int) -> int:
        return a + b

    trace = tmp_path / "run.bin"
    with Sandbox(tools=[add]) as sandbox:
        result = sandbox.run(
            "import random\nprint('hi')\nadd(1, random.randint(1, 5))", record=trace
        )
    assert result.ok
    report = replay_trace(trace)
    assert report.instances[0].exports == 1
    done = subprocess.run(
        [str(Path(sys.executable).parent / "mty"), "replay", str(trace)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(json_values(4))
def test_json_values_round_trip(sandbox: Sandbox, value: object) -> None:
    """JSON-compatible values go into the guest as inputs and come back unchanged."""
    result = sandbox.run("result = v", {"v": value})
    assert result.ok, result.error
    assert result.value == value


def _exec(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "mty"), "exec", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.slow
def test_cli_exec_json(interpreter: object, tmp_path: Path) -> None:
    """mty exec --json prints one RunResult object; exit 0 when ok, 1 otherwise."""
    script = tmp_path / "s.py"
    script.write_text("print('hi')\nresult = [1, 2]")
    done = _exec(str(script), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["ok"] is True and document["value"] == [1, 2] and document["stdout"] == "hi\n"
    done = _exec("-", "--json", "--timeout", "0.2", stdin="while True: pass")
    assert done.returncode == 1
    assert json.loads(done.stdout)["error"]["kind"] == "deadline_exceeded"


@pytest.mark.slow
def test_cli_exec_plain_and_usage_errors(interpreter: object) -> None:
    """Plain output shows the value; bad options exit 2."""
    done = _exec("-", stdin="6 * 7")
    assert done.returncode == 0 and done.stdout.strip() == "42"
    done = _exec("-", stdin="1/0")
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr
    assert _exec("-", "--fuel", "zero").returncode == 2
    assert _exec("/no/such/file.py").returncode == 2
