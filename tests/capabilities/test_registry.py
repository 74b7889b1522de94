"""The capability registry and grants as data: names checked, kinds told apart, the manifest's
``[capabilities]`` and per-type grants parsed (or refused, naming the problem), and
``mty capabilities`` listing them without starting anything."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.agents import Grants, load_manifest
from mighty.agents.hosting import agent_types, capabilities
from mighty.capabilities import Capabilities, McpServer
from mighty.cli import main
from mighty.wasi import HttpGrant, Origin

SERVER = McpServer("files", command=("server",), tools=frozenset({"read", "listing"}))


def lookup(city: str) -> str:
    """A host tool."""
    return city


def _registry() -> Capabilities:
    http = HttpGrant(Origin.parse("https://api.example.com"))
    return Capabilities().with_tool("lookup", lookup).with_mcp(SERVER).with_http("api", http)


def test_kinds_are_told_apart_and_unknown_names_refused() -> None:
    """A tool, a server, one of its tools, HTTP; anything else names what is declared."""
    registry = _registry()
    assert registry.kind_of("lookup") == "tool"
    assert registry.kind_of("files") == "mcp"
    assert registry.kind_of("files.read") == "mcp-tool"
    assert registry.kind_of("api") == "http"
    with pytest.raises(BadInput, match="does not offer 'write'"):
        registry.kind_of("files.write")
    with pytest.raises(BadInput, match=r"no capability named 'lookup.x'.*api, files, lookup"):
        registry.kind_of("lookup.x")
    assert [g.origin.host for g in registry.http_grants({"api", "lookup"})] == ["api.example.com"]


def test_names_are_checked_when_declared() -> None:
    """Duplicates, bad names and a tool name Python cannot call are refused at once."""
    registry = _registry()
    with pytest.raises(BadInput, match="two capabilities"):
        registry.with_tool("lookup", lookup)
    for bad in ("", "a b", "-x", "x" * 65, "1abc"):
        with pytest.raises(BadInput):
            Capabilities().with_mcp(McpServer(bad, command=("s",)))
    with pytest.raises(BadInput, match="identifier"):
        Capabilities().with_tool("my-tool", lookup)
    with pytest.raises(BadInput, match="exactly one of command= or url="):
        McpServer("s")
    with pytest.raises(BadInput, match="must name its source"):
        McpServer("s", url="https://mcp.example.com", token="sk-live-123")


def test_describe_never_shows_a_secret() -> None:
    """A URL server's token is shown only as where it is, never read."""
    server = McpServer("remote", url="https://mcp.example.com/mcp", token="${MCP_TOKEN}")
    described = Capabilities().with_mcp(server).describe()
    assert described == [{"name": "remote", "kind": "mcp", "url": "https://mcp.example.com/mcp"}]


@given(
    spawn=st.frozensets(st.sampled_from(["a", "b", "*"])),
    message=st.frozensets(st.sampled_from(["a", "b", "n", "*"])),
    target=st.sampled_from(["a", "b", "c"]),
    name=st.sampled_from([None, "n", "m"]),
)
def test_grants_allow_exactly_what_they_name(
    spawn: frozenset[str], message: frozenset[str], target: str, name: str | None
) -> None:
    """A grant allows a type or name it lists, or anything with "*", and nothing else."""
    grants = Grants(spawn=spawn, message=message, inspect=spawn)
    assert grants.may_spawn(target) == ("*" in spawn or target in spawn)
    assert grants.may_inspect(target) == grants.may_spawn(target)
    expected = "*" in message or target in message or (name is not None and name in message)
    assert grants.may_message(target, name) == expected


def test_default_grants_deny_spawn_inspect_and_tools() -> None:
    """Nothing but messaging is granted by default; a bare string is not a set of names."""
    grants = Grants()
    assert not grants.may_spawn("anything")
    assert not grants.may_inspect("anything")
    assert grants.tools == frozenset()
    assert grants.may_message("anything", None)
    with pytest.raises(BadInput, match="set of names"):
        Grants(spawn="worker")  # type: ignore[arg-type]


_MANIFEST = """
[capabilities.lookup]
tool = "tools_mod:lookup"

[capabilities.files]
mcp = {{ command = ["{python}", "-c", "pass"], tools = ["read"] }}

[capabilities.api]
http = ["https://api.example.com"]

[agents.a]
component = "a.wasm"
capabilities = ["lookup", "files.read", "api"]
spawns = ["a"]
messages = ["a"]

[agents.b]
component = "a.wasm"
"""


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "tools_mod.py").write_text("def lookup(q: str) -> str:\n    return q\n")
    path = tmp_path / "mighty.toml"
    path.write_text(text.format(python=sys.executable))
    return path


def test_the_manifest_declares_and_grants(tmp_path: Path, budget_wasm_path: Path) -> None:
    """[capabilities] becomes a registry; a type's grants and its HTTP capability's origins."""
    (tmp_path / "a.wasm").write_bytes(budget_wasm_path.read_bytes())
    manifest, base = load_manifest(_write(tmp_path, _MANIFEST))
    registry = capabilities(manifest, base)
    assert registry.kind_of("lookup") == "tool"
    types = {t.name: t for t in agent_types(manifest, base, registry=registry)}
    a, b = types["a"], types["b"]
    assert a.grants == Grants(
        spawn=frozenset({"a"}),
        message=frozenset({"a"}),
        tools=frozenset({"lookup", "files.read"}),
    )
    assert [str(g.origin) for g in a.policy.http.grants] == ["https://api.example.com:443"]
    assert b.grants == Grants()
    assert b.policy.http.grants == ()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ('capabilities = ["lookup"]', "not in \\[capabilities\\]"),
        ('capabilities = ["nothing.read"]', "not in \\[capabilities\\]"),
        ('spawns = ["ghost"]', "spawns unknown type 'ghost'"),
    ],
)
def test_manifest_grants_must_name_what_exists(tmp_path: Path, change: str, problem: str) -> None:
    """A grant of something undeclared is refused when the manifest loads, naming it."""
    text = '[agents.a]\ncomponent = "a.wasm"\n' + change + "\n"
    with pytest.raises(BadInput, match=problem):
        load_manifest(_write(tmp_path, text))


def test_a_capability_is_exactly_one_kind(tmp_path: Path) -> None:
    """A [capabilities.x] with two kinds, or none, is refused."""
    text = '[capabilities.x]\ntool = "m:f"\nhttp = ["https://a.b"]\n[agents.a]\ncomponent = "a"\n'
    with pytest.raises(BadInput, match="exactly one of tool, mcp and http"):
        load_manifest(_write(tmp_path, text))


def test_mty_capabilities_lists_without_starting_anything(tmp_path: Path) -> None:
    """The command reads the manifest alone: a server command that cannot run is just listed."""
    path = tmp_path / "mighty.toml"
    path.write_text(_MANIFEST.format(python="/nonexistent/server"))
    result = CliRunner().invoke(main, ["capabilities", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    kinds = {c["name"]: c["kind"] for c in data["capabilities"]}
    assert kinds == {"lookup": "tool", "files": "mcp", "api": "http"}
    assert data["agents"]["a"]["capabilities"] == ["api", "files.read", "lookup"]
    assert data["agents"]["b"]["spawns"] == []
    text_out = CliRunner().invoke(main, ["capabilities", str(path)]).output
    assert "files: mcp /nonexistent/server -c pass (only read)" in text_out
