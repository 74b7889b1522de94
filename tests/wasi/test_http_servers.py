"""The loopback HTTP servers of tests/wasi/http_servers.py do what each route says, under httpx."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.wasi.http_servers import LoopbackServer, Request, Response, pattern

# Deadlines the tests set on every client, so a broken server fails a test instead of hanging it.
TIMEOUT = httpx.Timeout(5.0)


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    """A running server, closed (and its threads joined) after the test."""
    with LoopbackServer(join_timeout=5.0) as running:
        yield running
    assert running.errors == []


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """An httpx client with the tests' deadlines."""
    with httpx.Client(timeout=TIMEOUT) as c:
        yield c


def test_url_and_origin(server: LoopbackServer) -> None:
    """url() joins the origin and a path; the origin is 127.0.0.1 at the bound port."""
    assert server.origin == f"http://127.0.0.1:{server.port}"
    assert server.url("/echo?a=1") == f"{server.origin}/echo?a=1"
    with pytest.raises(ValueError, match="must start with"):
        server.url("echo")


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE"])
def test_echo_reports_the_request(
    server: LoopbackServer, client: httpx.Client, method: str
) -> None:
    """/echo answers with the method, path, query, headers and body it got, as JSON."""
    body = b"caf\xe9 body" if method != "GET" else b""
    response = client.request(
        method, server.url("/echo?x=1&y=two"), content=body, headers={"X-Test": "yes"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    echoed = response.json()
    assert echoed["method"] == method
    assert echoed["path"] == "/echo"
    assert echoed["query"] == "x=1&y=two"
    assert ["X-Test", "yes"] in echoed["headers"]
    assert echoed["body"].encode("latin-1") == body


def test_echo_reads_a_chunked_request_body(server: LoopbackServer, client: httpx.Client) -> None:
    """A request body sent with Transfer-Encoding: chunked arrives whole."""

    def parts() -> Iterator[bytes]:
        yield b"first,"
        yield b"second,"
        yield b"third"

    response = client.post(server.url("/echo"), content=parts())
    echoed = response.json()
    assert ["Transfer-Encoding", "chunked"] in [[n.title(), v] for n, v in echoed["headers"]]
    assert echoed["body"] == "first,second,third"


def test_chunked_request_with_extensions_and_trailers(server: LoopbackServer) -> None:
    """Chunk extensions and trailer fields are parsed past, from raw bytes on a socket."""
    raw = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        sock.sendall(raw)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["body"] == "abcde"


def test_a_bad_chunk_size_is_a_400(server: LoopbackServer) -> None:
    """A chunk size that is not hex gets 400, and the connection is closed."""
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        sock.sendall(raw)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    assert received.startswith(b"HTTP/1.1 400")


def test_keep_alive_reuses_one_connection(server: LoopbackServer, client: httpx.Client) -> None:
    """Consecutive requests of one client arrive over the same connection."""
    for i in range(3):
        assert client.post(server.url("/echo"), content=b"x" * i).status_code == 200
    peers = {r.peer for r in server.requests}
    assert len(server.requests) == 3
    assert len(peers) == 1


def test_requests_are_recorded(server: LoopbackServer, client: httpx.Client) -> None:
    """Every request is recorded with method, path, query, headers and body."""
    client.post(server.url("/status/201?why=test"), content=b"payload", headers={"X-A": "1"})
    client.get(server.url("/nowhere"))
    first, second = server.requests
    assert isinstance(first, Request)
    assert (first.method, first.path, first.target) == (
        "POST",
        "/status/201",
        "/status/201?why=test",
    )
    assert first.param("why") == "test"
    assert first.header("x-a") == "1"
    assert first.body == b"payload"
    assert (second.method, second.path, second.body) == ("GET", "/nowhere", b"")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_bytes_is_chunked_and_follows_the_pattern(
    server: LoopbackServer, client: httpx.Client, method: str
) -> None:
    """/bytes/N sends N pattern bytes with chunked transfer-encoding in chunks of C."""
    response = client.request(method, server.url("/bytes/100003?chunk=4096"))
    assert response.status_code == 200
    assert response.headers["transfer-encoding"] == "chunked"
    assert "content-length" not in response.headers
    assert response.content == pattern(0, 100_003)
    assert response.content[:3] == bytes([0, 1, 2])
    assert response.content[251] == 0


def test_bytes_chunk_sizes_are_as_asked(server: LoopbackServer) -> None:
    """The chunks on the wire have the size asked for (the last one the remainder)."""
    raw = b"GET /bytes/10?chunk=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        sock.sendall(raw)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    body = received.partition(b"\r\n\r\n")[2]
    assert body == (b"4\r\n\x00\x01\x02\x03\r\n4\r\n\x04\x05\x06\x07\r\n2\r\n\x08\x09\r\n0\r\n\r\n")


def test_bytes_streams_64_mib(server: LoopbackServer, client: httpx.Client) -> None:
    """A 64 MiB body streams through whole and in pattern, chunk after chunk."""
    total = 64 * 1024 * 1024
    received = 0
    with client.stream("GET", server.url(f"/bytes/{total}")) as response:
        for piece in response.iter_raw():
            assert piece == pattern(received, len(piece))
            received += len(piece)
    assert received == total


def test_bytes_zero(server: LoopbackServer, client: httpx.Client) -> None:
    """/bytes/0 is an empty chunked body."""
    response = client.get(server.url("/bytes/0"))
    assert response.status_code == 200
    assert response.content == b""


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_fixed_has_a_content_length(
    server: LoopbackServer, client: httpx.Client, method: str
) -> None:
    """/fixed/N sends N pattern bytes with a Content-Length."""
    response = client.request(method, server.url("/fixed/200000"))
    assert response.headers["content-length"] == "200000"
    assert "transfer-encoding" not in response.headers
    assert response.content == pattern(0, 200_000)


@pytest.mark.parametrize("code", [200, 201, 204, 304, 404, 418, 500, 503])
def test_status(server: LoopbackServer, client: httpx.Client, code: int) -> None:
    """/status/CODE answers with that status (no body for 204 and 304)."""
    response = client.post(server.url(f"/status/{code}"), content=b"ignored")
    assert response.status_code == code
    assert response.content == (b"" if code in (204, 304) else f"status {code}\n".encode())
    # The connection stays usable after a bodiless answer.
    assert client.get(server.url("/echo")).status_code == 200


def test_status_rejects_informational_codes(server: LoopbackServer, client: httpx.Client) -> None:
    """A 1xx is not a final answer, so /status/1xx is refused with 400."""
    assert client.get(server.url("/status/100")).status_code == 400


def test_redirect(server: LoopbackServer, client: httpx.Client) -> None:
    """/redirect answers with the code and Location asked for; following it reaches the target."""
    target = server.url("/echo?from=redirect")
    response = client.get(server.url("/redirect"), params={"to": target, "code": "307"})
    assert response.status_code == 307
    assert response.headers["location"] == target
    followed = client.post(
        server.url("/redirect"), params={"to": target}, content=b"b", follow_redirects=True
    )
    assert followed.status_code == 200
    assert followed.json()["query"] == "from=redirect"
    assert followed.history[0].status_code == 302


def test_redirect_needs_a_target(server: LoopbackServer, client: httpx.Client) -> None:
    """/redirect without ?to= is a 400."""
    assert client.get(server.url("/redirect")).status_code == 400


def test_headers_sets_response_headers(server: LoopbackServer, client: httpx.Client) -> None:
    """/headers sets each query pair as a response header, repeated names kept."""
    response = client.get(
        server.url("/headers"),
        params=[("X-One", "1"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")],
    )
    assert response.status_code == 200
    assert response.headers["x-one"] == "1"
    assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert response.json() == [["X-One", "1"], ["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"]]


def test_trickle_sends_bytes_until_the_server_closes(client: httpx.Client) -> None:
    """/trickle sends its headers at once, then bytes one by one until close() cuts it short."""
    server = LoopbackServer(join_timeout=5.0).start()
    try:
        with client.stream("GET", server.url("/trickle?every=0.01")) as response:
            assert response.headers["content-length"] == "1000000"
            pieces = response.iter_raw()
            received = b""
            while len(received) < 3:
                received += next(pieces)
            assert received[:3] == pattern(0, 3)
            server.close()  # joins the trickling handler, or raises
            with pytest.raises(httpx.RemoteProtocolError):
                for _piece in pieces:
                    pass
    finally:
        server.close()
    assert server.errors == []


def test_close_mid_body_is_a_protocol_error(server: LoopbackServer, client: httpx.Client) -> None:
    """/close-mid-body hangs up 99,000 bytes short of its Content-Length."""
    with pytest.raises(httpx.RemoteProtocolError):
        client.get(server.url("/close-mid-body"))
    received = b""
    with client.stream("POST", server.url("/close-mid-body"), content=b"x") as response:
        assert response.headers["content-length"] == "100000"
        pieces = response.iter_raw()
        while len(received) < 1000:
            received += next(pieces)
        with pytest.raises(httpx.RemoteProtocolError):
            next(pieces)
    assert received == pattern(0, 1000)


def test_stall_never_answers(server: LoopbackServer) -> None:
    """/stall reads the request and never answers: the client's own deadline ends the wait."""
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=0.2)) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post(server.url("/stall"), content=b"abc")
    assert [(r.path, r.body) for r in server.requests] == [("/stall", b"abc")]


def test_close_ends_a_stalled_request_in_flight() -> None:
    """close() while a client waits on /stall ends the request with a hang-up, not a hang."""
    server = LoopbackServer(join_timeout=5.0).start()
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=TIMEOUT) as client:
        future = pool.submit(client.get, server.url("/stall"))
        while not server.requests:
            server.stopping.wait(0.01)  # until the handler has the request
        server.close()
        with pytest.raises(httpx.RemoteProtocolError):
            future.result(timeout=10)


def test_close_hangs_up_idle_keep_alive_connections(client: httpx.Client) -> None:
    """close() joins a handler that waits for the next request on an idle keep-alive connection."""
    server = LoopbackServer(join_timeout=5.0).start()
    assert client.get(server.url("/echo")).status_code == 200
    server.close()  # raises if the idle connection's thread is not joined
    server.close()  # and a second close is a no-op


def test_delay_answers_ok(server: LoopbackServer, client: httpx.Client) -> None:
    """/delay answers "ok" after the delay asked for."""
    response = client.get(server.url("/delay?ms=5"))
    assert (response.status_code, response.text) == (200, "ok")
    assert client.get(server.url("/delay")).text == "ok"


@pytest.mark.parametrize("path", ["/", "/nope", "/echo/extra", "/bytes"])
def test_unknown_paths_are_404(server: LoopbackServer, client: httpx.Client, path: str) -> None:
    """Anything that is not a route is a 404."""
    assert client.get(server.url(path)).status_code == 404
    assert client.post(server.url(path), content=b"x").status_code == 404


def test_bad_parameters_are_400(server: LoopbackServer, client: httpx.Client) -> None:
    """A route parameter that is not a number is a 400, not a crash."""
    for path in ("/bytes/ten", "/bytes/10?chunk=0", "/fixed/-1", "/delay?ms=soon", "/status/x"):
        assert client.get(server.url(path)).status_code == 400, path


def test_custom_routes(client: httpx.Client) -> None:
    """routes= and add_route() serve a test's own handlers, over builtin routes of that path."""

    def teapot(request: Request) -> Response:
        return 418, {"X-Method": request.method}, b"short and stout: " + request.body

    def echo_override(request: Request) -> Response:
        return 200, [("Content-Type", "text/plain")], b"mine"

    with LoopbackServer(routes={"/teapot": teapot}) as server:
        response = client.post(server.url("/teapot"), content=b"tip")
        assert response.status_code == 418
        assert response.headers["x-method"] == "POST"
        assert response.content == b"short and stout: tip"
        server.add_route("/echo", echo_override)
        assert client.get(server.url("/echo")).text == "mine"
    assert server.errors == []


def test_a_failing_route_is_recorded(client: httpx.Client) -> None:
    """A route that raises hangs up on the client and leaves its error in server.errors."""

    def broken(request: Request) -> Response:
        raise LookupError("route bug")

    with LoopbackServer(routes={"/broken": broken}) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            client.get(server.url("/broken"))
        (error,) = server.errors
        assert isinstance(error, LookupError)


def test_many_concurrent_requests(server: LoopbackServer) -> None:
    """Sixty-four requests in flight at once, over as many connections, all answered right."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(timeout=TIMEOUT, limits=limits) as client:

        def one(i: int) -> tuple[int, dict[str, object]]:
            response = client.post(server.url(f"/echo?i={i}"), content=str(i).encode())
            return response.status_code, response.json()

        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, range(64)))
    for i, (status, echoed) in enumerate(results):
        assert status == 200
        assert (echoed["query"], echoed["body"]) == (f"i={i}", str(i))
    assert len(server.requests) == 64
