"""The compiled-component cache: hits, misses, and never loading a bad entry."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mighty import Component, Instance, InvalidComponent
from mighty.engine import CompiledCache, EngineSettings

TRIVIAL = """
(component
  (core module $m (func (export "f") (result i32) i32.const 7))
  (core instance $i (instantiate $m))
  (func (export "f") (result u32) (canon lift (core func $i "f"))))
"""


@pytest.fixture
def trivial(wat) -> bytes:  # type: ignore[no-untyped-def]
    """A component exporting f() -> u32 returning 7."""
    return wat(TRIVIAL)


def _call_f(component: Component) -> int:
    with Instance(component) as instance:
        result = instance.call("f")
    assert isinstance(result, int)
    return result


def test_second_load_comes_from_cache(tmp_path: Path, trivial: bytes) -> None:
    """The first load compiles and stores; the second deserializes the stored entry."""
    cache = CompiledCache(tmp_path)
    first = Component.load(trivial, cache=cache)
    second = Component.load(trivial, cache=cache)
    assert not first.from_cache
    assert second.from_cache
    assert first.sha256 == second.sha256
    assert _call_f(second) == 7


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="payload-bit-flip"),
        pytest.param(lambda b: b"XXXXXXXX" + b[8:], id="bad-magic"),
        pytest.param(lambda b: b[:10], id="header-cut"),
        pytest.param(lambda b: b"", id="empty"),
        pytest.param(lambda b: b + b"extra", id="trailing-bytes"),
    ],
)
def test_damaged_entry_is_rebuilt_not_loaded(tmp_path: Path, trivial: bytes, damage) -> None:  # type: ignore[no-untyped-def]
    """A damaged cache entry is detected, discarded and replaced by a fresh compile."""
    cache = CompiledCache(tmp_path)
    component = Component.load(trivial, cache=cache)
    entry = cache.path_for(component.sha256)
    entry.write_bytes(damage(entry.read_bytes()))
    again = Component.load(trivial, cache=cache)
    assert not again.from_cache
    assert _call_f(again) == 7
    assert Component.load(trivial, cache=cache).from_cache


def test_concurrent_writers_leave_a_valid_entry(tmp_path: Path, trivial: bytes) -> None:
    """Several threads compiling the same component at once leave one whole, loadable entry."""
    errors: list[BaseException] = []

    def load() -> None:
        try:
            assert _call_f(Component.load(trivial, cache=CompiledCache(tmp_path))) == 7
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Component.load(trivial, cache=CompiledCache(tmp_path)).from_cache
    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".cwasm")]
    assert leftovers == []


def test_key_includes_engine_settings() -> None:
    """Different engine settings give different cache directories."""
    assert EngineSettings().fingerprint != EngineSettings(nan_canonicalization=False).fingerprint
    assert EngineSettings().fingerprint == EngineSettings().fingerprint


def test_core_module_is_refused_with_a_hint(wat) -> None:  # type: ignore[no-untyped-def]
    """A core module is InvalidComponent, and the message says how to make a component."""
    with pytest.raises(
        InvalidComponent, match=r"core WebAssembly module.*wasm-tools component new"
    ):
        Component.load(wat("(module)"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not WebAssembly"),
        (b"hello world, not wasm", "not WebAssembly"),
        (b"\x00asm\x0d\x00\x01\x00\xff\xff\xff", "not a valid component"),
    ],
)
def test_bad_bytes_are_invalid_component(tmp_path: Path, data: bytes, message: str) -> None:
    """Garbage, empty files and broken component bodies are one clear InvalidComponent."""
    with pytest.raises(InvalidComponent, match=message):
        Component.load(data, cache=CompiledCache(tmp_path))


def test_missing_file_is_invalid_component(tmp_path: Path) -> None:
    """A path that does not exist names the path."""
    with pytest.raises(InvalidComponent, match="no such file"):
        Component.load(tmp_path / "nope.wasm")
