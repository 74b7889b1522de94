"""`mty call` policy options: what the guest may see, and its output in the JSON object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main

pytestmark = pytest.mark.slow


def call_json(probe: Path, code: str, *options: str) -> tuple[int, dict[str, object]]:
    """Run the probe's `run` export through `mty call --json`."""
    result = CliRunner().invoke(
        main, ["call", str(probe), "run", json.dumps(code), *options, "--json"]
    )
    return result.exit_code, json.loads(result.stdout)


def test_env_args_stdin_and_output(probe_wasm: Path, tmp_path: Path) -> None:
    """--env, --arg and --stdin reach the guest; stdout and stderr are fields of the JSON."""
    stdin = tmp_path / "in.txt"
    stdin.write_bytes(b"from stdin")
    code, doc = call_json(
        probe_wasm,
        "print('hi'); sys.stderr.write('warn'); result = json.dumps([dict(os.environ), sys.argv, sys.stdin.read()])",
        "--env",
        "A=1",
        "--env",
        "B=x=y",
        "--arg",
        "prog",
        "--arg",
        "-v",
        "--stdin",
        str(stdin),
    )
    assert code == 0
    assert doc["stdout"] == "hi\n"
    assert doc["stderr"] == "warn"
    result = doc["result"]
    assert isinstance(result, dict)
    assert json.loads(result["ok"]) == [{"A": "1", "B": "x=y"}, ["prog", "-v"], "from stdin"]


def test_dir_read_only_and_read_write(probe_wasm: Path, tmp_path: Path) -> None:
    """--dir grants a directory, read-only by default and with :ro, read-write with :rw."""
    (tmp_path / "f.txt").write_text("content")
    snippet = "\ntry:\n    open('/d/new', 'w')\n    w = 'wrote'\nexcept OSError:\n    w = 'refused'\nresult = open('/d/f.txt').read() + ' ' + w\n"
    _, plain = call_json(probe_wasm, snippet, "--dir", f"{tmp_path}:/d")
    _, ro = call_json(probe_wasm, snippet, "--dir", f"{tmp_path}:/d:ro")
    _, rw = call_json(probe_wasm, snippet, "--dir", f"{tmp_path}:/d:rw")
    assert plain["result"] == {"ok": "content refused"}
    assert ro["result"] == {"ok": "content refused"}
    assert rw["result"] == {"ok": "content wrote"}


def test_clock_and_seed(probe_wasm: Path) -> None:
    """--clock fixed and --seed make a run repeatable."""
    snippet = "result = json.dumps([time.time_ns(), os.urandom(4).hex()])"
    _, first = call_json(probe_wasm, snippet, "--clock", "fixed", "--seed", "3")
    _, second = call_json(probe_wasm, snippet, "--clock", "fixed", "--seed", "3")
    assert first["result"] == second["result"]


def test_guest_failure_keeps_its_output(probe_wasm: Path) -> None:
    """When the guest fails, the JSON error still carries what it printed and its usage."""
    code, doc = call_json(probe_wasm, "print('before'); os._exit(1)")
    assert code == 1
    assert doc["ok"] is False
    assert doc["stdout"] == "before\n"
    assert doc["error"] == {"kind": "guest_exit", "message": "guest exited with status 1"}
    assert "usage" in doc


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        (["--env", "NOEQUALS"], "--env takes KEY=VALUE"),
        (["--dir", "/nonexistent-dir:/x"], "is not a directory"),
        (["--dir", "onlyhost"], "--dir takes HOST:GUEST"),
        (["--dir", ".:relative"], "guest path must be absolute"),
    ],
)
def test_bad_policy_options(probe_wasm: Path, options: list[str], needle: str) -> None:
    """Malformed policy options are usage errors naming the option."""
    result = CliRunner().invoke(main, ["call", str(probe_wasm), "run", '"result = 1"', *options])
    assert result.exit_code == 2
    assert needle in result.stderr
