"""wasi:http end to end: a componentize-py guest (guests/testing/http_probe) against a real
loopback server, through the gate, recorded, and replayed with every socket refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mighty import Budget, Instance
from mighty.abi import Err, Ok
from mighty.engine import Component
from mighty.trace import Recorder, replay_trace
from mighty.wasi import Policy, Secret, _http
from tests.wasi.http_servers import LoopbackServer

ROOT = Path(__file__).resolve().parent.parent.parent
pytestmark = pytest.mark.slow

# A Python that refuses every socket connect and name lookup: replay must need neither.
_OFFLINE = """
import sys
def refuse(event, args):
    if event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.bind"):
        raise PermissionError(f"offline: {event} refused")
sys.addaudithook(refuse)
from mighty.cli import main
sys.argv = ["mty", *sys.argv[1:]]
main()
"""


@pytest.fixture(scope="module")
def http_probe(http_probe_wasm: Path) -> Component:
    """The HTTP probe guest, loaded once per module."""
    return Component.load(http_probe_wasm)


@pytest.fixture(scope="module")
def server() -> Any:
    with LoopbackServer() as running:
        yield running


def _instance(component: Component, policy: Policy, **kw: Any) -> Instance:
    return Instance(component, budget=Budget(fuel=10**11, timeout=60.0), policy=policy, **kw)


def test_a_guest_gets_a_response_through_the_sdk(http_probe: Component, server: Any) -> None:
    """fetch through mighty_agent.http: status, headers and body as the server sent them."""
    with _instance(http_probe, Policy().with_http(server.origin)) as guest:
        got = guest.call("fetch", "POST", server.url("/echo"), [("x-a", "1")], b"hello", 5000)
    assert isinstance(got, Ok)
    echoed = json.loads(got.value["body"])
    assert got.value["status"] == 200
    assert echoed["method"] == "POST" and echoed["body"] == "hello"
    assert ["x-a", "1"] in [[k.lower(), v] for k, v in echoed["headers"]]


def test_an_origin_not_granted_is_denied_in_the_guest(http_probe: Component, server: Any) -> None:
    """No grant: the guest's request fails HTTP-request-denied and the server sees nothing."""
    before = len(server.requests)
    with _instance(http_probe, Policy()) as guest:
        got = guest.call("fetch", "GET", server.url("/echo"), [], b"", 0)
    assert isinstance(got, Err) and got.value.startswith("HTTP-request-denied")
    assert len(server.requests) == before


def test_a_redirect_to_a_private_address_is_refused(http_probe: Component, server: Any) -> None:
    """The SDK follows a redirect as a new request: one to a name resolving to loopback is
    refused after resolution, and one to the metadata address is not granted."""
    policy = Policy().with_http(server.origin).with_http("http://2130706433:*")
    with _instance(http_probe, policy) as guest:
        inner = f"http://2130706433:{server.port}/echo"
        hop = guest.call("fetch-follow", server.url(f"/redirect?to={inner}"), 5)
        metadata = guest.call(
            "fetch-follow", server.url("/redirect?to=http://169.254.169.254/latest/meta-data"), 5
        )
    assert isinstance(hop, Err) and hop.value.startswith("destination-IP-prohibited"), hop
    assert isinstance(metadata, Err) and metadata.value.startswith("HTTP-request-denied")


def test_several_requests_in_flight_and_a_streamed_body(http_probe: Component, server: Any) -> None:
    """fetch-many polls several futures at once; stream-sum reads a chunked body to its end."""
    urls = [server.url(f"/delay?ms={ms}") for ms in (200, 50, 100)] + [server.url("/nope")]
    with _instance(http_probe, Policy().with_http(server.origin)) as guest:
        assert guest.call("fetch-many", urls) == [Ok(200), Ok(200), Ok(200), Ok(404)]
        assert guest.call("stream-sum", server.url("/bytes/3000000?chunk=7000")) == Ok(3_000_000)


def test_an_oversized_response_is_cut_with_a_typed_error(
    http_probe: Component, server: Any
) -> None:
    """A body over max_response_bytes fails in the guest with HTTP-response-body-size."""
    policy = Policy().with_http(server.origin).with_http_limits(max_response_bytes=1 << 20)
    with _instance(http_probe, policy) as guest:
        got = guest.call("stream-sum", server.url("/bytes/20000000"))
    assert isinstance(got, Err) and got.value.startswith("HTTP-response-body-size"), got


