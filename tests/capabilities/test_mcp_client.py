"""The MCP client broker against a real MCP server process (tests/capabilities/mcp_server.py,
the ``mcp`` SDK's own server): over stdio, listing, calls and their results, error results,
a result over the size bound, a line that is not JSON-RPC, a call that never ends, a server
that dies mid-call or at start, restarts, close; over Streamable HTTP with a bearer token from
the environment, the same calls and an oversized response.

No test sleeps: each waits on a condition (``wait_ready`` with a generous deadline) and every
timeout a test meets is one it set itself. Every client is closed (``with``)."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator

import mcp_types
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.capabilities import (
    McpClient,
    McpServer,
    McpToolFailed,
    McpUnavailable,
    mcp_tools,
)
from mighty.capabilities._mcp_client import result_value
from tests.capabilities.conftest import (
    HTTP_TOKEN,
    TOKEN_ENV,
    HttpServer,
    StdioServer,
    make_stdio_server,
    pid_alive,
)

READY = 120.0  # seconds a test waits for a (re)start: generous, a loaded 2-core machine
ALL_TOOLS = {"add", "big", "die", "fail", "garbage", "hang", "listing", "read", "shout", "write"}

Factory = Callable[..., StdioServer]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpClient]:
    """One connected stdio client for the tests that leave the server as they found it."""
    made = make_stdio_server(tmp_path_factory.mktemp("shared"))
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        yield client


# -- listing ----------------------------------------------------------------------------------


def test_lists_every_tool_with_its_schema(shared: McpClient) -> None:
    """The client offers every tool the server lists, with descriptions and input schemas."""
    tools = shared.tools()
    assert set(tools) == ALL_TOOLS
    add = tools["add"]
    assert add.description == "Add two integers."
    assert add.input_schema["type"] == "object"
    assert add.input_schema["properties"]["a"]["type"] == "integer"
    assert add.input_schema["required"] == ["a"]
    assert add.wrapped  # an int result: the SDK wraps it in {"result": ...}
    assert not tools["shout"].wrapped  # no output schema at all


def test_only_the_named_tools_are_offered(stdio_server: Factory) -> None:
    """With ``tools=`` only that subset is offered; calling another is refused, typed."""
    made = stdio_server(tools=frozenset({"read", "add"}))
    with McpClient(made.server) as client:
        assert set(client.wait_ready(READY)) == {"read", "add"}
        assert client.call("add", {"a": 2, "b": 2}) == 4
        with pytest.raises(McpUnavailable, match="offers no tool 'write'"):
            client.call("write", {"path": "x", "text": "y"})
        with pytest.raises(McpUnavailable, match="offers no tool 'write'"):
            mcp_tools(client, only=["write"])


def test_a_named_tool_the_server_lacks_fails_typed(stdio_server: Factory) -> None:
    """A ``tools=`` name the server does not list: the connection is refused, saying which."""
    made = stdio_server(tools=frozenset({"read", "nope"}))
    with McpClient(made.server) as client:
        with pytest.raises(McpUnavailable, match="does not list nope"):
            client.wait_ready(READY, fail_fast=True)
        assert not client.connected


# -- calls and results --------------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_TEXTS = st.lists(st.text(max_size=12), max_size=4)


@given(_TEXTS, st.one_of(st.none(), st.dictionaries(st.text(max_size=4), _JSON, max_size=3)))
def test_result_value_of_any_result(texts: list[str], structured: dict[str, object] | None) -> None:
    """Structured content wins, else the text blocks joined; an error result raises its text."""
    blocks = [mcp_types.TextContent(type="text", text=t) for t in texts]
    result = mcp_types.CallToolResult(content=blocks, structured_content=structured)
    expected = structured if structured is not None else "\n".join(texts)
    assert result_value("s", "t", result) == expected
    failed = mcp_types.CallToolResult(content=blocks, structured_content=structured, is_error=True)
    with pytest.raises(McpToolFailed) as caught:
        result_value("s", "t", failed)
    assert str(caught.value) == "s.t: " + ("\n".join(texts) or "the tool failed")


@given(_TEXTS, st.binary(min_size=1, max_size=12))
def test_result_value_keeps_blocks_that_are_not_text(texts: list[str], data: bytes) -> None:
    """A result with a block that is not text (an image) comes back as the blocks, as JSON."""
    import base64

    image = mcp_types.ImageContent(
        type="image", data=base64.b64encode(data).decode(), mime_type="image/png"
    )
    blocks = [*(mcp_types.TextContent(type="text", text=t) for t in texts), image]
    value = result_value("s", "t", mcp_types.CallToolResult(content=blocks))
    assert value == [
        *({"type": "text", "text": t} for t in texts),
        {"type": "image", "data": image.data, "mimeType": "image/png"},
    ]


def test_values_come_back_unwrapped(shared: McpClient) -> None:
    """Structured results arrive as data: an int, a string, a list, never {"result": ...}."""
    assert shared.call("add", {"a": 2, "b": 3}) == 5
    assert shared.call("add", {"a": 2}) == 3
    assert shared.call("read", {"path": "hello.txt"}) == "hello, world"
    assert shared.call("write", {"path": "new.txt", "text": "four"}) == 4
    assert shared.call("read", {"path": "new.txt"}) == "four"
    assert shared.call("listing", {}) == ["hello.txt", "new.txt"]


def test_text_results_are_joined(shared: McpClient) -> None:
    """A result of text blocks only (no structured content) is their text, one per line."""
    assert shared.call("shout", {"text": "hi"}) == "HI"
    assert shared.call("shout", {"text": "hi", "times": 3}) == "HI\nHI\nHI"


def test_an_error_result_is_tool_failed(shared: McpClient) -> None:
    """An ``isError`` result is McpToolFailed with the server's text; the connection stays."""
    with pytest.raises(McpToolFailed, match="boom") as caught:
        shared.call("fail", {"message": "boom"})
    assert caught.value.kind == "tool_failed"
    # A crash inside a tool: the SDK keeps the exception's text on the server.
    with pytest.raises(McpToolFailed, match=r"files\.read: Error executing tool read"):
        shared.call("read", {"path": "missing.txt"})
    # Arguments the server's own validation refuses are an error result too.
    with pytest.raises(McpToolFailed, match=r"files\.add"):
        shared.call("add", {"a": "not a number"})
    assert shared.connected
    assert shared.call("add", {"a": 1}) == 2


