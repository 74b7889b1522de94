"""Lowering rejects values that do not fit, with a path, and frees what it allocated."""

from __future__ import annotations

from typing import Any

import pytest

from mighty._errors import ArgumentError
from mighty.abi import (
    BOOL,
    CHAR,
    F32,
    STRING,
    U8,
    U32,
    Err,
    FlagsType,
    FuncCodec,
    FuncSig,
    ListType,
    Ok,
    OptionType,
    RecordType,
    ResultType,
    Some,
    TupleType,
    Variant,
    VariantType,
    WitType,
)


def lower(wt: WitType, value: Any, name: str = "x") -> ArgumentError:
    codec = FuncCodec(FuncSig(((name, wt),), None))
    with pytest.raises(ArgumentError) as info:
        codec.lower_params(None, [value])
    return info.value


@pytest.mark.parametrize(
    ("wt", "value", "path", "message"),
    [
        (ListType(U8), [1, 2, 3, 300], "data[3]", "expected u8 (0..=255), got 300 at data[3]"),
        (ListType(U32), [1, -1], "data[1]", "expected u32 (0..=4294967295), got -1 at data[1]"),
        (ListType(U32), [1, True], "data[1]", "expected u32, got bool True at data[1]"),
        (ListType(BOOL), [True, 1], "data[1]", "expected bool, got 1 at data[1]"),
        (
            ListType(F32),
            [1.0, 1e300],
            "data[1]",
            "expected f32, got 1e+300 (out of range) at data[1]",
        ),
        (U8, True, "data", "expected u8, got bool True at data"),
        (BOOL, 1, "data", "expected bool, got 1 at data"),
        (CHAR, "\udfff", "data", "surrogate U+DFFF"),
        (CHAR, "ab", "data", "1-character str"),
        (STRING, "a\ud800", "data", "lone surrogate at index 1"),
        (ResultType(U32, U32), 1, "data", "expected Ok(...) or Err(...)"),
        (ResultType(U32, STRING), Err(5), "data.<err>", "expected string, got 5"),
        (ResultType(None, U32), Ok(3), "data.<ok>", "has no payload"),
        (OptionType(OptionType(U8)), 5, "data", "Some(value)"),
        (OptionType(U8), Some(256), "data.<some>", "u8 (0..=255)"),
        (VariantType((("a", U8),)), Variant("z"), "data", "unknown case 'z'"),
        (VariantType((("a", U8),)), "a", "data", "expected Variant(case, value)"),
        (FlagsType(("r", "w")), {"r", "x"}, "data", "unknown flag 'x'"),
        (TupleType((U8, U8)), (1,), "data", "expected tuple<u8, u8>"),
        (RecordType((("a", U8),)), {"b": 1}, "data", "missing field 'a'"),
        (RecordType((("a", U8),)), {"a": 1, "b": 1}, "data", "unknown field 'b'"),
    ],
)
def test_mismatch_names_path_and_range(wt: WitType, value: Any, path: str, message: str) -> None:
    """Each mismatch raises ArgumentError whose path and message locate the offending part."""
    err = lower(wt, value, "data")
    assert err.path == path
    assert message in err.message


def test_failure_half_way_through_nested_values_frees_and_reports() -> None:
    """A bad value deep in a record of lists of records is reported after partial lowering."""
    inner = RecordType((("name", STRING), ("n", U8)))
    wt = RecordType((("items", ListType(inner)), ("tail", STRING)))
    good = {"name": "x" * 1000, "n": 1}
    value = {"items": [good] * 50 + [{"name": "y", "n": 999}], "tail": "t"}
    for _ in range(200):  # a leak or double free here would show up as growth or a crash
        err = lower(wt, value, "cfg")
        assert err.path == "cfg.items[50].n"


def test_failure_in_a_flat_records_later_field_frees_and_reports() -> None:
    """A record of only flat fields is lowered from a cloned template: a bad second field
    after a lowered first one (a string, a list<u8> long and short) frees what was written
    and names the field; the codec's template stays intact for the next call."""
    wt = RecordType((("name", STRING), ("body", ListType(U8)), ("n", U8)))
    for body in (b"x", b"y" * 5000):
        for _ in range(200):  # a leak or double free would show up as growth or a crash
            err = lower(wt, {"name": "s" * 100, "body": body, "n": 256}, "msg")
            assert err.path == "msg.n"
        err = lower(wt, {"name": "s", "body": "not bytes", "n": 1}, "msg")
        assert err.path == "msg.body"
    codec = FuncCodec(FuncSig((("msg", wt),), None))
    array, n = codec.lower_params(None, [{"name": "ok", "body": b"\x01", "n": 7}])
    FuncCodec.free_params(array, n)


def test_wrong_argument_count_is_an_argument_error() -> None:
    """Passing too many or too few arguments says how many the function takes."""
    codec = FuncCodec(FuncSig((("a", U8), ("b", U8)), None))
    with pytest.raises(ArgumentError, match=r"expected 2 arguments \(a, b\), got 1"):
        codec.lower_params(None, [1])


def test_later_parameter_failure_frees_earlier_parameters() -> None:
    """When parameter two fails, parameter one (already lowered) is freed and no crash follows."""
    codec = FuncCodec(FuncSig((("a", ListType(STRING)), ("b", U8)), None))
    for _ in range(100):
        with pytest.raises(ArgumentError) as info:
            codec.lower_params(None, [["s" * 100] * 100, -1])
        assert info.value.path == "b"


def test_bytes_like_values_lower_as_list_u8() -> None:
    """bytes, bytearray, memoryview and lists of ints all lower as list<u8>."""
    codec = FuncCodec(FuncSig((("a", ListType(U8)),), None))
    for v in (b"ab", bytearray(b"ab"), memoryview(b"ab"), [97, 98], (97, 98)):
        array, n = codec.lower_params(None, [v])
        codec.free_params(array, n)
