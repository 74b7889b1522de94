"""mighty.serve's Server on loopback, with real HTTP clients (httpx, and raw sockets for what a
well-behaved client never sends): streaming both ways, keep-alive, per-request budgets, and
the hostile client's repertoire (slow headers, oversized heads and bodies, malformed HTTP,
idle connections, a stalled body), each answered or cut while the server stays up."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component
from mighty._errors import BadInput, ExportNotFound
from mighty.budget import Budget
from mighty.serve import Running, ServeLimits, Server
from mighty.trace import replay_trace
from mighty.wasi import Policy

# Enough for a request of the test guest, small enough that /spin stops in a fraction of a second.
FUEL = 2_000_000_000


def _server(component: Component, **kw: Any) -> Server:
    kw.setdefault("budget", Budget(fuel=FUEL, timeout=30.0))
    return Server(component, **kw)


@pytest.fixture(scope="module")
def running(serve_guest: Component) -> Iterator[Running]:
    """One server for the tests that do not need limits of their own."""
    server = _server(serve_guest, limits=ServeLimits(max_request_bytes=8 << 20))
    with server.background() as live:
        yield live


@pytest.fixture
def client(running: Running) -> Iterator[httpx.Client]:
    """An httpx client on the shared server (keep-alive on)."""
    with httpx.Client(base_url=running.url, timeout=60.0) as session:
        yield session


def _raw(running: Running, data: bytes, *, shut: bool = False) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection((running.host, running.port), timeout=60.0) as sock:
        sock.sendall(data)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        return _read_to_end(sock)


def _read_to_end(sock: socket.socket) -> bytes:
    out = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def test_a_request_gets_the_guest_response(client: httpx.Client) -> None:
    """Status, headers and body come from the guest; what it saw came from the request."""
    response = client.get("/info?x=1", headers={"X-Who": "test"})
    assert response.status_code == 200
    assert response.reason_phrase == "OK"
    assert response.text == f"Method_Get /info?x=1 {client.base_url.netloc.decode()} ['x-who=test']"


def test_keep_alive_serves_many_requests_on_one_connection(serve_guest: Component) -> None:
    """Twenty requests from one client take one connection, each in a fresh instance."""
    server = _server(serve_guest)
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        for _ in range(20):
            assert session.get("/hello").text == "hello"
    assert server.stats.connections == 1
    assert server.stats.requests == 20
    assert server.stats.statuses[200] == 20


def test_bodies_stream_both_ways(client: httpx.Client) -> None:
    """A 4 MiB chunked upload is echoed back chunked, byte for byte (more than the window
    the server reads ahead and the window the guest writes ahead)."""
    piece = bytes(range(256)) * 256

    def upload() -> Iterator[bytes]:
        for _ in range(64):
            yield piece

    response = client.post("/stream", content=upload())
    assert response.status_code == 200
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.content == piece * 64


def test_a_content_length_response_keeps_it(client: httpx.Client) -> None:
    """A guest that sets content-length sends a sized body, not a chunked one."""
    response = client.post("/echo", content=b"abc")
    assert response.headers["content-length"] == str(len(response.content))
    assert response.content == b"got 3 bytes: abc"


@pytest.mark.parametrize(
    ("path", "status", "kind"),
    [
        ("/trap", 500, "trap"),
        ("/spin", 500, "out_of_fuel"),
        ("/noreply", 500, "no_response"),
        ("/error", 500, "handler_error"),
    ],
)
def test_a_failing_handler_is_a_5xx_naming_the_kind(
    client: httpx.Client, path: str, status: int, kind: str
) -> None:
    """A trap, fuel run out, no answer or an error-code: 500 with the kind and nothing of the
    host (no message, no guest detail); the next request is served as ever."""
    response = client.get(path)
    assert response.status_code == status
    body = response.json()
    assert body["error"] == kind
    assert set(body) <= {"error", "code"}
    assert "secret" not in response.text and "wasm" not in response.text
    assert client.get("/hello").text == "hello"


def test_a_handler_past_its_deadline_is_504(serve_guest: Component) -> None:
    """A handler still waiting at the request's deadline is stopped: 504."""
    server = _server(serve_guest, budget=Budget(fuel=FUEL, timeout=1.0))
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        response = session.get("/sleep?30")
        assert response.status_code == 504
        assert response.json() == {"error": "deadline_exceeded"}
        assert session.get("/hello").status_code == 200


def test_an_error_code_answer_names_only_the_case(client: httpx.Client) -> None:
    """The guest's error-code reaches the client as its case, never its payload."""
    assert client.get("/error").json() == {"error": "handler_error", "code": "internal-error"}


