"""`mty send` / `mty ask` into a running system over its control socket (real runtime, socket)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cli import main
from mighty.control import ControlError, ControlServer, request, runtime_ops

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(wat: Callable[[str], bytes]) -> Iterator[tuple[Runtime, Path]]:
    """A runtime with one echo agent named ``e``, its ops on a control socket."""
    echo = Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    with tempfile.TemporaryDirectory(prefix="mty-send-", dir="/tmp") as name:
        os.chmod(name, 0o700)
        path = Path(name) / "c.sock"
        with Runtime(workers=1) as rt, ControlServer(path, runtime_ops(rt)):
            rt.register(AgentType("echo", echo))
            rt.spawn("echo", name="e")
            yield rt, path


def test_ask_prints_the_reply(served: tuple[Runtime, Path]) -> None:
    """`mty ask e ping BODY` prints the agent's reply as JSON; --json wraps it."""
    _, path = served
    runner = CliRunner()
    done = runner.invoke(main, ["ask", "e", "ping", '{"n": [1, 2]}', "--socket", str(path)])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {"n": [1, 2]}
    done = runner.invoke(main, ["ask", "e", "ping", "7", "--socket", str(path), "--json"])
    assert json.loads(done.stdout) == {
        "ok": True,
        "result": {"to": "e", "message": "ping", "reply": 7},
    }


def test_send_is_handled(served: tuple[Runtime, Path]) -> None:
    """`mty send` returns once the mailbox accepted the message; the agent then handles it."""
    rt, path = served
    done = CliRunner().invoke(main, ["send", "e", "note", '"hi"', "--socket", str(path)])
    assert done.exit_code == 0, done.output
    assert done.stdout == "e <- note: accepted\n"
    assert rt.drain(30)
    assert rt.inspect("e")["handled"] == 1


def test_unknown_agent_and_bad_body_exit_2(served: tuple[Runtime, Path]) -> None:
    """An unknown address is a noproc error (exit 2); a BODY that is not JSON is refused."""
    _, path = served
    runner = CliRunner()
    done = runner.invoke(main, ["ask", "nobody", "ping", "--socket", str(path)])
    assert done.exit_code == 2
    assert "no agent at 'nobody'" in done.stderr
    done = runner.invoke(main, ["send", "e", "ping", "{oops", "--socket", str(path)])
    assert done.exit_code == 2
    assert "BODY is not JSON" in done.stderr


def test_ops_validate_their_arguments(served: tuple[Runtime, Path]) -> None:
    """send/ask arguments are typed and bounded: bad ones are bad_input replies."""
    _, path = served
    for op, args in (
        ("send", {"to": 5, "message": "x"}),
        ("ask", {"to": "e", "message": ""}),
        ("ask", {"to": "e", "message": "x", "timeout": -1}),
        ("ask", {"to": "e", "message": "x", "timeout": True}),
        ("send", {"to": "e", "message": "x", "extra": 1}),
        ("ask", {"to": "e" * 300, "message": "x"}),
    ):
        with pytest.raises(ControlError) as caught:
            request(path, op, args)
        assert caught.value.kind == "bad_input", (op, args)


def test_no_socket_is_exit_1(tmp_path: Path) -> None:
    """Nothing listening: one line, exit 1."""
    done = CliRunner().invoke(main, ["ask", "e", "ping", "--socket", str(tmp_path / "x.sock")])
    assert done.exit_code == 1
    assert "no control socket at" in done.stderr
