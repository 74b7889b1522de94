"""wasi:http: requests through the bindings against a real loopback server, policy and bounds."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.abi import Err, Ok, Variant
from mighty.budget import CallScope
from mighty.gate import UNSCOPED, GuestContext, Handle
from mighty.wasi import Secret, _http
from mighty.wasi._policy import Policy
from tests.wasi import call, make_ctx, obj
from tests.wasi.http_servers import LoopbackServer

T = "wasi:http/types"
H = "wasi:http/outgoing-handler"
S = "wasi:io/streams"


@pytest.fixture(scope="module")
def server() -> Any:
    with LoopbackServer() as running:
        yield running


def _ok(result: Any) -> Any:
    assert isinstance(result, Ok), result
    return result.value


def send(
    ctx: GuestContext,
    url: str,
    *,
    method: str = "get",
    headers: Sequence[tuple[str, bytes]] = (),
    body: bytes | None = None,
    options: Any = None,
) -> Any:
    """Build a request as a guest would and hand it to ``handle``; its result."""
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    fields = obj(ctx, _ok(call(ctx, T, "[static]fields.from-list", list(headers))))
    request = obj(ctx, call(ctx, T, "[constructor]outgoing-request", fields))
    assert call(ctx, T, "[method]outgoing-request.set-method", request, Variant(method)) == Ok()
    case = "HTTP" if scheme == "http" else "HTTPS"
    assert call(ctx, T, "[method]outgoing-request.set-scheme", request, Variant(case)) == Ok()
    assert call(ctx, T, "[method]outgoing-request.set-authority", request, authority) == Ok()
    path_ok = call(ctx, T, "[method]outgoing-request.set-path-with-query", request, slash + path)
    assert path_ok == Ok()
    if body is not None:
        outgoing = obj(ctx, _ok(call(ctx, T, "[method]outgoing-request.body", request)))
        stream = obj(ctx, _ok(call(ctx, T, "[method]outgoing-body.write", outgoing)))
        written = call(ctx, S, "[method]output-stream.blocking-write-and-flush", stream, body)
        assert written == Ok(), written
        assert call(ctx, T, "[static]outgoing-body.finish", outgoing, None) == Ok()
    return call(ctx, H, "handle", request, options)


def response(ctx: GuestContext, future_handle: Handle) -> Any:
    """Wait for a future's response; the ``result<incoming-response, error-code>``."""
    future = obj(ctx, future_handle)
    pollable = obj(ctx, call(ctx, T, "[method]future-incoming-response.subscribe", future))
    call(ctx, "wasi:io/poll", "[method]pollable.block", pollable)
    got = call(ctx, T, "[method]future-incoming-response.get", future)
    assert isinstance(got, Ok), got
    return got.value


def read_all(ctx: GuestContext, incoming: Any) -> tuple[bytes, Any]:
    """Read a response body to its end: (bytes, the stream error or None at a clean end)."""
    body = obj(ctx, _ok(call(ctx, T, "[method]incoming-response.consume", incoming)))
    stream = obj(ctx, _ok(call(ctx, T, "[method]incoming-body.stream", body)))
    data = bytearray()
    while True:
        got = call(ctx, S, "[method]input-stream.blocking-read", stream, 1 << 16)
        if isinstance(got, Err):
            if got.value == Variant("closed"):
                return bytes(data), None
            error = obj(ctx, got.value.value)
            return bytes(data), call(ctx, T, "http-error-code", error)
        data += got.value


def fetch(ctx: GuestContext, url: str, **kw: Any) -> tuple[int, list[tuple[str, bytes]], bytes]:
    """A whole request: status, headers, body (a failure fails the test)."""
    incoming = obj(ctx, _ok(response(ctx, _ok(send(ctx, url, **kw)))))
    status = call(ctx, T, "[method]incoming-response.status", incoming)
    headers = obj(ctx, call(ctx, T, "[method]incoming-response.headers", incoming))
    entries = call(ctx, T, "[method]fields.entries", headers)
    data, error = read_all(ctx, incoming)
    assert error is None, error
    return status, entries, data