def test_a_response_over_the_limit_is_cut(serve_guest: Component) -> None:
    """A body past max_response_bytes fails the guest's write; the head was sent, so the
    connection is cut: the client never takes the part for the whole."""
    server = _server(serve_guest, limits=ServeLimits(max_response_bytes=1 << 20))
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        with pytest.raises(httpx.RemoteProtocolError):
            session.get("/big?3000000")
        assert session.get("/big?1000").content == b"x" * 1000


def test_a_body_larger_than_the_limit_is_413(serve_guest: Component) -> None:
    """A declared length over the limit is refused before the guest runs; a chunked body that
    grows past it is refused when it does."""
    server = _server(serve_guest, limits=ServeLimits(max_request_bytes=100_000))
    with server.background() as live:
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100001\r\n\r\n"
        raw = _raw(live, head)
        assert _status(raw) == 413
        assert raw.endswith(b'{"error": "too_large"}\n')
        chunk = b"%x\r\n%s\r\n" % (50_000, b"a" * 50_000)
        chunked = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        assert _status(_raw(live, chunked + chunk * 3)) == 413
        with httpx.Client(base_url=live.url, timeout=60.0) as session:
            assert session.post("/echo", content=b"a" * 1000).status_code == 200
    assert server.stats.failures["too_large"] == 2


def test_headers_larger_than_the_limit_are_431(serve_guest: Component) -> None:
    """A header section over max_header_bytes is answered 431 and the connection closed."""
    server = _server(serve_guest, limits=ServeLimits(max_header_bytes=4096))
    with server.background() as live:
        head = b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
        assert _status(_raw(live, head)) == 431


@pytest.mark.parametrize(
    "data",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n",
        b"GET /hello HTTP/1.1\r\nHost: x\r\nHost: y\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
)
def test_malformed_http_is_400(running: Running, data: bytes) -> None:
    """What h11 cannot parse is a 400, then the connection ends; the server stays up."""
    assert _status(_raw(running, data)) == 400
    with httpx.Client(base_url=running.url, timeout=60.0) as session:
        assert session.get("/hello").status_code == 200