def test_calls_from_an_event_loop_and_from_threads(shared: McpClient) -> None:
    """``acall`` from another event loop, and many threads at once over one connection."""

    async def several() -> list[int]:
        return list(await asyncio.gather(*(shared.acall("add", {"a": i}) for i in range(20))))

    assert asyncio.run(several()) == [i + 1 for i in range(20)]
    results: dict[int, int] = {}

    def one(i: int) -> None:
        results[i] = shared.call("add", {"a": i, "b": i})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: 2 * i for i in range(8)}


def test_a_call_past_its_timeout_is_unavailable(shared: McpClient) -> None:
    """``hang`` under a per-call timeout the test sets fails typed; the server stays up."""
    with pytest.raises(McpUnavailable, match=r"hang\(\) took more than 0.5 s"):
        shared.call("hang", {}, timeout=0.5)
    assert shared.connected
    assert shared.call("add", {"a": 41}) == 42


def test_the_servers_timeout_bounds_every_call(stdio_server: Factory) -> None:
    """``McpServer(timeout=)`` bounds a call given no timeout, and a longer one asked for."""
    made = stdio_server(timeout=0.5)
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        with pytest.raises(McpUnavailable, match=r"took more than 0\.5 s"):
            client.call("hang", {})
        with pytest.raises(McpUnavailable, match=r"took more than 0\.5 s"):
            client.call("hang", {}, timeout=60)


# -- failures and restarts -----------------------------------------------------------------


def test_a_result_over_the_size_bound_drops_and_restarts(stdio_server: Factory) -> None:
    """A 50 MB result: McpUnavailable naming the bound, the process restarted, calls work."""
    made = stdio_server()
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        assert made.starts() == 1
        with pytest.raises(McpUnavailable, match=f"over {4 << 20} bytes") as caught:
            client.call("big", {"size": 50_000_000})
        assert caught.value.kind == "unavailable"
        client.wait_ready(READY)
        assert client.call("add", {"a": 1}) == 2
        assert made.starts() == 2
        assert client.starts == 2
        first, second = made.pids()
        assert first != second
        assert not pid_alive(first)


def test_a_line_that_is_not_json_rpc_drops_the_connection(stdio_server: Factory) -> None:
    """``garbage`` writes a line that is not JSON-RPC: the connection drops, saying so."""
    made = stdio_server()
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        with pytest.raises(McpUnavailable, match="not JSON-RPC: b'this is not json'"):
            client.call("garbage", {})
        client.wait_ready(READY)
        assert client.call("read", {"path": "hello.txt"}) == "hello, world"
        assert made.starts() == 2


def test_a_server_that_dies_mid_call_is_restarted(stdio_server: Factory) -> None:
    """``die`` ends the process during the call: McpUnavailable with its status, a restart."""
    made = stdio_server()
    with McpClient(made.server) as client:
        client.wait_ready(READY)
        with pytest.raises(McpUnavailable, match=r"went away during die\(\).*status 3"):
            client.call("die", {})
        client.wait_ready(READY)
        assert client.call("add", {"a": 5}) == 6
        assert made.starts() == 2
        assert not pid_alive(made.pids()[0])


def test_calls_while_down_fail_at_once(tmp_path: object) -> None:
    """A server that exits at every start: after the first failure, waits and calls fail at once."""
    server = McpServer(
        "broken", command=(sys.executable, "-c", "raise SystemExit(4)"), connect_timeout=3600
    )
    with McpClient(server) as client:
        with pytest.raises(McpUnavailable, match="status 4"):
            client.wait_ready(fail_fast=True)  # a 3600 s connect timeout: returns at the failure
        with pytest.raises(McpUnavailable, match="broken is not connected"):
            client.call("add", {"a": 1})
        with pytest.raises(McpUnavailable, match="broken is not connected"):
            client.wait_ready(fail_fast=True)
        assert not client.connected


