"""A closed CBOR decoder: exactly the subset the trace writer emits, safe on hostile bytes.

Accepted: unsigned and negative integers, byte and text strings, arrays, maps with text keys,
``false``/``true``/``null``, and tags, each of which goes to the caller's ``tag_hook`` (which
rejects what it does not know). Everything else is refused: indefinite lengths, floats (the
writer tags them as 8 bytes), other simple values, duplicate or non-text map keys, trailing bytes.

Why not ``cbor2.loads``: cbor2 6 decodes about thirty semantic tags itself (datetimes, decimals,
regular expressions compiled with ``re``, MIME messages, IP addresses, sets, shared references
that can build cyclic lists) before any ``tag_hook`` runs, and ``semantic_decoders={}`` does not
turn them off. Overriding each built-in tag depends on knowing that list for every cbor2 release.
A hundred lines that accept only our own shapes is the smaller thing to trust.

Safety: the input is one frame's payload, already bounded by the frame limit. Every length is
checked against the bytes left before anything is sliced or a container is filled (a container
of ``n`` items needs at least ``n`` bytes), nesting is capped at ``max_depth``, and every loop
consumes input, so time is linear in the payload. Memory is not, by bytes alone: a one-byte
empty map becomes a 64-byte dict, so a 60 MB frame of them took 4.2 GB. ``max_items`` caps the
items (every string, number, container and tag) one payload may decode to, checked before a
container is filled, so the Python objects one frame makes are bounded by the cap, not by the
payload's bytes times the largest object-to-byte ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["CBORInvalid", "TagHook", "decode"]

TagHook = Callable[[int, Any], Any]
"""``hook(tag, content) -> value``; raises ``ValueError`` to reject the tag or its content."""

_ARG_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}


class CBORInvalid(Exception):
    """The payload is not in the accepted subset; ``at`` is the offset inside the payload."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(f"{message} (payload byte {at})")
        self.reason = message
        self.at = at


def decode(payload: bytes, tag_hook: TagHook, max_depth: int, max_items: int = 1 << 62) -> Any:
    """The one item that ``payload`` holds, all of it, in at most ``max_items`` items."""
    dec = _Decoder(payload, tag_hook, max_depth, max_items)
    value = dec.item(0)
    if dec.pos != len(payload):
        raise CBORInvalid(f"{len(payload) - dec.pos} bytes left after the item", dec.pos)
    return value


class _Decoder:
    __slots__ = ("buf", "end", "hook", "items_left", "max_depth", "max_items", "pos")

    def __init__(self, buf: bytes, hook: TagHook, max_depth: int, max_items: int) -> None:
        self.buf = buf
        self.end = len(buf)
        self.hook = hook
        self.max_depth = max_depth
        self.max_items = max_items
        self.items_left = max_items
        self.pos = 0

    def _take(self, n: int, start: int) -> None:
        if n > self.items_left:
            raise CBORInvalid(f"more than {self.max_items} items in one payload", start)
        self.items_left -= n

    def _argument(self, info: int, start: int) -> int:
        if info < 24:
            return info
        size = _ARG_SIZES.get(info)
        if size is None:
            what = "an indefinite length" if info == 31 else f"reserved additional info {info}"
            raise CBORInvalid(f"{what} is not allowed", start)
        if self.pos + size > self.end:
            raise CBORInvalid("item header runs past the end of the payload", start)
        value = int.from_bytes(self.buf[self.pos : self.pos + size], "big")
        self.pos += size
        return value

    def item(self, depth: int) -> Any:
        start = self.pos
        if start >= self.end:
            raise CBORInvalid("payload ends where an item was expected", start)
        self._take(1, start)
        initial = self.buf[start]
        self.pos += 1
        major, info = initial >> 5, initial & 31
        if major == 7:
            if info == 20:
                return False
            if info == 21:
                return True
            if info == 22:
                return None
            raise CBORInvalid(
                f"simple value or native float (0x{initial:02x}) is not allowed; "
                "floats are tagged 8-byte strings",
                start,
            )
        arg = self._argument(info, start)
        if major == 0:
            return arg
        if major == 1:
            return -1 - arg
        left = self.end - self.pos
        if major in (2, 3):
            if arg > left:
                raise CBORInvalid(f"string claims {arg} bytes but {left} are left", start)
            chunk = self.buf[self.pos : self.pos + arg]
            self.pos += arg
            if major == 2:
                return chunk
            try:
                return chunk.decode("utf-8")
            except UnicodeDecodeError:
                raise CBORInvalid("text string is not valid UTF-8", start) from None
        if depth >= self.max_depth:
            raise CBORInvalid(f"nested deeper than {self.max_depth} levels", start)
        if major == 4:
            if arg > left:
                raise CBORInvalid(f"array claims {arg} items but {left} bytes are left", start)
            if arg > self.items_left:
                raise CBORInvalid(f"more than {self.max_items} items in one payload", start)
            return [self.item(depth + 1) for _ in range(arg)]
        if major == 5:
            if arg > left // 2:
                raise CBORInvalid(f"map claims {arg} entries but {left} bytes are left", start)
            if 2 * arg > self.items_left:
                raise CBORInvalid(f"more than {self.max_items} items in one payload", start)
            out: dict[str, Any] = {}
            for _ in range(arg):
                key_at = self.pos
                key = self.item(depth + 1)
                if type(key) is not str:
                    raise CBORInvalid(f"map key is a {type(key).__name__}, not text", key_at)
                if key in out:
                    raise CBORInvalid(f"duplicate map key {key!r}", key_at)
                out[key] = self.item(depth + 1)
            return out
        # major 6: a tag; its content first, then the hook decides.
        content = self.item(depth + 1)
        try:
            return self.hook(arg, content)
        except (ValueError, TypeError) as exc:
            raise CBORInvalid(f"tag {arg}: {exc}", start) from None
