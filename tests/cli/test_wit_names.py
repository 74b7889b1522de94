"""`mty inspect-component` names the world's types (read from the component binary)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.cli import main
from mighty.cli._wit_names import named_signatures

NAMED_TYPES = """
(component
  (type $shape' (variant (case "circle" f64) (case "dot")))
  (import "shape" (type $shape (eq $shape')))
  (type $unit' (enum "metres" "feet"))
  (import "unit" (type $unit (eq $unit')))
  (type $perms' (flags "read" "write"))
  (import "perms" (type $perms (eq $perms')))
  (core module $m
    (func (export "area") (param i32 f64 i32) (result f64) local.get 1)
    (func (export "allowed") (param i32) (result i32) local.get 0))
  (core instance $i (instantiate $m))
  (type $ft (func (param "s" $shape) (param "u" $unit) (result f64)))
  (func $area (type $ft) (canon lift (core func $i "area")))
  (type $gt (func (param "p" $perms) (result $perms)))
  (func $allowed (type $gt) (canon lift (core func $i "allowed")))
  (export "area" (func $area))
  (export "allowed" (func $allowed))
)
"""

HELLO_BYTES: list[bytes] = []


def test_hello_record_is_named(hello_wasm: Path) -> None:
    """word-stats returns `stats`, and `record stats {...}` is listed under types."""
    result = CliRunner().invoke(main, ["inspect-component", str(hello_wasm), "--exports"])
    assert result.exit_code == 0, result.output
    assert "  word-stats: func(text: string) -> stats" in result.stdout
    assert (
        "types:\n  record stats { words: u32, lines: u32, chars: u32, top-word: option<string> }"
    ) in result.stdout
    doc = json.loads(
        CliRunner().invoke(main, ["inspect-component", str(hello_wasm), "--json"]).stdout
    )
    assert doc["types"] == [
        "record stats { words: u32, lines: u32, chars: u32, top-word: option<string> }"
    ]


def test_variant_enum_and_flags_are_named(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """Variants, enums and flags keep their WIT names in signatures and are defined once."""
    path = tmp_path / "shapes.wasm"
    path.write_bytes(wat(NAMED_TYPES))
    named = named_signatures(path.read_bytes())
    assert named is not None
    assert named.functions == {
        "area": "area: func(s: shape, u: unit) -> f64",
        "allowed": "allowed: func(p: perms) -> perms",
    }
    assert named.types == [
        "variant shape { circle(f64), dot }",
        "enum unit { metres, feet }",
        "flags perms { read, write }",
    ]
    result = CliRunner().invoke(main, ["inspect-component", str(path), "-q"])
    assert "  area: func(s: shape, u: unit) -> f64" in result.stdout
    assert result.stdout.rstrip().endswith("imports: (none)")


@settings(max_examples=200)
@given(data=st.data())
def test_damaged_bytes_never_raise(wat: Callable[[str], bytes], data: st.DataObject) -> None:
    """Truncated or altered binaries give names or None, never an exception."""
    if not HELLO_BYTES:
        HELLO_BYTES.append(wat(NAMED_TYPES))
    original = bytearray(HELLO_BYTES[0])
    cut = data.draw(st.integers(0, len(original)))
    changed = original[:cut]
    for _ in range(data.draw(st.integers(0, 4))):
        if changed:
            at = data.draw(st.integers(0, len(changed) - 1))
            changed[at] = data.draw(st.integers(0, 255))
    named_signatures(bytes(changed))


def test_deep_nesting_is_refused_not_recursed() -> None:
    """Instance types nested thousands deep give None (no RecursionError)."""

    def leb(n: int) -> bytes:
        out = b""
        while True:
            low, n = n & 0x7F, n >> 7
            if not n:
                return out + bytes([low])
            out += bytes([low | 0x80])

    body = b"\x01" + b"\x42\x01\x01" * 5000 + b"\x00" * 5000
    data = b"\0asm\x0d\x00\x01\x00" + b"\x07" + leb(len(body)) + body
    assert named_signatures(data) is None
