"""The compiled taps and queue (host/trace/_speedups.c) against the pure-Python paths they are
the compiled form of: the same CRC-32s, frames, value encodings and whole traces, byte for
byte; the same steps, fuel and errors; and the pure path still chosen when asked for."""

from __future__ import annotations

import ctypes
import os
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component, GuestExit, Instance
from mighty.abi import Ok
from mighty.gate import Binding, Handle
from mighty.trace import HandleRef, Recorder, TraceError, read_trace
from mighty.trace._emit import emit_item, emit_result
from mighty.trace._format import _frame
from mighty.trace._native import native, use_native
from mighty.trace._recorder import InstanceRecording
from tests.trace.paths import pure_python
from tests.trace.test_taps import CREATED, POLICY, SNIPPET, STREAM, arguments, results

HOST = Path(__file__).resolve().parents[2] / "host"


def test_the_compiled_module_is_built_from_its_source() -> None:
    """Built in place (editable install, hatch_build.py) and not older than its source, or,
    in a pure-Python build, absent; MIGHTY_PURE_PYTHON turns it off at run time."""
    source = HOST / "trace" / "_speedups.c"
    if os.environ.get("MIGHTY_PURE_PYTHON", "") not in ("", "0"):
        assert not use_native()
        return
    assert native is not None, "mighty.trace._speedups is not built: run hatch_build.py"
    built = Path(native.__file__ or "")
    if built.parent == source.parent:  # an in-place build (a wheel's has no source beside it)
        assert built.stat().st_mtime >= source.stat().st_mtime, "rebuild: python hatch_build.py"
    assert use_native()
    with pure_python(True):
        assert not use_native()


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1))
def test_crc32_is_zlibs(data: bytes, start: int) -> None:
    assert native is not None
    assert native.crc32(data) == zlib.crc32(data)
    assert native.crc32(data, start) == zlib.crc32(data, start)


@given(st.binary(max_size=600))
def test_a_frame_is_the_writers(payload: bytes) -> None:
    assert native is not None
    assert native.frame(payload) == _frame(payload)


@settings(max_examples=300)
@given(results | arguments, st.sampled_from([0, 1, 5, 4096]))
def test_values_encode_as_emit_does(value: Any, blob_min: int) -> None:
    """An argument as emit_item, a result as emit_result: the same bytes, or None for the
    values those refuse and for handles (the compiled taps leave both to the general path)."""
    assert native is not None
    for compiled, pure in (
        (native.encode(value, blob_min, False, Ok), emit_item(value, blob_min)),
        (native.encode(value, blob_min, True, Ok), emit_result(value, blob_min)),
    ):
        if compiled is None:
            assert pure is None or _holds_handle(value)
        else:
            assert compiled == pure


def _holds_handle(value: Any) -> bool:
    if type(value) in (Handle, HandleRef):
        return True
    if type(value) is Ok:
        return _holds_handle(value.value)
    if type(value) is list:
        return any(_holds_handle(v) for v in value)
    if type(value) is dict:
        return any(_holds_handle(v) for v in value.values())
    return False


def _record(probe: Path, path: Path, flush: Any, agent: str | None) -> None:
    with (
        Recorder(path, flush=flush, created=CREATED, buffer_bytes=4000) as recorder,
        Instance(Component.load(probe), record=recorder, policy=POLICY, agent=agent) as instance,
    ):
        instance.call("spam", "hello", 20)
        instance.call("churn", 20)
        instance.call("run", SNIPPET)
        instance.call("spam", "x" * 5000, 1)  # a blob-sized write: the general path
        with pytest.raises(GuestExit):
            instance.call("run", "os._exit(3)")


@pytest.mark.parametrize("flush", ["call", "record", "os"])
def test_whole_traces_are_the_pure_paths_bytes(
    probe_wasm: Path, tmp_path: Path, flush: str
) -> None:
    """One run recorded with the compiled taps and with the pure-Python ones (a small
    buffer, so size drains happen too): the same file, byte for byte."""
    for pure in (False, True):
        with pure_python(pure):
            _record(probe_wasm, tmp_path / f"{pure}.bin", flush, "probe:1")
    compiled_bytes = (tmp_path / "False.bin").read_bytes()
    assert compiled_bytes == (tmp_path / "True.bin").read_bytes()
    imports = [r for r in read_trace(tmp_path / "False.bin").all_records if r["k"] == "import"]
    assert len(imports) > 100 and imports[-1]["out"] == "exit"