def test_a_granted_get_reaches_the_server_with_the_guests_headers(server: LoopbackServer) -> None:
    """A GET to a granted origin arrives with the guest's headers and Host; its body comes back."""
    ctx = make_ctx(Policy().with_http(server.origin))
    status, _, body = fetch(ctx, server.url("/echo?a=1"), headers=[("x-test", b"yes")])
    echoed = json.loads(body)
    assert status == 200
    assert echoed["method"] == "GET"
    assert echoed["query"] in ("a=1", {"a": ["1"]}, {"a": "1"})
    names = {k.lower(): v for k, v in echoed["headers"]}
    assert names["x-test"] == "yes"
    assert names["host"] == f"127.0.0.1:{server.port}"


def test_a_post_body_reaches_the_server_whole(server: LoopbackServer) -> None:
    """A request body written through the output stream arrives whole, with its length."""
    ctx = make_ctx(Policy().with_http(server.origin))
    payload = bytes(range(256)) * 300
    _, _, body = fetch(ctx, server.url("/echo"), method="post", body=payload)
    echoed = json.loads(body)
    assert echoed["method"] == "POST"
    assert echoed["body"].encode("latin-1") == payload
    names = {k.lower(): v for k, v in echoed["headers"]}
    assert names["content-length"] == str(len(payload))


def test_an_origin_not_granted_is_denied_before_any_connection(server: LoopbackServer) -> None:
    """No grant, another port, or another scheme: HTTP-request-denied, nothing reaches the server."""
    before = len(server.requests)
    for policy in (
        Policy(),
        Policy().with_http(f"http://127.0.0.1:{server.port + 1}"),
        Policy().with_http(f"https://127.0.0.1:{server.port}"),
    ):
        ctx = make_ctx(policy)
        assert send(ctx, server.url("/echo")) == Err(Variant("HTTP-request-denied"))
    assert len(server.requests) == before


def test_a_method_not_granted_is_denied(server: LoopbackServer) -> None:
    """A grant limited to GET refuses a POST."""
    ctx = make_ctx(Policy().with_http(server.origin, methods=["GET"]))
    denied = send(ctx, server.url("/echo"), method="post", body=b"x")
    assert denied == Err(Variant("HTTP-request-denied"))


@pytest.mark.parametrize("name", ["2130706433", "127.1", "0x7f.0.0.1"])
def test_a_name_resolving_to_loopback_is_prohibited(server: LoopbackServer, name: str) -> None:
    """A granted name that resolves to 127.0.0.1 is refused after resolution, unless allowed."""
    origin = f"http://{name}:{server.port}"
    ctx = make_ctx(Policy().with_http(origin))
    before = len(server.requests)
    future = _ok(send(ctx, f"{origin}/echo"))
    assert response(ctx, future) == Err(Variant("destination-IP-prohibited"))
    assert len(server.requests) == before
    allowed = make_ctx(Policy().with_http(origin, allow_private=True))
    assert fetch(allowed, f"{origin}/echo")[0] == 200


def test_a_redirect_is_the_guests_to_follow_and_each_hop_is_checked(
    server: LoopbackServer,
) -> None:
    """The host hands a 302 to the guest; a hop to a name that resolves to loopback is refused,
    and a hop to the metadata address is not granted at all."""
    ctx = make_ctx(Policy().with_http(server.origin).with_http(f"http://127.1:{server.port}"))
    hop = f"http://127.1:{server.port}/echo"
    status, headers, _ = fetch(ctx, server.url(f"/redirect?to={hop}&code=302"))
    assert status == 302
    assert (b"Location" in {k.title().encode(): v for k, v in headers}) or any(
        k.lower() == "location" and v == hop.encode() for k, v in headers
    )
    assert response(ctx, _ok(send(ctx, hop))) == Err(Variant("destination-IP-prohibited"))
    assert send(ctx, "http://169.254.169.254/latest/meta-data") == Err(
        Variant("HTTP-request-denied")
    )


