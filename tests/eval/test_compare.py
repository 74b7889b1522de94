"""Comparators on plain outcomes: each passes and fails where it should; diffs stay bounded."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import BadInput
from mighty.eval import (
    Comparison,
    EmbeddingCache,
    Equal,
    Outcome,
    SemanticSimilarity,
    ToolCall,
    ToolCallSetEqual,
    bounded_diff,
    canonical_tool_args,
    make_comparator,
    register_comparator,
)
from mighty.eval._compare import MAX_DIFF_LINES, MAX_LINE

calls = st.lists(
    st.builds(
        ToolCall,
        st.sampled_from(["search", "weather", "ask kv:1"]),
        st.text(max_size=8).map(lambda t: json.dumps({"q": t}, sort_keys=True)),
    ),
    max_size=12,
)


def outcome(calls: Sequence[ToolCall] = (), value: object = None, stdout: str = "") -> Outcome:
    return Outcome(
        results=[{"fn": "run", "ok": True, "value": value}], stdout=stdout, tool_calls=list(calls)
    )


@given(calls, st.randoms())
def test_tool_calls_ignore_order(made: list[ToolCall], rnd: object) -> None:
    """Any reordering of the same calls is the same multiset."""
    shuffled = list(made)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert ToolCallSetEqual().compare(outcome(made), outcome(shuffled)).ok


@given(calls, st.data())
def test_tool_calls_count_duplicates(made: list[ToolCall], data: st.DataObject) -> None:
    """A call made once more, or once less, is a difference that names the call."""
    extra = data.draw(st.sampled_from(made)) if made else ToolCall("search", "{}")
    more = ToolCallSetEqual().compare(outcome(made), outcome([*made, extra]))
    assert not more.ok
    assert "1 unexpected" in more.summary
    assert str(extra) in more.diff
    if made:
        fewer = ToolCallSetEqual().compare(outcome(made), outcome(made[1:]))
        assert not fewer.ok
        assert "1 missing" in fewer.summary


PARAMS = [
    {"name": "origin", "kind": "POSITIONAL_OR_KEYWORD"},
    {"name": "destination", "kind": "POSITIONAL_OR_KEYWORD"},
]


@given(st.text(max_size=10), st.text(max_size=10), st.booleans())
def test_canonical_args_bind_positionals(a: str, b: str, swap: bool) -> None:
    """f(a, b), f(origin=a, destination=b) and either key order are one canonical call."""
    positional = json.dumps({"args": [a, b], "kwargs": {}}).encode()
    kwargs = {"destination": b, "origin": a} if swap else {"origin": a, "destination": b}
    keyword = json.dumps({"args": [], "kwargs": kwargs}).encode()
    assert canonical_tool_args(positional, PARAMS) == canonical_tool_args(keyword, PARAMS)
    assert canonical_tool_args(positional, PARAMS) != canonical_tool_args(
        json.dumps({"args": [a, b + "x"], "kwargs": {}}).encode(), PARAMS
    )


def test_equal_on_each_output() -> None:
    """Equal passes on the same value and fails with a diff naming both sides."""
    base = Outcome(results=[{"fn": "f", "ok": True, "value": {"a": 1}}], stdout="hi\n")
    same = Outcome(results=[{"fn": "f", "ok": True, "value": {"a": 1}}], stdout="hi\n")
    other = Outcome(results=[{"fn": "f", "ok": True, "value": {"a": 2}}], stdout="ho\n")
    assert Equal().compare(base, same).ok
    failed = Equal().compare(base, other)
    assert not failed.ok
    assert '- "a": 1' in failed.diff
    assert '+ "a": 2' in failed.diff
    assert Equal(on="stdout").compare(base, same).ok
    assert not Equal(on="stdout").compare(base, other).ok
    with pytest.raises(BadInput, match="on must be one of"):
        Equal(on="fuel")


@given(st.lists(st.text(max_size=400), max_size=200), st.lists(st.text(max_size=400), max_size=200))
def test_diffs_are_bounded(a: list[str], b: list[str]) -> None:
    """However large the texts, a diff has at most MAX_DIFF_LINES (+1) short lines."""
    diff = bounded_diff("\n".join(a), "\n".join(b))
    lines = diff.splitlines()
    assert len(lines) <= MAX_DIFF_LINES + 1
    assert all(len(line) <= MAX_LINE + 40 for line in lines)


def words(texts: Sequence[str]) -> list[list[float]]:
    """A bag-of-letters embedding: a real function of the text, for the pluggable path."""
    return [[float(t.count(c)) for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts]


def test_semantic_with_a_pluggable_embedding_and_cache() -> None:
    """A custom embedding function decides; each distinct text is embedded once."""
    seen: list[str] = []

    def embed(texts: Sequence[str]) -> list[list[float]]:
        seen.extend(texts)
        return words(texts)

    cache = EmbeddingCache(embed)
    judge = SemanticSimilarity(0.9, embed=embed, cache=cache)
    base = outcome(value="abc abc")
    assert judge.compare(base, outcome(value="cab cab")).ok  # same letters
    assert not judge.compare(base, outcome(value="xyz")).ok
    assert judge.compare(base, outcome(value="bca")).ok
    assert seen == ["abc abc", "cab cab", "xyz", "bca"]  # the baseline once
    assert (cache.hits, cache.misses) == (2, 4)


@pytest.mark.parametrize("threshold", [-0.1, 1.5, float("nan"), "high", True])
def test_threshold_outside_unit_interval_is_refused(threshold: object) -> None:
    """A threshold that is not a number in [0, 1] is BadInput."""
    with pytest.raises(BadInput, match="threshold"):
        SemanticSimilarity(threshold, embed=words)  # type: ignore[arg-type]


class FirstWord:
    """A user's comparator: the results start with the same word."""

    def __init__(self, on: str = "result") -> None:
        self.name = "first-word"
        self.on = on

    def compare(self, expected: Outcome, got: Outcome) -> Comparison:
        a, b = expected.text(self.on).split()[:1], got.text(self.on).split()[:1]
        return Comparison(self.name, a == b, f"{a} vs {b}")


def test_registering_a_comparator() -> None:
    """A registered factory is what a suite file's name makes; unknown names are refused."""
    register_comparator("first-word", FirstWord)
    made = make_comparator("first-word", {"on": "result"})
    assert made.compare(outcome(value="Sunny today"), outcome(value="Sunny later")).ok
    with pytest.raises(BadInput, match="unknown comparator 'nope'"):
        make_comparator("nope", {})
    with pytest.raises(BadInput, match="comparator 'equal'"):
        make_comparator("equal", {"bogus": 1})