@pytest.fixture(scope="module")
def probe(probe_wasm: Path) -> Component:
    return Component.load(probe_wasm)


def _store(fuel: bool) -> tuple[Any, int]:
    config = wasmtime.Config()
    config.consume_fuel = fuel
    store = wasmtime.Store(wasmtime.Engine(config))
    if fuel:
        store.set_fuel(10**6)
    return store, ctypes.cast(store._context(), ctypes.c_void_p).value or 0


def _calls(
    probe: Component, where: Path, pure: bool, fuel_limit: int, context_ptr: int
) -> list[int]:
    """A few tapped calls through one recording; the steps seen after each."""
    steps = []
    with pure_python(pure), Recorder(where, flush="call", created=CREATED) as recorder:
        recording = recorder.attach(probe, {"fuel": 10}, None)
        assert isinstance(recording, InstanceRecording)
        assert native is not None
        assert (type(recording._core) is native.Core) is not pure
        recording.fuel_limit = fuel_limit
        write = recording.tap_import(Binding("wasi:io/streams", "w", print), 2, STREAM)
        now = recording.tap_import(Binding("wasi:clocks/wall-clock", "now", print), 0, None)
        assert write is not None and now is not None
        write(context_ptr, Ok(None), 3, b"hi")
        steps.append(recording.step)
        recording.step += 5  # another path's records (begin_export, watch_import)
        now(context_ptr, {"seconds": 7, "nanoseconds": 9})
        steps.append(recording.step)
        write(context_ptr, Ok(None), 2**40, "t\u00e9xt")
        now(context_ptr, [1, b"x", None])
        steps.append(recording.step)
    return steps


@pytest.mark.parametrize("fuel_limit", [10**7, 0, -5, 2**64 - 1, 2**64, -(2**63)])
@pytest.mark.parametrize("fuel", [True, False])
def test_steps_and_fuel_are_the_pure_paths(
    tmp_path: Path, probe: Component, fuel_limit: int, fuel: bool
) -> None:
    """The step the taps share with the other paths, and the fuel of each record: as the pure
    path has them for any fuel limit (outside u64: the general path) and for a store whose
    fuel cannot be read (no fuel metering: -1)."""
    _store_kept, context_ptr = _store(fuel)
    steps = [
        _calls(probe, tmp_path / f"{pure}.bin", pure, fuel_limit, context_ptr)
        for pure in (False, True)
    ]
    assert steps[0] == steps[1] == [1, 7, 9]
    assert (tmp_path / "False.bin").read_bytes() == (tmp_path / "True.bin").read_bytes()
    fuels = [r["fuel"] for r in read_trace(tmp_path / "False.bin").all_records[1:]]
    assert fuels == [fuel_limit - 10**6 if fuel else -1] * 4


def test_a_tap_after_close_raises_as_the_pure_one(tmp_path: Path, probe: Component) -> None:
    _kept, context_ptr = _store(True)
    errors = []
    for pure in (False, True):
        with pure_python(pure):
            recorder = Recorder(tmp_path / f"{pure}.bin", created=CREATED)
            recording = recorder.attach(probe, {"fuel": 10}, None)
            tap = recording.tap_import(Binding("wasi:io/streams", "w", print), 1, STREAM)
            assert tap is not None
            recorder.close()
            with pytest.raises(TraceError) as caught:
                tap(context_ptr, Ok(None), 3)
            errors.append(str(caught.value).replace(f"{pure}.bin", "t.bin"))
    assert errors[0] == errors[1]
    assert errors[0].endswith("t.bin is closed")


