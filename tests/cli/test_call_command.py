"""`mty call` as a command runner (issue 36): `mty call X.wasm -- ARGS` reads like `wasmtime run`,
argv[0] is the component's file name unless --argv0, and the guest's exit status is ours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from tests.conftest import assemble

# A command component: wasi:cli/run reads its arguments and ends by argv[1]'s first letter:
# o returns ok, e returns err, q exits ok, f exits err, n exits with argc; anything else exits
# with the length of the last argument, and argv[0] alone exits with argv[0]'s length.
COMMAND_WAT = """
(component
  (import "wasi:cli/environment@0.2.0" (instance $env
    (export "get-arguments" (func (result (list string))))
  ))
  (import "wasi:cli/exit@0.2.0" (instance $exit
    (export "exit" (func (param "status" (result))))
    (export "exit-with-code" (func (param "status-code" u8)))
  ))
  (core module $libc
    (memory (export "memory") 1)
    (global $next (mut i32) (i32.const 1024))
    (func (export "realloc") (param i32 i32 i32 i32) (result i32)
      (local $at i32)
      global.get $next local.get 2 i32.add i32.const 1 i32.sub
      i32.const 0 local.get 2 i32.sub i32.and local.set $at
      local.get $at local.get 3 i32.add global.set $next
      local.get $at))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $mem))
  (alias core export $libc "realloc" (core func $realloc))
  (core func $args (canon lower (func $env "get-arguments") (memory $mem) (realloc $realloc)))
  (core func $exit (canon lower (func $exit "exit")))
  (core func $code (canon lower (func $exit "exit-with-code")))
  (core module $m
    (import "env" "memory" (memory 1))
    (import "wasi" "args" (func $args (param i32)))
    (import "wasi" "exit" (func $exit (param i32)))
    (import "wasi" "code" (func $code (param i32)))
    ;; argv as (ptr, len) pairs at [16], argc at [20]
    (func $len (param $i i32) (result i32)
      i32.const 16 i32.load local.get $i i32.const 8 i32.mul i32.add i32.load offset=4)
    (func $first (param $i i32) (result i32)
      i32.const 16 i32.load local.get $i i32.const 8 i32.mul i32.add i32.load i32.load8_u)
    (func (export "run") (result i32)
      (local $argc i32) (local $mode i32)
      i32.const 16 call $args
      i32.const 20 i32.load local.set $argc
      local.get $argc i32.const 2 i32.lt_u
      if  ;; argv[0] alone: exit with its length
        i32.const 0 call $len call $code unreachable
      end
      i32.const 1 call $first local.set $mode
      local.get $mode i32.const 111 i32.eq if i32.const 0 return end  ;; o: run returns ok
      local.get $mode i32.const 101 i32.eq if i32.const 1 return end  ;; e: run returns err
      local.get $mode i32.const 113 i32.eq if i32.const 0 call $exit unreachable end  ;; q: exit(ok)
      local.get $mode i32.const 102 i32.eq if i32.const 1 call $exit unreachable end  ;; f: exit(err)
      local.get $mode i32.const 110 i32.eq if local.get $argc call $code unreachable end  ;; n: argc
      ;; anything else: the length of the last argument
      local.get $argc i32.const 1 i32.sub call $len call $code unreachable))
  (core instance $i (instantiate $m
    (with "env" (instance (export "memory" (memory $mem))))
    (with "wasi" (instance
      (export "args" (func $args)) (export "exit" (func $exit)) (export "code" (func $code))))))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $run_instance (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $run_instance))
)
"""


@pytest.fixture(scope="module")
def command(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The command component written as cmd.wasm (argv[0] is 'cmd.wasm', 8 bytes)."""
    path = tmp_path_factory.mktemp("command") / "cmd.wasm"
    path.write_bytes(assemble(COMMAND_WAT))
    return path


