"""`mty call`: results, budgets as error kinds, bad input as one line with exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main, parse_size


def run(*args: str) -> tuple[int, str, str]:
    """Run `mty` in-process; return (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def run_json(*args: str) -> tuple[int, dict[str, object]]:
    """Run `mty ... --json`; stdout must be exactly one JSON object."""
    code, out, _ = run(*args, "--json")
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1, out
    return code, json.loads(lines[0])


def test_call_prints_result(budget_wasm_path: Path) -> None:
    """A successful call prints the result as JSON and exits 0."""
    code, out, _ = run("call", str(budget_wasm_path), "add", "2", "40")
    assert code == 0
    assert json.loads(out) == 42


def test_call_json_has_result_and_usage(budget_wasm_path: Path) -> None:
    """--json prints ok, result and usage with fuel, peak memory and wall time."""
    code, doc = run_json("call", str(budget_wasm_path), "count", "1000")
    assert code == 0
    assert doc["ok"] is True
    assert doc["result"] == 1000
    usage = doc["usage"]
    assert isinstance(usage, dict)
    assert set(usage) == {"fuel", "memory_peak", "wall_ms"}
    assert usage["fuel"] > 0 and usage["memory_peak"] == 65536


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["spin", "--fuel", "100000"], "out_of_fuel"),
        (["spin", "--fuel", "1000000000000000", "--timeout", "0.1"], "deadline_exceeded"),
        (["grow", "1000", "--memory", "1MiB"], "out_of_memory"),
        (["boom"], "trap"),
        (["quit", "1"], "guest_exit"),
    ],
)
def test_guest_failures_have_their_kind(budget_wasm_path: Path, args: list[str], kind: str) -> None:
    """Each way a guest can fail is reported with its kind and exit status 1."""
    code, doc = run_json("call", str(budget_wasm_path), *args)
    assert code == 1
    assert doc["ok"] is False
    error = doc["error"]
    assert isinstance(error, dict)
    assert error["kind"] == kind
    assert error["message"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nope", "1"], "no exported function 'nope'"),
        (["add", "1"], "add takes 2 argument(s) (a: u32, b: u32), got 1"),
        (["add", "1", "-5"], "u32"),
        (["add", "1", "{not json"], "argument 2 is not JSON"),
        (["add", "1", '"x"'], "u32"),
    ],
)
def test_bad_input_is_one_line_exit_2(budget_wasm_path: Path, args: list[str], needle: str) -> None:
    """Bad names and arguments give one error line naming the problem, exit 2, no traceback."""
    code, out, err = run("call", str(budget_wasm_path), *args)
    assert code == 2
    assert out == ""
    assert err.startswith("mty: error: ")
    assert needle in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_bad_input_json(budget_wasm_path: Path) -> None:
    """With --json, bad input is an error object of kind bad_input."""
    code, doc = run_json("call", str(budget_wasm_path), "add", "1", "2", "3")
    assert code == 2
    assert doc == {
        "ok": False,
        "error": {
            "kind": "bad_input",
            "message": "add takes 2 argument(s) (a: u32, b: u32), got 3",
        },
    }


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"not wasm at all", "not WebAssembly"),
        (b"\x00asm\x01\x00\x00\x00", "core WebAssembly module"),
    ],
)
def test_bad_files(tmp_path: Path, content: bytes, needle: str) -> None:
    """A file that is not a component is one line naming the problem."""
    path = tmp_path / "x.wasm"
    path.write_bytes(content)
    code, _, err = run("call", str(path), "f")
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1


def test_missing_imports_are_all_named(tmp_path: Path, wat) -> None:  # type: ignore[no-untyped-def]
    """A component importing unknown interfaces fails listing every one of them."""
    path = tmp_path / "needs.wasm"
    path.write_bytes(
        wat(
            '(component (import "acme:db/query" (instance (export "q" (func))))'
            ' (import "acme:kv/store@1.0.0" (instance (export "get" (func)))))'
        )
    )
    code, _, err = run("call", str(path), "f")
    assert code == 2
    assert "acme:db/query" in err and "acme:kv/store@1.0.0" in err


def test_missing_component_file(tmp_path: Path) -> None:
    """A path that does not exist is a usage error."""
    code, _, err = run("call", str(tmp_path / "none.wasm"), "f")
    assert code == 2
    assert "no such file" in err


@pytest.mark.parametrize(
    ("text", "value"),
    [("1024", 1024), ("64MiB", 64 * 2**20), ("256M", 256 * 10**6), ("1g", 10**9), ("2KiB", 2048)],
)
def test_parse_size(text: str, value: int) -> None:
    """Sizes accept plain bytes and decimal or binary units."""
    assert parse_size(text) == value


def test_bad_size_is_usage_error(budget_wasm_path: Path) -> None:
    """A malformed --memory is a usage error with exit status 2."""
    code, _, err = run("call", str(budget_wasm_path), "add", "1", "2", "--memory", "lots")
    assert code == 2
    assert "not a size" in err


@pytest.mark.slow
def test_mty_build_finds_the_agent_world_and_sdk(tmp_path: Path) -> None:
    """An agent handler builds with no --wit or -p: the agent world and SDK are found."""
    source = Path(__file__).resolve().parents[2] / "guests" / "testing" / "counter" / "v2.py"
    out = tmp_path / "v2.wasm"
    code, stdout, err = run("build", str(source), "-o", str(out))
    assert code == 0, err
    assert out.read_bytes()[:4] == b"\x00asm"
    assert str(out) in stdout