def test_slow_headers_are_408(serve_guest: Component) -> None:
    """A client that starts a request and never finishes its head is answered 408 once the
    header timeout passes, and its connection is closed. (The test waits for the answer; the
    client sends all it will send at once, so no speed of the machine can beat the timer.)"""
    server = _server(serve_guest, limits=ServeLimits(header_timeout=2.0))
    with server.background() as live:
        raw = _raw(live, b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        assert _status(raw) == 408
        assert b'"header_timeout"' in raw


def test_a_stalled_body_is_408(serve_guest: Component) -> None:
    """A body that stops arriving fails the guest's read and the request is answered 408
    (the guest cannot answer before the body is whole, however fast or slow it starts)."""
    server = _server(serve_guest, limits=ServeLimits(body_timeout=2.0))
    with server.background() as live:
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly part"
        assert _status(_raw(live, head)) == 408


def _flood(server: Server, live: Running, count: int, bound: int) -> None:
    """Open ``count`` connections and leave them idle: the first ``bound`` are held (the idle
    timeout is far away), every later one is closed at once, unread; once the held ones are
    closed by the client, the server answers again."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection((live.host, live.port), timeout=60.0))
        # Connections are accepted in order: the first `bound` hold the slots, the rest
        # find them taken (nothing frees a slot: the idle timeout is 600 s).
        assert all(_read_to_end(sock) == b"" for sock in socks[bound:])
        _wait_for(lambda: server.stats.connections == count)
        assert server.stats.refused_connections == count - bound
        assert server.stats.peak_connections == bound
    finally:
        for sock in socks:
            sock.close()
    _wait_for(lambda: server.stats.open_connections == 0)  # the server saw them go
    with httpx.Client(base_url=live.url, timeout=60.0) as session:
        assert session.get("/hello").status_code == 200


def test_idle_connections_are_bounded(serve_guest: Component) -> None:
    """Past max_connections a connection is closed at once, unread; the server answers again
    once the idle ones go."""
    server = _server(serve_guest, limits=ServeLimits(max_connections=5, idle_timeout=600.0))
    with server.background() as live:
        _flood(server, live, 25, 5)


def test_an_idle_connection_is_closed_at_the_idle_timeout(serve_guest: Component) -> None:
    """A connection that sends nothing is closed by the server once the idle timeout passes
    (the test waits for the close, whenever it comes), and so is one idle after a request."""
    server = _server(serve_guest, limits=ServeLimits(idle_timeout=1.0))
    with server.background() as live:
        with socket.create_connection((live.host, live.port), timeout=60.0) as sock:
            assert _read_to_end(sock) == b""
        with socket.create_connection((live.host, live.port), timeout=60.0) as sock:
            sock.sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            raw = _read_to_end(sock)  # the answer, then the close at the idle timeout
        assert _status(raw) == 200
        assert raw.endswith(b"hello")
    assert server.stats.refused_connections == 0


def test_excess_concurrent_requests_get_503_at_once(serve_guest: Component) -> None:
    """With every slot taken, another request is answered 503 at once, not queued."""
    server = _server(serve_guest, limits=ServeLimits(max_concurrent=1))
    with server.background() as live:
        started = threading.Event()
        results: list[int] = []

        def slow() -> None:
            with httpx.Client(base_url=live.url, timeout=60.0) as session:
                started.set()
                results.append(session.get("/sleep?2").status_code)

        worker = threading.Thread(target=slow)
        worker.start()
        started.wait()
        _wait_for(lambda: server.stats.in_flight == 1)
        with httpx.Client(base_url=live.url, timeout=60.0) as session:
            response = session.get("/hello")
        worker.join()
    assert response.status_code == 503
    assert response.json() == {"error": "busy"}
    assert results == [200]


def test_a_bearer_token_is_required_when_set(serve_guest: Component) -> None:
    """With a token, a request without it (or with another) is 401; with it, served."""
    server = _server(serve_guest, token="t" * 32)
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        assert session.get("/hello").status_code == 401
        wrong = session.get("/hello", headers={"Authorization": "Bearer " + "u" * 32})
        assert wrong.status_code == 401
        right = session.get("/hello", headers={"Authorization": "Bearer " + "t" * 32})
        assert right.text == "hello"


def test_each_request_records_a_trace_that_replays(serve_guest: Component, tmp_path: Path) -> None:
    """With record_dir, each request is one trace; each replays with no server."""
    server = _server(serve_guest, record_dir=tmp_path / "traces")
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        assert session.post("/echo", content=b"recorded body").status_code == 200
        assert session.get("/info", headers={"X-A": "1"}).status_code == 200
        assert session.get("/trap").status_code == 500
    traces = sorted((tmp_path / "traces").iterdir())
    assert [t.name for t in traces] == [
        "request-000001.bin",
        "request-000002.bin",
        "request-000003.bin",
    ]
    for trace in traces:
        report = replay_trace(trace, progress=None)
        assert report.instances[0].exports == 1


def test_shutdown_lets_a_request_in_flight_finish(serve_guest: Component) -> None:
    """A graceful shutdown waits for the request in flight, then stops."""
    server = _server(serve_guest)
    results: list[httpx.Response] = []
    with server.background() as live:

        def slow() -> None:
            with httpx.Client(base_url=live.url, timeout=60.0) as session:
                results.append(session.get("/sleep?1"))

        worker = threading.Thread(target=slow)
        worker.start()
        _wait_for(lambda: server.stats.in_flight == 1)
    worker.join()
    assert results[0].status_code == 200 and results[0].text == "woke"


def test_a_component_without_the_handler_is_refused(tmp_path: Path, wat: Any) -> None:
    """A component that does not export wasi:http/incoming-handler is refused by name."""
    path = tmp_path / "plain.wasm"
    path.write_bytes(
        wat('(component (core module $m (func (export "f"))) (core instance (instantiate $m)))')
    )
    with pytest.raises(ExportNotFound, match="wasi:http/incoming-handler"):
        Server(Component.load(path))


@given(
    name=st.sampled_from(
        [
            "max_connections",
            "max_concurrent",
            "max_header_bytes",
            "max_request_bytes",
            "header_timeout",
            "body_timeout",
        ]
    ),
    value=st.one_of(st.integers(max_value=0), st.just(True), st.text(max_size=3)),
)
def test_limits_refuse_non_positive_or_non_numbers(name: str, value: Any) -> None:
    """Every limit refuses zero, negatives, booleans and non-numbers with BadInput."""
    with pytest.raises(BadInput):
        ServeLimits(**{name: value})


def _wait_for(condition: Any) -> None:
    """Poll ``condition`` (an event the test controls, not a time it asserts)."""
    done = threading.Event()
    for _ in range(6000):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("the condition never held")


def test_error_bodies_are_json(client: httpx.Client) -> None:
    """A failure's body is one JSON object with a content-type saying so."""
    response = client.get("/trap")
    assert response.headers["content-type"] == "application/json"
    assert json.loads(response.content) == {"error": "trap"}


def test_ten_thousand_idle_connections_stay_bounded(serve_guest: Component) -> None:
    """10,000 connections opened and left idle (fewer if the process may not open as many
    files): past max_connections each is closed at once, unread; then the server answers as
    ever."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(10_000, soft - 1_000)
    server = _server(serve_guest, limits=ServeLimits(max_connections=256, idle_timeout=600.0))
    with server.background() as live:
        _flood(server, live, count, 256)


def test_expect_100_continue_is_answered(running: Running) -> None:
    """A client that waits for `100 Continue` before its body (curl, over 1 KiB) gets it,
    then the response to the body it sent."""
    with socket.create_connection((running.host, running.port), timeout=60.0) as sock:
        head = (
            b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
        )
        sock.sendall(head)
        interim = b""
        while not interim.endswith(b"\r\n\r\n"):
            byte = sock.recv(1)
            assert byte, f"the server closed the connection after {interim!r}"
            interim += byte
        assert interim.startswith(b"HTTP/1.1 100 ")
        sock.sendall(b"hello")
        reply = b""
        while not reply.endswith(b"got 5 bytes: hello"):
            chunk = sock.recv(65536)
            assert chunk
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK")


def test_a_share_of_the_requests_is_recorded(serve_guest: Component, tmp_path: Path) -> None:
    """record_share 0.25 records every fourth request (by number); the others run on pooled
    instances; each recorded one replays."""
    server = _server(serve_guest, record_dir=tmp_path, record_share=0.25)
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        for _ in range(8):
            assert session.get("/hello").text == "hello"
    assert sorted(t.name for t in tmp_path.iterdir()) == [
        "request-000004.bin",
        "request-000008.bin",
    ]
    for trace in tmp_path.iterdir():
        assert replay_trace(trace, progress=None).instances[0].exports == 1


@given(share=st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0001), st.just(True)))
@settings(max_examples=30, deadline=None)
def test_record_share_outside_0_1_is_refused(serve_guest: Component, share: Any) -> None:
    """A share that is not a number in (0, 1] is a BadInput (NaN included)."""
    with pytest.raises(BadInput):
        Server(serve_guest, record_share=share, pool=0)


def test_a_client_that_goes_away_cancels_its_request(serve_guest: Component) -> None:
    """A client that closes its connection while the handler works cancels the request at
    once (the slot is not held until the deadline); the server stays up."""
    server = _server(serve_guest, budget=Budget(fuel=FUEL, timeout=600.0))
    with server.background() as live:
        with socket.create_connection((live.host, live.port), timeout=60.0) as sock:
            sock.sendall(b"GET /sleep?600 HTTP/1.1\r\nHost: x\r\n\r\n")
            _wait_for(lambda: server.stats.in_flight == 1)
        _wait_for(lambda: server.stats.in_flight == 0)
        assert server.stats.failures["gone"] == 1
        with httpx.Client(base_url=live.url, timeout=60.0) as session:
            assert session.get("/hello").text == "hello"


def test_pipelined_requests_are_answered_in_order(running: Running) -> None:
    """Two requests in one write (HTTP/1.1 pipelining) get their two responses, in order."""
    with socket.create_connection((running.host, running.port), timeout=60.0) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        raw = _read_to_end(sock)
    first, _, second = raw.partition(b"got 3 bytes: abc")
    assert first.startswith(b"HTTP/1.1 200 OK")
    assert second.startswith(b"HTTP/1.1 200 OK") and second.endswith(b"hello")


def test_a_head_request_gets_the_head_only(client: httpx.Client) -> None:
    """HEAD: the guest's status and headers, no body (what it writes is dropped), and the
    connection goes on."""
    response = client.head("/hello")
    assert response.status_code == 200
    assert response.headers["content-length"] == "5"
    assert response.content == b""
    assert client.get("/hello").text == "hello"


class _Upstream(http.server.BaseHTTPRequestHandler):
    """A loopback origin the handler's own outgoing requests may reach."""

    def do_GET(self) -> None:
        body = b"from upstream"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        return


@pytest.fixture
def upstream() -> Iterator[str]:
    """The origin of an upstream server on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_each_request_has_the_policy_grants_and_no_more(
    serve_guest: Component, upstream: str
) -> None:
    """The policy's grants reach every request's instance (an environment variable, an
    origin for the handler's outgoing requests); without the grant the origin is denied."""
    granted = Policy(env=(("GREETING", "hi"),)).with_http(upstream)
    server = _server(serve_guest, policy=granted)
    with server.background() as live, httpx.Client(base_url=live.url, timeout=60.0) as session:
        assert session.get("/env").text == "hi"
        assert session.get(f"/fetch?{upstream}/x").text == "200 from upstream"
    with (
        _server(serve_guest).background() as live,
        httpx.Client(base_url=live.url, timeout=60.0) as session,
    ):
        assert session.get("/env").text == "none"
        denied = session.get(f"/fetch?{upstream}/x")
        assert denied.status_code == 502 and denied.text == "HTTP-request-denied"