def test_a_response_over_the_limit_fails_its_body_with_a_typed_error(
    server: LoopbackServer,
) -> None:
    """A body larger than max_response_bytes is cut: the stream fails HTTP-response-body-size
    and no more than the limit (plus one chunk) was ever received."""
    limit = 256 << 10
    ctx = make_ctx(Policy().with_http(server.origin).with_http_limits(max_response_bytes=limit))
    incoming = obj(
        ctx, _ok(response(ctx, _ok(send(ctx, server.url("/bytes/8000000?chunk=16384")))))
    )
    data, error = read_all(ctx, incoming)
    assert isinstance(error, Variant)
    assert error.case == "HTTP-response-body-size"
    assert len(data) <= limit


def test_a_server_that_trickles_forever_ends_at_the_total_timeout(server: LoopbackServer) -> None:
    """A response trickling a byte at a time never ends by itself: the request's total time
    limit fails its body with HTTP-response-timeout."""
    # The trickle never ends, so any limit ends it: 4 s leaves the head (sent at once) time to
    # come on a loaded machine, where 0.5 s could expire before it and fail the wrong step.
    ctx = make_ctx(Policy().with_http(server.origin).with_http_limits(total_timeout=4.0))
    incoming = obj(ctx, _ok(response(ctx, _ok(send(ctx, server.url("/trickle?every=0.02"))))))
    data, error = read_all(ctx, incoming)
    assert error == Variant("HTTP-response-timeout")
    assert len(data) < 1_000_000


def test_a_server_that_closes_mid_body_is_an_incomplete_response(server: LoopbackServer) -> None:
    """A connection closed before Content-Length bytes came fails the body, typed."""
    ctx = make_ctx(Policy().with_http(server.origin))
    incoming = obj(ctx, _ok(response(ctx, _ok(send(ctx, server.url("/close-mid-body"))))))
    data, error = read_all(ctx, incoming)
    assert error == Variant("HTTP-response-incomplete")
    assert len(data) == 1000


def test_a_server_that_never_answers_hits_the_guests_first_byte_timeout(
    server: LoopbackServer,
) -> None:
    """request-options' first-byte timeout bounds the wait for a head: connection-read-timeout."""
    ctx = make_ctx(Policy().with_http(server.origin))
    options = obj(ctx, call(ctx, T, "[constructor]request-options"))
    set_ = call(ctx, T, "[method]request-options.set-first-byte-timeout", options, 200_000_000)
    assert set_ == Ok()
    assert call(ctx, T, "[method]request-options.first-byte-timeout", options) == 200_000_000
    future = _ok(send(ctx, server.url("/stall"), options=options))
    assert response(ctx, future) == Err(Variant("connection-read-timeout"))


def test_ten_thousand_requests_in_one_call_are_bounded(server: LoopbackServer) -> None:
    """One call's requests past max_requests_per_call, and past max_in_flight at once, are
    refused with connection-limit-reached; the host's threads stay bounded."""
    ctx = make_ctx(Policy().with_http(server.origin))
    ctx.scope = CallScope(60.0, None)
    threads_before = threading.active_count()
    try:
        results = [send(ctx, server.url("/stall")) for _ in range(10_000)]
        peak = threading.active_count() - threads_before
    finally:
        ctx.scope = UNSCOPED
    accepted = [r for r in results if isinstance(r, Ok)]
    refused = [r for r in results if isinstance(r, Err)]
    assert len(accepted) <= ctx.slot(_http._STATE).policy.limits.max_in_flight
    assert refused and all(r == Err(Variant("connection-limit-reached")) for r in refused)
    assert peak <= 2 * ctx.slot(_http._STATE).policy.limits.max_in_flight + 4
    _http.close_all(ctx)


