"""What a recording holds when its process is killed (SIGKILL) in the middle of a call.

Each test runs a real child process that records the probe guest, waits until the guest is
asleep inside its second export call, kills it with SIGKILL and reads what the file holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.trace import Recorder, TraceError, TraceWriter, read_trace
from tests.trace.test_components import guest

CHILD = r"""
import sys
from pathlib import Path

from mighty import Budget, Component, Instance
from mighty.trace import Recorder
from mighty.wasi import STDOUT_SINK

wasm, trace, mode, interval = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])


def show(chunk: bytes) -> None:
    sys.stdout.write(chunk.decode())
    sys.stdout.flush()


recorder = Recorder(Path(trace), flush=mode, flush_interval=interval)
sink = STDOUT_SINK.of(show)
instance = Instance(Component.load(wasm), record=recorder, slots=[sink], budget=Budget(timeout=120))
instance.call("run", "print('one')")
print("first call done", flush=True)
instance.call("run", "print('A')\nprint('B')\ntime.sleep(100)")
"""


def killed_mid_call(
    probe_wasm: Path,
    trace: Path,
    mode: str,
    interval: float,
    until: Callable[[], bool] | None = None,
) -> None:
    """Run the child until the guest printed B in its second call (and then until ``until()``
    holds, polled for at most a minute), then SIGKILL it."""
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, str(probe_wasm), str(trace), mode, str(interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            seen = []
            for line in child.stdout:  # the child never ends by itself: it sleeps in the guest
                seen.append(line)
                if line == "B\n":
                    break
            else:
                pytest.fail(f"the child ended before the guest slept: {seen}")
            deadline = time.monotonic() + 60
            while until is not None and not until() and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL


def kinds(records: tuple[dict[str, Any], ...]) -> list[str]:
    return [r["k"] if r["k"] != "import" else r["fn"] for r in records]


def printed(records: tuple[dict[str, Any], ...], text: bytes) -> bool:
    return any(
        r["k"] == "import" and any(type(a) is bytes and text in a for a in r["args"])
        for r in records
    )


def test_record_mode_keeps_every_record_made(probe_wasm: Path, tmp_path: Path) -> None:
    """flush="record": everything up to the last import before the kill is in the file."""
    trace = tmp_path / "t.bin"
    killed_mid_call(probe_wasm, trace, "record", 60)
    records = read_trace(trace, schema=True).all_records
    assert [r["k"] for r in records[:2]] == ["instance", "call"]
    exports = [r for r in records if r["k"] == "export"]
    assert len(exports) == 1 and exports[0]["ok"]
    assert sum(r["k"] == "call" for r in records) == 2
    assert printed(records, b"A"), kinds(records)


def test_call_mode_keeps_every_finished_call(probe_wasm: Path, tmp_path: Path) -> None:
    """flush="call" (the default): the finished call and the start of the one in flight are
    in the file; the imports of the call in flight are lost (they waited in the buffer)."""
    trace = tmp_path / "t.bin"
    killed_mid_call(probe_wasm, trace, "call", 60)
    trace_read = read_trace(trace, schema=True)
    records = trace_read.all_records
    assert not trace_read.truncated
    calls = [i for i, r in enumerate(records) if r["k"] == "call"]
    assert len(calls) == 2
    first_export = next(i for i, r in enumerate(records) if r["k"] == "export")
    assert calls[0] < first_export < calls[1]
    assert printed(records[: calls[1]], b"one")
    assert records[calls[1] :] == records[-1:]  # nothing of the call in flight but its start
    assert not printed(records, b"A")


def test_os_mode_may_lose_finished_calls(probe_wasm: Path, tmp_path: Path) -> None:
    """flush="os" with a long interval: even the finished call is lost; the file is still a
    readable trace (header, no damage)."""
    trace = tmp_path / "t.bin"
    killed_mid_call(probe_wasm, trace, "os", 60)
    got = read_trace(trace, schema=True)
    assert got.all_records == ()
    assert "engine" in got.header


def test_os_mode_writes_by_age(probe_wasm: Path, tmp_path: Path) -> None:
    """flush="os": records older than the interval are written by the background flusher even
    while the guest sleeps and appends nothing."""
    trace = tmp_path / "t.bin"

    def written() -> bool:
        return printed(read_trace(trace).all_records, b"B")

    killed_mid_call(probe_wasm, trace, "os", 0.2, written)
    records = read_trace(trace, schema=True).all_records
    assert sum(r["k"] == "call" for r in records) == 2
    assert printed(records, b"A") and printed(records, b"B")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flush": "disk"}, "flush must be one of record, call, os"),
        ({"buffer_bytes": -1}, "buffer_bytes"),
        ({"flush_interval": 0}, "flush_interval"),
        ({"flush_interval": float("nan")}, "flush_interval"),
    ],
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        Recorder(tmp_path / "t.bin", **kwargs)
    assert not (tmp_path / "t.bin").exists()


def test_buffered_writer_writes_by_size_boundary_and_close(tmp_path: Path) -> None:
    """In "call" mode records wait until the buffer is full, boundary(), flush() or close()."""
    path = tmp_path / "t.bin"
    w = TraceWriter(path, {}, flush="call", buffer_bytes=300, flush_interval=3600)
    w.append({"k": "x", "n": 1})
    assert read_trace(path).all_records == ()
    w.boundary()
    assert len(read_trace(path).all_records) == 1
    for n in range(2, 100):
        w.append({"k": "x", "n": n, "pad": b"p" * 20})
        on_disk = len(read_trace(path).all_records)
        assert n - on_disk < 300 // 20  # never more than the buffer's worth waiting
    w.flush()
    assert len(read_trace(path).all_records) == 99
    w.append({"k": "x", "n": 100})
    w.close()
    assert [r["n"] for r in read_trace(path).all_records] == list(range(1, 101))


def test_os_mode_ignores_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    with TraceWriter(path, {}, flush="os", flush_interval=3600) as w:
        w.append({"k": "x"})
        w.boundary()
        assert read_trace(path).all_records == ()
    assert len(read_trace(path).all_records) == 1


@pytest.mark.parametrize("flush", ["record", "call", "os"])
def test_cli_call_records_with_each_setting(
    wat: Callable[[str], bytes], tmp_path: Path, flush: str
) -> None:
    """``mty call --record T --flush MODE`` writes a whole trace in every mode."""
    component = guest(wat, tmp_path / "g")
    trace = tmp_path / "t.bin"
    done = CliRunner().invoke(
        main, ["call", str(component), "run", "2", "--record", str(trace), "--flush", flush, "-q"]
    )
    assert done.exit_code == 0, done.output
    assert [r["k"] for r in read_trace(trace, schema=True).all_records][-2:] == ["export", "close"]


def test_cli_refuses_an_unknown_flush(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    done = CliRunner().invoke(
        main, ["call", str(guest(wat, tmp_path)), "run", "2", "--record", "--flush", "disk"]
    )
    assert done.exit_code == 2
    assert "disk" in done.output


def test_a_writer_never_closed_is_written_out_at_exit(tmp_path: Path) -> None:
    """flush="os" with nothing to trigger a write: a normal interpreter exit still writes the
    records that wait (a crash is what the setting is about, not a forgotten close)."""
    path = tmp_path / "t.bin"
    script = (
        "import sys\nfrom mighty.trace import TraceWriter\n"
        "w = TraceWriter(sys.argv[1], {}, flush='os', flush_interval=3600)\n"
        "w.append({'k': 'x', 'n': 1})\n"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=120)
    assert read_trace(path).all_records == ({"k": "x", "n": 1},)
