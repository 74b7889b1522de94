"""The server side of wasi:http in the WASI layer: incoming-request, incoming-body,
response-outparam and outgoing-response, driven by a host that calls
``wasi:http/incoming-handler.handle`` itself (no server: mighty.serve is tested apart)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component, GuestError, Instance
from mighty.abi import Variant
from mighty.budget import Budget
from mighty.trace import Recorder, replay_trace
from mighty.wasi import (
    Policy,
    RequestBody,
    ServedRequest,
    ServedResponse,
    error_code,
    incoming_handler_args,
)

HANDLE = "wasi:http/incoming-handler@0.2.0#handle"


def _serve(
    component: Component,
    path: str,
    body: bytes = b"",
    *,
    method: str = "GET",
    headers: list[tuple[str, bytes]] | None = None,
    fail: Variant | None = None,
    **kw: Any,
) -> ServedResponse:
    """One request through a fresh instance; what the guest answered."""
    source = RequestBody()
    source.feed(body)
    if fail is None:
        source.end()
    else:
        source.fail(fail)
    request = ServedRequest(method, path, "http", "example.test", headers or [], source)
    response = ServedResponse()
    with Instance(component, policy=Policy(), **kw) as guest:
        guest.call(HANDLE, *incoming_handler_args(guest.context, request, response))
    return response


def _body(response: ServedResponse) -> bytes:
    assert response.body is not None
    data, done, aborted = response.body.take(1 << 30)
    assert done and not aborted
    return data


def test_a_request_reaches_the_guest_and_its_response_comes_back(serve_guest: Component) -> None:
    """Method, path, authority and headers reach the guest; status, headers and body return."""
    response = _serve(serve_guest, "/info?q=1", headers=[("X-Trace", b"abc"), ("Other", b"z")])
    assert response.status == 200
    assert response.headers == [(b"content-length", b"49")]
    assert _body(response) == b"Method_Get /info?q=1 example.test ['x-trace=abc']"


def test_the_request_body_is_read_through_incoming_body(serve_guest: Component) -> None:
    """The guest reads the body the host fed, then the end."""
    response = _serve(serve_guest, "/echo", b"0123456789" * 1000, method="POST")
    assert _body(response) == b"got 10000 bytes: " + (b"0123456789" * 7)[:64]


def test_a_failed_request_body_ends_the_guest_read_with_its_code(serve_guest: Component) -> None:
    """A body the server failed (too large, client gone) ends the guest's read: it keeps what
    arrived and answers."""
    response = _serve(
        serve_guest, "/echo", b"abc", method="POST", fail=error_code("HTTP-request-body-size")
    )
    assert _body(response) == b"got 3 bytes: abc"


def test_an_error_code_answer_carries_the_case(serve_guest: Component) -> None:
    """response-outparam.set with an error-code: no head, the code for the server."""
    response = _serve(serve_guest, "/error")
    assert response.status is None
    assert response.error is not None and response.error.case == "internal-error"


def test_an_outparam_dropped_unset_is_seen(serve_guest: Component) -> None:
    """A guest that returns without answering drops its outparam: the server learns it."""
    response = _serve(serve_guest, "/noreply")
    assert not response.answered and response.dropped


def test_a_response_over_its_limit_fails_the_guest_write(serve_guest: Component) -> None:
    """The server's response limit caps the body: the write past it fails and the guest,
    which does not handle that, traps; what it wrote before stays bounded."""
    source = RequestBody()
    source.end()
    request = ServedRequest("GET", "/big?200000", "http", None, [], source)
    response = ServedResponse(limit=100_000)
    with Instance(serve_guest, policy=Policy()) as guest, pytest.raises(GuestError) as failure:
        guest.call(HANDLE, *incoming_handler_args(guest.context, request, response))
    assert getattr(failure.value, "kind", None) == "trap"
    assert response.status == 200 and response.body is not None
    assert response.body.written <= 100_000


def test_a_served_request_records_and_replays(serve_guest: Component, tmp_path: Any) -> None:
    """A request served under a recorder replays from the trace alone, byte for byte."""
    trace = tmp_path / "request.bin"
    with Recorder(trace) as recorder:
        response = _serve(serve_guest, "/echo", b"hello", method="POST", record=recorder)
    assert _body(response) == b"got 5 bytes: hello"
    report = replay_trace(trace, progress=None)
    assert report.instances[0].exports == 1 and report.instances[0].imports > 10


@settings(max_examples=30, deadline=None)
@given(
    chunks=st.lists(st.binary(max_size=300), max_size=12),
    reads=st.lists(st.integers(min_value=1, max_value=500), min_size=1, max_size=40),
)
def test_request_body_reads_give_back_the_fed_bytes(chunks: list[bytes], reads: list[int]) -> None:
    """Whatever the feeding and reading sizes, the reads give the fed bytes in order, never
    more than asked, and the end only once everything was read."""
    body = RequestBody()
    for chunk in chunks:
        body.feed(chunk)
    body.end()
    out = bytearray()
    ended = False
    total = sum(len(c) for c in chunks)
    for size in itertools.islice(itertools.cycle(reads), total + 2):
        data, ended, error = body.read(size)
        assert len(data) <= size and error is None
        out += data
        if ended:
            break
    assert ended and bytes(out) == b"".join(chunks)
    assert body.buffered == 0


def test_budget_failures_keep_their_kind(serve_guest: Component) -> None:
    """A handler that spins runs out of fuel; the kind is the budget's."""
    with pytest.raises(GuestError) as failure:
        _serve(serve_guest, "/spin", budget=Budget(fuel=200_000_000))
    assert getattr(failure.value, "kind", None) == "out_of_fuel"


@settings(max_examples=40, deadline=None)
@given(
    writes=st.lists(st.binary(max_size=700), max_size=20),
    takes=st.lists(st.integers(min_value=1, max_value=900), min_size=1, max_size=20),
    window=st.integers(min_value=1, max_value=2000),
)
def test_response_body_window_and_order(writes: list[bytes], takes: list[int], window: int) -> None:
    """The guest writes within the room the window leaves; the server takes the bytes in
    order, never more than asked; the body is done only once finished and all taken."""
    import threading

    from mighty.wasi._http import _ResponseBody

    body = _ResponseBody(limit=1 << 30, wake=threading.Event(), window=window)
    taken = bytearray()
    sent = bytearray()
    pending = [bytes(w) for w in writes]
    steps = itertools.cycle(takes)
    while pending:
        room = body.room()
        assert 0 <= room <= window
        if room:
            piece, pending[0] = pending[0][:room], pending[0][room:]
            body.write(piece)
            sent += piece
            if not pending[0]:
                pending.pop(0)
        size = next(steps)
        data, done, aborted = body.take(size)
        assert len(data) <= size and not done and not aborted
        taken += data
    body.finish()
    while True:
        data, done, _ = body.take(next(steps))
        taken += data
        if done:
            break
    assert bytes(taken) == bytes(sent) == b"".join(writes)
