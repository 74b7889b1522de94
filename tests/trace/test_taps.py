"""The recorder's taps (the gate's one-frame recorded imports) write the bytes the general path
writes: for whole recordings of a real guest in every durability setting, and record by record
for drawn arguments and results, with the general path (``_record_import``) as the oracle."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component, GuestExit, Instance
from mighty.abi import Err, Ok, Some
from mighty.gate import Binding, Handle, ResourceKind
from mighty.trace import HandleRef, Recorder, TraceError, read_trace, replay_trace
from mighty.trace._emit import emit_result, emit_simple
from mighty.trace._format import MAX_ITEMS
from mighty.trace._recorder import InstanceRecording
from mighty.wasi import Policy
from tests.trace.paths import PATHS, pure_python
from tests.trace.test_emit import fast, gate_handles
from tests.trace.test_values import values

POLICY = Policy().with_clock("virtual").with_seed(7)
CREATED = "2026-01-01T00:00:00+00:00"
SNIPPET = "import os, time\nprint('hi', os.urandom(4), time.time(), os.listdir('.'))\nresult = 1.5"


def _record(probe_wasm: Path, path: Path, flush: Any, agent: str | None) -> None:
    with (
        Recorder(path, flush=flush, created=CREATED) as recorder,
        Instance(
            Component.load(probe_wasm), record=recorder, policy=POLICY, agent=agent
        ) as instance,
    ):
        instance.call("spam", "hello", 20)
        instance.call("churn", 20)
        instance.call("run", SNIPPET)
        instance.call("spam", "x" * 5000, 1)  # a write of a blob-sized byte string
        with pytest.raises(GuestExit):
            instance.call("run", "os._exit(3)")  # an import that ends the guest


@PATHS
@pytest.mark.parametrize("flush", ["call", "record", "os"])
@pytest.mark.parametrize("agent", [None, "probe:1"])
def test_a_tapped_recording_is_the_general_paths_bytes(
    probe_wasm: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flush: str,
    agent: str | None,
    pure: bool,
) -> None:
    """The same run recorded through the taps and with every tap refused (each import goes
    to watch_import, the path of c04a061): the same file, byte for byte, and it replays; the
    compiled taps (host/trace/_speedups.c) and the pure-Python ones alike."""
    if pure:
        monkeypatch.setenv("MIGHTY_PURE_PYTHON", "1")
    else:
        monkeypatch.delenv("MIGHTY_PURE_PYTHON", raising=False)
    taps: list[str] = []
    tap_import = InstanceRecording.tap_import

    def counted(self: InstanceRecording, binding: Binding, *rest: Any) -> Any:
        tap = tap_import(self, binding, *rest)
        if tap is not None:
            taps.append(binding.name)
        return tap

    monkeypatch.setattr(InstanceRecording, "tap_import", counted)
    _record(probe_wasm, tmp_path / "tapped.bin", flush, agent)
    assert {"[method]output-stream.write", "now", "get-random-bytes"} <= set(taps)
    monkeypatch.setattr(InstanceRecording, "tap_import", lambda *_: None)
    _record(probe_wasm, tmp_path / "watched.bin", flush, agent)
    tapped = (tmp_path / "tapped.bin").read_bytes()
    assert tapped == (tmp_path / "watched.bin").read_bytes()
    imports = [r for r in read_trace(tmp_path / "tapped.bin").all_records if r["k"] == "import"]
    assert len(imports) > 100
    assert any(len(a) >= 4096 for r in imports for a in r["args"] if type(a) is bytes)  # a blob
    assert imports[-1]["out"] == "exit"
    report = replay_trace(tmp_path / "tapped.bin")  # raises on any divergence
    assert not report.truncated and sum(r.imports for r in report.instances) == len(imports)


STREAM = ResourceKind("wasi:io/streams", "output-stream")
results = (
    values
    | gate_handles
    | st.builds(Ok, st.none() | st.integers(-5, 2**65) | st.binary(max_size=20) | gate_handles)
    | st.builds(Err, st.integers(0, 300) | st.text(max_size=5))
    | st.builds(Some, st.integers(0, 9))
    | st.dictionaries(st.sampled_from(["seconds", "nanoseconds", "\ud800"]), st.integers(-9, 2**64))
    | st.integers(0, 2**64 + 5)
    | st.binary(max_size=300)
    | st.builds(bytes, st.sampled_from([4095, 4096, 5000]))
    | st.lists(st.integers(0, 300) | st.binary(max_size=5) | gate_handles, max_size=3)
)
arguments = (
    st.integers(-(2**63), 2**64 + 5)
    | st.binary(max_size=300)
    | st.builds(bytes, st.sampled_from([4095, 4096]))
    | st.text(max_size=5)
    | values
    | st.builds(HandleRef, st.just("a"), st.just("b"), st.integers(0, 5))
)
shapes = st.one_of(
    st.tuples(st.just(None), st.lists(arguments, max_size=2)),
    st.tuples(st.just(STREAM), st.tuples(st.integers(0, 2**32 - 1))),
    st.tuples(st.just(STREAM), st.tuples(st.integers(0, 2**32 - 1), arguments)),
)


@pytest.fixture(scope="module")
def probe(probe_wasm: Path) -> Component:
    return Component.load(probe_wasm)


@pytest.fixture(scope="module")
def fuel_context() -> tuple[Any, int]:
    """A real store with fuel, and its context pointer as the gate hands it to a tap."""
    config = wasmtime.Config()
    config.consume_fuel = True
    store = wasmtime.Store(wasmtime.Engine(config))
    store.set_fuel(10**6)
    return store, ctypes.cast(store._context(), ctypes.c_void_p).value or 0


@PATHS
@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(shapes, results), min_size=1, max_size=6),
    st.sampled_from(["call", "record"]),
)
def test_each_tapped_record_is_the_general_paths(
    tmp_path_factory: pytest.TempPathFactory,
    probe: Component,
    fuel_context: tuple[Any, int],
    pure: bool,
    calls: list[Any],
    flush: Any,
) -> None:
    """Drawn import calls of every tapped shape, each through a tap of one recording and
    through ``_record_import`` (the oracle) of another: the two files are the same bytes,
    for the compiled taps and the pure-Python ones."""
    _, context_ptr = fuel_context
    component = probe
    where = tmp_path_factory.mktemp("taps")
    with (
        pure_python(pure),
        Recorder(where / "tap.bin", flush=flush, created=CREATED) as tapping,
        Recorder(where / "oracle.bin", flush=flush, created=CREATED) as oracle,
    ):
        tapped = tapping.attach(component, {"fuel": 10**7}, None, agent="x:1")
        general = oracle.attach(component, {"fuel": 10**7}, None, agent="x:1")
        tapped.fuel_limit = general.fuel_limit = 10**7
        fuel = 10**7 - 10**6
        for n, ((kind, args), result) in enumerate(calls):
            binding = Binding("t:x/api", f"f{n % 3}-{kind is None}-{len(args)}", lambda *_: None)
            tap = tapped.tap_import(binding, len(args), kind)
            assert tap is not None
            refused = False
            try:
                tap(context_ptr, result, *args)
            except TraceError:  # a value no trace holds (a lone surrogate)
                refused = True
            seen = list(args)
            if kind is not None:
                seen[0] = Handle(kind, seen[0])
            try:
                general._record_import(general._next_step(), binding, seen, result, "ok", fuel)
            except TraceError:
                assert refused
            else:
                assert not refused
    assert (where / "tap.bin").read_bytes() == (where / "oracle.bin").read_bytes()


@given(results, st.sampled_from([0, 5, 4096]))
def test_the_result_encoding_is_the_simple_one(value: Any, blob_min: int) -> None:
    """emit_result is emit_simple (taken or not alike), and where it takes a value it is the
    general encoder's bytes, no blob left behind."""
    encoded = emit_result(value, blob_min)
    assert encoded == emit_simple(value, blob_min)
    if encoded is not None:
        assert (encoded, {}) == fast(value, blob_min, handles=True)


