"""Loading components: validate the bytes, compile once, cache the compiled form."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import component as wc

from mighty._errors import CompileError, InvalidComponent
from mighty._files import FileRefused, read_regular_file
from mighty.engine._cache import CompiledCache
from mighty.engine._engine import get_engine
from mighty.engine._image import MemoryImage, split_images
from mighty.engine._memory import MemoryAccount, instantiating_into
from mighty.engine._shared import (
    externalize,
    is_shared_import,
    shared_module,
    would_externalize,
)
from mighty.engine._signals import shielded
from mighty.engine._state import MemoryState
from mighty.engine._store import keep_component

__all__ = ["MAX_COMPONENT_BYTES", "SHARE_MODULES_ENV", "Component", "check_component_bytes"]

_T = TypeVar("_T")
SHARE_MODULES_ENV = "MTY_SHARE_MODULES"
"""Set to ``1``: ``Component.load(share_modules=None)`` shares big core modules (else whole)."""
_WASM_MAGIC = b"\x00asm"
_CORE_VERSION = b"\x01\x00\x00\x00"
_COMPONENT_VERSION_LAYER = b"\x01\x00"  # layer field of the component binary header


def _imports(
    wasm: wc.Component, modules: Sequence[tuple[str, wasmtime.Module]] = ()
) -> tuple[str, ...]:
    """Every import but the shared ``modules`` (one named like them that is not among them is
    the guest's own import, which the gate then reports as missing)."""
    linked = {name for name, _ in modules}
    return tuple(name for name in wasm.type.imports(get_engine()) if name not in linked)


def _compile(origin: str, size: int, compile_: Callable[[], _T]) -> _T:
    try:
        return compile_()
    except MemoryError:
        raise CompileError(
            f"cannot compile {origin}: not enough memory for a {size}-byte component"
        ) from None
    except WasmtimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid"
        if "failed to parse" in str(exc) or "invalid" in first.lower():
            raise InvalidComponent(f"{origin} is not a valid component: {first}") from exc
        raise CompileError(f"cannot compile {origin}: {first}") from exc


def _compiled_module(
    name: str,
    data: bytes,
    cache: CompiledCache | None,
    origin: str,
    progress: Callable[[str], None] | None,
) -> wasmtime.Module:
    module = shared_module(name, None, cache)
    if module is not None:
        return module
    if progress is not None:
        progress(f"compiling a core module of {origin} ({len(data) / 1e6:.1f} MB), once for all")
    compiled = _compile(origin, len(data), lambda: shared_module(name, data, cache))
    assert compiled is not None  # given its bytes, it is compiled or raises
    return compiled


def _linked_modules(
    wasm: wc.Component, cache: CompiledCache | None
) -> tuple[tuple[str, wasmtime.Module], ...] | None:
    """The shared modules a compiled component imports, or None if one is in no cache."""
    found = []
    for name in wasm.type.imports(get_engine()):
        if is_shared_import(name):
            module = shared_module(name, None, cache)
            if module is None:
                return None  # removed from the cache: compile the component again
            found.append((name, module))
    return tuple(found)


def check_component_bytes(data: bytes | bytearray | memoryview, origin: str) -> None:
    """Raise InvalidComponent with a precise reason unless ``data`` starts like a component."""
    head = bytes(data[:8])
    if len(head) < 8 or head[:4] != _WASM_MAGIC:
        raise InvalidComponent(f"{origin} is not WebAssembly (it does not start with \\0asm)")
    if head[4:8] == _CORE_VERSION:
        raise InvalidComponent(
            f"{origin} is a core WebAssembly module, not a component "
            "(wrap it with `wasm-tools component new`, or build it with `mty build`)"
        )
    if head[6:8] != _COMPONENT_VERSION_LAYER:
        raise InvalidComponent(
            f"{origin} is WebAssembly of an unknown kind (version/layer {head[4:8].hex()})"
        )


MAX_COMPONENT_BYTES = 256 << 20
"""The largest component :meth:`Component.load` takes (componentize-py's are ~20 MB), checked
before a byte is read. Loading holds about twice the size (the bytes, and wasmtime's copy while
it compiles): 256 MiB took +518 MB of RSS and 5 s (``benchmarks/bench_restore.py``); the 1 GiB
limit before it let a control-socket reload reach 2.16 GB and end in ``MemoryError``."""


def _read_component_file(path: Path, origin: str) -> bytes:
    """The file's bytes, if it is a regular file of at most MAX_COMPONENT_BYTES that starts like
    WebAssembly: checked before the rest is read, so a FIFO, a device or a huge file of
    something else costs nothing (paths come from manifests, traces and control requests)."""
    try:
        return read_regular_file(
            path, MAX_COMPONENT_BYTES, head=lambda head: check_component_bytes(head, origin)
        )
    except FileRefused as exc:
        raise InvalidComponent(exc.message) from exc


@dataclass(frozen=True, eq=False)
class Component:
    """A compiled component, ready to instantiate any number of times.

    ``sha256`` names its bytes (the compiled-cache key and, later, the trace's reference to it).
    ``origin`` is the path or a description, used in messages.
    """

    wasm: wc.Component
    sha256: str
    origin: str
    size: int
    from_cache: bool
    imports: tuple[str, ...]
    """Every import by its full name (``wasi:cli/stdout@0.2.9`` ...), read once at load."""
    images: tuple[MemoryImage, ...] = ()
    """Initial memory contents shared copy-on-write by every instance (see ``_image``). When
    present, ``wasm`` was compiled from the bytes with those segments emptied, so it must be
    instantiated inside :meth:`instantiating`, as :class:`mighty.Instance` does."""
    modules: tuple[tuple[str, wasmtime.Module], ...] = ()
    """The core modules ``wasm`` imports by these names instead of carrying them (``_shared``):
    a linker that instantiates it must define them (``Gate.linker_for`` does)."""

    def instantiating(
        self,
        account: MemoryAccount,
        *,
        prefault: bool = False,
        states: Sequence[MemoryState] = (),
    ) -> instantiating_into:
        """The block inside which to instantiate ``wasm``: memories charged to ``account``
        and started from this component's images (their known hot pages copied up front
        with ``prefault``), or from ``states`` frozen from earlier instances."""
        return instantiating_into(account, self.images, prefault=prefault, states=states)

    @classmethod
    @shielded
    def load(
        cls,
        source: str | os.PathLike[str] | bytes | bytearray,
        *,
        cache: CompiledCache | None = None,
        use_cache: bool = True,
        progress: Callable[[str], None] | None = None,
        share_memory: bool = True,
        share_modules: bool | None = None,
    ) -> Component:
        """Load a component from a path or bytes, compiling it only if no cached form exists.

        With ``share_memory`` (the default) the initial memory contents become images that all
        instances share copy-on-write, when the component's shape allows (see ``_image``);
        ``share_memory=False`` keeps wasmtime copying the data segments into every instance
        (the baseline the benchmarks and the differential tests compare against).
        With ``share_modules`` its big core modules are compiled once for every component that
        carries them (see ``_shared``): a new build compiles ~15x faster, and each instantiation
        costs ~1 ms more. ``None`` (the default): whole, unless ``$MTY_SHARE_MODULES`` is ``1``.
        """
        if isinstance(source, bytes | bytearray):
            if len(source) > MAX_COMPONENT_BYTES:
                raise InvalidComponent(
                    f"<bytes> is {len(source)} bytes, over the {MAX_COMPONENT_BYTES}-byte "
                    "limit for a component"
                )
            data = bytes(source)
            origin = "<bytes>"
        else:
            path = Path(source)
            origin = str(path)
            data = _read_component_file(path, origin)
        check_component_bytes(data, origin)
        size = len(data)
        digest = hashlib.sha256(data).hexdigest()
        keep_component(digest, data)  # traces find it by hash (_store); a stat when kept
        # Cut the images whether or not a compiled form is cached: they live in memory only.
        # The cache key says which bytes were compiled, so a compiled form of the emptied bytes
        # is never loaded without its images (or the other way round).
        split = split_images(data) if share_memory else None
        images: tuple[MemoryImage, ...] = ()
        key = digest
        if split is not None:
            data, images = split
            key = f"{digest}-images"
        cache = cache if cache is not None else (CompiledCache() if use_cache else None)
        # Compiled with its big modules cut out (``_shared``), or whole (small components; or
        # modules the rewrite does not handle, then whole under the "-shared" key too).
        if share_modules is None:
            share_modules = os.environ.get(SHARE_MODULES_ENV) == "1"
        sharing = share_modules and would_externalize(data)
        if sharing:
            key = f"{key}-shared"
        if cache is not None:
            cached = cache.load(key)
            modules = _linked_modules(cached, cache) if cached is not None and sharing else ()
            if cached is not None and modules is not None:
                imports = _imports(cached, modules)
                return cls(cached, digest, origin, size, True, imports, images, modules)
        cut = externalize(data) if sharing else None
        shared: tuple[tuple[str, wasmtime.Module], ...] = ()
        if cut is not None:
            data, parts = cut
            shared = tuple(
                (part.name, _compiled_module(part.name, part.data, cache, origin, progress))
                for part in parts
            )
        if progress is not None:
            progress(f"compiling {origin} ({size / 1e6:.1f} MB); cached after this run")
        compiled = _compile(origin, size, lambda: wc.Component(get_engine(), data))
        if cache is not None:
            cache.store(key, compiled)
        imports = _imports(compiled, shared)
        return cls(compiled, digest, origin, size, False, imports, images, shared)

    def export_functions(self, *, include_internal: bool = False) -> dict[str, wc.FuncType]:
        """Every exported function, top level by name and nested ones as ``instance#name``.

        Toolchain internals are left out unless ``include_internal``: componentize-py's
        ``exports#init(app-name, symbols, stub-wasi)``, which it calls itself while building
        (pre-initialisation) and which no host should call. It is recognised by its name and
        its parameters, so a handler's own ``init`` in an interface named ``exports`` stays.
        """
        engine = get_engine()
        found: dict[str, wc.FuncType] = {}
        for name, extern in self.wasm.type.exports(engine).items():
            item = extern.ty
            if isinstance(item, wc.FuncType):
                found[name] = item
            elif isinstance(item, wc.ComponentInstanceType):
                for inner, inner_extern in item.exports(engine).items():
                    inner_item = inner_extern.ty
                    if isinstance(inner_item, wc.FuncType):
                        found[f"{name}#{inner}"] = inner_item
        if not include_internal:
            internal = found.get("exports#init")
            if internal is not None and [p[0] for p in internal.params] == [
                "app-name",
                "symbols",
                "stub-wasi",
            ]:
                del found["exports#init"]
        return found
