"""The typed JSON mapping used by `mty call`."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings

from mighty._errors import ArgumentError
from mighty.abi import (
    F32,
    F64,
    S8,
    STRING,
    U8,
    U32,
    EnumType,
    Err,
    FlagsType,
    ListType,
    MapType,
    Ok,
    OptionType,
    RecordType,
    ResultType,
    Some,
    Variant,
    VariantType,
    WitType,
    from_json,
    to_json,
)

from ._harness import RESOURCE_TYPE
from ._strategies import same, typed_values


@settings(max_examples=300, deadline=None)
@given(typed_values())
def test_json_round_trips_every_type_kind(tv: tuple[WitType, Any]) -> None:
    """from_json(to_json(v)) == v for random types and values, through real JSON text."""
    wt, v = tv
    text = json.dumps(to_json(wt, v), allow_nan=False)
    assert same(from_json(wt, json.loads(text)), v)


@pytest.mark.parametrize(
    ("wt", "value", "obj"),
    [
        (ResultType(U32, U32), Ok(1), {"ok": 1}),
        (ResultType(U32, U32), Err(1), {"err": 1}),
        (ResultType(None, STRING), Ok(), {"ok": None}),
        (OptionType(OptionType(U8)), Some(None), {"some": None}),
        (OptionType(OptionType(U8)), Some(5), {"some": 5}),
        (OptionType(U8), 5, 5),
        (VariantType((("a", None), ("b", U8))), Variant("a"), {"a": None}),
        (VariantType((("a", None), ("b", U8))), Variant("b", 3), {"b": 3}),
        (FlagsType(("x", "y", "z")), frozenset({"z", "x"}), ["x", "z"]),
        (F64, math.inf, "Infinity"),
        (F32, -math.inf, "-Infinity"),
        (ListType(U8), b"\x01\x02", [1, 2]),
        (MapType(STRING, U32), {"k": 1}, [["k", 1]]),
        (EnumType(("p", "q")), "q", "q"),
    ],
)
def test_json_forms(wt: WitType, value: Any, obj: Any) -> None:
    """Each kind has the documented JSON form, both ways."""
    assert to_json(wt, value) == obj
    assert same(from_json(wt, obj), value)


def test_json_accepts_shorthands() -> None:
    """Bare case names, base64 bytes, NaN strings and string-keyed map objects are accepted."""
    assert from_json(VariantType((("a", None),)), "a") == Variant("a")
    assert from_json(ListType(U8), {"base64": "AQI="}) == b"\x01\x02"
    assert math.isnan(from_json(F64, "NaN"))
    assert from_json(MapType(STRING, U8), {"k": 1}) == {"k": 1}


@pytest.mark.parametrize(
    ("wt", "obj", "path", "fragment"),
    [
        (RecordType((("retries", U8),)), {"retries": 300}, "cfg.retries", "u8 (0..=255)"),
        (RecordType((("a", U8),)), {}, "cfg", "missing field 'a'"),
        (RecordType((("a", U8),)), {"a": 1, "b": 2}, "cfg", "unknown field 'b'"),
        (ListType(S8), [1, "x"], "cfg[1]", "expected s8"),
        (ResultType(U32, None), {"ok": None}, "cfg.<ok>", "expected u32"),
        (ResultType(U32, None), 5, "cfg", '{"ok": value}'),
        (OptionType(OptionType(U8)), 5, "cfg", '{"some": inner}'),
        (U8, True, "cfg", "expected u8"),
        (STRING, "\ud800", "cfg", "lone surrogate"),
        (ListType(U8), {"base64": "!!"}, "cfg", "bad base64"),
        (FlagsType(("a",)), ["b"], "cfg", "flags { a }"),
    ],
)
def test_json_mismatch_names_path_and_type(wt: WitType, obj: Any, path: str, fragment: str) -> None:
    """A JSON value that does not fit raises ArgumentError with its path and expected type."""
    with pytest.raises(ArgumentError) as info:
        from_json(wt, obj, "cfg")
    assert info.value.path == path
    assert fragment in info.value.message


def test_json_rejects_resources() -> None:
    """Resources have no JSON form, in either direction."""
    from mighty.abi import OwnType

    with pytest.raises(ArgumentError, match="cannot be given as JSON"):
        from_json(OwnType(RESOURCE_TYPE), 1, "h")
    with pytest.raises(ArgumentError, match="no JSON form"):
        to_json(OwnType(RESOURCE_TYPE), object())
