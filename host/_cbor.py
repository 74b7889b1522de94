"""Decoding CBOR that came from outside (cluster frames, leases, agent bodies on the host side).

``cbor2.loads`` decodes about thirty semantic tags itself before any ``tag_hook`` runs: a MIME
message (tag 36) goes to ``email``'s parser, a regular expression (tag 35) to ``re.compile``,
shared references build cycles; a 750 KB frame of them took 22 s to decode on a node's event
loop, and the other nodes declared it dead. ``semantic_decoders={}`` does not turn them off.
So :func:`loads_untrusted` first walks the item headers (no allocation: each header's length is
checked against the bytes left, nesting and item counts are capped) and refuses every tag but a
bignum's and every indefinite length, none of which mighty's own encoders (cbor2.dumps of plain
data, the guest SDK's codec) ever write; only then does cbor2 decode what is plain data.

Rejected: mighty.trace's closed decoder for these too (it refuses floats and non-text map keys,
which agent bodies carry), and a per-tag override table (it depends on knowing every tag each
cbor2 release decodes).
"""

from __future__ import annotations

import io
import re
from typing import Any

import cbor2

__all__ = ["CBORRefused", "loads_untrusted"]

_ARG_SIZES = {24: 1, 25: 2, 26: 4, 27: 8}


class CBORRefused(cbor2.CBORDecodeError):
    """The bytes hold something plain-data CBOR does not: a tag, an indefinite length, a length
    past the end, too deep or too many items. A ``CBORDecodeError``, so callers that handle
    cbor2's errors handle it."""


def _scan(data: bytes, max_depth: int, max_items: int) -> None:
    """Check ``data`` holds exactly one plain-data item, in linear time and no allocation."""
    pos, end, items = 0, len(data), 0
    # Items still to read at each open level: one at the top.
    pending = [1]
    while pending:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        if pos >= end:
            raise CBORRefused(f"the data ends where an item was expected (byte {pos})")
        items += 1
        if items > max_items:
            raise CBORRefused(f"more than {max_items} items")
        start = pos
        initial = data[pos]
        major, info = initial >> 5, initial & 0x1F
        pos += 1
        if info < 24:
            arg = info
        elif info in _ARG_SIZES:
            size = _ARG_SIZES[info]
            if pos + size > end:
                raise CBORRefused(f"an item header runs past the end (byte {start})")
            arg = int.from_bytes(data[pos : pos + size], "big")
            pos += size
        else:
            raise CBORRefused(f"indefinite and reserved lengths are refused (byte {start})")
        if major == 6:
            # Bignums (2, 3) are plain integers past 64 bits, built from their bytes in linear
            # time: the one tag plain data needs. Their content must be a byte string.
            if arg not in (2, 3) or pos >= end or data[pos] >> 5 != 2:
                raise CBORRefused(
                    f"tag {arg} is refused: plain data carries no tags (byte {start})"
                )
            items -= 1  # the tag and its byte string are one integer
            pending[-1] += 1
            continue
        if major in (2, 3):
            if arg > end - pos:
                raise CBORRefused(f"a string claims {arg} bytes but {end - pos} are left")
            pos += arg
        elif major in (4, 5):
            count = arg * (2 if major == 5 else 1)
            if count > end - pos:
                raise CBORRefused(
                    f"a container claims {arg} entries but {end - pos} bytes are left"
                )
            if len(pending) > max_depth:
                raise CBORRefused(f"nested deeper than {max_depth} levels")
            pending.append(count)
        elif major == 7 and info not in (20, 21, 22, 25, 26, 27):
            raise CBORRefused(f"simple value {arg} is refused (byte {start})")
    if pos != end:
        raise CBORRefused(f"{end - pos} bytes left after the item")


# Every head byte the scan has something to say about: tags (0xc0-0xdb), indefinite lengths
# (0x1f, 0x3f, ... 0xff), simple values and reserved heads (0xe0-0xf3, 0xf7, 0xf8, 0xfc-0xfe),
# and 4- and 8-byte lengths of strings, arrays and maps. Data without any of these bytes, short
# enough that its nesting and item count are under the caps, cannot hold what the scan refuses.
_NOTEWORTHY = re.compile(
    rb"[\xc0-\xdf\xe0-\xf3\xf7\xf8\xfc-\xff\x1f\x3f\x5f\x7f\x9f\xbf"
    rb"\x5a\x5b\x7a\x7b\x9a\x9b\xba\xbb]"
)
_SHORT = 64


def loads_untrusted(data: bytes, *, max_depth: int = 64, max_items: int = 1 << 20) -> Any:
    """The plain data ``data`` encodes (ints, floats, strings, bytes, lists, maps, bools,
    None); :class:`CBORRefused` for anything else, before cbor2 decodes a byte."""
    raw = bytes(data)
    # The commonest body (a small map of ASCII keys and small values) skips the item walk: a
    # search in C instead of ~1.6 us of Python per host-side ask.
    if len(raw) > min(_SHORT, max_depth, max_items) or _NOTEWORTHY.search(raw) is not None:
        _scan(raw, max_depth, max_items)
        return cbor2.loads(raw)
    # Short and plain: decode, then check nothing follows the item (cbor2.loads ignores it).
    stream = io.BytesIO(raw)
    value = cbor2.CBORDecoder(stream).decode()
    if stream.tell() != len(raw):
        raise CBORRefused(f"{len(raw) - stream.tell()} bytes left after the item")
    return value
