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

__all__ = ["CBORInvalid", "TagHook", "decode", "decode_reference"]

TagHook = Callable[[int, Any], Any]
"""``hook(tag, content) -> value``; raises ``ValueError`` to reject the tag or its content."""

_ARG_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}


class CBORInvalid(Exception):
    """The payload is not in the accepted subset; ``at`` is the offset inside the payload."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(f"{message} (payload byte {at})")
        self.reason = message
        self.at = at


def decode_reference(
    payload: bytes, tag_hook: TagHook, max_depth: int, max_items: int = 1 << 62
) -> Any:
    """``decode`` as first written: one method call per item, the checks in plain sight.
    ``decode`` is held to it, value for value and error for error (tests/trace/test_cbor.py)."""
    dec = _Decoder(payload, tag_hook, max_depth, max_items)
    value = dec.item(0)
    if dec.pos != len(payload):
        raise CBORInvalid(f"{len(payload) - dec.pos} bytes left after the item", dec.pos)
    return value


def decode(payload: bytes, tag_hook: TagHook, max_depth: int, max_items: int = 1 << 62) -> Any:
    """The one item that ``payload`` holds, all of it, in at most ``max_items`` items.

    Exactly what ``decode_reference`` gives (the same value, or the same ``CBORInvalid`` at
    the same offset), three times faster: inside arrays and maps the commonest items (small
    integers, short text and byte strings, the three simple values) are read in the loop
    itself, only when every check ``_item`` would make passes; anything else, and anything
    that would fail, goes through ``_item``, which says why.
    """
    state = _Fast(payload, tag_hook, max_depth, max_items)
    value = state.item(0)
    if state.pos != len(payload):
        raise CBORInvalid(f"{len(payload) - state.pos} bytes left after the item", state.pos)
    return value


_SIMPLE = {0xF4: False, 0xF5: True, 0xF6: None}


def _scalar(buf: bytes, pos: int, end: int) -> tuple[Any, int] | None:
    """The item at ``pos`` and where it ends, if it is one ``_Fast.item`` would return without
    a complaint and without a container: an int, a byte or text string of fewer than 256 bytes
    (valid UTF-8), false, true or null. Else None (the caller asks ``item``, which decides)."""
    if pos >= end:
        return None
    b = buf[pos]
    if b < 0x18:
        return b, pos + 1
    major = b >> 5
    info = b & 31
    if major <= 1:
        if info > 27:
            return None
        at = pos + 1
        if info < 24:
            n = info
        else:
            size = 1 << (info - 24)
            if at + size > end:
                return None
            n = int.from_bytes(buf[at : at + size], "big")
            at += size
        return (n if major == 0 else -1 - n), at
    if major <= 3:
        if info < 24:
            at = pos + 1
        elif info == 24 and pos + 1 < end:
            info = buf[pos + 1]
            at = pos + 2
        else:
            return None
        stop = at + info
        if stop > end:
            return None
        chunk = buf[at:stop]
        if major == 2:
            return chunk, stop
        try:
            return chunk.decode("utf-8"), stop
        except UnicodeDecodeError:
            return None
    if 0xF4 <= b <= 0xF6:
        return _SIMPLE[b], pos + 1
    return None


class _Reader:
    """A decoder's position in one payload and what is left of its bounds."""

    __slots__ = ("buf", "end", "hook", "items_left", "max_depth", "max_items", "pos")

    def __init__(self, buf: bytes, hook: TagHook, max_depth: int, max_items: int) -> None:
        self.buf = buf
        self.end = len(buf)
        self.hook = hook
        self.max_depth = max_depth
        self.max_items = max_items
        self.items_left = max_items
        self.pos = 0