def run(*args: str) -> tuple[int, str, str]:
    """Run `mty` in-process; return (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, ["call", "-q", *args])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    ("guest_args", "status"),
    [
        (["o"], 0),  # run returns ok
        (["e"], 1),  # run returns err
        (["q"], 0),  # wasi:cli/exit(ok): success, not a failure
        (["f"], 1),  # wasi:cli/exit(err)
        (["n", "a", "b"], 4),  # exit-with-code(argc): argv[0] counts
        (["x", "abcdefghijklmnopqrstuvwxyz"], 26),
        ([], 8),  # argv[0] is "cmd.wasm"
    ],
)
def test_exit_status_is_the_guests(command: Path, guest_args: list[str], status: int) -> None:
    """mty call exits with the guest's own status and prints nothing of its own."""
    code, out, err = run(str(command), "--", *guest_args)
    assert (code, out, err) == (status, "", "")


def test_without_dashes_and_with_func(command: Path) -> None:
    """Leaving FUNC out, or naming the run export, runs the command the same way."""
    assert run(str(command))[0] == 8
    assert run(str(command), "wasi:cli/run@0.2.0#run", "--arg", "n")[0] == 2
    assert run(str(command), "--arg", "n", "--", "a")[0] == 3


def test_argv0(command: Path) -> None:
    """--argv0 replaces the file name as argv[0]."""
    assert run(str(command), "--argv0", "ab")[0] == 2
    assert run(str(command), "--argv0", "", "--", "n")[0] == 2


def test_options_after_dashes_belong_to_the_guest(command: Path) -> None:
    """--json, --fuel and -v after `--` are the guest's arguments, not mty's."""
    code, out, _ = run(str(command), "--", "n", "--json", "--fuel", "1", "-v")
    assert (code, out) == (6, "")
    assert run(str(command), "--", "x", "--json")[0] == len("--json")


@pytest.mark.parametrize(
    ("guest_args", "status", "kind"),
    [(["o"], 0, None), (["q"], 0, None), (["e"], 1, "guest_exit"), (["n", "1"], 3, "guest_exit")],
)
def test_json_carries_the_exit_status(
    command: Path, guest_args: list[str], status: int, kind: str | None
) -> None:
    """--json: ok is exit status 0, exit_code is the status, and an error says guest_exit."""
    code, out, _ = run(str(command), "--json", "--", *guest_args)
    doc = json.loads(out)
    assert code == status
    assert doc["ok"] is (status == 0)
    assert doc["exit_code"] == status
    assert set(doc) >= {"usage", "stdout", "stderr"}
    assert (doc.get("error") or {}).get("kind") == kind


def test_exit_zero_from_a_function_is_success(budget_wasm_path: Path) -> None:
    """A plain function that calls exit(ok) succeeds; exit(err) fails with status 1."""
    code, out, _ = run(str(budget_wasm_path), "quit", "0", "--json")
    assert code == 0
    assert json.loads(out) == {
        "ok": True,
        "exit_code": 0,
        "result": None,
        "usage": json.loads(out)["usage"],
        "stdout": "",
        "stderr": "",
    }
    code, _, err = run(str(budget_wasm_path), "quit", "1")
    assert code == 1
    assert "guest exited with status 1" in err


def test_function_args_are_unchanged(budget_wasm_path: Path) -> None:
    """A function's JSON arguments may still follow `--` (negative numbers, say)."""
    code, out, _ = run(str(budget_wasm_path), "add", "--", "2", "40")
    assert (code, json.loads(out)) == (0, 42)


def test_not_a_command_without_func(budget_wasm_path: Path) -> None:
    """Leaving FUNC out of a component that is no command is bad usage naming its exports."""
    code, _, err = run(str(budget_wasm_path), "--", "x")
    assert code == 2
    assert "not a command" in err and "add" in err


def test_the_mty_process_exits_with_the_guests_status(command: Path) -> None:
    """Through a real `mty` process, as a shell script sees it."""
    mty = [sys.executable, "-m", "mighty.cli"]
    done = subprocess.run(
        [*mty, "call", "-q", str(command), "--", "n", "a", "b", "c", "d", "e", "f"],
        capture_output=True,
        check=False,
    )
    assert (done.returncode, done.stdout) == (8, b"")
