"""Idempotency keys: a durable agent's outgoing request carries the key of its place in the
message (the same in a re-run), and a guest's own key is left alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Budget, Instance
from mighty.abi import Ok
from mighty.engine import Component
from mighty.wasi import IDEMPOTENCY_KEYS, IdempotencyKeys, Policy
from tests.wasi.http_servers import LoopbackServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with LoopbackServer() as running:
        yield running


def _headers(
    component: Component, server: Any, keys: IdempotencyKeys | None, own: list[Any]
) -> dict[str, str]:
    slots = [] if keys is None else [IDEMPOTENCY_KEYS.of(keys)]
    with Instance(
        component,
        budget=Budget(fuel=10**11, timeout=60.0),
        policy=Policy().with_http(server.origin),
        slots=slots,
    ) as guest:
        got = guest.call("fetch", "GET", server.url("/echo"), own, b"", 5000)
    assert isinstance(got, Ok)
    return {k.lower(): v for k, v in json.loads(got.value["body"])["headers"]}


def test_a_request_carries_the_key_of_its_place(http_probe_wasm: Path, server: Any) -> None:
    """With keys in the slot the request has Idempotency-Key; the same place, the same key."""
    component = Component.load(http_probe_wasm)
    keys = IdempotencyKeys("worker:1")
    keys.begin(7)
    keys.position = 3
    first = _headers(component, server, keys, [])["idempotency-key"]
    keys.begin(7)
    keys.position = 3
    assert _headers(component, server, keys, [])["idempotency-key"] == first
    assert "idempotency-key" not in _headers(component, server, None, [])
    own = _headers(component, server, keys, [("Idempotency-Key", "mine")])
    assert own["idempotency-key"] == "mine"


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**40),
    st.integers(0, 2**20),
    st.integers(0, 2**40),
    st.integers(0, 2**20),
)
def test_keys_differ_exactly_when_their_places_do(
    agent: str, m1: int, p1: int, m2: int, p2: int
) -> None:
    """(agent, message, position) decides the key, and nothing else."""
    a, b = IdempotencyKeys(agent), IdempotencyKeys(agent)
    a.begin(m1)
    a.position = p1
    b.begin(m2)
    b.position = p2
    assert (a.key() == b.key()) == ((m1, p1) == (m2, p2))