@PATHS
@pytest.mark.parametrize("kind", [None, STREAM])
@pytest.mark.parametrize("size", [100_000, MAX_ITEMS + 1])
def test_a_long_result_is_the_general_paths(
    tmp_path: Path,
    probe: Component,
    fuel_context: tuple[Any, int],
    kind: Any,
    size: int,
    pure: bool,
) -> None:
    """A result whose record would be over MAX_ITEMS bytes goes the general way, which
    refuses it (too many items) as it always did; a long one under the bound is queued."""
    _, context_ptr = fuel_context
    result = [0] * size
    outcomes = []
    for name in ("tap", "oracle"):
        with pure_python(pure), Recorder(tmp_path / f"{name}.bin", created=CREATED) as recorder:
            recording = recorder.attach(probe, {"fuel": 10**7}, None)
            recording.fuel_limit = 10**7
            binding = Binding("t:x/api", "long", lambda *_: None)
            args = [] if kind is None else [7]
            try:
                if name == "tap":
                    tap = recording.tap_import(binding, len(args), kind)
                    assert tap is not None
                    tap(context_ptr, result, *args)
                else:
                    seen = [] if kind is None else [Handle(kind, 7)]
                    recording._record_import(1, binding, seen, result, "ok", 10**7 - 10**6)
                outcomes.append("written")
            except TraceError as exc:
                outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0] == "written") == (size < MAX_ITEMS)
    assert (tmp_path / "tap.bin").read_bytes() == (tmp_path / "oracle.bin").read_bytes()