def test_requests_per_call_are_counted_per_export_call(server: LoopbackServer) -> None:
    """The per-call count starts again with each guest call (each CallScope)."""
    ctx = make_ctx(Policy().with_http(server.origin).with_http_limits(max_requests_per_call=2))
    for _ in range(2):
        ctx.scope = CallScope(60.0, None)
        try:
            first, second, third = (send(ctx, server.url("/echo")) for _ in range(3))
            assert isinstance(first, Ok) and isinstance(second, Ok)
            assert third == Err(Variant("connection-limit-reached"))
            response(ctx, first.value)
            response(ctx, second.value)
        finally:
            ctx.scope = UNSCOPED


def test_several_requests_are_in_flight_at_once(server: LoopbackServer) -> None:
    """Three delayed requests started together are all answered; poll returns the ready ones."""
    ctx = make_ctx(Policy().with_http(server.origin))
    futures = [obj(ctx, _ok(send(ctx, server.url(f"/delay?ms={ms}")))) for ms in (300, 100, 200)]
    pollables = [
        obj(ctx, call(ctx, T, "[method]future-incoming-response.subscribe", f)) for f in futures
    ]
    pending = set(range(3))
    while pending:
        ready = call(ctx, "wasi:io/poll", "poll", [pollables[i] for i in sorted(pending)])
        assert ready
        order = sorted(pending)
        pending -= {order[i] for i in ready}
    for future in futures:
        got = call(ctx, T, "[method]future-incoming-response.get", future)
        assert isinstance(got, Ok) and isinstance(got.value, Ok)
        assert call(ctx, T, "[method]future-incoming-response.get", future) == Err()


def test_a_streamed_body_is_read_chunk_by_chunk(server: LoopbackServer) -> None:
    """Non-blocking reads of a chunked body return what has arrived, b'' while waiting."""
    ctx = make_ctx(Policy().with_http(server.origin))
    incoming = obj(ctx, _ok(response(ctx, _ok(send(ctx, server.url("/bytes/300000?chunk=4096"))))))
    body = obj(ctx, _ok(call(ctx, T, "[method]incoming-response.consume", incoming)))
    stream = obj(ctx, _ok(call(ctx, T, "[method]incoming-body.stream", body)))
    pollable = obj(ctx, call(ctx, S, "[method]input-stream.subscribe", stream))
    data = bytearray()
    reads = 0
    while True:
        got = call(ctx, S, "[method]input-stream.read", stream, 5000)
        if got == Err(Variant("closed")):
            break
        chunk = _ok(got)
        assert len(chunk) <= 5000
        reads += 1
        if not chunk:
            call(ctx, "wasi:io/poll", "[method]pollable.block", pollable)
        data += chunk
    assert data == bytes(i % 251 for i in range(300_000))
    assert reads >= 60


_NAME = st.text(st.characters(codec="latin-1"), min_size=0, max_size=12)
_VALUE = st.binary(max_size=16)


@given(entries=st.lists(st.tuples(_NAME, _VALUE), max_size=4))
@settings(max_examples=300)
def test_header_entries_are_valid_or_refused_with_the_right_case(
    entries: list[tuple[str, bytes]],
) -> None:
    """fields.from-list takes RFC 9110 tokens and values without control characters (but tab),
    keeps them in order, and refuses anything else (forbidden hop-by-hop names: forbidden)."""
    ctx = make_ctx()
    got = call(ctx, T, "[static]fields.from-list", entries)
    token = set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    bad = [
        (n, v)
        for n, v in entries
        if not n or not set(n) <= token or any((b < 0x20 and b != 0x09) or b == 0x7F for b in v)
    ]
    forbidden = [n for n, _ in entries if n.lower() in _http._FORBIDDEN]
    if bad:
        assert got == Err(Variant("invalid-syntax"))
    elif forbidden:
        assert got == Err(Variant("forbidden"))
    else:
        fields = obj(ctx, _ok(got))
        assert call(ctx, T, "[method]fields.entries", fields) == entries