class _Fast(_Reader):
    __slots__ = ()

    def _too_many(self, start: int) -> CBORInvalid:
        return CBORInvalid(f"more than {self.max_items} items in one payload", start)

    def item(self, depth: int) -> Any:  # noqa: PLR0915 - one dispatch, as _Decoder.item
        buf = self.buf
        end = self.end
        start = self.pos
        if start >= end:
            raise CBORInvalid("payload ends where an item was expected", start)
        if self.items_left < 1:
            raise self._too_many(start)
        self.items_left -= 1
        initial = buf[start]
        pos = start + 1
        major = initial >> 5
        info = initial & 31
        if major == 7:
            self.pos = pos
            if 20 <= info <= 22:
                return _SIMPLE[initial]
            raise CBORInvalid(
                f"simple value or native float (0x{initial:02x}) is not allowed; "
                "floats are tagged 8-byte strings",
                start,
            )
        if info < 24:
            arg = info
        elif info < 28:
            size = 1 << (info - 24)
            if pos + size > end:
                raise CBORInvalid("item header runs past the end of the payload", start)
            arg = int.from_bytes(buf[pos : pos + size], "big")
            pos += size
        else:
            what = "an indefinite length" if info == 31 else f"reserved additional info {info}"
            raise CBORInvalid(f"{what} is not allowed", start)
        if major == 0:
            self.pos = pos
            return arg
        if major == 1:
            self.pos = pos
            return -1 - arg
        left = end - pos
        if major in (2, 3):
            if arg > left:
                raise CBORInvalid(f"string claims {arg} bytes but {left} are left", start)
            self.pos = pos + arg
            chunk = buf[pos : pos + arg]
            if major == 2:
                return chunk
            try:
                return chunk.decode("utf-8")
            except UnicodeDecodeError:
                raise CBORInvalid("text string is not valid UTF-8", start) from None
        if depth >= self.max_depth:
            raise CBORInvalid(f"nested deeper than {self.max_depth} levels", start)
        inner = depth + 1
        if major == 4:
            if arg > left:
                raise CBORInvalid(f"array claims {arg} items but {left} bytes are left", start)
            if arg > self.items_left:
                raise self._too_many(start)
            items: list[Any] = []
            append = items.append
            for _ in range(arg):
                b = buf[pos] if pos < end else 0xFF
                if b < 0x18 and self.items_left:  # a small unsigned int
                    self.items_left -= 1
                    append(b)
                    pos += 1
                    continue
                scalar = self.items_left and (b < 0x80 or 0xF4 <= b <= 0xF6)
                got = _scalar(buf, pos, end) if scalar else None
                if got is None:
                    self.pos = pos
                    append(self.item(inner))
                    pos = self.pos
                else:
                    self.items_left -= 1
                    append(got[0])
                    pos = got[1]
            self.pos = pos
            return items
        if major == 5:
            if arg > left // 2:
                raise CBORInvalid(f"map claims {arg} entries but {left} bytes are left", start)
            if 2 * arg > self.items_left:
                raise self._too_many(start)
            out: dict[str, Any] = {}
            for _ in range(arg):
                key_at = pos
                b = buf[pos] if pos < end else 0xFF
                stop = pos + 1 + (b & 31)
                if 0x60 <= b < 0x78 and stop <= end and self.items_left:  # a short text key
                    try:
                        key = buf[pos + 1 : stop].decode("utf-8")
                    except UnicodeDecodeError:
                        raise CBORInvalid("text string is not valid UTF-8", pos) from None
                    self.items_left -= 1
                    pos = stop
                else:
                    self.pos = pos
                    key = self.item(inner)
                    pos = self.pos
                    if type(key) is not str:
                        raise CBORInvalid(f"map key is a {type(key).__name__}, not text", key_at)
                if key in out:
                    raise CBORInvalid(f"duplicate map key {key!r}", key_at)
                b = buf[pos] if pos < end else 0xFF
                if b < 0x18 and self.items_left:  # a small unsigned int
                    self.items_left -= 1
                    out[key] = b
                    pos += 1
                    continue
                scalar = self.items_left and (b < 0x80 or 0xF4 <= b <= 0xF6)
                got = _scalar(buf, pos, end) if scalar else None
                if got is None:
                    self.pos = pos
                    out[key] = self.item(inner)
                    pos = self.pos
                else:
                    self.items_left -= 1
                    out[key], pos = got
            self.pos = pos
            return out
        # major 6: a tag; its content first, then the hook decides.
        self.pos = pos
        content = self.item(inner)
        try:
            return self.hook(arg, content)
        except (ValueError, TypeError) as exc:
            raise CBORInvalid(f"tag {arg}: {exc}", start) from None


class _Decoder(_Reader):
    __slots__ = ()

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
