"""The frames nodes exchange over NATS: CBOR maps with a version field, validated and bounded.

A request frame goes to its node's subject, which also names the sender
(``<prefix>.node.<node>.<sender>``, :func:`node_subject`), and names what to do in ``k``:
``send`` (put a message in a mailbox; the reply acknowledges it), ``ask`` (request/reply;
``ttl`` is the asker's deadline in milliseconds left when it sent, so clocks need not agree),
``sends`` (several messages from one sender to one agent, in ``m``, put in its mailbox in
order; the reply acknowledges them all and names each that failed: see ``_pipes``),
``spawn``, ``stop``, ``migrate`` (an agent's state and mailbox moving in) and ``hb`` (a
heartbeat, published to ``<prefix>.hb.<sender>``; the last one of a node that leaves carries
``leaving: true`` in ``x``). Every answer is a reply frame: ``ok`` with a
body, or ``err`` with the ``agent-error`` code (``noproc``, ``timeout``, ``refused``,
``mailbox-full``, ``circuit-open``, ``failed``, ``cycle``, ``bad-spawn``) and a message.

Everything here is untrusted network input. :func:`sender_of` reads the sender from the subject
(its last token) without looking at the bytes, so a node checks the sender against its peers and
the size against its limit before anything is decoded; ``decode`` then checks the CBOR, the
version, every field's type and length, and raises FrameError (with a short ``reason`` for the
drop counters) for anything else. It never raises anything but FrameError. The ``node`` field
inside the frame must agree with the subject.

Rejected: the sender only inside the CBOR (it cannot be read without decoding, so a frame from
anyone was decoded first), and a NATS header (a subject can be granted per NATS user with the
server's publish permissions, ``<prefix>.node.*.<sender>``; a header cannot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cbor2

from mighty._cbor import loads_untrusted
from mighty._errors import HostError

__all__ = [
    "KINDS",
    "MAX_BATCH",
    "MAX_FRAME",
    "VERSION",
    "Frame",
    "FrameError",
    "decode",
    "encode",
    "heartbeat_subject",
    "node_subject",
    "sender_of",
]

VERSION = 1
"""The frame version this node writes; a frame with a higher version is dropped."""
MAX_FRAME = 8 << 20
"""The largest frame accepted by default (bytes); the node's ``max_frame`` lowers it."""
MAX_BATCH = 1024
"""The most messages one ``sends`` frame carries."""
KINDS = frozenset({"send", "sends", "ask", "spawn", "stop", "migrate", "hb", "ok", "err"})
_MAX_TEXT = 512
_MAX_CHAIN = 64
_MAX_TTL_MS = 24 * 3600 * 1000
_TEXT_ATTRS = {
    "node": "node",
    "to": "to",
    "from": "sender",
    "name": "name",
    "id": "id",
    "code": "code",
    "msg": "msg",
    "type": "type",
}
"""Text fields: the CBOR key, and the Frame attribute it fills."""


class FrameError(HostError):
    """A frame that is not ours to read: too large, not CBOR, a newer version, a bad field."""

    kind = "bad_frame"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Frame:
    """One validated frame. Unused fields keep their defaults."""

    k: str
    node: str = ""
    """The sending node."""
    to: str = ""
    sender: str = ""
    name: str = ""
    body: bytes = b""
    ttl: int = 0
    """ask: the asker's deadline, in milliseconds left when the frame was sent."""
    chain: tuple[str, ...] = ()
    id: str = ""
    code: str = ""
    msg: str = ""
    type: str = ""
    batch: tuple[tuple[str, bytes], ...] = ()
    """sends: the messages, (name, body) each, in the order they go in the mailbox."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Kind-specific data (heartbeat load, a migration's mailbox), checked by its reader."""


def node_subject(prefix: str, node: str, sender: str) -> str:
    """The subject of a request from node ``sender`` to node ``node``."""
    return f"{prefix}.node.{node}.{sender}"


def heartbeat_subject(prefix: str, sender: str) -> str:
    """The subject node ``sender`` publishes its heartbeats to."""
    return f"{prefix}.hb.{sender}"


def sender_of(subject: str) -> str:
    """The sending node a request or heartbeat subject names (its last token; "" if none).

    Subscriptions are to ``<prefix>.node.<node>.*`` and ``<prefix>.hb.*``: NATS delivers only
    subjects with exactly one more token, so the last one is the sender's.
    """
    head, dot, sender = subject.rpartition(".")
    return sender if dot and head else ""


