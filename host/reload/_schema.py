"""State schemas, and the rules that decide whether a running agent's state fits a new version.

A guest's ``state-schema`` export returns JSON::

    {"hash": "<sha256 hex>",
     "fields": {"count": {"type": "int", "default": true},
                "names": {"type": "list", "default": false, "renamed_from": "labels"}},
     "migrates_from": ["<old hash>", ...]}

The JSON comes from the guest, so :func:`parse_schema` treats it as hostile: bounded size, bounded
counts and lengths, and only :class:`SchemaError` on anything wrong.

Types are the annotation text handler authors wrote. We normalise that text into a tiny type
tree and decide compatibility on the tree; text that does not parse stays an opaque name, equal
only to the same text.

Rejected designs: evaluating annotations (the host must never run guest text, and the names need
not exist host-side); a full PEP 484 checker (state values are plain data restored by copy, so the
only question is "does every old value fit the new type", which a dozen rules answer).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

from mighty._errors import BadInput

__all__ = [
    "MAX_FIELDS",
    "MAX_MIGRATES_FROM",
    "MAX_NAME_LENGTH",
    "MAX_SCHEMA_BYTES",
    "MAX_TYPE_LENGTH",
    "Compatibility",
    "FieldInfo",
    "SchemaError",
    "StateSchema",
    "check_compatible",
    "normalise_type",
    "parse_schema",
    "to_json",
]

MAX_SCHEMA_BYTES = 64 * 1024
MAX_FIELDS = 1024
MAX_NAME_LENGTH = 128
MAX_TYPE_LENGTH = 256
MAX_HASH_LENGTH = 128
MAX_MIGRATES_FROM = 64
# Deeper type nesting than this is treated as opaque text rather than parsed, so a hostile
# type string cannot make the parser recurse deeply.
_MAX_TYPE_DEPTH = 32


class SchemaError(BadInput):
    """A state schema is not well-formed; the message says which part and why."""

    kind = "bad_schema"


@dataclass(frozen=True)
class FieldInfo:
    """One state field: its annotation text, whether it has a default, and a former name."""

    type: str
    has_default: bool
    renamed_from: str | None = None


@dataclass(frozen=True)
class StateSchema:
    """The state layout of one agent version, identified by ``hash``."""

    hash: str
    fields: Mapping[str, FieldInfo]
    migrates_from: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        # A read-only copy: the schema is frozen data, and a caller's dict must not change it.
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def __hash__(self) -> int:
        # The generated hash would hash the mapping proxy, which is unhashable.
        return hash((self.hash, frozenset(self.fields.items()), self.migrates_from))


@dataclass(frozen=True)
class Compatibility:
    """The verdict of :func:`check_compatible`; ``problems`` is one sentence per fault."""

    ok: bool
    migration: bool = False
    problems: tuple[str, ...] = ()


# -- parsing -----------------------------------------------------------------------------------

_HEX = re.compile(r"[0-9a-fA-F]+")
_FIELD_KEYS = frozenset({"type", "default", "renamed_from"})
_TOP_KEYS = frozenset({"hash", "fields", "migrates_from"})


class _Duplicate(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json keeps the last of repeated keys silently; two definitions of a field is an error.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_schema(text: str | bytes) -> StateSchema:
    """Parse the JSON of a guest's ``state-schema`` export; :class:`SchemaError` if malformed."""
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if len(raw) > MAX_SCHEMA_BYTES:
            raise SchemaError(
                f"state schema is {len(raw)} bytes, more than the limit of {MAX_SCHEMA_BYTES}"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError(f"state schema is not UTF-8: {exc}") from None
    elif not isinstance(text, str):
        raise SchemaError(f"state schema must be str or bytes, not {type(text).__name__}")
    elif len(text) > MAX_SCHEMA_BYTES:
        # Characters, not bytes, but a cheap first bound before we encode anything.
        raise SchemaError(
            f"state schema is {len(text)} characters, more than the limit of {MAX_SCHEMA_BYTES}"
        )
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _Duplicate as dup:
        raise SchemaError(f"state schema repeats the key {dup.key!r}") from None
    except RecursionError:
        raise SchemaError("state schema is nested too deeply") from None
    except ValueError as exc:
        raise SchemaError(f"state schema is not valid JSON: {exc}") from None
    return _from_data(data)


def _from_data(data: Any) -> StateSchema:
    if not isinstance(data, dict):
        raise SchemaError(f"state schema must be a JSON object, not {_json_kind(data)}")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise SchemaError(f"state schema has unknown keys: {', '.join(map(repr, unknown))}")
    if "hash" not in data:
        raise SchemaError("state schema has no 'hash'")
    schema_hash = _hash(data["hash"], "'hash'")
    if "fields" not in data:
        raise SchemaError("state schema has no 'fields'")
    raw_fields = data["fields"]
    if not isinstance(raw_fields, dict):
        raise SchemaError(f"'fields' must be an object, not {_json_kind(raw_fields)}")
    if len(raw_fields) > MAX_FIELDS:
        raise SchemaError(f"state schema has {len(raw_fields)} fields, more than {MAX_FIELDS}")
    fields = {name: _field(name, spec) for name, spec in raw_fields.items()}
    raw_from = data.get("migrates_from", [])
    if not isinstance(raw_from, list):
        raise SchemaError(f"'migrates_from' must be a list, not {_json_kind(raw_from)}")
    if len(raw_from) > MAX_MIGRATES_FROM:
        raise SchemaError(
            f"'migrates_from' has {len(raw_from)} hashes, more than {MAX_MIGRATES_FROM}"
        )
    migrates_from = frozenset(
        _hash(item, f"'migrates_from'[{i}]") for i, item in enumerate(raw_from)
    )
    return StateSchema(schema_hash, fields, migrates_from)


def _field(name: str, spec: Any) -> FieldInfo:
    _check_name(name, "field name")
    where = f"field {name!r}"
    if not isinstance(spec, dict):
        raise SchemaError(f"{where} must be an object, not {_json_kind(spec)}")
    unknown = sorted(set(spec) - _FIELD_KEYS)
    if unknown:
        raise SchemaError(f"{where} has unknown keys: {', '.join(map(repr, unknown))}")
    if "type" not in spec:
        raise SchemaError(f"{where} has no 'type'")
    type_text = spec["type"]
    if not isinstance(type_text, str):
        raise SchemaError(f"{where}: 'type' must be a string, not {_json_kind(type_text)}")
    if not type_text.strip():
        raise SchemaError(f"{where}: 'type' is empty")
    if len(type_text) > MAX_TYPE_LENGTH:
        raise SchemaError(
            f"{where}: 'type' is {len(type_text)} characters, more than {MAX_TYPE_LENGTH}"
        )
    if not type_text.isprintable():
        raise SchemaError(f"{where}: 'type' contains unprintable characters")
    if "default" not in spec:
        raise SchemaError(f"{where} has no 'default'")
    has_default = spec["default"]
    if not isinstance(has_default, bool):
        raise SchemaError(
            f"{where}: 'default' must be true or false, not {_json_kind(has_default)}"
        )
    renamed_from = spec.get("renamed_from")
    if renamed_from is not None:
        if not isinstance(renamed_from, str):
            raise SchemaError(
                f"{where}: 'renamed_from' must be a string or null, not {_json_kind(renamed_from)}"
            )
        _check_name(renamed_from, f"{where}: 'renamed_from'")
        if renamed_from == name:
            raise SchemaError(f"{where} is renamed from itself")
    return FieldInfo(type_text, has_default, renamed_from)


def _check_name(name: str, what: str) -> None:
    if len(name) > MAX_NAME_LENGTH:
        raise SchemaError(f"{what} {name[:40]!r}... is longer than {MAX_NAME_LENGTH} characters")
    if not name.isidentifier():
        raise SchemaError(f"{what} {name!r} is not a Python identifier")


def _hash(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{where} must be a hex string, not {_json_kind(value)}")
    if len(value) > MAX_HASH_LENGTH:
        raise SchemaError(f"{where} is longer than {MAX_HASH_LENGTH} characters")
    if not _HEX.fullmatch(value):
        raise SchemaError(f"{where} must be a non-empty hex string, got {value[:40]!r}")
    # hashlib writes lowercase; accept either so a hand-written schema compares equal.
    return value.lower()


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def to_json(schema: StateSchema) -> str:
    """The JSON text of ``schema``, in the format :func:`parse_schema` reads."""
    fields: dict[str, dict[str, Any]] = {}
    for name, info in schema.fields.items():
        spec: dict[str, Any] = {"type": info.type, "default": info.has_default}
        if info.renamed_from is not None:
            spec["renamed_from"] = info.renamed_from
        fields[name] = spec
    return json.dumps(
        {"hash": schema.hash, "fields": fields, "migrates_from": sorted(schema.migrates_from)},
        sort_keys=True,
    )


# -- types -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Name:
    name: str


@dataclass(frozen=True)
class _Generic:
    origin: str
    args: tuple[_Type, ...]


@dataclass(frozen=True)
class _Union:
    members: frozenset[_Type]


@dataclass(frozen=True)
class _Items:
    """A bracketed list inside a subscript, as in ``Callable[[int], str]``."""

    items: tuple[_Type, ...]


_Type: TypeAlias = _Name | _Generic | _Union | _Items

_PREFIXES = re.compile(r"(?<![\w.])(?:typing_extensions|typing|builtins)\.")
_TOKEN = re.compile(r"\.\.\.|[A-Za-z_][\w.]*|'[^']*'|\"[^\"]*\"|-?\d+|[\[\],|]")
_ALIASES = {
    "List": "list",
    "Dict": "dict",
    "Tuple": "tuple",
    "Set": "set",
    "FrozenSet": "frozenset",
    "Type": "type",
    "NoneType": "None",
    "types.NoneType": "None",
}
_NONE = _Name("None")
_TOP = frozenset({"Any", "object"})
# Containers whose elements are plain data, restored by copy: a list of ints is a fine list of
# floats. Other generics may be invariant, so their arguments must match exactly.
_COVARIANT = frozenset({"list", "set", "frozenset", "dict", "tuple"})


class _Opaque(Exception):
    pass


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        piece = self.peek()
        if piece is None or (expected is not None and piece != expected):
            raise _Opaque
        self.pos += 1
        return piece

    def union(self, depth: int) -> _Type:
        if depth > _MAX_TYPE_DEPTH:
            raise _Opaque
        members = [self.atom(depth)]
        while self.peek() == "|":
            self.take()
            members.append(self.atom(depth))
        return _make_union(members)

    def atom(self, depth: int) -> _Type:
        piece = self.take()
        if piece == "[":
            items = self.arguments(depth + 1)
            return _Items(tuple(items))
        if piece in {"]", ",", "|"}:
            raise _Opaque
        name = _ALIASES.get(piece, piece)
        if self.peek() != "[":
            return _Name(name)
        self.take("[")
        args = self.arguments(depth + 1)
        if name == "Optional" and len(args) == 1:
            return _make_union([args[0], _NONE])
        if name == "Union" and args:
            return _make_union(args)
        return _Generic(name, tuple(args))

    def arguments(self, depth: int) -> list[_Type]:
        # After an opening bracket: comma-separated types up to the closing one.
        args: list[_Type] = []
        if self.peek() == "]":
            self.take()
            return args
        while True:
            args.append(self.union(depth))
            piece = self.take()
            if piece == "]":
                return args
            if piece != ",":
                raise _Opaque


def _make_union(members: list[_Type]) -> _Type:
    flat: set[_Type] = set()
    for member in members:
        if isinstance(member, _Union):
            flat |= member.members
        else:
            flat.add(member)
    if len(flat) == 1:
        return next(iter(flat))
    return _Union(frozenset(flat))


_QUOTED = re.compile(r"('[^']*'|\"[^\"]*\")")


def _clean(text: str) -> str:
    # Whitespace and module prefixes go, except inside quoted literals (Literal['a b']).
    parts = _QUOTED.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = _PREFIXES.sub("", "".join(parts[i].split()))
    return "".join(parts)


def _parse_type(text: str) -> _Type:
    cleaned = _clean(text)
    # A quoted forward reference means the same as the bare annotation.
    if len(cleaned) >= 2 and cleaned[0] == cleaned[-1] and cleaned[0] in "'\"":
        cleaned = cleaned[1:-1]
    tokens = _TOKEN.findall(cleaned)
    if "".join(tokens) != cleaned or len(cleaned) > MAX_TYPE_LENGTH:
        return _Name(cleaned)
    parser = _Parser(tokens)
    try:
        parsed = parser.union(0)
    except _Opaque:
        return _Name(cleaned)
    if parser.peek() is not None:
        return _Name(cleaned)
    return parsed


def _render(t: _Type) -> str:
    if isinstance(t, _Name):
        return t.name
    if isinstance(t, _Generic):
        return f"{t.origin}[{', '.join(_render(a) for a in t.args)}]"
    if isinstance(t, _Items):
        return f"[{', '.join(_render(a) for a in t.items)}]"
    # None last, the rest sorted, so equal unions always print the same way.
    rendered = sorted(_render(m) for m in t.members if m != _NONE)
    if _NONE in t.members:
        rendered.append("None")
    return " | ".join(rendered)


def normalise_type(text: str) -> str:
    """The canonical spelling of annotation ``text``, e.g. ``list[int] | None``."""
    return _render(_parse_type(text))


def _fits(old: _Type, new: _Type) -> bool:
    """Whether every value of type ``old`` is also a value of type ``new``."""
    if old == new:
        return True
    if isinstance(new, _Name) and new.name in _TOP:
        return True
    if isinstance(old, _Union):
        return all(_fits(member, new) for member in old.members)
    if isinstance(new, _Union):
        return any(_fits(old, member) for member in new.members)
    if old == _Name("int") and new == _Name("float"):
        return True
    if isinstance(old, _Generic) and isinstance(new, _Name):
        # list[int] -> list, dict[str, int] -> dict: dropping the parameters only widens.
        return old.origin == new.name
    if isinstance(old, _Generic) and isinstance(new, _Generic):
        if old.origin != new.origin or old.origin not in _COVARIANT:
            return False
        return _args_fit(old.origin, old.args, new.args)
    return False


_ELLIPSIS = _Name("...")


def _args_fit(origin: str, old: tuple[_Type, ...], new: tuple[_Type, ...]) -> bool:
    if origin == "tuple":
        if len(new) == 2 and new[1] == _ELLIPSIS:
            # tuple[X, ...] takes any fixed tuple whose items all fit X.
            items = old[:1] if len(old) == 2 and old[1] == _ELLIPSIS else old
            return all(_fits(item, new[0]) for item in items)
        if _ELLIPSIS in old or _ELLIPSIS in new:
            return False
    if len(old) != len(new):
        return False
    return all(_fits(a, b) for a, b in zip(old, new, strict=True))


# -- compatibility -----------------------------------------------------------------------------


def check_compatible(old: StateSchema, new: StateSchema) -> Compatibility:
    """Whether state saved under ``old`` can be restored into an agent built with ``new``."""
    if old.hash == new.hash:
        return Compatibility(ok=True)
    if old.hash in new.migrates_from:
        # The new version says it maps the old state itself; field rules do not apply.
        return Compatibility(ok=True, migration=True)

    problems: list[str] = []
    renamers: dict[str, list[str]] = {}
    for name, info in new.fields.items():
        if info.renamed_from is not None and info.renamed_from in old.fields:
            renamers.setdefault(info.renamed_from, []).append(name)

    for old_name, targets in sorted(renamers.items()):
        if len(targets) > 1:
            listed = " and ".join(repr(t) for t in sorted(targets))
            problems.append(
                f"fields {listed} are all renamed from {old_name!r}; only one can take its state."
            )

    for name, info in sorted(new.fields.items()):
        source = info.renamed_from
        if source is not None and source in old.fields:
            if source in new.fields:
                problems.append(
                    f"field {name!r} is renamed from {source!r}, but {source!r} is still a field;"
                    f" drop one of them."
                )
                continue
            if name in old.fields:
                problems.append(
                    f"field {name!r} is renamed from {source!r}, but the old state has both"
                    f" {name!r} and {source!r}; which one to keep is ambiguous."
                )
                continue
            if len(renamers[source]) > 1:
                continue  # already reported once for the whole group
            problem = _type_problem(
                f"field {name!r} (renamed from {source!r})", old.fields[source].type, info.type
            )
        elif name in old.fields:
            # A kept field; a stale renamed_from (the rename happened in an earlier version)
            # lands here too, since the old state already uses the new name.
            problem = _type_problem(f"field {name!r}", old.fields[name].type, info.type)
        elif source is not None:
            problem = (
                f"field {name!r} is renamed from {source!r}, but the old state has no field"
                f" {source!r}."
            )
        elif not info.has_default:
            problem = (
                f"field {name!r} is new and has no default, so the old state cannot fill it;"
                f" give it a default."
            )
        else:
            problem = None
        if problem is not None:
            problems.append(problem)
    return Compatibility(ok=not problems, problems=tuple(problems))


def _type_problem(what: str, old_text: str, new_text: str) -> str | None:
    old_type, new_type = _parse_type(old_text), _parse_type(new_text)
    if _fits(old_type, new_type):
        return None
    return (
        f"{what} changed type from {_render(old_type)} to {_render(new_type)}, "
        f"which not every old value fits."
    )