@pytest.mark.parametrize(
    ("name", "value", "case"),
    [
        ("bad name", b"x", "invalid-syntax"),
        ("x-ok", b"a\r\nInjected: 1", "invalid-syntax"),
        ("x-ok", b"nul\x00", "invalid-syntax"),
        ("", b"x", "invalid-syntax"),
        ("Host", b"evil.example", "forbidden"),
        ("Transfer-Encoding", b"chunked", "forbidden"),
        ("Connection", b"close", "forbidden"),
    ],
)
def test_a_malformed_or_forbidden_header_is_refused(name: str, value: bytes, case: str) -> None:
    """set, append and from-list refuse the same headers with the same case."""
    ctx = make_ctx()
    fields = obj(ctx, call(ctx, T, "[constructor]fields"))
    assert call(ctx, T, "[method]fields.append", fields, name, value) == Err(Variant(case))
    assert call(ctx, T, "[method]fields.set", fields, name, [value]) == Err(Variant(case))
    assert call(ctx, T, "[static]fields.from-list", [(name, value)]) == Err(Variant(case))


def test_request_headers_are_immutable_once_in_a_request() -> None:
    """The headers a request took, and its headers() view, refuse changes: immutable."""
    ctx = make_ctx()
    fields = obj(ctx, call(ctx, T, "[constructor]fields"))
    request = obj(ctx, call(ctx, T, "[constructor]outgoing-request", fields))
    view = obj(ctx, call(ctx, T, "[method]outgoing-request.headers", request))
    for target in (fields, view):
        assert call(ctx, T, "[method]fields.append", target, "x", b"1") == Err(Variant("immutable"))


def test_held_header_bytes_are_bounded() -> None:
    """Header bytes held in live fields are capped per instance: past the cap, forbidden."""
    ctx = make_ctx(Policy().with_http_limits(max_held_header_bytes=10_000))
    big = b"v" * 4_000
    first = call(ctx, T, "[static]fields.from-list", [("a", big)])
    second = call(ctx, T, "[static]fields.from-list", [("a", big)])
    third = call(ctx, T, "[static]fields.from-list", [("a", big)])
    assert isinstance(first, Ok) and isinstance(second, Ok)
    assert third == Err(Variant("forbidden"))
    _http._drop_fields(ctx, obj(ctx, first.value))
    assert isinstance(call(ctx, T, "[static]fields.from-list", [("a", big)]), Ok)


def test_a_request_body_over_its_limit_fails_the_write(server: LoopbackServer) -> None:
    """Writing past max_request_bytes fails the stream with HTTP-request-body-size."""
    ctx = make_ctx(Policy().with_http(server.origin).with_http_limits(max_request_bytes=1000))
    fields = obj(ctx, call(ctx, T, "[constructor]fields"))
    request = obj(ctx, call(ctx, T, "[constructor]outgoing-request", fields))
    outgoing = obj(ctx, _ok(call(ctx, T, "[method]outgoing-request.body", request)))
    stream = obj(ctx, _ok(call(ctx, T, "[method]outgoing-body.write", outgoing)))
    assert call(ctx, S, "[method]output-stream.write", stream, b"x" * 1000) == Ok()
    failed = call(ctx, S, "[method]output-stream.write", stream, b"x")
    assert isinstance(failed, Err)
    error = obj(ctx, failed.value.value)
    assert call(ctx, T, "http-error-code", error) == Variant("HTTP-request-body-size", 1001)


def test_a_body_never_read_is_released_at_close(server: LoopbackServer) -> None:
    """A response whose body the guest never reads holds at most one buffer, and closing the
    instance stops its worker."""
    ctx = make_ctx(Policy().with_http(server.origin).with_http_limits(buffer_bytes=64 << 10))
    future = obj(ctx, _ok(send(ctx, server.url("/bytes/50000000?chunk=65536"))))
    pollable = obj(ctx, call(ctx, T, "[method]future-incoming-response.subscribe", future))
    call(ctx, "wasi:io/poll", "[method]pollable.block", pollable)
    exchange = future.exchange
    deadline = time.monotonic() + 30
    while exchange.received < 64 << 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exchange._buffered <= (64 << 10) + (64 << 10)
    _http.close_all(ctx)
    deadline = time.monotonic() + 30
    while exchange.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not exchange.running
    assert exchange.received < 50_000_000


