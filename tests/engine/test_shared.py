"""Shared core modules: a component's big modules are cut out, imported by name, compiled once
for every component that carries them, and the guest runs exactly as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wasmtime import component as wc

from mighty import Instance, MissingImports
from mighty.engine import SHARE_MODULES_ENV, CompiledCache, Component, get_engine
from mighty.engine._shared import externalize, is_shared_import, module_type, would_externalize
from tests.conftest import assemble

_NUMS = ("i32", "i64", "f32", "f64")
_ZERO = {"i32": "i32.const 0", "i64": "i64.const 0", "f32": "f32.const 0", "f64": "f64.const 0"}

_func = st.tuples(
    st.just("func"),
    st.lists(st.sampled_from(_NUMS), max_size=3),
    st.lists(st.sampled_from(_NUMS), max_size=2),
)
_global = st.tuples(st.just("global"), st.sampled_from(_NUMS), st.booleans())
_table = st.tuples(st.just("table"), st.integers(0, 3), st.none() | st.integers(3, 9))
_memory = st.tuples(st.just("memory"), st.integers(0, 2), st.none() | st.integers(2, 5))


_Item = tuple[str, object, object]


def _desc(item: _Item, ident: str = "") -> str:
    """``item``'s WAT descriptor (``(func $x (param i32))``...), with an identifier if given."""
    kind, a, b = item
    if kind == "func":
        params = " ".join(f"(param {p})" for p in a)  # type: ignore[attr-defined]
        results = " ".join(f"(result {r})" for r in b)  # type: ignore[attr-defined]
        return f"(func {ident} {params} {results})"
    if kind == "global":
        return f"(global {ident} {f'(mut {a})' if b else a})"
    limits = f"{a}" + ("" if b is None else f" {b}")
    return f"(table {ident} {limits} funcref)" if kind == "table" else f"(memory {ident} {limits})"


def _define(index: int, item: _Item) -> str:
    """A definition of ``item`` exported as ``e<index>``."""
    desc = _desc(item, f'(export "e{index}")')[:-1]
    if item[0] == "func":
        return f"{desc} unreachable)"
    if item[0] == "global":
        return f"{desc} ({_ZERO[str(item[1])]}))"
    return f"{desc})"


def _pair(items: list[_Item], answer: int) -> bytes:
    """A component whose module $P defines ``items`` and whose module $M imports them all from
    $P, exports each again and adds `run` (returns ``answer``), lifted as the component's."""
    provider = "\n".join(_define(i, item) for i, item in enumerate(items))
    imports = "\n".join(
        f'(import "p" "e{i}" {_desc(item, f"$i{i}")})' for i, item in enumerate(items)
    )
    again = "\n".join(f'(export "r{i}" ({item[0]} $i{i}))' for i, item in enumerate(items))
    return assemble(
        f"""(component
          (core module $P {provider})
          (core module $M {imports} {again}
            (func (export "run") (result i32) i32.const {answer}))
          (core instance $p (instantiate $P))
          (core instance $m (instantiate $M (with "p" (instance $p))))
          (func (export "run") (result u32) (canon lift (core func $m "run"))))"""
    )


def _run(data: bytes, modules: tuple[tuple[str, wasmtime.Module], ...] = ()) -> int:
    engine = get_engine()
    store = wasmtime.Store(engine)
    store.set_fuel(10_000_000)
    store.set_epoch_deadline(1 << 40)
    linker = wc.Linker(engine)
    with linker.root() as root:
        for name, module in modules:
            root.add_module(name, module)
    instance = linker.instantiate(store, wc.Component(engine, data))
    run = instance.get_func(store, "run")
    assert run is not None
    result = run(store)
    assert isinstance(result, int)
    return result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(st.one_of(_func, _global, _table, _memory), max_size=8).filter(
        lambda items: sum(item[0] == "memory" for item in items) <= 1
    ),
    answer=st.integers(0, 1 << 31),
)
def test_a_cut_out_module_links_where_it_was(items: list[_Item], answer: int) -> None:
    """Whatever a module imports and exports, the type the rewrite declares for it is the one
    wasmtime checks it against: the rewritten component links the modules and runs as before."""
    data = _pair(items, answer)
    cut = externalize(data, min_size=0)
    assert cut is not None
    rewritten, parts = cut
    assert len(parts) == 2
    assert [is_shared_import(part.name) for part in parts] == [True, True]
    engine = get_engine()
    modules = tuple((part.name, wasmtime.Module(engine, part.data)) for part in parts)
    assert _run(rewritten, modules) == _run(data) == answer


