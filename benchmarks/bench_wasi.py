"""mighty's Python WASI vs wasmtime's native WASI, on the same guest in the same run.

Run: .venv/bin/python benchmarks/bench_wasi.py [--json]

- print-heavy: the probe guest prints a short line N times (check-write/write/flush per line).
- clock/random-heavy: the probe reads both clocks and 16 random bytes N times.
Target (issue 12): ours / native <= 8, the print path <= 7 us per import. Also the cost of one
import through the gate: wall time of the call divided by the number of imports the gate
served, and the extra cost per import over native; ``cpu_*`` are the same from the thread's CPU
time, which a loaded machine disturbs far less than wall time. Ours and native run in turns
(one call each per round) and ``ratio`` is the median of the rounds' own ratios, so a burst of
load on the machine hits both sides of a round alike.

The floor: what any Python host pays per import on wasmtime-py's component API whatever its
host functions do. A tiny component (WAT below) calls an import N times in a loop; the import
returns nothing, a ``u64``, a ``record { seconds: u64, nanoseconds: u32 }`` (wasi:clocks'
datetime) or a ``list<u8>`` of 16 bytes (a get-random-bytes). ``bare``: a ctypes callback
registered with ``wasmtime_component_linker_instance_add_func`` that only writes a prepared
result (the least the C API allows: one 32-byte slot, one clone of a prepared record, one copy
of prepared list elements); ``gate``: the same imports served by mighty's gate with host
functions that return constants. Per import = (time of N calls - time of none) / N, CPU time.
``floor_ratio`` of the clocks+random probe is what it would be if our imports cost only the
bare callbacks: (native + the bare cost of its imports) / native. ``wasi_us``: the same import
served by mighty's own WASI function (monotonic / wall ``now``, ``get-random-bytes``), and
``wasi_own_us`` its cost over the bare callback: the gap to the floor per import.
"""

from __future__ import annotations

import ctypes
import statistics
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

import wasmtime
from _common import ROOT, median, report, wasm_tools
from wasmtime import _ffi as ffi
from wasmtime import component as wc

from mighty import Component, Instance
from mighty.abi import U32, U64, FuncCodec, FuncSig, RecordType
from mighty.build import build_component
from mighty.gate import Binding, Gate, GuestContext, ResourceKind
from mighty.wasi import WasiProvider

LINES = 500
CHURN = 500
ROUNDS = 21
FLOOR_CALLS = 20_000

FLOOR_WAT = """
(component
  (import "t:floor/host" (instance $host
    (type $dt0 (record (field "seconds" u64) (field "nanoseconds" u32)))
    (export "datetime" (type $dt (eq $dt0)))
    (export "nothing" (func))
    (export "get-u64" (func (result u64)))
    (export "get-dt" (func (result $dt)))
    (export "get-bytes" (func (param "len" u64) (result (list u8))))
  ))
  (core module $libc
    (memory (export "memory") 1)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) i32.const 4096))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $mem))
  (alias core export $libc "realloc" (core func $realloc))
  (core func $nothing (canon lower (func $host "nothing")))
  (core func $u64 (canon lower (func $host "get-u64")))
  (core func $dt (canon lower (func $host "get-dt") (memory $mem)))
  (core func $bytes (canon lower (func $host "get-bytes") (memory $mem) (realloc $realloc)))
  (core module $m
    (import "host" "nothing" (func $nothing))
    (import "host" "get-u64" (func $u64 (result i64)))
    (import "host" "get-dt" (func $dt (param i32)))
    (import "host" "get-bytes" (func $bytes (param i64 i32)))
    (func (export "nothing") (param $n i32)
      (block $out (loop $l (br_if $out (i32.eqz (local.get $n)))
        (call $nothing)
        (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br $l))))
    (func (export "u64") (param $n i32)
      (block $out (loop $l (br_if $out (i32.eqz (local.get $n)))
        (drop (call $u64))
        (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br $l))))
    (func (export "record") (param $n i32)
      (block $out (loop $l (br_if $out (i32.eqz (local.get $n)))
        (call $dt (i32.const 64))
        (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br $l))))
    (func (export "list16") (param $n i32)
      (block $out (loop $l (br_if $out (i32.eqz (local.get $n)))
        (call $bytes (i64.const 16) (i32.const 64))
        (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br $l)))))
  (core instance $i (instantiate $m (with "host" (instance
    (export "nothing" (func $nothing)) (export "get-u64" (func $u64))
    (export "get-dt" (func $dt)) (export "get-bytes" (func $bytes))))))
  (func (export "nothing") (param "n" u32) (canon lift (core func $i "nothing")))
  (func (export "u64") (param "n" u32) (canon lift (core func $i "u64")))
  (func (export "record") (param "n" u32) (canon lift (core func $i "record")))
  (func (export "list16") (param "n" u32) (canon lift (core func $i "list16")))
)
"""