def encode(frame: Frame) -> bytes:
    """The frame as CBOR (only the fields that differ from the defaults)."""
    data: dict[str, Any] = {"v": VERSION, "k": frame.k}
    if frame.node:
        data["node"] = frame.node
    if frame.to:
        data["to"] = frame.to
    if frame.sender:
        data["from"] = frame.sender
    if frame.name:
        data["name"] = frame.name
    if frame.body:
        data["body"] = frame.body
    if frame.ttl:
        data["ttl"] = frame.ttl
    if frame.chain:
        data["chain"] = list(frame.chain)
    for key in ("id", "code", "msg", "type"):
        value = getattr(frame, key)
        if value:
            data[key] = value
    if frame.batch:
        data["m"] = [[name, body] for name, body in frame.batch]
    if frame.extra:
        data["x"] = frame.extra
    return bytes(cbor2.dumps(data))


def decode(data: bytes, *, max_frame: int = MAX_FRAME) -> Frame:
    """A validated Frame from untrusted bytes, or FrameError."""
    if len(data) > max_frame:
        raise FrameError(f"frame of {len(data)} bytes (limit {max_frame})", reason="size")
    try:
        raw = loads_untrusted(data)
    except Exception as exc:  # noqa: BLE001 -- cbor2 raises many kinds on garbage
        raise FrameError(f"not CBOR: {type(exc).__name__}", reason="garbage") from None
    if not isinstance(raw, dict):
        raise FrameError("a frame is a CBOR map", reason="garbage")
    version = raw.get("v")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FrameError(f"bad frame version {version!r}", reason="garbage")
    if version > VERSION:
        raise FrameError(
            f"frame version {version} is newer than this node's ({VERSION})", reason="version"
        )
    kind = raw.get("k")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {str(kind)[:32]!r}", reason="garbage")
    # One pass over the map's own keys (most frames carry few of the optional fields).
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if type(key) is not str:
            continue  # not a field of ours (and maybe not hashable in a dict of str)
        attr = _TEXT_ATTRS.get(key)
        if attr is not None:
            if type(value) is not str or len(value) > _MAX_TEXT:
                raise FrameError(
                    f"field {key!r} is not a string of at most {_MAX_TEXT}", reason="field"
                )
            fields[attr] = value
        elif key == "body":
            if not isinstance(value, bytes):
                raise FrameError("field 'body' is not bytes", reason="field")
            fields["body"] = value
        elif key == "ttl":
            if type(value) is not int or not 0 <= value <= _MAX_TTL_MS:
                raise FrameError("field 'ttl' is not a deadline in milliseconds", reason="field")
            fields["ttl"] = value
        elif key == "chain":
            if (
                not isinstance(value, list)
                or len(value) > _MAX_CHAIN
                or not all(isinstance(c, str) and len(c) <= _MAX_TEXT for c in value)
            ):
                raise FrameError("field 'chain' is not a short list of addresses", reason="field")
            fields["chain"] = tuple(value)
        elif key == "m":
            fields["batch"] = _batch(value)
        elif key == "x":
            if not isinstance(value, dict):
                raise FrameError("field 'x' is not a map", reason="field")
            fields["extra"] = value
    if kind == "ask" and not fields.get("ttl"):
        raise FrameError("an ask carries its deadline (ttl > 0)", reason="field")
    if kind == "sends" and not fields.get("batch"):
        raise FrameError("a sends frame carries its messages (m)", reason="field")
    return Frame(kind, **fields)


def _batch(value: Any) -> tuple[tuple[str, bytes], ...]:
    """Field ``m``: a list of at most MAX_BATCH [name, body] pairs."""
    if type(value) is not list or len(value) > MAX_BATCH:
        raise FrameError(f"field 'm' is not a list of at most {MAX_BATCH} messages", reason="field")
    batch = []
    for item in value:
        if (
            type(item) is not list
            or len(item) != 2
            or type(item[0]) is not str
            or len(item[0]) > _MAX_TEXT
            or type(item[1]) is not bytes
        ):
            raise FrameError("field 'm' holds a message that is not [name, body]", reason="field")
        batch.append((item[0], item[1]))
    return tuple(batch)
