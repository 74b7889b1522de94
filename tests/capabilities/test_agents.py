"""Agents call what they were granted (host tools, a real MCP server's tools) through the gate,
the calls are recorded and replay with the server stopped, and spawn, send, ask and inspect are
grants too."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.budget import Budget
from mighty.capabilities import Capabilities, McpServer
from mighty.trace import Recorder, replay_trace

ROOT = Path(__file__).resolve().parents[2]
SERVER = (sys.executable, "-m", "tests.capabilities.mcp_server")


def triple(n: int) -> int:
    """Three times n."""
    return 3 * n


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The probe agent (tests/capabilities/guests/probe_agent.py), built once."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("probe") / "probe.wasm"
    build_component(
        ROOT / "tests" / "capabilities" / "guests" / "probe_agent.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return Component.load(out)


def _registry() -> Capabilities:
    server = McpServer("files", command=SERVER, cwd=str(ROOT), env={"PYTHONPATH": str(ROOT)})
    return Capabilities().with_tool("triple", triple).with_mcp(server)


def _type(component: Component, name: str = "probe", **grants: Any) -> AgentType:
    granted = {k: frozenset(v) for k, v in grants.items()}
    return AgentType(name, component, budget=Budget(timeout=60.0), grants=Grants(**granted))


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    """A runtime with the host tool `triple` and the MCP server `files` declared."""
    with Runtime(workers=2, capabilities=_registry()) as rt:
        yield rt


def _call(rt: Runtime, address: str, tool: str, **kwargs: Any) -> Any:
    return rt.ask(address, "call", {"tool": tool, "kwargs": kwargs}, timeout=60)


def test_a_granted_host_tool_is_called_and_its_arguments_validated(
    runtime: Runtime, probe: Component
) -> None:
    """A granted host tool answers; a wrong argument type is invalid_arguments, not a call."""
    runtime.register(_type(probe, tools={"triple"}))
    address = runtime.spawn("probe")
    assert _call(runtime, address, "triple", n=14) == {"ok": 42}
    bad = _call(runtime, address, "triple", n="many")
    assert bad["error"] == "invalid_arguments"
    assert runtime.ask(address, "names") == ["triple"]
    grants = runtime.inspect(address)["grants"]
    assert grants["tools"] == ["triple"]
    assert grants["spawn"] == []
    assert grants["message"] == ["*"]


def test_a_tool_not_granted_is_refused_by_name(runtime: Runtime, probe: Component) -> None:
    """Neither a declared tool nor a made-up name can be called without a grant."""
    runtime.register(_type(probe))
    address = runtime.spawn("probe")
    for name in ("triple", "files.read", "files", "nothing", "x" * 10_000):
        answer = _call(runtime, address, name)
        assert answer["error"] == "not_granted", name
    assert runtime.ask(address, "names") == []


def test_one_tool_of_a_server_grants_that_tool_only(runtime: Runtime, probe: Component) -> None:
    """Granted files.read but not files.write: reading works, writing is refused."""
    runtime.register(_type(probe, tools={"files.read"}))
    address = runtime.spawn("probe")
    assert _call(runtime, address, "files.read", path="hello.txt") == {"ok": "hello, world"}
    assert _call(runtime, address, "files.write", path="a", text="b")["error"] == "not_granted"
    assert runtime.ask(address, "names") == ["files.read"]


def test_a_whole_server_grants_each_of_its_tools(runtime: Runtime, probe: Component) -> None:
    """Granted `files`: every tool it lists, errors typed as the server gave them."""
    runtime.register(_type(probe, tools={"files"}))
    address = runtime.spawn("probe")
    assert _call(runtime, address, "files.write", path="n.txt", text="note") == {"ok": 4}
    assert _call(runtime, address, "files.read", path="n.txt") == {"ok": "note"}
    assert _call(runtime, address, "files.add", a=2, b=5) == {"ok": 7}
    failed = _call(runtime, address, "files.fail", message="no disk")
    assert failed["error"] == "McpToolFailed"
    assert "no disk" in failed["message"] or "fail" in failed["message"]
    wrong = _call(runtime, address, "files.add", a="two")
    assert wrong["error"] == "InvalidMcpArguments"
    assert "files.listing" in runtime.ask(address, "names")


def test_a_server_dying_mid_call_fails_the_call_typed(runtime: Runtime, probe: Component) -> None:
    """The server's process exits during a call: the agent hears unavailable, not a hang."""
    runtime.register(_type(probe, tools={"files"}))
    address = runtime.spawn("probe")
    assert _call(runtime, address, "files.add", a=1)["ok"] == 2
    died = _call(runtime, address, "files.die")
    assert died["error"] == "McpUnavailable"
    assert "ended" in died["message"]


