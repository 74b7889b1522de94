"""The guest SDK's CBOR codec as it was before its fast paths (c04a061), kept as the oracle the
fast one is held to, byte for byte and error for error (tests/agents/test_sdk_cbor.py)."""

import struct

_MAX_DEPTH = 64


def dumps(value):
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
        out += struct.pack(">H", n)
    elif n < 0x100000000:
        out.append(major << 5 | 26)
        out += struct.pack(">I", n)
    else:
        out.append(major << 5 | 27)
        out += struct.pack(">Q", n)


def _encode(v, out, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply for CBOR")
    if v is None:
        out.append(0xF6)
    elif v is True:
        out.append(0xF5)
    elif v is False:
        out.append(0xF4)
    elif isinstance(v, int):
        if not -(2**64) <= v < 2**64:
            raise ValueError("integer out of CBOR range")
        if v >= 0:
            _head(0, v, out)
        else:
            _head(1, -1 - v, out)
    elif isinstance(v, float):
        out.append(0xFB)
        out += struct.pack(">d", v)
    elif isinstance(v, str):
        data = v.encode("utf-8")
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
    data = bytes(data)
    value, end = _decode(data, 0, 0)
    if end != len(data):
        raise ValueError("trailing bytes after CBOR value")
    return value


def _length(data, pos, info):
    if info < 24:
        return info, pos
    size = {24: 1, 25: 2, 26: 4, 27: 8}.get(info)
    if size is None or pos + size > len(data):
        raise ValueError("malformed CBOR length")
    return int.from_bytes(data[pos : pos + size], "big"), pos + size


def _decode(data, pos, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("CBOR nested too deeply")
    if pos >= len(data):
        raise ValueError("truncated CBOR")
    initial = data[pos]
    major, info = initial >> 5, initial & 31
    pos += 1
    if major == 7:
        if info == 20:
            return False, pos
        if info == 21:
            return True, pos
        if info in (22, 23):
            return None, pos
        if info == 25 and pos + 2 <= len(data):
            return struct.unpack(">e", data[pos : pos + 2])[0], pos + 2
        if info == 26 and pos + 4 <= len(data):
            return struct.unpack(">f", data[pos : pos + 4])[0], pos + 4
        if info == 27 and pos + 8 <= len(data):
            return struct.unpack(">d", data[pos : pos + 8])[0], pos + 8
        raise ValueError("unsupported CBOR simple value")
    n, pos = _length(data, pos, info)
    if major == 0:
        return n, pos
    if major == 1:
        return -1 - n, pos
    if major in (2, 3):
        if pos + n > len(data):
            raise ValueError("truncated CBOR string")
        chunk = data[pos : pos + n]
        return (chunk if major == 2 else chunk.decode("utf-8")), pos + n
    if major == 4:
        if n > len(data) - pos:
            raise ValueError("CBOR array longer than its input")
        items = []
        for _ in range(n):
            item, pos = _decode(data, pos, depth + 1)
            items.append(item)
        return items, pos
    if major == 5:
        if n > len(data) - pos:
            raise ValueError("CBOR map longer than its input")
        result = {}
        for _ in range(n):
            key, pos = _decode(data, pos, depth + 1)
            if isinstance(key, (dict, list)):  # added with the SDK's fix: was a TypeError
                raise ValueError("CBOR map key is an array or a map")  # noqa: TRY004 - bad input
            value, pos = _decode(data, pos, depth + 1)
            result[key] = value
        return result, pos
    if major == 6:
        return _decode(data, pos, depth + 1)  # tags are ignored; the payload is kept
    raise ValueError("unsupported CBOR item")