def _assemble(wat: str) -> bytes:
    done = subprocess.run(
        [wasm_tools(), "parse", "-", "-o", "/dev/stdout"],
        input=wat.encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.decode())
    return done.stdout


_KEEP: list[object] = []


class _Bare:
    """The floor component on a linker whose imports are bare ctypes callbacks."""

    def __init__(self, wasm: bytes) -> None:
        vp = ctypes.c_void_p
        holding = ctypes.PyDLL(ffi.dll._name)

        def raw(name: str, restype: Any, *argtypes: Any) -> Any:
            fn = holding[name]
            fn.restype, fn.argtypes = restype, list(argtypes)
            return fn

        add_func = ffi.dll["wasmtime_component_linker_instance_add_func"]
        add_func.restype = vp
        add_func.argtypes = [vp, vp, ctypes.c_size_t, vp, vp, vp]
        clone = raw("wasmtime_component_val_clone", None, vp, vp)
        list_new = raw("wasmtime_component_vallist_new", None, vp, ctypes.c_size_t, vp)
        slot_at = (ctypes.c_char * 32).from_address
        byte_at = (ctypes.c_char * 1).from_address
        u64_slot = struct.pack("<B7xQ16x", 8, 7)
        self.record = ffi.wasmtime_component_val_t()  # kept: the template the callback clones
        codec = FuncCodec(FuncSig((), RecordType((("seconds", U64), ("nanoseconds", U32)))))
        codec.lower_result_into(None, {"seconds": 1, "nanoseconds": 2}, self.record)
        record = ctypes.addressof(self.record)
        elements = bytearray(16 * 32)
        elements[0::32] = bytes([2]) * 16
        elements[8::32] = b"x" * 16
        self.elements = ctypes.create_string_buffer(bytes(elements), len(elements))
        items = ctypes.addressof(self.elements)

        def nothing(*_: Any) -> int:
            return 0

        def u64(_k: Any, _c: Any, _t: Any, _a: Any, _n: Any, res: int, _r: Any) -> int:
            slot_at(res).raw = u64_slot
            return 0

        def dt(_k: Any, _c: Any, _t: Any, _a: Any, _n: Any, res: int, _r: Any) -> int:
            clone(record, res)
            return 0

        def list16(_k: Any, _c: Any, _t: Any, _a: Any, _n: Any, res: int, _r: Any) -> int:
            list_new(res + 8, 16, items)
            byte_at(res).raw = b"\x0d"
            return 0

        proto = ctypes.CFUNCTYPE(vp, vp, vp, vp, vp, ctypes.c_size_t, vp, ctypes.c_size_t)
        self.callbacks = {
            "nothing": proto(nothing),
            "get-u64": proto(u64),
            "get-dt": proto(dt),
            "get-bytes": proto(list16),
        }
        self.finalize = ctypes.CFUNCTYPE(None, vp)(lambda _key: None)
        engine = wasmtime.Engine()
        linker = wc.Linker(engine)
        with linker.root() as root, root.add_instance("t:floor/host") as instance:
            for name, callback in self.callbacks.items():
                encoded = name.encode()
                error = add_func(
                    instance.ptr(),
                    ctypes.create_string_buffer(encoded),
                    len(encoded),
                    callback,
                    None,
                    self.finalize,
                )
                assert not error
        self.store = wasmtime.Store(engine)
        self.instance = linker.instantiate(self.store, wc.Component(engine, wasm))

    def loop(self, name: str) -> Callable[[int], object]:
        fn = self.instance.get_func(self.store, name)
        assert fn is not None
        return lambda n: fn(self.store, n)


