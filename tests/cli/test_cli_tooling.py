"""`mty` as a tool: --version/-V, EPIPE, inspect-component, compile, build --json, debug, --dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.engine import SETTINGS

MTY = str(Path(sys.executable).parent / "mty")


def run(*args: str) -> tuple[int, str, str]:
    """Run `mty` in-process; return (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_names_the_toolchain(flag: str) -> None:
    """--version and -V name mighty, wasmtime, componentize-py and the engine fingerprint."""
    code, out, _ = run(flag)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("mty (mighty) ")
    assert lines[1].startswith("wasmtime ") and lines[2].startswith("componentize-py ")
    assert lines[3] == f"engine fingerprint {SETTINGS.fingerprint}"


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess[str]:
    read, write = os.pipe()
    os.close(read)  # every write to stdout fails with EPIPE, as after `| head` exited
    try:
        return subprocess.run(
            [MTY, *args], stdout=write, stderr=subprocess.PIPE, text=True, check=False
        )
    finally:
        os.close(write)


def test_broken_pipe_exits_quietly(tmp_path: Path, budget_wasm_path: Path) -> None:
    """`mty trace show X | head` whose reader is gone: exit 141, nothing on stderr."""
    trace = tmp_path / "t.bin"
    code, _, err = run("call", str(budget_wasm_path), "add", "1", "2", "--record", str(trace))
    assert code == 0, err
    done = _closed_pipe_run("trace", "show", str(trace))
    assert done.returncode == 141
    assert done.stderr == ""
    done = _closed_pipe_run("--version")
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def test_inspect_component_lists_signatures(hello_wasm: Path) -> None:
    """inspect-component shows exports with WIT signatures and WASI imports, not exports#init."""
    code, out, _ = run("inspect-component", str(hello_wasm))
    assert code == 0
    assert "  add: func(a: s64, b: s64) -> s64" in out
    assert "  divide: func(a: f64, b: f64) -> result<f64, string>" in out
    assert "wasi:cli/stdout@0.2.9" in out
    assert "exports#init" not in out
    code, alias, _ = run("wit", str(hello_wasm))
    assert (code, alias) == (0, out)


def test_inspect_component_json(hello_wasm: Path) -> None:
    """--json gives exports with params and result, imports, and names the hidden internals."""
    code, out, _ = run("inspect-component", str(hello_wasm), "--json")
    assert code == 0
    doc = json.loads(out)
    exports = {item["name"]: item for item in doc["exports"]}
    assert exports["greet"]["params"] == [{"name": "name", "type": "string"}]
    assert exports["greet"]["result"] == "string"
    assert doc["internal"] == ["exports#init"]
    names = {entry["name"] for entry in doc["imports"]}
    assert "wasi:io/streams@0.2.9" in names


def test_call_refuses_toolchain_internal(hello_wasm: Path) -> None:
    """`mty call X exports#init` is refused with a clear error, exit 2."""
    code, _, err = run("call", str(hello_wasm), "exports#init")
    assert code == 2
    assert "internal export of the toolchain" in err
    code, _, err = run("call", str(hello_wasm), "nope")
    assert code != 0 and "exports#init" not in err


def test_compile_fills_the_cache(tmp_path: Path, budget_wasm_path: Path) -> None:
    """mty compile compiles into a fresh cache once; the second time it is already compiled."""
    env = {**os.environ, "MTY_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run(
        [MTY, "compile", str(budget_wasm_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["components"][0]["cached"] is False
    again = subprocess.run(
        [MTY, "compile", str(budget_wasm_path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert again.returncode == 0
    assert "already compiled" in again.stdout


def test_compile_progress_without_terminal(tmp_path: Path, hello_wasm: Path) -> None:
    """A first compile without a terminal says what it does and how long it took; -q is silent."""
    env = {**os.environ, "MTY_CACHE_DIR": str(tmp_path / "cache"), "MTY_PROGRESS_TICK": "0.5"}
    done = subprocess.run(
        [MTY, "compile", str(hello_wasm)], capture_output=True, text=True, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"mty: compiling {hello_wasm}" in done.stderr
    assert "mty: ... still compiling" in done.stderr
    assert "mty: done in " in done.stderr
    quiet = subprocess.run(
        [MTY, "compile", "-q", str(hello_wasm)],
        capture_output=True,
        text=True,
        env={**env, "MTY_CACHE_DIR": str(tmp_path / "cache2")},
        check=False,
    )
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""


def test_build_json(tmp_path: Path) -> None:
    """mty build --json prints one object: path, cached, hashes."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "hello.wasm"
    code, stdout, _ = run(
        "build", str(root / "examples" / "hello" / "handler.py"), "-o", str(out), "--json"
    )
    assert code == 0
    doc = json.loads(stdout)
    assert doc["ok"] is True and doc["path"] == str(out)
    assert len(doc["component_sha256"]) == 64 and isinstance(doc["cached"], bool)


def test_build_json_failure_is_json(tmp_path: Path) -> None:
    """mty build --json of a missing source prints a JSON error and exits 2."""
    code, stdout, _ = run("build", str(tmp_path / "nope.py"), "-o", str(tmp_path / "x"), "--json")
    assert code == 2
    assert json.loads(stdout)["ok"] is False


def test_debug_non_trace_exits_2(tmp_path: Path) -> None:
    """mty debug on a file that is not a trace fails like mty replay: one line, exit 2."""
    path = tmp_path / "not-a-trace.bin"
    path.write_bytes(b"hello")
    code, out, err = run("debug", str(path))
    assert code == 2
    assert "not a mighty trace" in err and out == ""
    replay_code, _, _ = run("replay", str(path))
    assert replay_code == code


def test_dir_is_read_only_unless_rw(tmp_path: Path, budget_wasm_path: Path) -> None:
    """--dir HOST:GUEST is read-only; :rw opts in to writing; a bad mode names both forms."""
    from mighty.cli._main import _policy

    plain = _policy((), (), None, (f"{tmp_path}:/d",), "real", None)
    ro = _policy((), (), None, (f"{tmp_path}:/d:ro",), "real", None)
    rw = _policy((), (), None, (f"{tmp_path}:/d:rw",), "real", None)
    assert [g.readonly for g in (*plain.dirs, *ro.dirs, *rw.dirs)] == [True, True, False]
    code, _, err = run("call", str(budget_wasm_path), "add", "1", "2", "--dir", f"{tmp_path}:/d:x")
    assert code == 2 and "HOST:GUEST:rw" in err
