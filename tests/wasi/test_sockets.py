"""wasi:sockets: everything exists, everything is refused."""

from __future__ import annotations

import pytest

from mighty.abi import Err
from mighty.wasi import _sockets
from mighty.wasi._policy import Policy
from mighty.wasi._streams import POLLABLE
from tests.wasi import call, make_ctx, obj

ADDR = {"port": 80, "address": (1, 2, 3, 4)}


def test_instance_network_is_a_resource() -> None:
    """instance-network hands out a network resource."""
    ctx = make_ctx()
    handle = call(ctx, "wasi:sockets/instance-network", "instance-network")
    assert handle.kind is _sockets.NETWORK


@pytest.mark.parametrize(("network", "code"), [(False, "access-denied"), (True, "not-supported")])
def test_creation_and_lookup_are_refused(network: bool, code: str) -> None:
    """Sockets and name lookups are refused: access-denied, or not-supported when granted."""
    ctx = make_ctx(Policy(network=network))
    net = obj(ctx, call(ctx, "wasi:sockets/instance-network", "instance-network"))
    assert call(ctx, "wasi:sockets/tcp-create-socket", "create-tcp-socket", "ipv4") == Err(code)
    assert call(ctx, "wasi:sockets/udp-create-socket", "create-udp-socket", "ipv6") == Err(code)
    lookup = "wasi:sockets/ip-name-lookup"
    assert call(ctx, lookup, "resolve-addresses", net, "example.com") == Err(code)


def test_every_result_method_refuses() -> None:
    """Every socket method with an error case refuses; the others answer harmlessly."""
    ctx = make_ctx()
    for binding in _sockets.bindings():
        if binding.name.endswith(".subscribe"):
            handle = binding.fn(ctx, object())
            assert handle.kind is POLLABLE
            assert obj(ctx, handle).ready()
        elif binding.name.endswith(".is-listening"):
            assert binding.fn(ctx, object()) is False
        elif binding.name.endswith(".address-family"):
            assert binding.fn(ctx, object()) == "ipv4"
        elif binding.name == "network-error-code":
            assert binding.fn(ctx, "an io error") is None
        elif binding.name == "instance-network":
            continue
        else:
            assert binding.fn(ctx, object(), ADDR) == Err("access-denied"), binding.name


def test_every_wasi_sockets_function_is_bound() -> None:
    """The bindings cover every function of wasi:sockets 0.2 (counted per interface)."""
    names: dict[str, set[str]] = {}
    for binding in _sockets.bindings():
        names.setdefault(binding.interface, set()).add(binding.name)
    assert len(names["wasi:sockets/tcp"]) == 28
    assert len(names["wasi:sockets/udp"]) == 18  # udp-socket 13, incoming 2, outgoing 3
    assert names["wasi:sockets/ip-name-lookup"] == {
        "resolve-addresses",
        "[method]resolve-address-stream.resolve-next-address",
        "[method]resolve-address-stream.subscribe",
    }
    assert "[method]udp-socket.stream" in names["wasi:sockets/udp"]


def test_resources_are_declared() -> None:
    """Every sockets resource is declared under its interface."""
    assert {(k.interface, k.name) for k in _sockets.resources()} == {
        ("wasi:sockets/network", "network"),
        ("wasi:sockets/tcp", "tcp-socket"),
        ("wasi:sockets/udp", "udp-socket"),
        ("wasi:sockets/udp", "incoming-datagram-stream"),
        ("wasi:sockets/udp", "outgoing-datagram-stream"),
        ("wasi:sockets/ip-name-lookup", "resolve-address-stream"),
    }
