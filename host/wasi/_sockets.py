"""``wasi:sockets`` 0.2: every interface present, nothing reachable.

Networking is not implemented. Each function exists, so a guest that imports sockets (every
componentize-py guest does) links and runs; each refuses with the WIT ``error-code``
``access-denied`` when the policy does not grant the network, and ``not-supported`` when it does
(granted but not implemented yet). ``instance-network`` hands out a ``network`` resource (it has
no error case, and a network handle alone grants nothing); socket creation and name lookup are
refused, so no socket or resolver stream ever exists. The methods on those resources are still
bound, because the component's import types name them; the ones whose WIT has no error case
answer harmlessly (not listening, IPv4, an always-ready pollable).
"""

from __future__ import annotations

from typing import Any

from mighty.abi import Err
from mighty.gate import Binding, GuestContext, ResourceKind, Slot
from mighty.wasi._io import ReadyPollable
from mighty.wasi._policy import Policy
from mighty.wasi._streams import POLLABLE

__all__ = [
    "INCOMING_DATAGRAM_STREAM",
    "NETWORK",
    "OUTGOING_DATAGRAM_STREAM",
    "RESOLVE_ADDRESS_STREAM",
    "TCP_SOCKET",
    "UDP_SOCKET",
    "bindings",
    "resources",
    "setup",
]

NETWORK = ResourceKind("wasi:sockets/network", "network")
TCP_SOCKET = ResourceKind("wasi:sockets/tcp", "tcp-socket")
UDP_SOCKET = ResourceKind("wasi:sockets/udp", "udp-socket")
INCOMING_DATAGRAM_STREAM = ResourceKind("wasi:sockets/udp", "incoming-datagram-stream")
OUTGOING_DATAGRAM_STREAM = ResourceKind("wasi:sockets/udp", "outgoing-datagram-stream")
RESOLVE_ADDRESS_STREAM = ResourceKind("wasi:sockets/ip-name-lookup", "resolve-address-stream")
_STATE: Slot[bool] = Slot("wasi.sockets")
"""Whether the policy granted the network (it only changes the refusal's code)."""


class _Network:
    """The guest's network handle: a token that grants nothing."""


def resources() -> list[ResourceKind]:
    """Every wasi:sockets resource, so guests importing them link."""
    return [
        NETWORK,
        TCP_SOCKET,
        UDP_SOCKET,
        INCOMING_DATAGRAM_STREAM,
        OUTGOING_DATAGRAM_STREAM,
        RESOLVE_ADDRESS_STREAM,
    ]


def setup(ctx: GuestContext, policy: Policy) -> None:
    """Remember whether the network was granted (it only changes the refusal's code)."""
    ctx.put(_STATE, policy.network)


def _refusal(ctx: GuestContext) -> Err:
    granted = ctx.slot(_STATE)
    return Err("not-supported" if granted else "access-denied")


def _refuse(ctx: GuestContext, *_args: Any) -> Err:
    return _refusal(ctx)


def _instance_network(ctx: GuestContext) -> Any:
    return ctx.new(NETWORK, _Network())


def _network_error_code(_ctx: GuestContext, _error: object) -> None:
    # No stream error in this host comes from a network.
    return None


def _not_listening(_ctx: GuestContext, _socket: object) -> bool:
    return False


def _ipv4(_ctx: GuestContext, _socket: object) -> str:
    return "ipv4"


def _subscribe(ctx: GuestContext, _resource: object) -> Any:
    # Ready at once: the next call on the resource answers (with a refusal) without waiting.
    return ctx.new(POLLABLE, ReadyPollable())


_TCP_REFUSED = (
    "start-bind",
    "finish-bind",
    "start-connect",
    "finish-connect",
    "start-listen",
    "finish-listen",
    "accept",
    "local-address",
    "remote-address",
    "set-listen-backlog-size",
    "keep-alive-enabled",
    "set-keep-alive-enabled",
    "keep-alive-idle-time",
    "set-keep-alive-idle-time",
    "keep-alive-interval",
    "set-keep-alive-interval",
    "keep-alive-count",
    "set-keep-alive-count",
    "hop-limit",
    "set-hop-limit",
    "receive-buffer-size",
    "set-receive-buffer-size",
    "send-buffer-size",
    "set-send-buffer-size",
    "shutdown",
)
_UDP_REFUSED = (
    "start-bind",
    "finish-bind",
    "stream",
    "local-address",
    "remote-address",
    "unicast-hop-limit",
    "set-unicast-hop-limit",
    "receive-buffer-size",
    "set-receive-buffer-size",
    "send-buffer-size",
    "set-send-buffer-size",
)


def bindings() -> list[Binding]:
    """Every function of the seven wasi:sockets 0.2 interfaces (``network-error-code`` too)."""
    tcp = "wasi:sockets/tcp"
    udp = "wasi:sockets/udp"
    lookup = "wasi:sockets/ip-name-lookup"
    out: list[Binding] = [
        Binding("wasi:sockets/network", "network-error-code", _network_error_code),
        Binding("wasi:sockets/instance-network", "instance-network", _instance_network),
        Binding("wasi:sockets/tcp-create-socket", "create-tcp-socket", _refuse),
        Binding("wasi:sockets/udp-create-socket", "create-udp-socket", _refuse),
        Binding(lookup, "resolve-addresses", _refuse),
        Binding(lookup, "[method]resolve-address-stream.resolve-next-address", _refuse),
        Binding(lookup, "[method]resolve-address-stream.subscribe", _subscribe),
    ]
    out += [Binding(tcp, f"[method]tcp-socket.{name}", _refuse) for name in _TCP_REFUSED]
    out += [
        Binding(tcp, "[method]tcp-socket.is-listening", _not_listening),
        Binding(tcp, "[method]tcp-socket.address-family", _ipv4),
        Binding(tcp, "[method]tcp-socket.subscribe", _subscribe),
    ]
    out += [Binding(udp, f"[method]udp-socket.{name}", _refuse) for name in _UDP_REFUSED]
    out += [
        Binding(udp, "[method]udp-socket.address-family", _ipv4),
        Binding(udp, "[method]udp-socket.subscribe", _subscribe),
        Binding(udp, "[method]incoming-datagram-stream.receive", _refuse),
        Binding(udp, "[method]incoming-datagram-stream.subscribe", _subscribe),
        Binding(udp, "[method]outgoing-datagram-stream.check-send", _refuse),
        Binding(udp, "[method]outgoing-datagram-stream.send", _refuse),
        Binding(udp, "[method]outgoing-datagram-stream.subscribe", _subscribe),
    ]
    return out