def test_a_module_missing_from_the_linker_is_an_error_not_a_wrong_module() -> None:
    """The rewritten component cannot run without its modules, nor with another module under
    a shared name."""
    data = _pair([("func", ["i32"], ["i64"]), ("global", "i32", True)], 7)
    rewritten, parts = externalize(data, min_size=0) or pytest.fail("nothing cut out")
    engine = get_engine()
    with pytest.raises(wasmtime.WasmtimeError):
        _run(rewritten)
    swapped = tuple(
        (part.name, wasmtime.Module(engine, other.data))
        for part, other in zip(parts, reversed(parts), strict=True)
    )
    with pytest.raises(wasmtime.WasmtimeError):
        _run(rewritten, swapped)


def test_small_components_and_components_with_core_types_stay_whole() -> None:
    """Below the size threshold nothing is cut; a component with core types of its own is left
    whole (the declared types would shift their indices)."""
    data = _pair([("func", [], [])], 1)
    assert externalize(data) is None
    assert not would_externalize(data)
    typed = assemble(
        """(component
          (core type $t (module (export "run" (func (result i32)))))
          (core module $M (func (export "run") (result i32) i32.const 5))
          (core instance $m (instantiate $M))
          (func (export "run") (result u32) (canon lift (core func $m "run"))))"""
    )
    assert externalize(typed, min_size=0) is None
    assert _run(typed) == 5


def test_module_type_refuses_what_it_does_not_read() -> None:
    """A module with a type it does not handle (a GC struct) is left inside its component."""
    module = assemble('(module (type (struct (field i32))) (func (export "f")))')
    with pytest.raises(Exception, match="plain function type"):
        module_type(module)
    data = assemble(
        """(component
          (core module $M (type (struct (field i32))) (func (export "run") (result i32) i32.const 3))
          (core instance $m (instantiate $M))
          (func (export "run") (result u32) (canon lift (core func $m "run"))))"""
    )
    assert externalize(data, min_size=0) is None


def test_a_built_component_runs_the_same_with_its_modules_shared(hello_wasm: Path) -> None:
    """The README's handler, its big modules shared: the same imports and the same answers as
    the same component compiled whole."""
    shared = Component.load(hello_wasm, share_modules=True)
    whole = Component.load(hello_wasm, share_modules=False)
    assert len(shared.modules) == 3
    assert whole.modules == ()
    assert shared.imports == whole.imports
    assert shared.export_functions().keys() == whole.export_functions().keys()
    for component in (shared, whole):
        with Instance(component) as instance:
            assert instance.call("greet", "world") == "Hello, world!"
            assert instance.call("fib", 20) == 6765


def test_two_builds_share_one_compiled_copy(
    hello_wasm: Path, probe_wasm: Path, tmp_path: Path
) -> None:
    """Two different handlers carry the same big modules: one compiled module serves both, in
    the process and in the cache (one file per module, whatever the number of components)."""
    cache = CompiledCache(tmp_path)
    hello = Component.load(hello_wasm, cache=cache, share_modules=True)
    probe = Component.load(probe_wasm, cache=cache, share_modules=True)
    assert hello.sha256 != probe.sha256
    assert [name for name, _ in hello.modules] == [name for name, _ in probe.modules]
    for (_, one), (_, other) in zip(hello.modules, probe.modules, strict=True):
        assert one is other
    files = sorted(path.name for path in cache.directory.iterdir())
    assert len([name for name in files if name.startswith("module-")]) == 3
    assert len([name for name in files if name.endswith("-shared.cwasm")]) == 2


