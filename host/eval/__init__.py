"""Replay-driven evaluation: recorded cases x members under test x comparators (``mty eval``).

A :class:`Case` is a recorded trace (an export call, an agent exchange, a code-mode run); a
:class:`Member` is a thing under test (another component build, or another program and tool
set); a :class:`Suite` runs every cell in parallel workers, answering each member's imports
from the case's trace while they match (``strict``/``live`` at the first that does not), and
judges what it produced with comparators (:class:`Equal`, :class:`SemanticSimilarity`,
:class:`ToolCallSetEqual`, or your own :class:`Comparator`). See docs/eval.md.
"""

from mighty.eval._case import Case, CaseData, Member, load_case
from mighty.eval._compare import (
    COMPARATORS,
    Comparator,
    Comparison,
    Equal,
    SemanticSimilarity,
    ToolCallSetEqual,
    bounded_diff,
    make_comparator,
    register_comparator,
)
from mighty.eval._embed import EmbeddingCache, EmbedFunction, ModelUnavailable, minilm
from mighty.eval._file import SuiteFileError, load_suite, load_tools
from mighty.eval._outcome import Outcome, ToolCall, canonical_tool_args
from mighty.eval._suite import CellResult, Suite, SuiteReport, Verdict, evidence_text

__all__ = [
    "COMPARATORS",
    "Case",
    "CaseData",
    "CellResult",
    "Comparator",
    "Comparison",
    "EmbedFunction",
    "EmbeddingCache",
    "Equal",
    "Member",
    "ModelUnavailable",
    "Outcome",
    "SemanticSimilarity",
    "Suite",
    "SuiteFileError",
    "SuiteReport",
    "ToolCall",
    "ToolCallSetEqual",
    "Verdict",
    "bounded_diff",
    "canonical_tool_args",
    "evidence_text",
    "load_case",
    "load_suite",
    "load_tools",
    "make_comparator",
    "minilm",
    "register_comparator",
]