def test_tool_calls_replay_with_the_server_stopped(probe: Component, tmp_path: Path) -> None:
    """A recorded run replays to the same digest after the runtime and its server are gone."""
    trace = tmp_path / "tools.trace"
    with (
        Recorder(trace) as recorder,
        Runtime(workers=1, capabilities=_registry(), recorder=recorder) as rt,
    ):
        rt.register(_type(probe, tools={"triple", "files.read"}))
        address = rt.spawn("probe")
        assert _call(rt, address, "triple", n=2) == {"ok": 6}
        assert _call(rt, address, "files.read", path="hello.txt")["ok"] == "hello, world"
        assert _call(rt, address, "files.write", path="x", text="y")["error"] == "not_granted"
        server = rt.broker.clients["files"]
    assert not server.connected
    first, second = replay_trace(trace), replay_trace(trace)
    assert first.digest == second.digest
    assert first.instances[0].exports >= 4


def test_spawn_is_denied_unless_granted(runtime: Runtime, probe: Component) -> None:
    """No spawn by default; a type granted spawn of `probe` may spawn exactly that."""
    runtime.register(_type(probe))
    runtime.register(_type(probe, "parent", spawn={"probe"}))
    plain = runtime.spawn("probe")
    denied = runtime.ask(plain, "spawn", {"type": "probe"})
    assert denied["error"] == "Refused"
    assert "may not spawn" in denied["message"]
    parent = runtime.spawn("parent")
    child = runtime.ask(parent, "spawn", {"type": "probe"})
    assert child["ok"].startswith("probe:")
    assert runtime.ask(parent, "spawn", {"type": "parent"})["error"] == "Refused"


def test_messages_go_only_where_granted(runtime: Runtime, probe: Component) -> None:
    """A type granted messages to `friend` (a registered name) reaches it and nothing else."""
    runtime.register(_type(probe))
    runtime.register(_type(probe, "closed", message={"friend"}))
    friend = runtime.spawn("probe", name="friend")
    stranger = runtime.spawn("probe")
    closed = runtime.spawn("closed")
    assert runtime.ask(closed, "ask", {"to": "friend"}) == {"ok": "pong"}
    assert runtime.ask(closed, "send", {"to": "friend"}) == {"ok": True}
    answer = runtime.ask(closed, "ask", {"to": stranger})
    assert answer["error"] == "Refused"
    assert "may not message" in answer["message"]
    assert runtime.ask(closed, "send", {"to": stranger})["error"] == "Refused"
    # The host holds every grant: it may message the closed agent and the closed agent reply.
    assert runtime.ask(closed, "ping") == "pong"
    assert runtime.ask(friend, "ask", {"to": closed}) == {"ok": "pong"}


def test_inspect_of_bodies_needs_a_grant(probe: Component) -> None:
    """With introspect on, reading another agent's bodies needs `inspect` of its type."""
    with Runtime(workers=2, introspect=True) as rt:
        rt.register(_type(probe))
        rt.register(_type(probe, "auditor", inspect={"probe"}))
        target = rt.spawn("probe")
        nosy = rt.spawn("probe")
        auditor = rt.spawn("auditor")
        refused = rt.ask(nosy, "ask", {"to": target, "name": "__inspect"})
        assert refused["error"] == "Refused"
        assert "may not inspect" in refused["message"]
        seen = rt.ask(auditor, "ask", {"to": target, "name": "__inspect"})
        assert seen["ok"]["address"] == target


def test_grants_name_only_declared_capabilities(probe: Component) -> None:
    """Registering a type granted an undeclared capability fails, naming it."""
    from mighty._errors import BadInput

    with Runtime(workers=1, capabilities=_registry()) as rt:
        with pytest.raises(BadInput, match="no capability named 'search'"):
            rt.register(_type(probe, tools={"search"}))
        with pytest.raises(BadInput, match="does not offer"):
            Capabilities().with_mcp(
                McpServer("f", command=SERVER, tools=frozenset({"read"}))
            ).check({"f.write"}, "t")


def test_mcp_children_get_no_host_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child's environment holds PATH and friends and what `env` names, not the host's."""
    from mighty.capabilities._mcp_client import _child_env

    monkeypatch.setenv("SECRET_KEY", "hunter2")
    monkeypatch.setenv("GIVEN", "yes")
    env = _child_env(McpServer("s", command=("x",), env={"COPIED": "${GIVEN}", "PLAIN": "1"}))
    assert "SECRET_KEY" not in env
    assert env["COPIED"] == "yes"
    assert env["PLAIN"] == "1"
    assert env.get("PATH") == os.environ.get("PATH")


def test_an_agent_calls_a_server_over_streamable_http(
    probe: Component, http_server: Any, http_token: str
) -> None:
    """The same grants over Streamable HTTP, the bearer token read from the environment."""
    from tests.capabilities.conftest import TOKEN_ENV

    remote = McpServer("remote", url=http_server.url, token=f"${{{TOKEN_ENV}}}")
    with Runtime(workers=1, capabilities=Capabilities().with_mcp(remote)) as rt:
        rt.register(_type(probe, tools={"remote.read", "remote.add"}))
        address = rt.spawn("probe")
        assert _call(rt, address, "remote.read", path="hello.txt") == {"ok": "hello, world"}
        assert _call(rt, address, "remote.add", a=40, b=2) == {"ok": 42}
        assert _call(rt, address, "remote.write", path="x", text="y")["error"] == "not_granted"
