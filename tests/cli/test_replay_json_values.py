"""`mty replay --json` writes values as `mty call --json` does (variants as {case: payload})."""

from __future__ import annotations

from mighty.abi import Err, Ok, Variant
from mighty.cli._main import _jsonable


def test_variants_are_written_as_call_writes_them() -> None:
    """A variant is {case: payload} ({case: null} without one), inside results too."""
    assert _jsonable(Variant("circle", 1.5)) == {"circle": 1.5}
    assert _jsonable(Variant("dot")) == {"dot": None}
    assert _jsonable(Ok(Variant("square", [2, 3]))) == {"ok": {"square": [2, 3]}}
    assert _jsonable(Err("no")) == {"err": "no"}