_LOAD = """
import sys
from mighty.engine import Component
from mighty import Instance, MissingImports
component = Component.load(sys.argv[1])
with Instance(component) as instance:
    print(component.from_cache, len(component.modules), instance.call("fib", 10))
"""


def _load_in_a_new_process(path: Path, cache: Path) -> str:
    env = {**os.environ, "MTY_CACHE_DIR": str(cache), SHARE_MODULES_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_a_shared_module_lost_from_the_cache_is_compiled_again(
    hello_wasm: Path, tmp_path: Path
) -> None:
    """A new process finds the component and its modules in the cache; with the smallest module
    deleted, or its file corrupted, it compiles what is missing again and runs as before."""
    cache = tmp_path / "cache"
    assert _load_in_a_new_process(hello_wasm, cache) == "False 3 55"
    assert _load_in_a_new_process(hello_wasm, cache) == "True 3 55"
    compiled = CompiledCache(cache)
    modules = sorted(compiled.directory.glob("module-*.cwasm"), key=lambda p: p.stat().st_size)
    smallest = modules[0]
    smallest.unlink()
    assert _load_in_a_new_process(hello_wasm, cache) == "False 3 55"
    assert smallest.exists()
    data = bytearray(smallest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    smallest.write_bytes(bytes(data))
    assert _load_in_a_new_process(hello_wasm, cache) == "False 3 55"
    assert _load_in_a_new_process(hello_wasm, cache) == "True 3 55"


def test_a_guest_importing_a_shared_name_itself_gets_no_module() -> None:
    """A component that imports a core module under a shared module's name (not one mighty cut
    out) is told that nothing provides it, like any import nothing provides."""
    name = "mighty-shared-m" + "0" * 40
    data = assemble(
        f"""(component
          (core type $t (module (export "run" (func (result i32)))))
          (import "{name}" (core module $M (type $t)))
          (core instance $m (instantiate $M))
          (func (export "run") (result u32) (canon lift (core func $m "run"))))"""
    )
    component = Component.load(data, share_modules=True)
    assert component.modules == ()
    assert name in component.imports
    with pytest.raises(MissingImports) as caught:
        Instance(component)
    assert list(caught.value.missing) == [name]


def test_components_load_whole_unless_sharing_is_asked_for(
    hello_wasm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sharing costs every instantiation (wasmtime links each imported module's imports by name
    then), so it is opt-in: ``share_modules=True`` or ``$MTY_SHARE_MODULES=1``."""
    monkeypatch.delenv(SHARE_MODULES_ENV, raising=False)
    assert Component.load(hello_wasm).modules == ()
    monkeypatch.setenv(SHARE_MODULES_ENV, "1")
    assert len(Component.load(hello_wasm).modules) == 3
    assert Component.load(hello_wasm, share_modules=False).modules == ()
    monkeypatch.setenv(SHARE_MODULES_ENV, "0")
    assert Component.load(hello_wasm).modules == ()


_SAMPLE = _pair([("func", ["i32"], ["i64"]), ("global", "f64", False), ("memory", 1, 3)], 9)


@settings(max_examples=300, deadline=None)
@given(
    cut=st.integers(0, len(_SAMPLE)),
    flips=st.lists(st.tuples(st.integers(8, len(_SAMPLE) - 1), st.integers(0, 255)), max_size=4),
)
def test_damaged_components_are_left_whole_never_a_crash(
    cut: int, flips: list[tuple[int, int]]
) -> None:
    """Truncated or altered bytes (a component is untrusted input) make the rewrite decline or
    produce something wasmtime then validates: it never raises, never loops."""
    data = bytearray(_SAMPLE[:cut])
    for at, value in flips:
        if at < len(data):
            data[at] = value
    result = externalize(bytes(data), min_size=0)
    assert result is None or (isinstance(result[0], bytes) and len(result[1]) >= 1)
    assert isinstance(would_externalize(bytes(data), min_size=0), bool)
