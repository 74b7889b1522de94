"""Shared core modules: the big modules every componentize-py component carries, compiled once.

Every component componentize-py builds embeds the same large core modules (libpython's 6.3 MB
of code, libc, the runtime glue: 7 MB of the 7.3 MB left once the memory images are cut out,
identical byte for byte across builds of one componentize-py version); only a few small
modules (the world's bindings, the adapter) differ from one handler to the next. Wasmtime
compiles a component as a whole, so each new build (a hot swap's new version, an evaluated
refactor, a test's own guest) was ~18 s of CPU on the compiler for code it had compiled before,
and each compiled form took 20 MB of cache.

So a loaded component is rewritten: each core module of at least ``MIN_SHARED_BYTES`` is cut
out and the component *imports* a core module of exactly its type instead (a component may
import core modules: ``(import "..." (core module (type ...)))``), named by the module's
sha256. Each such module is compiled once (cached on disk like a component, under
``compiled/.../modules/``) and defined in the linker under that name, so every component that
carries the same module shares one compiled copy, in the cache and in memory. What the guest
runs is unchanged: the same module, instantiated by the same component at the same point.

The rewrite is narrow, like the memory images' (``_image``): a component with core types of its
own, or modules of a kind the reader does not handle (GC types, exception tags), stays whole.

Rejected: wasmtime's incremental compilation cache (per function, the same effect): the C API
has no way to turn it on; compiling components at a lower optimisation level: slower guests.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass

import wasmtime

from mighty._errors import Misuse
from mighty.engine._cache import CompiledCache
from mighty.engine._engine import get_engine
from mighty.engine._image import _Reader, _sections, _uleb, _Unsupported

__all__ = [
    "MIN_SHARED_BYTES",
    "SharedModule",
    "externalize",
    "is_shared_import",
    "module_type",
    "shared_module",
    "would_externalize",
]

MIN_SHARED_BYTES = 64 << 10
"""Modules smaller than this stay inside their component (compiling them costs little)."""

_IMPORT_PREFIX = "mighty-shared-m"


@dataclass(frozen=True)
class SharedModule:
    """A core module cut out of a component: the import name it is linked under, its bytes."""

    name: str
    sha256: str
    data: bytes


def _vec(items: list[bytes]) -> bytes:
    return _uleb(len(items)) + b"".join(items)


def _section(section_id: int, payload: bytes) -> bytes:
    return bytes((section_id,)) + _uleb(len(payload)) + payload


# -- reading a core module's type ----------------------------------------------------------------

_NUMERIC = frozenset((0x7F, 0x7E, 0x7D, 0x7C, 0x7B))
_REFS = frozenset((0x70, 0x6F))  # funcref, externref


def _valtype(reader: _Reader) -> None:
    kind = reader.byte()
    if kind not in _NUMERIC and kind not in _REFS:
        raise _Unsupported(f"value type {kind:#x}")


def _limits(reader: _Reader) -> None:
    flags = reader.byte()
    if flags & ~0x0F:
        raise _Unsupported(f"limits flags {flags:#x}")
    reader.uleb()
    if flags & 0x01:
        reader.uleb()
    if flags & 0x08:
        reader.uleb()  # custom page size


def _tabletype(reader: _Reader) -> None:
    if reader.byte() not in _REFS:
        raise _Unsupported("table of an unknown reference type")
    _limits(reader)


def _globaltype(reader: _Reader) -> None:
    _valtype(reader)
    if reader.byte() not in (0x00, 0x01):
        raise _Unsupported("global mutability")


def _const_expr(reader: _Reader) -> None:
    while True:
        op = reader.byte()
        if op == 0x0B:
            return
        if op in (0x41, 0x42):  # i32.const, i64.const
            reader.sleb()
        elif op == 0x43:
            reader.skip(4)
        elif op == 0x44:
            reader.skip(8)
        elif op in (0x23, 0xD2):  # global.get, ref.func
            reader.uleb()
        elif op == 0xD0:  # ref.null
            if reader.byte() not in _REFS:
                raise _Unsupported("ref.null of an unknown type")
        elif op in (0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E):  # extended constant arithmetic
            pass
        else:
            raise _Unsupported(f"constant expression opcode {op:#x}")


class _Shape:
    """What a core module's type is made of, read section by section."""

    def __init__(self) -> None:
        self.types: list[bytes] = []
        self.imports: list[bytes] = []
        self.funcs: list[int] = []  # type index of each function, imported ones first
        self.tables: list[bytes] = []
        self.memories: list[bytes] = []
        self.globals: list[bytes] = []
        self.exports: list[tuple[bytes, int, int]] = []

    def read(self, section: int, reader: _Reader) -> None:
        count = reader.uleb()
        if section == 1:
            self.types.extend(self._type(reader) for _ in range(count))
        elif section == 2:
            self.imports.extend(self._import(reader) for _ in range(count))
        elif section == 3:
            self.funcs.extend(reader.uleb() for _ in range(count))
        elif section == 4:
            self.tables.extend(self._table(reader) for _ in range(count))
        elif section == 5:
            self.memories.extend(self._memory(reader) for _ in range(count))
        elif section == 6:
            self.globals.extend(self._global(reader) for _ in range(count))
        elif section == 7:
            for _ in range(count):
                start = reader.pos
                reader.name()
                name = reader.since(start)
                self.exports.append((name, reader.byte(), reader.uleb()))

    @staticmethod
    def _type(reader: _Reader) -> bytes:
        start = reader.pos
        if reader.byte() != 0x60:
            raise _Unsupported("a type that is not a plain function type")
        for _ in range(reader.uleb()):
            _valtype(reader)
        for _ in range(reader.uleb()):
            _valtype(reader)
        return reader.since(start)

    def _import(self, reader: _Reader) -> bytes:
        start = reader.pos
        reader.name()
        reader.name()
        kind = reader.byte()
        desc = reader.pos
        if kind == 0x00:
            self.funcs.append(reader.uleb())
        elif kind == 0x01:
            _tabletype(reader)
            self.tables.append(reader.since(desc))
        elif kind == 0x02:
            _limits(reader)
            self.memories.append(reader.since(desc))
        elif kind == 0x03:
            _globaltype(reader)
            self.globals.append(reader.since(desc))
        else:
            raise _Unsupported(f"import kind {kind:#x}")
        return reader.since(start)

    @staticmethod
    def _table(reader: _Reader) -> bytes:
        initialised = reader.data[reader.pos] == 0x40  # a table with an initial value
        if initialised:
            reader.skip(1)
            if reader.byte() != 0x00:
                raise _Unsupported("table encoding")
        start = reader.pos
        _tabletype(reader)
        table = reader.since(start)
        if initialised:
            _const_expr(reader)
        return table

    @staticmethod
    def _memory(reader: _Reader) -> bytes:
        start = reader.pos
        _limits(reader)
        return reader.since(start)

    @staticmethod
    def _global(reader: _Reader) -> bytes:
        start = reader.pos
        _globaltype(reader)
        kind = reader.since(start)
        _const_expr(reader)
        return kind

    def export_decl(self, name: bytes, kind: int, index: int) -> bytes:
        try:
            if kind == 0x00:
                desc = b"\x00" + _uleb(self.funcs[index])
            elif kind == 0x01:
                desc = b"\x01" + self.tables[index]
            elif kind == 0x02:
                desc = b"\x02" + self.memories[index]
            elif kind == 0x03:
                desc = b"\x03" + self.globals[index]
            else:
                raise _Unsupported(f"export kind {kind:#x}")
        except IndexError:
            raise _Unsupported("an export of an index out of range") from None
        return b"\x03" + name + desc


