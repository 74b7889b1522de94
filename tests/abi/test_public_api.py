"""The public names of mighty.abi."""

from __future__ import annotations

import mighty.abi


def test_public_names_are_pinned() -> None:
    """mighty.abi exports exactly these names, and each one resolves."""
    assert set(mighty.abi.__all__) == {
        "BOOL", "CHAR", "F32", "F64", "PRIMITIVES", "S8", "S16", "S32", "S64", "STRING", "U8",
        "U16", "U32", "U64", "BorrowType", "EnumType", "Err", "FlagsType", "FuncCodec", "FuncSig",
        "ListType", "MapType", "Ok", "OptionType", "OwnType", "ParamArray", "PrimitiveType",
        "RecordType", "ResultType", "Some", "TupleType", "Variant", "VariantType", "WitType",
        "codec_for", "from_json", "to_json", "wit_type_of",
    }  # fmt: skip
    for name in mighty.abi.__all__:
        assert getattr(mighty.abi, name) is not None
