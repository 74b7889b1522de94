"""`mty sandbox serve --http`: a real server subprocess driven by the SDK's Streamable HTTP
client (several clients at once, tokens, a flood), plus the admission, token and chunking
policies in process."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import BlobResourceContents

from mighty._errors import BadInput
from mighty.cli import main
from mighty.sandbox._mcp import (
    MAX_PROGRESS_MESSAGE,
    MCP_OUTPUT,
    RUN_PYTHON,
    build_server,
)
from mighty.sandbox._mcp import _messages as progress_messages
from mighty.sandbox._mcp_http import BearerAuth, check_bind, is_loopback, parse_bind, read_token
from tests.sandbox_mcp.test_mcp import _FIRST_CALL_TIMEOUT, OK_DOC, _kind, _server_command, _value

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-" + "x" * 26


class _Server:
    def __init__(self, process: subprocess.Popen[str], url: str, lines: list[str]) -> None:
        self.process = process
        self.url = url
        self.lines = lines


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, interpreter: object) -> Iterator[_Server]:
    """One `mty sandbox serve --http 127.0.0.1:0 --token-file F` for the module's tests."""
    token_file = tmp_path_factory.mktemp("http") / "token"
    token_file.write_text(TOKEN + "\n")
    command, prefix = _server_command()
    env = {"PATH": os.environ.get("PATH", "")}
    env.update({key: os.environ[key] for key in ("MTY_CACHE_DIR",) if key in os.environ})
    process = subprocess.Popen(
        [
            command,
            *prefix,
            "sandbox",
            "serve",
            "--tools",
            "tests.sandbox_mcp.tools:HTTP_TOOLS",
            "--http",
            "127.0.0.1:0",
            "--token-file",
            str(token_file),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
        text=True,
    )
    assert process.stderr is not None
    lines: list[str] = []
    url = None
    for line in process.stderr:
        lines.append(line)
        found = re.search(r"on (http://\S+)", line)
        if found:
            url = found.group(1)
            break
    assert url is not None, "".join(lines)
    stream = process.stderr
    drain = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
    drain.start()
    try:
        yield _Server(process, url, lines)
    finally:
        process.terminate()
        process.wait(timeout=30)
        drain.join(timeout=5)
        stream.close()


def _http(token: str | None = TOKEN) -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))


