"""WIT type trees: rendering, hashing, and reading them from wasmtime."""

from __future__ import annotations

import pytest
from wasmtime.component import Component

from mighty.abi import (
    BOOL,
    S32,
    STRING,
    U8,
    U32,
    EnumType,
    FlagsType,
    FuncSig,
    ListType,
    MapType,
    OptionType,
    RecordType,
    ResultType,
    TupleType,
    VariantType,
    wit_type_of,
)

from ._harness import ENGINE, build, echo_wat


@pytest.mark.parametrize(
    ("wt", "text"),
    [
        (ListType(U8), "list<u8>"),
        (ResultType(U32, STRING), "result<u32, string>"),
        (ResultType(None, STRING), "result<_, string>"),
        (ResultType(U32, None), "result<u32>"),
        (ResultType(None, None), "result"),
        (RecordType((("a", U32), ("b", STRING))), "record { a: u32, b: string }"),
        (TupleType((U8, BOOL)), "tuple<u8, bool>"),
        (VariantType((("x", None), ("y", S32))), "variant { x, y(s32) }"),
        (EnumType(("p", "q")), "enum { p, q }"),
        (FlagsType(("r", "w")), "flags { r, w }"),
        (OptionType(OptionType(U8)), "option<option<u8>>"),
        (MapType(STRING, U32), "map<string, u32>"),
    ],
)
def test_types_render_wit_syntax(wt: object, text: str) -> None:
    """str() of each type kind is its WIT syntax."""
    assert str(wt) == text


def test_types_are_hashable_values() -> None:
    """Equal type trees built separately are equal and hash alike."""
    a = RecordType((("a", ListType(U8)), ("b", OptionType(STRING))))
    b = RecordType((("a", ListType(U8)), ("b", OptionType(STRING))))
    assert a == b
    assert hash(a) == hash(b)
    assert {a: 1}[b] == 1


def test_func_sig_reads_a_component_function_type() -> None:
    """FuncSig and wit_type_of read the same tree from a compiled component's import."""
    wt = RecordType((("first-name", STRING), ("tags", FlagsType(("a", "b-c")))))
    comp = Component(ENGINE, build(echo_wat(wt)))
    fty = comp.type.imports(ENGINE)["f"].ty
    sig = FuncSig.from_func_type(fty)
    assert sig.params == (("x", wt),)
    assert sig.result == wt
    assert wit_type_of(fty.params[0][1]) == wt
    assert str(sig) == "func(x: record { first-name: string, tags: flags { a, b-c } }) -> " + str(
        wt
    )