_TYPED_SECTIONS = frozenset((1, 2, 3, 4, 5, 6, 7))
# Start, elements, code, data, data count and custom sections are no part of the type.
_UNTYPED_SECTIONS = frozenset((0, 8, 9, 10, 11, 12))


def module_type(module: bytes) -> bytes:
    """The component-model encoding of ``module``'s type (``core:moduletype``): its function
    types, its imports as written and an export declaration for each of its exports."""
    if module[:8] != b"\x00asm\x01\x00\x00\x00":
        raise _Unsupported("not a core module")
    shape = _Shape()
    view = memoryview(module)
    for section, _start, body, end in _sections(view, 8):
        if section in _UNTYPED_SECTIONS:
            continue
        if section not in _TYPED_SECTIONS:
            raise _Unsupported(f"section {section}")  # tags, string constants, ...
        reader = _Reader(view[:end], body)
        shape.read(section, reader)
        if reader.pos != end:
            raise _Unsupported(f"section {section} has bytes left over")
    decls = [b"\x01" + t for t in shape.types] + [b"\x00" + i for i in shape.imports]
    decls.extend(shape.export_decl(*export) for export in shape.exports)
    return b"\x50" + _vec(decls)


# -- rewriting the component ---------------------------------------------------------------------


def externalize(
    data: bytes, min_size: int = MIN_SHARED_BYTES
) -> tuple[bytes, tuple[SharedModule, ...]] | None:
    """``data`` with each core module of at least ``min_size`` bytes replaced by an import of a
    core module of its type, and those modules; None when nothing is cut out (the component is
    small, or outside what the rewrite handles)."""
    try:
        return _externalize(data, min_size)
    except (_Unsupported, IndexError):
        return None


