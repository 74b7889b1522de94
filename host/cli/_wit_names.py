"""The WIT names of a component's types, read from its binary, for `mty inspect-component`.

wasmtime's component types are structural: an export returning the world's ``record stats``
shows as ``record { words: u32, ... }``, and a variant or an enum loses its name the same way.
The names are in the component itself: a world's own types are *imported* by name at the top
level (``(import "stats" (type (eq 61)))``), an interface's are aliased from its instance by
export name. This reads the top level of the component binary (component-model Binary.md) far
enough to give every exported function its signature in WIT terms with those names, and the
definitions of the named types it uses.

It reads only what it needs and gives up (None: the structural rendering stays) at anything it
does not know, so a newer encoding costs the names, never the command. Nested components and
core modules are skipped by their section sizes. Rejected: wasm-tools (``component wit``), a
development dependency only; parsing the ``component-type`` custom section (the same grammar,
and the top level already carries the names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["NamedSignatures", "named_signatures"]

_PRIMITIVES = {
    0x7F: "bool",
    0x7E: "s8",
    0x7D: "u8",
    0x7C: "s16",
    0x7B: "u16",
    0x7A: "s32",
    0x79: "u32",
    0x78: "s64",
    0x77: "u64",
    0x76: "f32",
    0x75: "f64",
    0x74: "char",
    0x73: "string",
    0x64: "error-context",
}


class _Unknown(Exception):
    """An encoding this reader does not handle: the caller falls back to structural types."""


class _Reader:
    def __init__(self, data: bytes, pos: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = pos
        self.end = len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _Unknown("truncated")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def u32(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 35:
                raise _Unknown("bad LEB128")

    def s33(self) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                if b & 0x40:
                    result -= 1 << shift
                return result
            if shift > 35:
                raise _Unknown("bad LEB128")

    def name(self) -> str:
        size = self.u32()
        if self.pos + size > self.end:
            raise _Unknown("truncated name")
        text = self.data[self.pos : self.pos + size].decode("utf-8", "replace")
        self.pos += size
        return text

    def vec(self) -> int:
        return self.u32()


# A decoded type: ("prim", name) | ("ref", index) | (kind, payload) for defined value types,
# ("func", params, result) | ("instance",) | ("component",) | ("resource",).
_Type = tuple[Any, ...]


def _valtype(r: _Reader) -> _Type:
    value = r.s33()
    if value >= 0:
        return ("ref", value)
    code = value & 0x7F
    if code not in _PRIMITIVES:
        raise _Unknown(f"value type 0x{code:02x}")
    return ("prim", _PRIMITIVES[code])


def _optional(r: _Reader) -> _Type | None:
    flag = r.byte()
    if flag == 0x00:
        return None
    if flag == 0x01:
        return _valtype(r)
    raise _Unknown("bad option flag")


def _defvaltype(r: _Reader, code: int) -> _Type:
    if code in _PRIMITIVES:
        return ("prim", _PRIMITIVES[code])
    if code == 0x72:
        return ("record", [(r.name(), _valtype(r)) for _ in range(r.vec())])
    if code == 0x71:
        cases = []
        for _ in range(r.vec()):
            label = r.name()
            payload = _optional(r)
            if r.byte() != 0x00:
                raise _Unknown("variant case refines")
            cases.append((label, payload))
        return ("variant", cases)
    if code == 0x70:
        return ("list", _valtype(r))
    if code == 0x67:
        inner = _valtype(r)
        return ("fixed-list", inner, r.u32())
    if code == 0x6F:
        return ("tuple", [_valtype(r) for _ in range(r.vec())])
    if code == 0x6E:
        return ("flags", [r.name() for _ in range(r.vec())])
    if code == 0x6D:
        return ("enum", [r.name() for _ in range(r.vec())])
    if code == 0x6B:
        return ("option", _valtype(r))
    if code == 0x6A:
        return ("result", _optional(r), _optional(r))
    if code == 0x69:
        return ("own", r.u32())
    if code == 0x68:
        return ("borrow", r.u32())
    if code in (0x66, 0x65):
        return ("stream" if code == 0x66 else "future", _optional(r))
    raise _Unknown(f"defined type 0x{code:02x}")


def _functype(r: _Reader) -> _Type:
    params = [(r.name(), _valtype(r)) for _ in range(r.vec())]
    kind = r.byte()
    if kind == 0x00:
        result: _Type | None = _valtype(r)
    elif kind == 0x01:
        if r.vec() != 0:
            raise _Unknown("named results")
        result = None
    else:
        raise _Unknown("bad result list")
    return ("func", params, result)


def _externdesc(r: _Reader) -> tuple[int, Any]:
    sort = r.byte()
    if sort == 0x00:
        if r.byte() != 0x11:
            raise _Unknown("core extern")
        return sort, r.u32()
    if sort in (0x01, 0x04, 0x05):
        return sort, r.u32()
    if sort == 0x02:
        raise _Unknown("value extern")
    if sort == 0x03:
        bound = r.byte()
        if bound == 0x00:
            return sort, ("eq", r.u32())
        if bound == 0x01:
            return sort, ("sub-resource",)
        raise _Unknown("type bound")
    raise _Unknown(f"extern sort 0x{sort:02x}")


def _externname(r: _Reader) -> str:
    kind = r.byte()
    if kind not in (0x00, 0x01):
        raise _Unknown("extern name")
    name = r.name()
    if kind == 0x01:
        r.name()  # a version suffix
    return name


def _skip_alias(r: _Reader) -> int:
    """Read an alias; return its sort (0x03 is a type)."""
    sort = r.byte()
    if sort == 0x00:
        r.byte()  # the core sort
    target = r.byte()
    if target in (0x00, 0x01):
        r.u32()
        r.name()
    elif target == 0x02:
        r.u32()
        r.u32()
    else:
        raise _Unknown("alias target")
    return sort


def _skip_decls(r: _Reader, component: bool, depth: int) -> None:
    for _ in range(r.vec()):
        kind = r.byte()
        if kind == 0x00:
            raise _Unknown("core type declaration")
        if kind == 0x01:
            _deftype(r, depth + 1)
        elif kind == 0x02:
            _skip_alias(r)
        elif kind == 0x04 or (component and kind == 0x03):
            _externname(r)
            _externdesc(r)
        else:
            raise _Unknown(f"declaration 0x{kind:02x}")


def _deftype(r: _Reader, depth: int = 0) -> _Type:
    if depth > 16:  # instance types inside component types inside...: a real one nests 2
        raise _Unknown("nesting")
    code = r.byte()
    if code in (0x40, 0x43):
        return _functype(r)
    if code == 0x41:
        _skip_decls(r, component=True, depth=depth)
        return ("component",)
    if code == 0x42:
        _skip_decls(r, component=False, depth=depth)
        return ("instance",)
    if code in (0x3F, 0x3E):
        if r.byte() != 0x7F:
            raise _Unknown("resource representation")
        if code == 0x3E:
            r.u32()
        if r.byte() == 0x01:
            r.u32()
            if code == 0x3E and r.byte() == 0x01:
                r.u32()
        return ("resource",)
    return _defvaltype(r, code)


def _skip_canon_opts(r: _Reader) -> None:
    for _ in range(r.vec()):
        opt = r.byte()
        if opt in (0x00, 0x01, 0x02, 0x06):
            continue
        if opt in (0x03, 0x04, 0x05, 0x07, 0x08):
            r.u32()
            continue
        raise _Unknown(f"canon option 0x{opt:02x}")


@dataclass
class _Top:
    types: list[_Type] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    funcs: list[int | None] = field(default_factory=list)  # the type of each func, if known
    exports: list[tuple[str, int]] = field(default_factory=list)  # (name, func index)


def _read_top(data: bytes) -> _Top:
    if data[:8] != b"\0asm\x0d\x00\x01\x00":
        raise _Unknown("not a component")
    top = _Top()
    r = _Reader(data, 8)
    readers = {7: _types, 6: _aliases, 10: _imports, 11: _exports, 8: _canons}
    while r.pos < r.end:
        section = r.byte()
        size = r.u32()
        body = _Reader(data, r.pos, r.pos + size)
        r.pos += size
        read = readers.get(section)
        if read is not None:  # the rest (core modules, nested components...) adds no type
            for _ in range(body.vec()):
                read(top, body)
    return top


def _types(top: _Top, body: _Reader) -> None:
    top.types.append(_deftype(body))


def _aliases(top: _Top, body: _Reader) -> None:
    start = body.pos
    sort = _skip_alias(body)
    if sort == 0x03:
        top.types.append(("alias",))
        named = _Reader(body.data, start)
        named.byte()
        if named.byte() == 0x00:  # an export of an instance: its name
            named.u32()
            top.names[len(top.types) - 1] = named.name()
    elif sort == 0x01:
        top.funcs.append(None)


def _imports(top: _Top, body: _Reader) -> None:
    name = _externname(body)
    sort, desc = _externdesc(body)
    if sort == 0x03:
        top.types.append(("ref", desc[1]) if desc[0] == "eq" else ("resource",))
        top.names[len(top.types) - 1] = name
    elif sort == 0x01:
        top.funcs.append(desc)


def _exports(top: _Top, body: _Reader) -> None:
    name = _externname(body)
    sort = body.byte()
    if sort == 0x00:
        body.byte()
    index = body.u32()
    if body.byte() == 0x01:  # an ascribed type
        _externdesc(body)
    if sort == 0x03:
        top.types.append(("ref", index))
        top.names[len(top.types) - 1] = name
    elif sort == 0x01:
        top.funcs.append(top.funcs[index] if index < len(top.funcs) else None)
        top.exports.append((name, index))


def _canons(top: _Top, body: _Reader) -> None:
    kind = body.byte()
    if kind == 0x00:  # lift: a component function of a known type
        if body.byte() != 0x00:
            raise _Unknown("lift")
        body.u32()
        _skip_canon_opts(body)
        top.funcs.append(body.u32())
    elif kind == 0x01:  # lower: a core function
        body.byte()
        body.u32()
        _skip_canon_opts(body)
    elif kind in (0x02, 0x03, 0x04, 0x07):  # resource.new/drop/rep, drop async
        body.u32()
    else:
        raise _Unknown(f"canon 0x{kind:02x}")


@dataclass
class NamedSignatures:
    """Exported functions as WIT with type names, and the named types they use."""

    functions: dict[str, str]
    """export name -> ``word-stats: func(text: string) -> stats``"""
    types: list[str]
    """``record stats { words: u32, lines: u32, ... }``, one per named type used, in order."""


class _Render:
    def __init__(self, top: _Top) -> None:
        self.top = top
        self.used: dict[int, None] = {}

    def resolve(self, index: int, depth: int = 0) -> _Type:
        kind = self.top.types[index]
        if kind[0] == "ref" and depth < 64:
            return self.resolve(kind[1], depth + 1)
        return kind

    def value(self, ty: _Type | None, depth: int = 0) -> str:
        if ty is None:
            return "_"
        if depth > 32:
            raise _Unknown("deep")
        if ty[0] == "prim":
            return str(ty[1])
        if ty[0] == "ref":
            index = int(ty[1])
            name = self.top.names.get(index)
            if name is not None:
                resolved = self.resolve(index)
                if resolved[0] in ("record", "variant", "enum", "flags"):
                    self.used.setdefault(index)
                return name
            return self.value(self.top.types[index], depth + 1)
        return self.structure(ty, depth)

    def structure(self, ty: _Type, depth: int) -> str:
        kind = ty[0]
        if kind == "list":
            return f"list<{self.value(ty[1], depth + 1)}>"
        if kind == "fixed-list":
            return f"list<{self.value(ty[1], depth + 1)}, {ty[2]}>"
        if kind == "option":
            return f"option<{self.value(ty[1], depth + 1)}>"
        if kind == "tuple":
            return f"tuple<{', '.join(self.value(t, depth + 1) for t in ty[1])}>"
        if kind == "result":
            ok, err = ty[1], ty[2]
            if ok is None and err is None:
                return "result"
            if err is None:
                return f"result<{self.value(ok, depth + 1)}>"
            return f"result<{self.value(ok, depth + 1)}, {self.value(err, depth + 1)}>"
        if kind in ("own", "borrow"):
            name = self.top.names.get(int(ty[1]), "resource")
            return name if kind == "own" else f"borrow<{name}>"
        if kind in ("stream", "future"):
            return kind if ty[1] is None else f"{kind}<{self.value(ty[1], depth + 1)}>"
        if kind == "record":
            fields = ", ".join(f"{n}: {self.value(t, depth + 1)}" for n, t in ty[1])
            return f"record {{ {fields} }}"
        if kind == "variant":
            cases = ", ".join(
                n if t is None else f"{n}({self.value(t, depth + 1)})" for n, t in ty[1]
            )
            return f"variant {{ {cases} }}"
        if kind in ("enum", "flags"):
            return f"{kind} {{ {', '.join(ty[1])} }}"
        raise _Unknown(f"render {kind}")

    def function(self, name: str, ty: _Type) -> str:
        params = ", ".join(f"{p}: {self.value(t)}" for p, t in ty[1])
        text = f"{name}: func({params})"
        return text if ty[2] is None else f"{text} -> {self.value(ty[2])}"

    def definition(self, index: int) -> str:
        ty = self.resolve(index)
        body = self.structure(ty, 0)
        kind, _, rest = body.partition(" ")
        return f"{kind} {self.top.names[index]} {rest}"


def named_signatures(data: bytes) -> NamedSignatures | None:
    """The exports of the component ``data`` as WIT with type names, or None when its encoding
    has something this reader does not know (then the structural rendering is all there is)."""
    try:
        top = _read_top(data)
        render = _Render(top)
        functions: dict[str, str] = {}
        for name, index in top.exports:
            type_index = top.funcs[index] if index < len(top.funcs) else None
            if type_index is None:
                return None
            ty = render.resolve(type_index)
            if ty[0] != "func":
                return None
            functions[name] = render.function(name, ty)
        types: list[str] = []
        seen: set[int] = set()
        while len(seen) < len(render.used):
            for index in list(render.used):
                if index not in seen:
                    seen.add(index)
                    types.append(render.definition(index))
        return NamedSignatures(functions, types)
    except (_Unknown, IndexError, KeyError, TypeError, RecursionError):
        return None