def test_secret_headers_are_injected_and_never_seen_by_the_guest(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The grant's secret reaches the server in place of the guest's own header; a response
    header echoing it is redacted; the guest's fields never hold it."""
    monkeypatch.setenv("MTY_TEST_KEY", "sk-very-secret-1234")
    secret = Secret("Authorization", env="MTY_TEST_KEY", prefix="Bearer ")
    ctx = make_ctx(Policy().with_http(server.origin, secrets=[secret]))
    _, _, body = fetch(
        ctx,
        server.url("/echo"),
        headers=[("authorization", b"Bearer guest-chosen")],
    )
    sent = [v for k, v in json.loads(body)["headers"] if k.lower() == "authorization"]
    assert sent == ["Bearer sk-very-secret-1234"]
    _, echoed, _ = fetch(ctx, server.url("/headers?x-echo=sk-very-secret-1234"))
    assert all(b"sk-very-secret" not in v for _, v in echoed)
    assert any(k.lower() == "x-echo" for k, _ in echoed)


def test_a_missing_secret_is_a_configuration_error(server: LoopbackServer) -> None:
    """A secret whose environment variable is unset fails the request before it is sent."""
    secret = Secret("X-Key", env="MTY_TEST_SURELY_UNSET")
    ctx = make_ctx(Policy().with_http(server.origin, secrets=[secret]))
    before = len(server.requests)
    assert response(ctx, _ok(send(ctx, server.url("/echo")))) == Err(Variant("configuration-error"))
    assert len(server.requests) == before


def test_a_refused_connection_is_typed() -> None:
    """Nothing listening: connection-refused."""
    with LoopbackServer() as gone:
        origin = gone.origin
    ctx = make_ctx(Policy().with_http(origin))
    assert response(ctx, _ok(send(ctx, origin + "/echo"))) == Err(Variant("connection-refused"))


@pytest.mark.parametrize(
    "authority", ["", "a b", "user@host", "host:99999", "host:x", "[::1", "h/x", "h:1:2"]
)
def test_a_malformed_authority_is_refused(authority: str) -> None:
    """set-authority refuses what is not host[:port]."""
    ctx = make_ctx()
    request = obj(
        ctx,
        call(
            ctx, T, "[constructor]outgoing-request", obj(ctx, call(ctx, T, "[constructor]fields"))
        ),
    )
    assert call(ctx, T, "[method]outgoing-request.set-authority", request, authority) == Err()


def test_a_request_without_authority_is_an_invalid_uri() -> None:
    """handle of a request that names no host: HTTP-request-URI-invalid."""
    ctx = make_ctx(Policy().with_http("http://127.0.0.1:1"))
    request = obj(
        ctx,
        call(
            ctx, T, "[constructor]outgoing-request", obj(ctx, call(ctx, T, "[constructor]fields"))
        ),
    )
    assert call(ctx, H, "handle", request, None) == Err(Variant("HTTP-request-URI-invalid"))


def test_a_clone_is_charged_to_the_instance() -> None:
    """fields.clone counts against max_held_header_bytes; past it the guest traps (no error
    case in the WIT), and a clone of a response's uncharged headers is charged too."""
    from mighty.gate import GuestViolation

    ctx = make_ctx(Policy().with_http_limits(max_held_header_bytes=10_000))
    fields = obj(ctx, _ok(call(ctx, T, "[static]fields.from-list", [("a", b"v" * 4_000)])))
    copy = obj(ctx, call(ctx, T, "[method]fields.clone", fields))
    assert call(ctx, T, "[method]fields.entries", copy) == [("a", b"v" * 4_000)]
    with pytest.raises(GuestViolation, match="max_held_header_bytes"):
        call(ctx, T, "[method]fields.clone", fields)
    uncharged = _http._Fields(None, [("b", b"w" * 1_000)], immutable=True)
    assert isinstance(call(ctx, T, "[method]fields.clone", uncharged), Handle)
    assert ctx.slot(_http._STATE).held_header_bytes == 2 * 4_001 + 1_001