def would_externalize(data: bytes, min_size: int = MIN_SHARED_BYTES) -> bool:
    """Whether :func:`externalize` would cut modules out of ``data`` (when they are modules of
    a kind it handles): read from the component's sections alone, no module is looked into."""
    try:
        return bool(_cut(data, min_size))
    except (_Unsupported, IndexError):
        return False


def _cut(data: bytes, min_size: int) -> list[tuple[int, int, int]]:
    """(start, payload start, end) of each module section to cut out: none when the component
    has core types of its own (ours would shift their indices). At the top level only a core
    type section defines them: an alias there cannot (core instances export no types, and
    there is no outer component to alias from)."""
    if data[:4] != b"\x00asm" or data[6:8] != b"\x01\x00":
        raise _Unsupported("not a component")
    sections = _sections(memoryview(data), 8)
    if any(section == 3 for section, _start, _body, _end in sections):
        return []
    return [
        (start, body, end)
        for section, start, body, end in sections
        if section == 1 and end - body >= min_size
    ]


def _externalize(data: bytes, min_size: int) -> tuple[bytes, tuple[SharedModule, ...]] | None:
    cut = _cut(data, min_size)
    if not cut:
        return None
    shared: list[SharedModule] = []
    types: list[bytes] = []
    for _start, body, end in cut:
        payload = data[body:end]
        digest = hashlib.sha256(payload).hexdigest()
        types.append(module_type(payload))
        shared.append(SharedModule(f"{_IMPORT_PREFIX}{digest[:40]}", digest, payload))
    parts: list[bytes] = [data[:8]]
    pos = 8
    for index, ((start, _body, end), part) in enumerate(zip(cut, shared, strict=True)):
        parts.append(data[pos:start])
        if index == 0:
            # Every module type in one core type section, before the first import that uses
            # one: the component has no other core types, so they are core types 0..n-1.
            parts.append(_section(3, _vec(types)))
        name = part.name.encode()
        entry = b"\x00" + _uleb(len(name)) + name + b"\x00\x11" + _uleb(index)
        parts.append(_section(10, _vec([entry])))
        pos = end
    parts.append(data[pos:])
    return b"".join(parts), tuple(shared)


# -- compiled modules, shared by every component in the process -----------------------------------


class _Compiled:
    lock = threading.Lock()
    modules: dict[str, wasmtime.Module] = {}  # noqa: RUF012 - one registry per process
    locks: dict[str, threading.Lock] = {}  # noqa: RUF012


def is_shared_import(name: str) -> bool:
    """Whether a component's import ``name`` is one of the shared modules it was rewritten to
    import (not something the guest asks the host for)."""
    return name.startswith(_IMPORT_PREFIX)


def shared_module(
    name: str, data: bytes | None, cache: CompiledCache | None
) -> wasmtime.Module | None:
    """The compiled core module linked as ``name``: this process's, else the cache's, else
    compiled from ``data`` (and cached). None when neither has it and ``data`` is None."""
    digest = name[len(_IMPORT_PREFIX) :]
    module = _Compiled.modules.get(name)
    if module is not None:
        if cache is not None and not cache.module_path_for(digest).exists():
            cache.store_module(digest, module)  # another cache directory than the first
        return module
    with _Compiled.lock:
        lock = _Compiled.locks.setdefault(name, threading.Lock())
    # One compiler per module at a time (7 s of CPU for libpython): the others wait for it.
    with lock:
        module = _Compiled.modules.get(name)
        if module is not None:
            return module
        if cache is not None:
            module = cache.load_module(digest)
        if module is None:
            if data is None:
                return None
            if not hashlib.sha256(data).hexdigest().startswith(digest):
                raise Misuse(f"the bytes given for {name} are another module's")
            module = wasmtime.Module(get_engine(), data)
            if cache is not None:
                cache.store_module(digest, module)
        _Compiled.modules[name] = module
        return module