class _Constants:
    """The floor's imports in mighty's gate: host functions returning constants."""

    def resources(self) -> Iterable[ResourceKind]:
        return []

    def bindings(self) -> Iterable[Binding]:
        host = "t:floor/host"
        return [
            Binding(host, "nothing", lambda _ctx: None),
            Binding(host, "get-u64", lambda _ctx: 7),
            Binding(host, "get-dt", lambda _ctx: {"seconds": 1, "nanoseconds": 2}),
            Binding(host, "get-bytes", lambda _ctx, _n: b"x" * 16),
        ]

    def setup(self, ctx: GuestContext) -> None:
        pass


class _RealWasi:
    """The floor's imports served by mighty's own WASI functions (the gate's unhooked path
    with the providers' real work): get-u64 is monotonic-clock ``now``, get-dt wall-clock
    ``now``, get-bytes ``get-random-bytes``; what each costs over the bare callback is the gap
    to the floor, per import."""

    _AS: ClassVar[dict[tuple[str, str], str]] = {
        ("wasi:clocks/monotonic-clock", "now"): "get-u64",
        ("wasi:clocks/wall-clock", "now"): "get-dt",
        ("wasi:random/random", "get-random-bytes"): "get-bytes",
    }

    def __init__(self) -> None:
        self.wasi = WasiProvider()

    def resources(self) -> Iterable[ResourceKind]:
        return []

    def bindings(self) -> Iterable[Binding]:
        out = [Binding("t:floor/host", "nothing", lambda _ctx: None)]
        for b in self.wasi.bindings():
            name = self._AS.get((b.interface, b.name))
            # getattr: a tree from before Binding.direct (the A/B baseline) has none.
            direct = getattr(b, "direct", None)
            if name is not None and direct is None:
                out.append(Binding("t:floor/host", name, b.fn))
            elif name is not None:
                out.append(Binding("t:floor/host", name, b.fn, direct))
        return out

    def setup(self, ctx: GuestContext) -> None:
        self.wasi.setup(ctx)


def _per_call(loop: Callable[[int], object], calls: int, rounds: int = 9) -> float:
    """CPU microseconds per import: (N calls - 0 calls) / N, median over rounds."""
    out = []
    for _ in range(rounds):
        start = time.thread_time()
        loop(0)
        empty = time.thread_time()
        loop(calls)
        full = time.thread_time()
        out.append(((full - empty) - (empty - start)) / calls)
    return statistics.median(out) * 1e6


def floor_rows() -> tuple[list[dict[str, object]], dict[str, float]]:
    wasm = _assemble(FLOOR_WAT)
    bare = _Bare(wasm)
    # Kept to the end of the process: wasmtime calls the finalizer of every callback when the
    # linker goes, and the ctypes objects must still be there then.
    _KEEP.append(bare)
    ours = Instance(Component.load(wasm), gate=Gate([_Constants()]))
    real = Instance(Component.load(wasm), gate=Gate([_RealWasi()]))
    rows: list[dict[str, object]] = []
    bare_us: dict[str, float] = {}
    served_as = {"u64": "monotonic now", "record": "wall now", "list16": "get-random-bytes(16)"}
    for name in ("nothing", "u64", "record", "list16"):
        bare_loop = bare.loop(name)
        gate_loop: Callable[[int], object] = lambda n, name=name: ours.call(name, n)  # noqa: E731
        real_loop: Callable[[int], object] = lambda n, name=name: real.call(name, n)  # noqa: E731
        bare_loop(100), gate_loop(100), real_loop(100)
        bare_us[name] = bare_cost = _per_call(bare_loop, FLOOR_CALLS)
        gate_cost = _per_call(gate_loop, FLOOR_CALLS)
        row: dict[str, object] = {
            "name": f"floor, import returning {name}",
            "bare_us": round(bare_cost, 2),
            "gate_us": round(gate_cost, 2),
            "gate_own_us": round(gate_cost - bare_cost, 2),
        }
        if name in served_as:
            # The same import served by mighty's WASI function (clocks real, random pooled).
            real_cost = _per_call(real_loop, FLOOR_CALLS)
            row["wasi"] = served_as[name]
            row["wasi_us"] = round(real_cost, 2)
            row["wasi_own_us"] = round(real_cost - bare_cost, 2)
        rows.append(row)
    return rows, bare_us


