"""A small CBOR codec for the guest (cbor2's C extension cannot run inside wasm).

Covers what message bodies carry: None, bool, int (64-bit and bignum-free), float, str, bytes,
list/tuple, dict. Decoding is bounded by the input length and a nesting limit.

Every byte here runs in CPython-in-wasm on each message, where a bytecode costs about a hundred
wasm instructions (fuel) and a Python call about six hundred, so the common shapes take the
fewest: a small map of short text keys to small ints and short text is read and written in
one loop (no call per item, ``while`` rather than ``range``, table lookups rather than chained
comparisons), heads under 24 inline, the exact types tested before the generic ``isinstance``
chain, short text encodings kept in a bounded cache. The bytes written and the values and
errors read are those of the plain recursive codec this replaced (tests/agents/test_sdk_cbor.py
holds the two together with hypothesis).
"""

import struct

_MAX_DEPTH = 64

_pack_double = struct.Struct(">d").pack
_unpack_half = struct.Struct(">e").unpack_from
_unpack_float = struct.Struct(">f").unpack_from
_unpack_double = struct.Struct(">d").unpack_from
_from_bytes = int.from_bytes

# Encoded short text (head and UTF-8), kept for the strings a program sends again and again
# (map keys, message fields): bounded in count and in each entry's length.
_TEXT = {}
_TEXT_MAX = 512
_MAP_HEADS = tuple(bytes((0xA0 | n,)) for n in range(24))
_UINTS = tuple(bytes((n,)) if n < 24 else bytes((24, n)) for n in range(0x100))
_TEXT_HEAD = bytes(1 if 0x60 <= n < 0x78 else 0 for n in range(0x100))


def dumps(value):
    if type(value) is dict and len(value) < 24:
        # Most bodies: a small map of short text keys to small ints and short text, joined
        # from pieces kept ready (each bytecode is about a hundred wasm instructions here).
        parts = [_MAP_HEADS[len(value)]]
        append = parts.append
        text = _TEXT
        for key, item in value.items():
            data = text.get(key) if type(key) is str else None
            if data is None:
                out = bytearray()
                _encode(key, out, 1)
                data = out
            append(data)
            kind = type(item)
            if kind is int and 0 <= item < 0x100:
                data = _UINTS[item]
            elif kind is not str or (data := text.get(item)) is None:
                out = bytearray()
                _encode(item, out, 1)
                data = out
            append(data)
        return b"".join(parts)
    out = bytearray()
    _encode(value, out, 0)
    return bytes(out)


def _head(major, n, out):
    if n < 24:
        out.append(major << 5 | n)
    elif n < 0x100:
        out += bytes((major << 5 | 24, n))
    elif n < 0x10000:
        out.append(major << 5 | 25)
        out += n.to_bytes(2, "big")
    elif n < 0x100000000:
        out.append(major << 5 | 26)
        out += n.to_bytes(4, "big")
    else:
        out.append(major << 5 | 27)
        out += n.to_bytes(8, "big")


def _text(v, out):
    data = _TEXT.get(v)
    if data is None:
        raw = v.encode("utf-8")
        n = len(raw)
        data = bytes((0x60 | n,)) + raw if n < 24 else None
        if data is None:
            _head(3, n, out)
            out += raw
            return
        if len(_TEXT) < _TEXT_MAX:
            _TEXT[v] = data
    out += data


