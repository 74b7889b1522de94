"""Hypothesis tests of ``LineSplitter``, the bounded line framing of the MCP stdio transport:
chunking never changes the lines, a line over the limit ends the stream, and what it holds
stays bounded."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from mighty.capabilities._mcp_client import LineSplitter

# Short lines over a tiny alphabet: newlines are frequent, so limits and chunk edges are hit.
_LINE = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"a"))
_STREAM = st.lists(st.one_of(_LINE, st.just(b"\n"), st.binary(max_size=12)), max_size=20).map(
    b"".join
)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length, sorted, deduplicated)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _feed_all(limit: int, chunks: list[bytes]) -> tuple[list[bytes], bool, int]:
    """Lines returned, whether ``over`` was set, and the most bytes held after any feed."""
    splitter = LineSplitter(limit)
    lines: list[bytes] = []
    most = 0
    for chunk in chunks:
        lines += splitter.feed(chunk)
        most = max(most, len(splitter._held))
    return lines, splitter.over, most


def _expected(data: bytes, limit: int) -> tuple[list[bytes], bool]:
    """The reference: split the whole stream at once, stop at the first line over ``limit``."""
    *complete, tail = data.split(b"\n")
    out: list[bytes] = []
    for line in complete:
        if len(line) > limit:
            return out, True
        out.append(line)
    return out, len(tail) > limit


@given(
    _STREAM, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), st.integers(1, 48)
)
def test_any_chunking_gives_the_whole_streams_lines(
    data: bytes, cuts: list[int], limit: int
) -> None:
    """Feeding a stream in any chunks returns exactly the lines of splitting it whole."""
    lines, over, _ = _feed_all(limit, _chunks(data, cuts))
    assert (lines, over) == _expected(data, limit)


@given(
    _STREAM, st.lists(st.integers(min_value=0, max_value=10_000), max_size=12), st.integers(1, 48)
)
def test_held_bytes_stay_within_the_limit(data: bytes, cuts: list[int], limit: int) -> None:
    """An unfinished line is held only while it fits: never more than ``limit + 1`` bytes."""
    _, _, most = _feed_all(limit, _chunks(data, cuts))
    assert most <= limit + 1


@given(
    st.lists(_LINE, max_size=5),
    st.integers(1, 32),
    st.integers(1, 20),
    _STREAM,
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_a_line_over_the_limit_ends_the_stream(
    before: list[bytes], limit: int, excess: int, after: bytes, cuts: list[int]
) -> None:
    """A line longer than the limit sets ``over``; the lines before it come back, nothing after."""
    before = [line[:limit] for line in before]
    data = b"".join(line + b"\n" for line in before) + b"y" * (limit + excess) + b"\n" + after
    lines, over, _ = _feed_all(limit, _chunks(data, cuts))
    assert over
    assert lines == before


@given(st.integers(1, 64), st.integers(1, 200))
def test_an_endless_line_is_refused_while_it_arrives(limit: int, size: int) -> None:
    """A line that never ends is refused as soon as it passes the limit, byte by byte too."""
    splitter = LineSplitter(limit)
    for _ in range(limit + size):
        assert splitter.feed(b"z") == []
    assert splitter.over
    assert len(splitter._held) == 0
    assert splitter.feed(b"\nfine\n") == []