def _rounds(ours: Callable[[], object], native: Callable[[], object]) -> dict[str, float]:
    """Ours and native in turns; medians of each side and of the rounds' ratios."""
    for _ in range(3):
        ours(), native()
    ours_t, native_t, ours_cpu, native_cpu, ratios, cpu_ratios = [], [], [], [], [], []
    for _ in range(ROUNDS):
        w0, c0 = time.perf_counter(), time.thread_time()
        ours()
        w1, c1 = time.perf_counter(), time.thread_time()
        native()
        w2, c2 = time.perf_counter(), time.thread_time()
        ours_t.append(w1 - w0)
        native_t.append(w2 - w1)
        ours_cpu.append(c1 - c0)
        native_cpu.append(c2 - c1)
        ratios.append((w1 - w0) / (w2 - w1))
        cpu_ratios.append((c1 - c0) / max(c2 - c1, 1e-9))
    return {
        "ours": median(ours_t),
        "native": median(native_t),
        "ours_cpu": median(ours_cpu),
        "native_cpu": median(native_cpu),
        "ratio": median(ratios),
        "cpu_ratio": median(cpu_ratios),
    }


def main() -> None:
    out = Path(tempfile.mkdtemp()) / "probe.wasm"
    build_component(ROOT / "guests" / "testing" / "probe" / "probe.py", output=out)
    ours = Instance(Component.load(out))

    engine = wasmtime.Engine()
    linker = wc.Linker(engine)
    linker.add_wasip2()
    store = wasmtime.Store(engine)
    config = wasmtime.WasiConfig()
    sink = Path(tempfile.mkdtemp()) / "stdout"
    config.stdout_file = str(sink)
    store.set_wasi(config)
    native = linker.instantiate(store, wc.Component(engine, out.read_bytes()))
    native_spam = native.get_func(store, "spam")
    native_churn = native.get_func(store, "churn")
    assert native_spam is not None and native_churn is not None

    rows, bare_us = floor_rows()
    for name, ours_fn, native_fn, bare_per_round in (
        (
            f"print x{LINES}",
            lambda: ours.call("spam", "hello mighty", LINES),
            lambda: native_spam(store, "hello mighty", LINES),
            None,
        ),
        (
            f"clocks+random x{CHURN}",
            lambda: ours.call("churn", CHURN),
            lambda: native_churn(store, CHURN),
            # monotonic now (u64), wall now (datetime), get-random-bytes(16) per round
            CHURN * (bare_us["u64"] + bare_us["record"] + bare_us["list16"]) / 1e6,
        ),
    ):
        before = ours.context.calls
        ours_fn()
        imports = ours.context.calls - before
        m = _rounds(ours_fn, native_fn)
        row: dict[str, object] = {
            "name": f"{name}: ours / native WASI",
            "ratio": round(m["ratio"], 2),
            "ours_ms": round(m["ours"] * 1e3, 2),
            "native_ms": round(m["native"] * 1e3, 2),
            "imports": imports,
            "us_per_import": round(m["ours"] / imports * 1e6, 2),
            "extra_us_per_import": round((m["ours"] - m["native"]) / imports * 1e6, 2),
            "cpu_ratio": round(m["cpu_ratio"], 2),
            "cpu_us_per_import": round(m["ours_cpu"] / imports * 1e6, 2),
            "native_cpu_us_per_import": round(m["native_cpu"] / imports * 1e6, 3),
        }
        if bare_per_round is not None:
            row["floor_ratio"] = round((m["native_cpu"] + bare_per_round) / m["native_cpu"], 2)
        row["target"] = "ratio <= 8, print path <= 7 us per import (issue 12)"
        rows.append(row)
    report(rows)


if __name__ == "__main__":
    main()