def test_a_compiled_tap_checks_its_arguments(tmp_path: Path, probe: Component) -> None:
    _kept, context_ptr = _store(True)
    with pure_python(False), Recorder(tmp_path / "t.bin", created=CREATED) as recorder:
        recording = recorder.attach(probe, {"fuel": 10}, None)
        tap = recording.tap_import(Binding("wasi:io/streams", "w", print), 1, STREAM)
        assert type(tap) is native.Tap
        with pytest.raises(TypeError, match="takes 3 arguments"):
            tap(context_ptr, None)
        with pytest.raises(TypeError, match="keyword"):
            tap(context_ptr, None, 3, extra=1)
        with pytest.raises(TypeError, match="context_ptr"):
            tap(None, None, 3)
        with pytest.raises(ValueError, match="context_ptr"):
            tap(0, None, 3)
        with pytest.raises(TypeError):
            recording.step = "1"  # type: ignore[assignment]
        with pytest.raises(ValueError, match=">= 0"):
            recording.step = -1
        with pytest.raises(TypeError):
            recording.fuel_limit = 1.5  # type: ignore[assignment]
        tap(context_ptr, None, 3)  # still works after the refusals
        assert recording.step == 1
    with pytest.raises(TypeError, match="callable"):
        native.Queue(None, 0, 1.0, 0, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        native.Queue(print, -1, 1.0, 0, 10)
    with pytest.raises(ValueError, match="interval"):
        native.Queue(print, 0, 0.0, 0, 10)
    bare = native.Core.__new__(native.Core)  # never initialised: refused, not called
    assert (bare.step, bare.fuel_limit) == (0, 0)
    with pytest.raises(TypeError, match="never initialised"):
        native.Tap(
            bare, native.Queue(print, 0, 1.0, 0, 10), Ok, b"", b"", b"", b"", b"", 0, False, print
        )
    with pytest.raises(TypeError, match="never initialised"):
        native.Tap.__new__(native.Tap)(context_ptr, None)
    queue = native.Queue(print, 1 << 20, 1.0, 0, 10)
    with pytest.raises(ValueError, match="over the 10 limit"):
        queue.push(b"x" * 11)
    with pytest.raises(TypeError):
        queue.push("text")  # type: ignore[arg-type]
    assert len(queue) == 0


def test_no_references_are_leaked(tmp_path: Path, probe: Component) -> None:
    """Many calls on both ways (queued, and the general path) leave every object's
    reference count where it was."""
    _kept, context_ptr = _store(True)
    data, text, result = b"data" * 3, "t\u00e9xt", Ok(None)
    blob = b"b" * 5000  # over the blob threshold: the general path
    with (
        pure_python(False),
        Recorder(tmp_path / "t.bin", created=CREATED, buffer_bytes=10_000) as recorder,
    ):
        recording = recorder.attach(probe, {"fuel": 10}, None)
        recording.fuel_limit = 10**7
        tap = recording.tap_import(Binding("wasi:io/streams", "w", print), 2, STREAM)
        assert type(tap) is native.Tap
        for value in (data, blob):
            tap(context_ptr, result, 1, value)  # warm: text caches, handle bytes
        before = [sys.getrefcount(x) for x in (data, text, result, blob)]
        for _ in range(2000):
            tap(context_ptr, result, 1, data)
            tap(context_ptr, result, 1, text)
        for _ in range(50):
            tap(context_ptr, result, 1, blob)
        assert [sys.getrefcount(x) for x in (data, text, result, blob)] == before
        assert recording.step == 2 + 4000 + 50


def test_handles_go_the_general_way(tmp_path: Path, probe: Component) -> None:
    """A result holding a gate Handle (get-stdout's) is not encoded in C: the general path
    writes it, as the pure tap's general path does."""
    _kept, context_ptr = _store(True)
    for pure in (False, True):
        with pure_python(pure), Recorder(tmp_path / f"{pure}.bin", created=CREATED) as recorder:
            recording = recorder.attach(probe, {"fuel": 10}, None)
            tap = recording.tap_import(Binding("wasi:cli/stdout", "get", print), 0, None)
            assert tap is not None
            tap(context_ptr, Handle(STREAM, 4))
            tap(context_ptr, Ok(Handle(STREAM, 5)))
            tap(context_ptr, 2**70)
    assert (tmp_path / "False.bin").read_bytes() == (tmp_path / "True.bin").read_bytes()