def test_a_command_that_does_not_exist(tmp_path: object) -> None:
    """A command that is not there: McpUnavailable saying it cannot be started."""
    server = McpServer("ghost", command=("/nonexistent/mty-no-such-mcp-server",))
    refused = pytest.raises(McpUnavailable, match="cannot start '/nonexistent/mty-no-such")
    with McpClient(server) as client, refused:
        client.wait_ready(READY, fail_fast=True)


def test_close_stops_the_process(stdio_server: Factory) -> None:
    """``close`` ends the server's process; afterwards calls and waits fail typed."""
    made = stdio_server()
    client = McpClient(made.server)
    try:
        client.wait_ready(READY)
        (pid,) = made.pids()
        assert pid_alive(pid)
    finally:
        client.close()
    assert not pid_alive(pid)
    with pytest.raises(McpUnavailable, match="not connected: closed"):
        client.call("add", {"a": 1})
    with pytest.raises(McpUnavailable):
        client.wait_ready(READY)
    client.close()  # idempotent


def test_close_during_a_hung_call_ends_it(stdio_server: Factory) -> None:
    """Closing while a call hangs fails the call typed and still ends the process."""
    made = stdio_server()
    client = McpClient(made.server)
    failed: list[BaseException] = []
    started = threading.Event()

    def hang() -> None:
        started.set()
        try:
            client.call("hang", {})
        except McpUnavailable as exc:
            failed.append(exc)

    try:
        client.wait_ready(READY)
        (pid,) = made.pids()
        caller = threading.Thread(target=hang)
        caller.start()
        started.wait()
    finally:
        client.close()
    caller.join(READY)
    assert not caller.is_alive()
    assert len(failed) == 1
    assert not pid_alive(pid)


def test_declarations_are_checked() -> None:
    """A server declaration that cannot work is BadInput at once, not at connect time."""
    with pytest.raises(BadInput, match="exactly one of command= or url="):
        McpServer("x")
    with pytest.raises(BadInput, match="must name its source"):
        McpServer("x", url="http://127.0.0.1:1/mcp", token="literal-secret")
    with pytest.raises(BadInput, match="token= goes with url="):
        McpServer("x", command=("true",), token="${T}")
    with pytest.raises(BadInput, match="name"):
        McpServer("9bad", command=("true",))


# -- Streamable HTTP ---------------------------------------------------------------------------


def test_http_lists_and_calls_with_a_bearer_token(http_server: HttpServer, http_token: str) -> None:
    """Over HTTP with ``token="${ENV}"``: the server checks the header (a 401 otherwise)."""
    server = McpServer("web", url=http_server.url, token=f"${{{TOKEN_ENV}}}")
    with McpClient(server) as client:
        assert set(client.wait_ready(READY)) == ALL_TOOLS
        assert client.call("add", {"a": 20, "b": 22}) == 42
        assert client.call("shout", {"text": "web", "times": 2}) == "WEB\nWEB"
        with pytest.raises(McpToolFailed, match="nope"):
            client.call("fail", {"message": "nope"})
        with pytest.raises(McpUnavailable, match=r"took more than 0\.5 s"):
            client.call("hang", {}, timeout=0.5)
        assert client.call("listing", {})[0] == "hello.txt"


def test_http_refuses_a_wrong_or_missing_token(
    http_server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong token never connects (the server answers 401); an unset variable says so."""
    monkeypatch.setenv(TOKEN_ENV, HTTP_TOKEN + "-wrong")
    server = McpServer("web", url=http_server.url, token=f"${{{TOKEN_ENV}}}")
    refused = pytest.raises(McpUnavailable, match="web is not connected")
    with McpClient(server) as client, refused:
        client.wait_ready(READY, fail_fast=True)
    monkeypatch.delenv(TOKEN_ENV)
    unset = pytest.raises(McpUnavailable, match=f"{TOKEN_ENV} is not set")
    with McpClient(server) as client, unset:
        client.wait_ready(READY, fail_fast=True)
    bare = McpServer("web", url=http_server.url)
    with McpClient(bare) as client, pytest.raises(McpUnavailable, match="web is not connected"):
        client.wait_ready(READY, fail_fast=True)


def test_http_an_oversized_response_drops_and_reconnects(
    http_server: HttpServer, http_token: str
) -> None:
    """A response over ``max_message`` drops the connection naming the bound; it reconnects."""
    server = McpServer("web", url=http_server.url, token=f"${{{TOKEN_ENV}}}", max_message=1 << 20)
    with McpClient(server) as client:
        client.wait_ready(READY)
        with pytest.raises(McpUnavailable, match=f"over {1 << 20} bytes"):
            client.call("big", {"size": 2_000_000})
        client.wait_ready(READY)
        assert client.call("big", {"size": 1000}) == "x" * 1000
        assert client.starts == 2
