"""Comparators: what a member produced against the baseline, judged one way each.

A comparator is any object with a ``name`` and ``compare(expected, got) -> Comparison``
(:class:`Comparator`); nothing else is required, so your own is a small class. To let suite
files name it, register a factory: ``register_comparator("mine", Mine)`` makes
``[[compare]] name = "mine"`` (its other keys are passed as keyword arguments).

The three built in: :class:`Equal` (exact, on the result value, stdout, stderr or the messages
sent), :class:`SemanticSimilarity` (cosine similarity of sentence embeddings of a text output,
at least a threshold) and :class:`ToolCallSetEqual` (the multiset of tool calls with their
canonical arguments, order ignored). Fuel and time are never compared.
"""

from __future__ import annotations

import difflib
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from mighty._errors import BadInput
from mighty.eval._embed import EmbeddingCache, EmbedFunction, default_cache
from mighty.eval._outcome import Outcome, jsonable

__all__ = [
    "COMPARATORS",
    "Comparator",
    "Comparison",
    "Equal",
    "SemanticSimilarity",
    "ToolCallSetEqual",
    "bounded_diff",
    "make_comparator",
    "register_comparator",
]

MAX_DIFF_LINES = 40
"""Lines of a diff shown; the rest are counted."""
MAX_LINE = 160
"""Characters of one diff line shown."""
MAX_TEXT = 2000
"""Characters of an expected or got text kept as evidence."""
_ON = ("result", "stdout", "stderr", "messages")


@dataclass(frozen=True, slots=True)
class Comparison:
    """One comparator's judgement: ``ok``, a one-line ``summary``, and bounded evidence."""

    comparator: str
    ok: bool
    summary: str
    expected: str = ""
    got: str = ""
    diff: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "comparator": self.comparator,
            "ok": self.ok,
            "summary": self.summary,
            "expected": self.expected,
            "got": self.got,
            "diff": self.diff,
        }


@runtime_checkable
class Comparator(Protocol):
    """What a comparator is: a name and a judgement of ``got`` against ``expected``."""

    name: str

    def compare(self, expected: Outcome, got: Outcome) -> Comparison: ...


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text)} characters in all]"


def bounded_diff(expected: str, got: str, *, max_lines: int = MAX_DIFF_LINES) -> str:
    """A unified diff of two texts, at most ``max_lines`` lines of at most ``MAX_LINE``
    characters each (the rest counted), control characters escaped."""
    lines = list(
        difflib.unified_diff(
            expected.splitlines()[:5000],
            got.splitlines()[:5000],
            "expected",
            "got",
            lineterm="",
            n=2,
        )
    )
    shown = [_cut(_printable(line), MAX_LINE) for line in lines[:max_lines]]
    if len(lines) > max_lines:
        shown.append(f"... {len(lines) - max_lines} more diff lines")
    return "\n".join(shown)


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


def _pretty(value: Any) -> str:
    return json.dumps(jsonable(value), sort_keys=True, indent=1, ensure_ascii=False)


class Equal:
    """Exact equality of one output: ``on`` is ``result`` (every export's value or failure),
    ``stdout``, ``stderr`` or ``messages`` (what an agent sent, in order)."""

    def __init__(self, on: str = "result") -> None:
        if on not in _ON:
            raise BadInput(f"Equal: on must be one of {', '.join(_ON)}, got {on!r}")
        self.on = on
        self.name = f"equal({on})"

    def _side(self, outcome: Outcome) -> tuple[Any, str]:
        if self.on in ("stdout", "stderr"):
            text = outcome.text(self.on)
            return text, text
        value = outcome.messages if self.on == "messages" else outcome.value()
        return jsonable(value), _pretty(value)

    def compare(self, expected: Outcome, got: Outcome) -> Comparison:
        want, want_text = self._side(expected)
        have, have_text = self._side(got)
        if want == have:
            return Comparison(self.name, True, f"{self.on} equal")
        return Comparison(
            self.name,
            False,
            f"{self.on} differs",
            _cut(want_text, MAX_TEXT),
            _cut(have_text, MAX_TEXT),
            bounded_diff(want_text, have_text),
        )


