"""`mty call` guests: one large print is kept up to the cap, counted exactly, never cut unseen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty import Component, GuestError, Instance
from mighty.abi import Ok
from mighty.cli import main
from mighty.wasi import DEFAULT_OUTPUT_CAP

KIB = 1 << 10
MIB = 1 << 20


def _print(stream: str, size: int) -> str:
    target = "" if stream == "stdout" else ", file=sys.stderr"
    return f"print('y' * {size}{target})"


@pytest.fixture(scope="module")
def probe(probe_wasm: Path) -> Component:
    """The probe guest, compiled once for the module."""
    return Component.load(probe_wasm)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", [64 * KIB - 1, 64 * KIB, 64 * KIB + 1, MIB, 2 * MIB])
def test_one_print_is_counted_exactly(probe: Component, stream: str, size: int) -> None:
    """One print keeps min(size + 1, cap) bytes, counts size + 1, and says truncated past the cap."""
    with Instance(probe) as instance:
        assert instance.call("run", _print(stream, size)) == Ok("None")
        capture = instance.stdout if stream == "stdout" else instance.stderr
        written = b"y" * size + b"\n"
        assert capture.total == len(written)
        assert capture.getvalue() == written[:DEFAULT_OUTPUT_CAP]
        assert capture.truncated == (len(written) > DEFAULT_OUTPUT_CAP)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", [64 * KIB + 1, 2 * MIB])
def test_mty_call_json_reports_the_capture(probe_wasm: Path, stream: str, size: int) -> None:
    """`mty call --json` carries the kept bytes and a truncated flag exactly when past the cap."""
    result = CliRunner().invoke(
        main, ["call", str(probe_wasm), "run", json.dumps(_print(stream, size)), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    written = "y" * size + "\n"
    assert doc[stream] == written[:DEFAULT_OUTPUT_CAP]
    assert doc.get(f"{stream}_truncated", False) == (len(written) > DEFAULT_OUTPUT_CAP)


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_print_too_large_to_hand_over_fails_loudly(probe: Component, stream: str) -> None:
    """A 50 MiB print is more than wasmtime lifts into one host call: the call fails, not ok
    with a silently shortened output."""
    with Instance(probe) as instance:
        with pytest.raises(GuestError, match="too much data"):
            instance.call("run", _print(stream, 50 * MIB))
        capture = instance.stdout if stream == "stdout" else instance.stderr
        assert capture.total == 0


def test_mty_call_of_a_too_large_print_exits_with_an_error(probe_wasm: Path) -> None:
    """`mty call` of a 50 MiB print exits non-zero with the guest's failure, never ok."""
    result = CliRunner().invoke(
        main, ["call", str(probe_wasm), "run", json.dumps(_print("stdout", 50 * MIB)), "--json"]
    )
    assert result.exit_code != 0
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert "too much data" in doc["error"]["message"]
