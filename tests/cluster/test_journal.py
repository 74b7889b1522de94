"""The cluster journal's entries (encoding, checks) and how a message's log is put back
together from them (mighty.cluster._journal), with no NATS server."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.cluster._journal import (
    ENTRY_DATA,
    MAX_ENTRIES,
    JournalCorrupt,
    JournalEntry,
    assemble,
    decode_entry,
    encode_entry,
)
from mighty.gate import Binding
from mighty.trace import NondeterminismError, TraceWriter

COMPONENT = "ab" * 32
TOOLS = "mighty:agent/tools@0.1.0"
STEP = Binding(TOOLS, "call", lambda ctx, name, payload: None)

ids = st.text(min_size=1, max_size=256)
entries = st.builds(
    JournalEntry,
    log=ids,
    n=st.integers(0, MAX_ENTRIES - 1),
    message=ids,
    data=st.binary(max_size=4096),
)


@given(entries)
def test_an_entry_decodes_to_itself(entry: JournalEntry) -> None:
    """encode_entry then decode_entry gives the entry back."""
    assert decode_entry(encode_entry(entry)) == entry


@given(st.binary(max_size=2048))
def test_any_bytes_are_an_entry_or_journal_corrupt(raw: bytes) -> None:
    """Garbage is a JournalCorrupt, never another exception."""
    with contextlib.suppress(JournalCorrupt):
        decode_entry(raw)


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=7),
    max_leaves=20,
)  # fmt: skip


@given(plain, st.dictionaries(st.sampled_from(["v", "log", "n", "msg", "data", "sum"]), plain))
def test_any_cbor_shape_is_an_entry_or_journal_corrupt(value: Any, fields: dict[str, Any]) -> None:
    """Any CBOR value, and any map of the entry's keys, is an entry or a JournalCorrupt."""
    for item in (value, fields):
        with contextlib.suppress(JournalCorrupt):
            decode_entry(cbor2.dumps(item))


@given(entries, st.data())
def test_a_changed_byte_is_journal_corrupt(entry: JournalEntry, data: st.DataObject) -> None:
    """One byte of an encoded entry changed: refused (the checksum covers every field)."""
    raw = bytearray(encode_entry(entry))
    at = data.draw(st.integers(0, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(JournalCorrupt):
        decode_entry(bytes(raw))


def test_an_entry_is_bounded() -> None:
    """Data past ENTRY_DATA is not encoded, and a long entry on the wire is refused unread."""
    with pytest.raises(ValueError, match="at most"):
        encode_entry(JournalEntry("l", 0, "m", bytes(ENTRY_DATA + 1)))
    with pytest.raises(JournalCorrupt, match="bytes"):
        decode_entry(bytes(ENTRY_DATA + 8192))


def trace_bytes(tmp: Path, steps: list[str], component: str = COMPONENT) -> bytes:
    """A log of one instance of ``component`` that called the tool ``step`` with each of
    ``steps``, answered ``answer STEP``."""
    path = tmp / f"log-{len(list(tmp.iterdir()))}.trace"
    writer = TraceWriter(path, {})
    writer.append({"k": "instance", "i": 1, "component": component, "path": "<bytes>",
                   "size": 1, "budget": {}, "policy": {}})  # fmt: skip
    for s, step in enumerate(steps, 1):
        writer.append({"k": "import", "i": 1, "s": s, "if": TOOLS, "fn": "call",
                       "args": [step, b"{}"], "res": f"answer {step}", "out": "ok", "fuel": 0})  # fmt: skip
    writer.close()
    return path.read_bytes()


def pieces(log: str, message: str, data: bytes, cuts: list[int]) -> list[JournalEntry]:
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [
        JournalEntry(log, n, message, data[a:b])
        for n, (a, b) in enumerate(itertools.pairwise(bounds))
    ]


@given(st.lists(st.integers(0, 10_000), max_size=6), st.randoms())
def test_a_log_cut_anywhere_and_shuffled_answers_its_calls(
    tmp_path_factory: pytest.TempPathFactory, cuts: list[int], rnd: Any
) -> None:
    """Entries in any order and cut at any byte make the log; its answers come first, then live."""
    tmp = tmp_path_factory.mktemp("log")
    got = pieces("l1", "m", trace_bytes(tmp, ["a", "b"]), cuts)
    rnd.shuffle(got)
    recovered = assemble(got, "m", COMPONENT, tmp)
    answers = recovered.answers
    assert answers is not None and recovered.imports == 2
    for step in ("a", "b"):
        assert answers(None, STEP, [step, b"{}"], lambda: "live") == f"answer {step}"  # type: ignore[arg-type]
    assert answers(None, STEP, ["c", b"{}"], lambda: "live") == "live"  # type: ignore[arg-type]
    assert list(tmp.glob("read-*")) == []


def test_the_longest_log_wins(tmp_path: Path) -> None:
    """Two runs' logs of one message: the one with more answers is taken (a re-run's)."""
    first = pieces("first", "m", trace_bytes(tmp_path, ["a"]), [])
    again = pieces("again", "m", trace_bytes(tmp_path, ["a", "b"]), [100])
    recovered = assemble([*again, *first, *again[:1]], "m", COMPONENT, tmp_path)
    assert recovered.imports == 2 and recovered.logs == 2


def test_a_log_that_is_not_this_message_diverges(tmp_path: Path) -> None:
    """The guest asks what the log does not hold while an answer is unused: NondeterminismError."""
    recovered = assemble(
        pieces("l", "m", trace_bytes(tmp_path, ["x"]), []), "m", COMPONENT, tmp_path
    )
    assert recovered.answers is not None
    with pytest.raises(NondeterminismError):
        recovered.answers(None, STEP, ["a", b"{}"], lambda: "live")  # type: ignore[arg-type]
    assert recovered.answers.divergence is not None


def test_another_builds_log_is_a_refusal(tmp_path: Path) -> None:
    """A log written by another component answers nothing and says why."""
    data = trace_bytes(tmp_path, ["a"], component="cd" * 32)
    recovered = assemble(pieces("l", "m", data, []), "m", COMPONENT, tmp_path)
    assert recovered.answers is None
    assert "cdcdcdcdcdcd" in recovered.refusal


@pytest.mark.parametrize(
    ("what", "make"),
    [
        ("gap", lambda good: good[:1] + good[2:]),
        ("of message", lambda good: [*good, JournalEntry("l", 9, "other", b"")]),
        ("two different", lambda good: [*good, JournalEntry("l", 0, "m", b"x")]),
        ("readable trace", lambda good: [JournalEntry("l", 0, "m", b"not a trace")]),
    ],
)
def test_a_damaged_journal_is_journal_corrupt(tmp_path: Path, what: str, make: Any) -> None:
    """A gap, another message's entry, a conflicting duplicate or garbage: JournalCorrupt."""
    good = pieces("l", "m", trace_bytes(tmp_path, ["a", "b"]), [50, 200])
    assert len(good) == 3
    with pytest.raises(JournalCorrupt, match=what):
        assemble(make(good), "m", COMPONENT, tmp_path)