def _encode(v, out, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply for CBOR")
    t = type(v)
    if t is str:
        _text(v, out)
    elif t is int:
        if 0 <= v < 24:
            out.append(v)
        elif -24 <= v < 0:
            out.append(0x1F - v)  # major 1, -1 - v
        elif v >= 0:
            if v >= 2**64:
                raise ValueError("integer out of CBOR range")
            _head(0, v, out)
        else:
            if v < -(2**64):
                raise ValueError("integer out of CBOR range")
            _head(1, -1 - v, out)
    elif t is dict:
        n = len(v)
        if n < 24:
            out.append(0xA0 | n)
        else:
            _head(5, n, out)
        depth += 1
        text = _TEXT
        for key, item in v.items():
            if type(key) is str and depth <= _MAX_DEPTH:
                data = text.get(key)
                if data is None:
                    _text(key, out)
                else:
                    out += data
            else:
                _encode(key, out, depth)
            if type(item) is int and 0 <= item < 24 and depth <= _MAX_DEPTH:
                out.append(item)
            else:
                _encode(item, out, depth)
    elif v is None:
        out.append(0xF6)
    elif v is True:
        out.append(0xF5)
    elif v is False:
        out.append(0xF4)
    elif t is bytes:
        n = len(v)
        if n < 24:
            out.append(0x40 | n)
        else:
            _head(2, n, out)
        out += v
    elif t is list or t is tuple:
        n = len(v)
        if n < 24:
            out.append(0x80 | n)
        else:
            _head(4, n, out)
        depth += 1
        for item in v:
            _encode(item, out, depth)
    elif t is float:
        out.append(0xFB)
        out += _pack_double(v)
    else:
        _encode_other(v, out, depth)


def _encode_other(v, out, depth):
    """Subclasses of the types above (and memoryview, bytearray), as their base type."""
    if isinstance(v, int):
        if not -(2**64) <= v < 2**64:
            raise ValueError("integer out of CBOR range")
        if v >= 0:
            _head(0, v, out)
        else:
            _head(1, -1 - v, out)
    elif isinstance(v, float):
        out.append(0xFB)
        out += _pack_double(v)
    elif isinstance(v, str):
        data = str.encode(v, "utf-8")
        _head(3, len(data), out)
        out += data
    elif isinstance(v, (bytes, bytearray, memoryview)):
        data = bytes(v)
        _head(2, len(data), out)
        out += data
    elif isinstance(v, (list, tuple)):
        _head(4, len(v), out)
        for item in v:
            _encode(item, out, depth + 1)
    elif isinstance(v, dict):
        _head(5, len(v), out)
        for key, item in v.items():
            _encode(key, out, depth + 1)
            _encode(item, out, depth + 1)
    else:
        raise TypeError(f"cannot encode {type(v).__name__} as CBOR")


def loads(data):
    if type(data) is not bytes:
        data = bytes(data)
    size = len(data)
    n = data[0] - 0xA0 if size else -1
    if not 0 <= n < 24:
        value, end = _decode(data, 0, 0)
        if end != size:
            raise ValueError("trailing bytes after CBOR value")
        return value
    # A map of under 24 entries, the most common body: _map's loop here, as a call and a
    # returned tuple cost more than the loop's own work for a small body.
    if n > size - 1:
        raise ValueError("CBOR map longer than its input")
    result = {}
    text_head = _TEXT_HEAD
    pos = 1
    while n:
        n -= 1
        try:
            initial = data[pos]
        except IndexError:
            initial = 0
        if text_head[initial]:
            end = pos + initial - 0x5F
            if end > size:
                raise ValueError("truncated CBOR string")
            key = data[pos + 1 : end].decode()
            pos = end
        else:
            key, pos = _decode(data, pos, 1)
            if key.__class__ is dict or key.__class__ is list:
                raise ValueError("CBOR map key is an array or a map")
        try:
            initial = data[pos]
        except IndexError:
            initial = 0xFF
        if initial < 24:
            result[key] = initial
            pos += 1
        elif text_head[initial]:
            end = pos + initial - 0x5F
            if end > size:
                raise ValueError("truncated CBOR string")
            result[key] = data[pos + 1 : end].decode()
            pos = end
        elif initial == 24 and pos + 2 <= size:
            result[key] = data[pos + 1]
            pos += 2
        else:
            result[key], pos = _decode(data, pos, 1)
    if pos != size:
        raise ValueError("trailing bytes after CBOR value")
    return result


_SIZES = (1, 2, 4, 8)


def _decode(data, pos, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("CBOR nested too deeply")
    size = len(data)
    if pos >= size:
        raise ValueError("truncated CBOR")
    initial = data[pos]
    major = initial >> 5
    info = initial & 31
    pos += 1
    if major == 7:
        if info == 22 or info == 23:
            return None, pos
        if info == 21:
            return True, pos
        if info == 20:
            return False, pos
        if info == 27 and pos + 8 <= size:
            return _unpack_double(data, pos)[0], pos + 8
        if info == 26 and pos + 4 <= size:
            return _unpack_float(data, pos)[0], pos + 4
        if info == 25 and pos + 2 <= size:
            return _unpack_half(data, pos)[0], pos + 2
        raise ValueError("unsupported CBOR simple value")
    if info < 24:
        n = info
    elif info < 28:
        width = _SIZES[info - 24]
        if pos + width > size:
            raise ValueError("malformed CBOR length")
        n = _from_bytes(data[pos : pos + width], "big")
        pos += width
    else:
        raise ValueError("malformed CBOR length")
    if major == 0:
        return n, pos
    if major == 3:
        end = pos + n
        if end > size:
            raise ValueError("truncated CBOR string")
        return data[pos:end].decode(), end
    if major == 5:
        if n > size - pos:
            raise ValueError("CBOR map longer than its input")
        return _map(data, pos, n, depth + 1)
    if major == 1:
        return -1 - n, pos
    if major == 2:
        end = pos + n
        if end > size:
            raise ValueError("truncated CBOR string")
        return data[pos:end], end
    if major == 4:
        if n > size - pos:
            raise ValueError("CBOR array longer than its input")
        items = []
        append = items.append
        depth += 1
        for _ in range(n):
            item, pos = _decode(data, pos, depth)
            append(item)
        return items, pos
    # major 6: tags are ignored; the payload is kept
    return _decode(data, pos, depth + 1)


def _map(data, pos, n, depth):
    """The ``n`` entries of a map from ``pos``, each key and value at ``depth``: a short text
    key and a small int or short text value in this loop, anything else by ``_decode`` (which
    raises every error it would)."""
    if n and depth > _MAX_DEPTH:
        raise ValueError("CBOR nested too deeply")  # what _decode says of the first key
    size = len(data)
    result = {}
    text_head = _TEXT_HEAD
    while n:
        n -= 1
        try:
            initial = data[pos]
        except IndexError:
            initial = 0
        if text_head[initial]:
            end = pos + initial - 0x5F
            if end > size:
                raise ValueError("truncated CBOR string")
            key = data[pos + 1 : end].decode()
            pos = end
        else:
            key, pos = _decode(data, pos, depth)
            if key.__class__ is dict or key.__class__ is list:
                raise ValueError("CBOR map key is an array or a map")
        try:
            initial = data[pos]
        except IndexError:
            initial = 0xFF
        if initial < 24:
            result[key] = initial
            pos += 1
        elif text_head[initial]:
            end = pos + initial - 0x5F
            if end > size:
                raise ValueError("truncated CBOR string")
            result[key] = data[pos + 1 : end].decode()
            pos = end
        elif initial == 24 and pos + 2 <= size:
            result[key] = data[pos + 1]
            pos += 2
        else:
            result[key], pos = _decode(data, pos, depth)
    return result, pos
