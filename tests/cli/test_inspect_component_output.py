"""`mty inspect-component`: exports in full, imports one line each (--imports: in full)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mighty.cli import main


def _run(*args: str) -> tuple[int, str]:
    """`mty ARGS` in-process: (exit code, stdout)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout


def test_default_output_is_short(hello_wasm: Path) -> None:
    """Each export in full, each imported interface on one line with its counts."""
    code, out = _run("inspect-component", str(hello_wasm))
    assert code == 0
    assert "  greet: func(name: string) -> string" in out
    assert "  wasi:random/random@0.2.9 (1 function)" in out
    assert "  wasi:io/poll@0.2.9 (2 functions, 1 resource)" in out
    assert "get-random-bytes" not in out
    assert len(out) < 4000  # 43,855 bytes when every import was listed


def test_imports_flag_lists_every_function(hello_wasm: Path) -> None:
    """--imports lists every imported function with its signature, as before."""
    code, out = _run("inspect-component", str(hello_wasm), "--imports")
    assert code == 0
    assert "    get-random-bytes: func(len: u64) -> list<u8>" in out
    assert "    resource pollable" in out


def test_exports_flag_prints_exports_alone(hello_wasm: Path) -> None:
    """--exports: only the exported functions (text and JSON)."""
    code, out = _run("inspect-component", str(hello_wasm), "--exports")
    assert code == 0
    assert "  add: func(a: s64, b: s64) -> s64" in out
    assert "imports" not in out
    code, out = _run("inspect-component", str(hello_wasm), "--exports", "--json")
    doc = json.loads(out)
    assert "imports" not in doc
    assert [e["name"] for e in doc["exports"]][:2] == ["greet", "add"]