@asynccontextmanager
async def _session(url: str, token: str | None = TOKEN) -> AsyncIterator[ClientSession]:
    async with (
        _http(token) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def _run(server: _Server, scenario: Any) -> None:
    try:
        anyio.run(scenario)
    finally:
        print("".join(server.lines))  # shown when the test fails


@pytest.mark.slow
def test_two_clients_run_at_once_and_share_nothing(server: _Server) -> None:
    """Two clients' calls run at the same time (each waits for the other inside a host tool),
    and a global one sets is not in the other's run."""

    async def scenario() -> None:
        async with _session(server.url) as one, _session(server.url) as two:
            first, second = await asyncio.gather(
                one.call_tool(RUN_PYTHON, {"code": "meet('two', 2)"}, _FIRST_CALL_TIMEOUT),
                two.call_tool(RUN_PYTHON, {"code": "meet('two', 2)"}, _FIRST_CALL_TIMEOUT),
            )
            assert _value(first) == 2
            assert _value(second) == 2
            await one.call_tool(RUN_PYTHON, {"code": "secret = 41"})
            seen = await two.call_tool(RUN_PYTHON, {"code": "'secret' in globals()"})
            assert _value(seen) is False
            again = await one.call_tool(RUN_PYTHON, {"code": "'secret' in globals()"})
            assert _value(again) is False

    _run(server, scenario)


@pytest.mark.slow
def test_each_call_has_its_own_limits(server: _Server) -> None:
    """A call that blows its tool-call budget fails alone; the same client's next call has the
    full budget again, and another client's call at the same time is untouched."""

    async def scenario() -> None:
        async with _session(server.url) as one, _session(server.url) as two:
            greedy, modest = await asyncio.gather(
                one.call_tool(
                    RUN_PYTHON, {"code": "for i in range(1000): add(i, 1)"}, _FIRST_CALL_TIMEOUT
                ),
                two.call_tool(
                    RUN_PYTHON, {"code": "[add(i, 1) for i in range(50)][-1]"}, _FIRST_CALL_TIMEOUT
                ),
            )
            assert _kind(greedy) == "tool_limit"
            assert _value(modest) == 50
            again = await one.call_tool(RUN_PYTHON, {"code": "[add(i, 1) for i in range(99)][-1]"})
            assert _value(again) == 99

    _run(server, scenario)


@pytest.mark.slow
def test_a_call_can_lower_its_limits_never_raise_them(server: _Server) -> None:
    """`limits` in a call lowers that call's budget (timeout, tool calls, output); a value above
    the server's is capped; a malformed one is refused; the next call has the full limits."""

    async def scenario() -> None:
        async with _session(server.url) as session:
            spin = await session.call_tool(
                RUN_PYTHON,
                {"code": "while True: pass", "limits": {"timeout": 0.3}},
                _FIRST_CALL_TIMEOUT,
            )
            assert _kind(spin) == "deadline_exceeded"
            assert spin.structured_content is not None
            assert "0.3 s" in spin.structured_content["error"]["message"]
            calls = await session.call_tool(
                RUN_PYTHON,
                {"code": "[add(1, i) for i in range(10)]", "limits": {"tool_calls": 2}},
            )
            assert _kind(calls) == "tool_limit"
            shown = await session.call_tool(
                RUN_PYTHON, {"code": "print('q' * 50)", "limits": {"output": 5}}
            )
            assert shown.structured_content is not None
            assert shown.structured_content["stdout"] == "q" * 5
            assert shown.structured_content["artifacts"][0]["bytes"] == 51
            capped = await session.call_tool(
                RUN_PYTHON, {"code": "1", "limits": {"fuel": 10**30, "timeout": 10**4}}
            )
            assert _value(capped) == 1
            for bad in ({"memory": 1}, {"timeout": -1}, {"nope": 1}):
                refused = await session.call_tool(RUN_PYTHON, {"code": "1", "limits": bad})
                assert refused.is_error is True, bad
            full = await session.call_tool(
                RUN_PYTHON, {"code": "[add(1, i) for i in range(50)][-1]"}
            )
            assert _value(full) == 50

    _run(server, scenario)


@pytest.mark.slow
def test_output_streams_as_progress_and_the_rest_is_an_artifact(server: _Server) -> None:
    """Over HTTP a call's prints arrive as progress notifications before its result; output past
    the 64 KiB view comes back whole, in parts, as resources matching its SHA-256."""

    async def scenario() -> None:
        async with _session(server.url) as session:
            heard: list[str] = []
            values: list[float] = []

            async def progress(done: float, total: float | None, message: str | None) -> None:
                heard.append(message or "")
                values.append(done)

            code = "import sys\nfor i in range(5): print('line', i)\nsys.stderr.write('warn')\n7"
            result = await session.call_tool(
                RUN_PYTHON, {"code": code}, _FIRST_CALL_TIMEOUT, progress_callback=progress
            )
            assert _value(result) == 7
            stdout = "".join(m.removeprefix("stdout: ") for m in heard if m.startswith("stdout: "))
            assert stdout == "".join(f"line {i}\n" for i in range(5))
            assert [m for m in heard if m.startswith("stderr: ")] == ["stderr: warn"]
            assert values == sorted(set(values))  # progress only grows

            big = "print('y' * 1_500_000 + 'end')"
            cut = await session.call_tool(RUN_PYTHON, {"code": big})
            assert cut.is_error is False
            document = cut.structured_content
            assert document is not None
            assert document["stdout"] == "y" * MCP_OUTPUT
            (ref,) = document["artifacts"]
            assert ref["name"] == "stdout"
            assert ref["bytes"] == 1_500_004
            links = [block.uri for block in cut.content if block.type == "resource_link"]
            assert [str(uri) for uri in links] == ref["parts"]
            whole = b""
            for uri in ref["parts"]:
                read = await session.read_resource(uri)
                (part,) = read.contents
                assert isinstance(part, BlobResourceContents)
                whole += base64.b64decode(part.blob)
            assert whole == b"y" * 1_500_000 + b"end\n"
            assert hashlib.sha256(whole).hexdigest() == ref["sha256"]
            made_up = ref["uri"][:-4] + "AAAA/0"
            with pytest.raises(Exception, match="no such artifact"):
                await session.read_resource(made_up)

    _run(server, scenario)


@pytest.mark.slow
def test_requests_without_the_right_token_are_401(server: _Server) -> None:
    """No header, a wrong token, another scheme, two headers: 401 before the MCP app; the SDK's
    client fails to connect with a wrong token; the right token still works."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}

    async def scenario() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            for headers in (
                {},
                {"Authorization": "Bearer wrong-token-of-some-length"},
                {"Authorization": f"Bearer {TOKEN}x"},
                {"Authorization": f"Basic {TOKEN}"},
                {"Authorization": TOKEN},
            ):
                reply = await http.post(server.url, json=initialize, headers=accept | headers)
                assert reply.status_code == 401, headers
                assert reply.headers["www-authenticate"].startswith("Bearer")
            twice = [("Authorization", f"Bearer {TOKEN}")] * 2 + list(accept.items())
            reply = await http.post(server.url, json=initialize, headers=twice)
            assert reply.status_code == 401
            good = await http.post(
                server.url, json=initialize, headers=accept | {"Authorization": f"Bearer {TOKEN}"}
            )
            assert good.status_code == 200
        with pytest.raises(BaseException):  # noqa: B017, PT011 - the SDK wraps it in a group
            async with _session(server.url, token="wrong-token-of-some-length"):
                pass
        async with _session(server.url) as session:
            result = await session.call_tool(RUN_PYTHON, {"code": "1 + 1"}, _FIRST_CALL_TIMEOUT)
            assert _value(result) == 2

    _run(server, scenario)


@pytest.mark.slow
def test_a_flood_leaves_the_server_serving(server: _Server) -> None:
    """Hundreds of bad requests at once (no token, oversized, garbage, no session) and dozens of
    real calls from several clients: each answered, and the server serves a clean call after."""

    async def bad(http: httpx2.AsyncClient, index: int) -> int:
        kind = index % 4
        headers = {"Accept": "application/json, text/event-stream"}
        if kind == 0:
            reply = await http.post(server.url, content=b"{}", headers=headers)
        elif kind == 1:
            headers["Authorization"] = f"Bearer {TOKEN}"
            reply = await http.post(server.url, content=b"[" * (5 << 20), headers=headers)
        elif kind == 2:
            headers["Authorization"] = f"Bearer {TOKEN}"
            reply = await http.post(server.url, content=b"\xff not json", headers=headers)
        else:
            headers["Authorization"] = f"Bearer {TOKEN}"
            call = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {}}
            reply = await http.post(server.url, json=call, headers=headers)
        return reply.status_code

    async def calls(count: int) -> list[Any]:
        async with _session(server.url) as session:
            return list(
                await asyncio.gather(
                    *(
                        session.call_tool(
                            RUN_PYTHON, {"code": f"sum(range({n}))"}, _FIRST_CALL_TIMEOUT
                        )
                        for n in range(count)
                    )
                )
            )

    async def scenario() -> None:
        limits = httpx2.Limits(max_connections=400)
        async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
            results = await asyncio.gather(
                *(bad(http, index) for index in range(200)), *(calls(12) for _ in range(3))
            )
        statuses = results[:200]
        assert {statuses[i] for i in range(0, 200, 4)} <= {401, 503}
        assert {statuses[i] for i in range(1, 200, 4)} <= {413, 503}
        assert {statuses[i] for i in range(2, 200, 4)} <= {400, 503}
        assert {statuses[i] for i in range(3, 200, 4)} <= {400, 404, 503}
        assert 401 in statuses and 413 in statuses
        for batch in results[200:]:
            assert isinstance(batch, list)
            for n, result in enumerate(batch):
                if result.is_error:
                    assert _kind(result) == "busy"
                else:
                    assert _value(result) == sum(range(n))
        async with _session(server.url) as session:
            after = await session.call_tool(RUN_PYTHON, {"code": "'still serving'"})
            assert _value(after) == "still serving"
        assert server.process.poll() is None

    _run(server, scenario)


# -- refusals at start ----------------------------------------------------------------------


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "[::]:8765", "192.0.2.1:80", "example.com:80"])
def test_a_public_bind_without_a_token_is_refused(bind: str) -> None:
    """Off loopback without --token-file: one line on stderr, exit 2, nothing bound."""
    result = CliRunner().invoke(main, ["sandbox", "serve", "--http", bind])
    assert result.exit_code == 2
    assert result.stderr.startswith("mty: error: refusing to serve on ")
    assert "--token-file" in result.stderr
    assert result.stderr.count("\n") == 1


def test_bad_http_arguments_are_usage_errors(tmp_path: Path) -> None:
    """A bad HOST:PORT, a bad token file, or a token file without --http: exit 2, one line."""
    short = tmp_path / "short"
    short.write_text("abc\n")
    cases = [
        ["--http", "127.0.0.1"],
        ["--http", "127.0.0.1:99999"],
        ["--http", "127.0.0.1:0", "--token-file", str(short)],
        ["--http", "127.0.0.1:0", "--token-file", str(tmp_path / "missing")],
        ["--token-file", str(short)],
    ]
    for args in cases:
        result = CliRunner().invoke(main, ["sandbox", "serve", *args])
        assert result.exit_code == 2, args
        assert result.stderr.startswith("mty: error: "), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def test_bind_policy() -> None:
    """Loopback needs no token; anything else does; HOST:PORT parses IPv4, [IPv6] and names."""
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost", "LOCALHOST"):
        assert is_loopback(host)
        check_bind(host, None)
    for host in ("0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.example.com"):
        assert not is_loopback(host)
        with pytest.raises(BadInput, match="refusing"):
            check_bind(host, None)
        check_bind(host, TOKEN)
    assert parse_bind("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_bind("[::1]:0") == ("::1", 0)
    assert parse_bind("localhost:1") == ("localhost", 1)
    for bad in ("8765", ":8765", "127.0.0.1:", "127.0.0.1:x", "h:-1", "h:70000"):
        with pytest.raises(BadInput):
            parse_bind(bad)


def test_token_file_rules(tmp_path: Path) -> None:
    """A token is one line of 16..4096 visible ASCII characters; surrounding whitespace goes."""
    path = tmp_path / "token"
    path.write_text(f"  {TOKEN}\n")
    assert read_token(path) == TOKEN
    for bad in ("", "short", "has space inside 1234", "é" * 20, "x" * 5000, "a\tb" * 8):
        path.write_text(bad)
        with pytest.raises(BadInput):
            read_token(path)


@given(st.binary(max_size=80) | st.text(max_size=80).map(lambda t: t.encode("utf-8")))
def test_bearer_auth_takes_exactly_the_token(value: bytes) -> None:
    """Any Authorization value but `Bearer <token>` is refused; so is no header or two."""
    auth = BearerAuth(_refuse_app, TOKEN)
    expected = f"Bearer {TOKEN}".encode()
    assert auth.allows([(b"authorization", value)]) is (value == expected)
    assert auth.allows([(b"Authorization", expected)])
    assert not auth.allows([])
    assert not auth.allows([(b"authorization", expected), (b"authorization", value)])


async def _refuse_app(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("not reached")


def test_bearer_auth_as_asgi_middleware() -> None:
    """Without the token: HTTP gets 401, a websocket is closed, the app is never reached;
    lifespan and a request with the token reach it."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    async def scenario() -> None:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        auth = BearerAuth(app, TOKEN)
        await auth({"type": "http", "headers": []}, receive, send)
        assert sent[0]["status"] == 401
        assert (b"www-authenticate", b'Bearer realm="mighty-sandbox"') in sent[0]["headers"]
        sent.clear()
        await auth({"type": "websocket", "headers": []}, receive, send)
        assert sent == [{"type": "websocket.close", "code": 1008}]
        assert reached == []
        await auth({"type": "lifespan"}, receive, send)
        good = [(b"authorization", f"Bearer {TOKEN}".encode())]
        await auth({"type": "http", "headers": good}, receive, send)
        assert reached == ["lifespan", "http"]

    anyio.run(scenario)


@given(
    st.lists(
        st.tuples(st.sampled_from(["stdout", "stderr"]), st.text(max_size=40_000)), max_size=6
    ),
    st.integers(min_value=0, max_value=10),
)
def test_progress_messages_keep_every_character_in_order(
    items: list[tuple[str, str]], dropped: int
) -> None:
    """Chunked into notifications: each stream's text is all there, in order, each message at
    most MAX_PROGRESS_MESSAGE characters of output, and drops are reported."""
    messages = list(progress_messages(items, dropped))
    for stream in ("stdout", "stderr"):
        sent = "".join(m.removeprefix(f"{stream}: ") for m in messages if m.startswith(stream))
        assert sent == "".join(text for name, text in items if name == stream)
    for message in messages:
        _, _, text = message.partition(": ")
        assert len(text) <= MAX_PROGRESS_MESSAGE
    assert (dropped > 0) is any("not forwarded" in m for m in messages)


# -- admission, in process ------------------------------------------------------------------


class _Result:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document

    def to_json(self) -> dict[str, Any]:
        return self.document


class _HeldSandbox:
    """Code "hold" waits for `release` to be set; anything else answers at once."""

    release: asyncio.Event
    holding: asyncio.Event

    def describe_tools(self) -> str:
        return ""

    def close(self) -> None:
        pass

    async def run_async(
        self, code: str, inputs: Mapping[str, Any] | None = None, **_: Any
    ) -> _Result:
        if code == "hold":
            _HeldSandbox.holding.set()
            await _HeldSandbox.release.wait()
        return _Result(OK_DOC)


def test_calls_past_the_admission_bound_are_busy() -> None:
    """With room for one running call and none waiting, a second call while the first runs is a
    `busy` result at once; once the first ends, calls run again."""

    async def scenario() -> None:
        _HeldSandbox.release = asyncio.Event()
        _HeldSandbox.holding = asyncio.Event()
        server = build_server(_HeldSandbox, concurrency=(1, 0))
        async with Client(server) as client:
            first = asyncio.ensure_future(client.call_tool(RUN_PYTHON, {"code": "hold"}))
            await _HeldSandbox.holding.wait()
            busy = await client.call_tool(RUN_PYTHON, {"code": "x"})
            assert _kind(busy) == "busy"
            _HeldSandbox.release.set()
            assert (await first).is_error is False
            assert (await client.call_tool(RUN_PYTHON, {"code": "x"})).is_error is False

    anyio.run(scenario)
