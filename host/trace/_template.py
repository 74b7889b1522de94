"""Import records read by template: the part that repeats decoded once, the rest read in place.

Most records of a trace are imports, and most imports repeat: the same interface, function and
arguments (a stream's write of the same line, a clock read, a check-write) with a new step,
fuel and often a new result. The recorder writes them with its keys in one order::

    {"k": "import", "i": I, "s": S, <the call: "if", "fn", "args", ...>, "res": R, "out": O,
     "fuel": F}

:class:`ImportTemplates` splits such a payload into its variable fields (``I``, ``S``, ``R``,
``O``, ``F``, read here when ``R`` is an unsigned int, a byte string, null/true/false, an
``Ok`` of an unsigned int or of null, or a map of up to 8 text keys to unsigned ints) and the
bytes of the call between ``S`` and ``"res"``, and answers from the call's decoded pairs when
it has seen those bytes before. It never decides anything: a payload it cannot split, or whose
call it has not learnt, goes to the closed decoder (``_cbor.decode``), which gives the value or
the error; a call is learnt only from a payload the closed decoder accepted, and only after the
call's bytes alone decode (as a map of their pairs, without blobs) to exactly the record's
pairs.

Why an answer from a template is the closed decoder's answer: CBOR items are prefix-free, so
the pairs of a learnt call decode from those same bytes at the same place of any payload, the
same way, and end where they ended; the fixed keys and variable fields around them are read
here byte for byte as the decoder would read them (the same heads, the same lengths, text that
must be valid UTF-8, no key twice in a result's map); the call decoded alone within the item
limit less ``_AROUND``, the most items the fixed fields and a result read here add; the keys
are the learnt record's, so none repeats. The record built is new (the call's lists are copied,
a result's map is made here; everything else in it is immutable), as the decoder's would be.

Cost where calls do not repeat: a call is learnt the second time it is seen (learning decodes
its bytes once more), one that cannot be kept is not tried again, and past ``_COLD`` payloads
without an answer only one in ``_SAMPLE`` is split, until one is answered. Bounded: ``_KEEP``
calls of at most ``_CALL_MAX`` bytes kept, as many seen once.

It also gives each templated record its canonical CBOR (what the replayer digests,
``canonical_record``): the call's part in canonical order is worked out once per call, checked
against ``canonical_record`` of the learnt record, and the variable fields are encoded in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mighty.abi import Ok
from mighty.trace._cbor import CBORInvalid, decode
from mighty.trace._emit import _canonical_simple, canonical_record, uint
from mighty.trace._native import native, use_native
from mighty.trace._schema import OUTCOMES
from mighty.trace._values import MAX_DEPTH, HandleRef, value_from_tag

__all__ = ["ImportTemplates"]

_AFTER_HEAD = b"\x61k\x66import\x61i"  # "k": "import", "i"
_KEY_S = b"\x61s"
_KEY_RES = b"\x63res"
_KEY_OUT = b"\x63out"
_KEY_FUEL = b"\x64fuel"
_OUT_OK = b"\x63out\x62ok"
_OK_TAG = b"\xd9\x69\x7a"  # tag 27002, as the writer heads it
# Items besides the call's: the map, "k", "i", "s", "out", "fuel" and their values (11), the
# "res" key, and a result of at most 17 (a map of 8 keys to ints).
_AROUND = 32
_CALL_MAX = 1024  # bytes of a call worth keeping
_KEEP = 4096  # calls kept
_SEEN = _KEEP  # calls seen once, or refused, kept
_COLD = 256  # payloads without an answer before only some are tried
_SAMPLE = 16  # then one in this many
_SCALARS = frozenset({int, str, bytes, bool, float, type(None), HandleRef})
_SIMPLE_VALUES = {0xF4: False, 0xF5: True, 0xF6: None}
_OK_TEXT = b"\x62ok"
_OK_NONE_BYTES = _OK_TAG + b"\xf6"
_CANONICAL_SIMPLE = {False: b"\xf4", True: b"\xf5", None: b"\xf6"}


def _head(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """The argument of the item head at ``pos`` (as the closed decoder reads a definite
    head, its major type ignored) and where the head ends; None if it is not one or is cut."""
    if pos >= end:
        return None
    info = buf[pos] & 31
    if info < 24:
        return info, pos + 1
    if info > 27:
        return None
    stop = pos + 1 + (1 << (info - 24))
    if stop > end:
        return None
    return int.from_bytes(buf[pos + 1 : stop], "big"), stop


def _uint(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """An unsigned int at ``pos`` and where it ends."""
    if pos >= end or buf[pos] >= 0x1C:
        return None
    return _head(buf, pos, end)


_canonical_uint = uint  # minimal heads: canonical


def _canonical_head(major: int, n: int) -> bytes:
    head = _canonical_uint(n)
    return bytes((head[0] | major << 5,)) + head[1:]


def _canonical_res(res: Any) -> bytes:
    """The canonical CBOR of a result ``_split`` reads (``canonical_record``'s bytes)."""
    t = type(res)
    if t is int:
        return _canonical_uint(res)
    if t is bytes:
        data: bytes = res
        return _canonical_head(2, len(data)) + data
    if t is Ok:
        inner = res.value
        return _OK_TAG + (b"\xf6" if inner is None else _canonical_uint(inner))
    if t is dict:
        encoded = _canonical_simple(res)  # a map of text keys: canonical_record's own
        assert encoded is not None
        return encoded
    return _CANONICAL_SIMPLE[res]


_Split = tuple[int, int, int, int, Any, str, int]


def _split(payload: bytes, ok: type[Ok] = Ok) -> _Split | None:  # noqa: PLR0915 - one pass
    """``(call_start, call_end, i, s, res, out, fuel)`` of a payload in the recorder's import
    layout whose result is simple (see the module note), read as the closed decoder reads
    them; the call is ``payload[call_start:call_end]``. None when it is not in that layout.
    (Every head is read inline, as ``_head`` reads it: this runs once per record.) ``ok`` makes
    an ``Ok`` result. The trace's compiled speedups have this very function (``split``): the
    reader uses that one unless ``MIGHTY_PURE_PYTHON`` is set, and tests/trace/test_template.py
    holds the two to the same answer."""
    end = len(payload)
    if end < 24 or not 0xA6 <= payload[0] <= 0xB7 or not payload.startswith(_AFTER_HEAD, 1):
        return None
    pos = 12  # 1 + len(_AFTER_HEAD)
    i = payload[pos]
    if i < 24:
        pos += 1
    elif i < 28:
        stop = pos + 1 + (1 << (i - 24))
        if stop > end:
            return None
        i, pos = int.from_bytes(payload[pos + 1 : stop], "big"), stop
    else:
        return None
    if not payload.startswith(_KEY_S, pos):
        return None
    pos += 2
    s = payload[pos]  # the call and the rest follow: pos < end
    if s < 24:
        pos += 1
    elif s < 28:
        stop = pos + 1 + (1 << (s - 24))
        if stop > end:
            return None
        s, pos = int.from_bytes(payload[pos + 1 : stop], "big"), stop
    else:
        return None
    call_start = pos
    call_end = payload.find(_KEY_RES, pos)
    if call_end < 0 or call_end + 4 >= end:
        return None
    pos = call_end + 4
    b = payload[pos]
    res: Any
    if b < 0x1C or 0x40 <= b < 0x5C:  # an unsigned int or a byte string: a head first
        info = b & 31
        if info < 24:
            n = info
            pos += 1
        else:
            stop = pos + 1 + (1 << (info - 24))
            if stop > end:
                return None
            n, pos = int.from_bytes(payload[pos + 1 : stop], "big"), stop
        if b < 0x1C:
            res = n
        else:
            stop = pos + n
            if stop > end:
                return None
            res, pos = payload[pos:stop], stop
    elif payload.startswith(_OK_TAG, pos):
        pos += 3
        if pos >= end:
            return None
        b = payload[pos]
        if b == 0xF6:
            res, pos = ok(None), pos + 1
        elif b < 24:
            res, pos = ok(b), pos + 1
        elif b < 28:
            stop = pos + 1 + (1 << (b - 24))
            if stop > end:
                return None
            res, pos = ok(int.from_bytes(payload[pos + 1 : stop], "big")), stop
        else:
            return None
    elif 0xF4 <= b <= 0xF6:
        res, pos = _SIMPLE_VALUES[b], pos + 1
    elif 0xA0 <= b <= 0xA8:  # a WIT record of ints (a datetime): text keys, unsigned ints
        res = {}
        pos += 1
        for _ in range(b & 31):
            if pos >= end or not 0x60 <= payload[pos] < 0x78:
                return None
            stop = pos + 1 + (payload[pos] & 31)
            if stop >= end:
                return None
            try:
                key = payload[pos + 1 : stop].decode("utf-8")
            except UnicodeDecodeError:
                return None
            if key in res:
                return None
            pos = stop
            b = payload[pos]
            if b < 24:
                res[key] = b
                pos += 1
            elif b < 28:
                stop = pos + 1 + (1 << (b - 24))
                if stop > end:
                    return None
                res[key], pos = int.from_bytes(payload[pos + 1 : stop], "big"), stop
            else:
                return None
    else:
        return None
    if payload.startswith(_OUT_OK, pos):  # "out": "ok", the commonest
        out = "ok"
        stop = pos + 7
    else:
        if not payload.startswith(_KEY_OUT, pos):
            return None
        pos += 4
        if pos >= end or not 0x60 <= payload[pos] < 0x78:
            return None
        stop = pos + 1 + (payload[pos] & 31)
        if stop > end:
            return None
        try:
            out = payload[pos + 1 : stop].decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not payload.startswith(_KEY_FUEL, stop):
        return None
    pos = stop + 5
    if pos >= end:
        return None
    b = payload[pos]
    if b < 24:
        if pos + 1 != end:
            return None
        fuel = b
    elif b < 28:
        if pos + 1 + (1 << (b - 24)) != end:
            return None
        fuel = int.from_bytes(payload[pos + 1 : end], "big")
    else:
        return None
    return call_start, call_end, i, s, res, out, fuel


class _Call:
    """One learnt call: its map head, its pairs, which of them are lists (copied for each
    record), and the constant pieces of the canonical record around its variable fields."""

    __slots__ = ("canonical", "checked", "head", "lists", "pairs", "record")

    def __init__(
        self,
        head: int,
        pairs: dict[str, Any],
        lists: tuple[str, ...],
        canonical: tuple[bytes, ...] | None,
    ) -> None:
        self.head = head
        self.pairs = pairs
        self.lists = lists
        self.canonical = canonical
        # A record of this call with its keys in order, the variable fields left to fill.
        self.record: dict[str, Any] = {
            "k": "import",
            "i": None,
            "s": None,
            **pairs,
            "res": None,
            "out": None,
            "fuel": None,
        }
        # The call's fields as the import schema wants them (``_schema._good_import``; the
        # step, instance and fuel are ints here by construction, the outcome is seen per record).
        self.checked = (
            type(pairs.get("if")) is str
            and type(pairs.get("fn")) is str
            and type(pairs.get("args")) is list
            and type(pairs.get("a", "")) is str
        )


def _kept(value: Any) -> bool:
    """Whether a call's value can be shared by records: immutable, or a flat list of
    immutable items (copied for each record)."""
    t = type(value)
    if t in _SCALARS:
        return True
    if t is list:
        return all(type(v) in _SCALARS for v in value)
    return False


# The variable fields in canonical key order (length first, then bytes: "i" < "s" among the
# one-letter keys, "out" < "res", then "fuel" among the four-letter ones).
_CANONICAL_SLOTS = ("i", "s", "out", "res", "fuel")


def _canonical_pieces(record: dict[str, Any]) -> tuple[bytes, ...] | None:
    """The constant pieces between the variable fields of ``record``'s canonical bytes, checked
    against ``canonical_record``; None when that record has none."""
    whole = canonical_record(record, "@")
    if whole is None:
        return None
    order = sorted((k for k in record if k != "@"), key=lambda k: (len(k.encode()), k.encode()))
    pieces: list[bytes] = []
    current = [whole[:1]]  # the map head (fewer than 24 keys)
    slots = []
    for key in order:
        raw = key.encode()
        name = _canonical_head(3, len(raw)) + raw
        current.append(name)
        if key in _CANONICAL_SLOTS:
            pieces.append(b"".join(current))
            current = []
            slots.append(key)
            continue
        part = canonical_record({key: record[key]}, "@")
        if part is None:
            return None
        current.append(part[1 + len(name) :])
    pieces.append(b"".join(current))
    if tuple(slots) != _CANONICAL_SLOTS or _join(pieces, record) != whole:
        return None
    return tuple(pieces)


def _join(pieces: list[bytes] | tuple[bytes, ...], record: dict[str, Any]) -> bytes:
    c0, c1, c2, c3, c4, c5 = pieces
    return b"".join(
        (
            c0,
            _canonical_uint(record["i"]),
            c1,
            _canonical_uint(record["s"]),
            c2,
            _canonical_head(3, len(record["out"].encode("utf-8"))),
            record["out"].encode("utf-8"),
            c3,
            _canonical_res(record["res"]),
            c4,
            _canonical_uint(record["fuel"]),
            c5,
        )
    )


class ImportTemplates:
    """The learnt calls of one reader (at most ``_KEEP``, each at most ``_CALL_MAX`` bytes)."""

    __slots__ = ("_calls", "_learn", "_misses", "_seen", "_split")

    def __init__(self) -> None:
        # The compiled split when it is there and wanted (asked once, as the trace writer does).
        self._split: Callable[[bytes, type[Ok]], _Split | None] = (
            native.split if use_native() else _split
        )
        self._calls: dict[bytes, _Call] = {}
        # Calls seen and not learnt: False once seen (learnt the second time: most calls of a
        # trace that prints varied lines never repeat, and learning costs a decode more),
        # True when learning refused it. At most _SEEN; emptied when full.
        self._seen: dict[bytes, bool] = {}
        # The payload ``get`` last missed and its split, when ``learn`` should learn its call.
        self._learn: tuple[bytes, _Split, bytes] | None = None
        # Payloads since the last answer: past _COLD, only one in _SAMPLE is tried (a trace
        # whose calls never repeat pays the split of a few records, not of all).
        self._misses = 0

    def get(
        self, payload: bytes, canonical: bool
    ) -> tuple[dict[str, Any], bytes | None, bool] | None:
        """When a learnt call answers ``payload``: the record it holds, if ``canonical`` its
        canonical bytes (else, or if not worked out, None), and whether the record is known to
        pass ``check_record`` (else the caller checks it). Else None (ask the closed decoder,
        then ``learn``)."""
        self._learn = None
        misses = self._misses = self._misses + 1
        if misses > _COLD and misses % _SAMPLE:
            return None
        split = self._split(payload, Ok)
        if split is None:
            return None
        call_start, call_end, i, s, res, out, fuel = split
        if call_end - call_start > _CALL_MAX:
            return None
        call = payload[call_start:call_end]
        known = self._calls.get(call)
        if known is None or known.head != payload[0]:
            seen = self._seen.get(call)
            if seen is None:
                if len(self._seen) >= _SEEN:
                    self._seen.clear()
                self._seen[call] = False
            elif not seen:
                self._learn = payload, split, call
            return None
        self._misses = 0
        record = known.record.copy()  # the keys in the payload's order
        record["i"] = i
        record["s"] = s
        for name in known.lists:
            record[name] = list(record[name])
        record["res"] = res
        record["out"] = out
        record["fuel"] = fuel
        checked = known.checked and out in OUTCOMES and (out != "exit" or type(res) is int)
        pieces = known.canonical
        if pieces is None or not canonical:
            return record, None, checked
        c0, c1, c2, c3, c4, c5 = pieces
        if out == "ok":
            out_bytes = _OK_TEXT
        else:
            raw_out = out.encode("utf-8")
            out_bytes = _canonical_head(3, len(raw_out)) + raw_out
        t = type(res)
        if t is int:
            res_bytes = uint(res)
        elif t is Ok and res.value is None:
            res_bytes = _OK_NONE_BYTES
        else:
            res_bytes = _canonical_res(res)
        return (
            record,
            b"".join((c0, uint(i), c1, uint(s), c2, out_bytes, c3, res_bytes, c4, uint(fuel), c5)),
            checked,
        )

    def learn(self, payload: bytes, record: dict[str, Any], max_items: int) -> bytes | None:
        """Learn the call of ``payload`` (the one ``get`` last missed, when it is worth
        learning), which the closed decoder read as ``record`` (within ``max_items``); return
        the record's canonical bytes when worked out, else None."""
        pending, self._learn = self._learn, None
        if pending is None or pending[0] is not payload:
            return None
        _, split, call = pending
        learnt = self._learnt(payload, split, call, record, max_items)
        if learnt is None:
            self._seen[call] = True  # not again
            return None
        self._seen.pop(call, None)
        return learnt

    def _learnt(
        self, payload: bytes, split: _Split, call: bytes, record: dict[str, Any], max_items: int
    ) -> bytes | None:
        _, _, i, s, res, out, fuel = split
        keys = list(record)
        n = len(keys)
        if (
            keys[:3] != ["k", "i", "s"]
            or keys[-3:] != ["res", "out", "fuel"]
            or (record["i"], record["s"], record["out"], record["fuel"]) != (i, s, out, fuel)
            or type(record["res"]) is not type(res)
            or record["res"] != res
            or n - 6 >= 24
            or payload[0] != 0xA0 + n
        ):
            return None
        pairs = {k: record[k] for k in keys[3:-3]}
        if not all(_kept(v) for v in pairs.values()):
            return None
        try:
            # Within fewer items than the record may have: what the fixed fields and a result
            # read here add always fits beside it. value_from_tag refuses a blob reference.
            head = bytes((0xA0 + n - 6,))
            alone = decode(head + call, value_from_tag, MAX_DEPTH, max_items - _AROUND)
        except (CBORInvalid, RecursionError):
            return None
        if type(alone) is not dict or list(alone) != list(pairs) or alone != pairs:
            return None
        pieces = _canonical_pieces(record)
        if len(self._calls) >= _KEEP:
            self._calls.clear()
        lists = tuple(k for k, v in pairs.items() if type(v) is list)
        self._calls[call] = _Call(payload[0], pairs, lists, pieces)
        return None if pieces is None else _join(pieces, record)