def _exchanges(guest: Instance) -> list[Any]:
    """The instance's requests as the host holds them."""
    return list(guest.context.slot(_http._STATE).exchanges)


def _ended(exchanges: list[Any]) -> bool:
    """Whether every exchange's worker has finished, waiting up to 30 s (a test's own bound)."""
    deadline = time.monotonic() + 30
    while any(e.running for e in exchanges) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not any(e.running for e in exchanges)


def test_a_body_the_guest_never_reads_is_released_at_close(
    http_probe: Component, server: Any
) -> None:
    """leak keeps a response whose 50 MB body it never reads: its worker holds at most its
    read-ahead buffer, and closing the instance ends it."""
    policy = Policy().with_http(server.origin).with_http_limits(buffer_bytes=1 << 16)
    guest = _instance(http_probe, policy)
    assert guest.call("leak", server.url("/bytes/50000000")) == Ok(200)
    (exchange,) = _exchanges(guest)
    assert exchange.running and not exchange.cancelled
    guest.close()
    assert exchange.cancelled
    assert _ended([exchange])
    assert exchange.received < 50_000_000


def test_ten_thousand_requests_from_one_call_stay_bounded(
    http_probe: Component, server: Any
) -> None:
    """hammer: 10,000 handle calls in one export call; past max_in_flight and
    max_requests_per_call each is refused, and at most max_in_flight requests ever run."""
    with _instance(http_probe, Policy().with_http(server.origin)) as guest:
        refused = guest.call("hammer", server.url("/echo"), 10_000)
        held = _exchanges(guest)
    assert 10_000 - 256 <= refused < 10_000
    assert len(held) <= 256
    assert _ended(held)


@pytest.mark.parametrize(
    ("name", "value", "case"),
    [
        ("bad name", b"x", "invalid-syntax"),
        ("x", b"a\r\nb: c", "invalid-syntax"),
        ("Host", b"h", "forbidden"),
    ],
)
def test_malformed_headers_from_the_guest_are_refused(
    http_probe: Component, name: str, value: bytes, case: str
) -> None:
    """A header the guest builds with a bad name or value, or a hop-by-hop name, is refused."""
    with _instance(http_probe, Policy()) as guest:
        assert guest.call("bad-header", name, value) == case


def test_a_recorded_run_replays_with_every_socket_refused(
    http_probe: Component, server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Record a guest's requests (with an injected secret), stop the server, then replay in a
    process that refuses every socket: the same result, byte for byte, and no secret in the
    trace."""
    monkeypatch.setenv("MTY_HTTP_TEST_KEY", "sk-live-0123456789")
    secret = Secret("Authorization", env="MTY_HTTP_TEST_KEY", prefix="Bearer ")
    trace = tmp_path / "run.bin"
    with Recorder(trace) as recorder:
        policy = Policy().with_http(server.origin, secrets=[secret])
        with _instance(http_probe, policy, record=recorder) as guest:
            got = guest.call("fetch", "GET", server.url("/echo"), [], b"", 5000)
            streamed = guest.call("stream-sum", server.url("/bytes/200000?chunk=3000"))
    assert isinstance(got, Ok) and streamed == Ok(200_000)
    assert b"Bearer sk-live-0123456789" in got.value["body"]  # the server saw it ...
    assert b"sk-live-0123456789" not in trace.read_bytes().replace(got.value["body"], b"")
    replay_trace(trace)  # in process too: a divergence raises

    env = {k: v for k, v in os.environ.items() if k != "MTY_HTTP_TEST_KEY"}
    hook = _OFFLINE.split("from mighty.cli", maxsplit=1)[0]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {server.port}))"
    sanity = subprocess.run(
        [sys.executable, "-c", hook + connect],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=120,
    )
    assert sanity.returncode != 0 and "offline: socket." in sanity.stderr  # the hook refuses
    replayed = subprocess.run(
        [sys.executable, "-c", _OFFLINE, "replay", str(trace)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert replayed.returncode == 0, replayed.stderr
    assert "ok: digest" in replayed.stdout + replayed.stderr
