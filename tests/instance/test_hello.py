"""The example handler, built by componentize-py, called through mighty with real WIT values."""

from __future__ import annotations

import json
import threading
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty import (
    ArgumentError,
    Budget,
    Cancelled,
    CancelScope,
    Component,
    Err,
    ExportNotFound,
    GuestTrap,
    Instance,
    Ok,
    OutOfFuel,
    OutOfMemory,
)
from mighty.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hello(hello_wasm: Path) -> Component:
    """The compiled example component (compiled once, then from the cache)."""
    return Component.load(hello_wasm)


@pytest.fixture
def instance(hello: Component) -> Instance:
    """A fresh instance of the example."""
    return Instance(hello)


def test_every_export_returns_its_value(instance: Instance) -> None:
    """Strings, integers, records with options, bytes, results and u64 all come back typed."""
    assert instance.call("greet", "world") == "Hello, world!"
    assert instance.call("add", -5, 3) == -2
    assert instance.call("word-stats", "a b a\nc") == {
        "words": 4,
        "lines": 2,
        "chars": 7,
        "top-word": "a",
    }
    assert instance.call("word-stats", "")["top-word"] is None
    data = bytes(range(256)) * 300
    assert instance.call("checksum", data) == zlib.crc32(data)
    assert instance.call("divide", 1.0, 4.0) == Ok(0.25)
    assert instance.call("divide", 1.0, 0.0) == Err("division by zero")
    assert instance.call("fib", 90) == 2880067194370816120


def test_exports_lists_signatures(instance: Instance) -> None:
    """exports() names every function with its WIT signature."""
    signatures = instance.exports()
    assert str(signatures["divide"].result) == "result<f64, string>"
    assert [name for name, _ in signatures["add"].params] == ["a", "b"]


def test_python_exception_in_handler_is_a_trap_with_its_traceback(instance: Instance) -> None:
    """An exception in the handler is a GuestTrap whose message carries the guest's traceback."""
    with pytest.raises(GuestTrap) as info:
        instance.call("add", 2**62, 2**62)  # the sum does not fit s64
    assert "guest stderr" in info.value.message
    assert "Traceback" in info.value.message or "Error" in info.value.message


def test_fuel_budget_on_a_python_guest(instance: Instance) -> None:
    """A CPython guest burning fuel stops with OutOfFuel."""
    with pytest.raises(OutOfFuel):
        instance.call("fib", 1_000_000, budget=Budget(fuel=5_000_000))


def test_memory_ceiling_below_the_interpreter_fails_instantiation(hello: Component) -> None:
    """A ceiling below CPython's initial memory is OutOfMemory at instantiation."""
    with pytest.raises(OutOfMemory) as info:
        Instance(hello, budget=Budget(memory=4 * 1024 * 1024))
    assert info.value.requested > 4 * 1024 * 1024


def test_cancel_a_python_guest(instance: Instance) -> None:
    """A long CPython loop is cancelled from another thread."""
    scope = CancelScope()
    threading.Timer(0.1, scope.cancel, args=("enough",)).start()
    with pytest.raises(Cancelled):
        instance.call("fib", 10**9, budget=Budget(fuel=10**15, timeout=60), cancel=scope)


def test_wrong_argument_types(instance: Instance) -> None:
    """A value that does not fit the WIT type names the parameter and the expected type."""
    with pytest.raises(ArgumentError, match="u32"):
        instance.call("fib", -1)
    with pytest.raises(ArgumentError, match="name"):
        instance.call("greet", b"bytes")
    with pytest.raises(ExportNotFound, match="greet"):
        instance.call("greeet", "x")
    assert instance.call("greet", "still fine") == "Hello, still fine!"


def test_instances_are_isolated(hello: Component) -> None:
    """Two instances of one component have separate memory accounts and usage."""
    with Instance(hello) as one, Instance(hello) as two:
        one.call("fib", 10)
        two.call("fib", 10)
        assert one.last_usage is not None and two.last_usage is not None
        assert one.last_usage.fuel == two.last_usage.fuel


def test_mty_build_and_call_end_to_end(tmp_path: Path) -> None:
    """`mty build` then `mty call --json` on the example gives the result and usage."""
    out = tmp_path / "hello.wasm"
    runner = CliRunner()
    source = Path(__file__).resolve().parents[2] / "examples" / "hello" / "handler.py"
    built = runner.invoke(main, ["build", str(source), "-o", str(out)])
    assert built.exit_code == 0, built.output
    called = runner.invoke(main, ["call", str(out), "word-stats", '"x y x"', "--json"])
    assert called.exit_code == 0, called.output
    doc = json.loads(called.stdout)
    assert doc["ok"] is True
    assert doc["result"] == {"words": 3, "lines": 1, "chars": 5, "top-word": "x"}
    assert doc["usage"]["memory_peak"] > 10_000_000


def test_mty_call_fuel_applies_to_the_call(hello_wasm: Path) -> None:
    """--fuel limits the call itself (instantiation has its own default budget): the JSON
    error carries the call's usage and the guest's output."""
    result = CliRunner().invoke(
        main, ["call", str(hello_wasm), "fib", "90000", "--fuel", "1000000", "--json"]
    )
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["error"]["kind"] == "out_of_fuel"
    assert doc["usage"]["fuel"] == 1_000_000
    assert doc["stdout"] == ""