class SemanticSimilarity:
    """Cosine similarity of sentence embeddings of a text output, at least ``threshold``.

    ``on`` is ``result`` (a string value as it is, other values as JSON), ``stdout`` or
    ``stderr``. ``embed`` maps texts to vectors (default: all-MiniLM-L6-v2, offline, from the
    ``eval`` extra); ``cache`` keeps vectors by text hash (default: one per process).
    """

    def __init__(
        self,
        threshold: float = 0.8,
        *,
        on: str = "result",
        embed: EmbedFunction | None = None,
        cache: EmbeddingCache | None = None,
    ) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise BadInput(f"SemanticSimilarity: threshold must be a number, got {threshold!r}")
        if not (0.0 <= float(threshold) <= 1.0):
            raise BadInput(f"SemanticSimilarity: threshold must be in [0, 1], got {threshold}")
        if on not in ("result", "stdout", "stderr"):
            raise BadInput(f"SemanticSimilarity: on must be result, stdout or stderr, got {on!r}")
        self.threshold = float(threshold)
        self.on = on
        self.cache = cache or default_cache(embed)
        self.name = f"semantic({on}>={self.threshold:g})"

    def similarity(self, a: str, b: str) -> float:
        """Cosine similarity of the embeddings of ``a`` and ``b`` (1.0 for equal texts)."""
        if a == b:
            return 1.0
        va, vb = self.cache.embed([a, b])
        dot = sum(x * y for x, y in zip(va, vb, strict=True))
        norm = math.sqrt(sum(x * x for x in va)) * math.sqrt(sum(y * y for y in vb))
        return dot / norm if norm else 0.0

    def compare(self, expected: Outcome, got: Outcome) -> Comparison:
        want, have = expected.text(self.on), got.text(self.on)
        score = self.similarity(want, have)
        ok = score >= self.threshold
        relation = ">=" if ok else "<"
        summary = f"similarity {score:.3f} {relation} {self.threshold:g}"
        if ok:
            return Comparison(self.name, True, summary)
        return Comparison(self.name, False, summary, _cut(want, MAX_TEXT), _cut(have, MAX_TEXT), "")


class ToolCallSetEqual:
    """The multiset of tool calls (name and canonical arguments) is the same, order ignored.

    A call made twice must be made twice: duplicates count."""

    name = "tool-calls"

    def compare(self, expected: Outcome, got: Outcome) -> Comparison:
        want, have = Counter(expected.tool_calls), Counter(got.tool_calls)
        if want == have:
            return Comparison(self.name, True, f"{sum(want.values())} tool call(s), same set")
        missing = sorted((want - have).elements())
        extra = sorted((have - want).elements())
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing")
        if extra:
            parts.append(f"{len(extra)} unexpected")
        lines = [f"- {c}" for c in missing] + [f"+ {c}" for c in extra]
        diff = "\n".join(_cut(_printable(line), MAX_LINE) for line in lines[:MAX_DIFF_LINES])
        if len(lines) > MAX_DIFF_LINES:
            diff += f"\n... {len(lines) - MAX_DIFF_LINES} more"
        return Comparison(
            self.name,
            False,
            "tool calls differ: " + ", ".join(parts),
            _cut("\n".join(map(str, sorted(want.elements()))), MAX_TEXT),
            _cut("\n".join(map(str, sorted(have.elements()))), MAX_TEXT),
            diff,
        )


ComparatorFactory = Callable[..., Comparator]

COMPARATORS: dict[str, ComparatorFactory] = {
    "equal": Equal,
    "semantic": SemanticSimilarity,
    "tool-calls": ToolCallSetEqual,
}
"""Comparator names a suite file may use, and their factories."""


def register_comparator(name: str, factory: ComparatorFactory) -> None:
    """Let suite files name ``factory`` as ``[[compare]] name = NAME`` (keys: its kwargs)."""
    if not name or not isinstance(name, str):
        raise BadInput(f"a comparator name must be a non-empty str, got {name!r}")
    COMPARATORS[name] = factory


def make_comparator(name: str, options: dict[str, Any]) -> Comparator:
    """The comparator a suite file names, or ``BadInput`` saying what is wrong with it."""
    factory = COMPARATORS.get(name)
    if factory is None:
        raise BadInput(f"unknown comparator {name!r} (known: {', '.join(sorted(COMPARATORS))})")
    try:
        comparator = factory(**options)
    except TypeError as exc:
        raise BadInput(f"comparator {name!r}: {exc}") from None
    if not isinstance(comparator, Comparator):
        raise BadInput(f"comparator {name!r} has no name and compare()")
    return comparator
