"""Run contexts and linked cancel scopes: a cancel or a deadline reaches everything beneath it."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Cancelled
from mighty.budget import (
    MAX_PROGRESS_TEXT,
    CancelScope,
    Progress,
    RunContext,
    current_context,
    using_context,
)

FAR = 10**9  # a deadline no test reaches


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[list[int]], list[int], list[float | None]]:
    """Scopes 0..n-1, each with up to two parents among the earlier ones, some cancelled,
    some with a (far) deadline."""
    n = draw(st.integers(1, 12))
    parents = [
        sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=2)))) if i else []
        for i in range(n)
    ]
    cancelled = draw(st.lists(st.integers(0, n - 1), max_size=n, unique=True))
    deadlines = [
        draw(st.one_of(st.none(), st.floats(FAR, 2 * FAR, allow_nan=False))) for _ in range(n)
    ]
    return parents, cancelled, deadlines


@given(trees())
@settings(max_examples=200, deadline=None)
def test_a_cancel_reaches_exactly_the_scopes_beneath_it(
    tree: tuple[list[list[int]], list[int], list[float | None]],
) -> None:
    """A scope is cancelled iff it or one of its ancestors was; its deadline is the earliest
    of its own and its ancestors'; reason and `by` come from the cancel that reached it."""
    parents, cancelled, deadlines = tree
    scopes: list[CancelScope] = []
    for i, linked in enumerate(parents):
        scopes.append(
            CancelScope.within(*(scopes[p] for p in linked), deadline=deadlines[i])
            if len(linked) != 1
            else CancelScope(deadline=deadlines[i], parent=scopes[linked[0]])
        )
    for i in cancelled:
        scopes[i].cancel(f"cancel {i}", by="supervisor")

    def ancestors(i: int) -> set[int]:
        found = {i}
        for p in parents[i]:
            found |= ancestors(p)
        return found

    for i, scope in enumerate(scopes):
        above = ancestors(i)
        assert scope.cancel_called == bool(above & set(cancelled))
        own = [deadlines[j] for j in above if deadlines[j] is not None]
        assert scope.deadline == (min(own) if own else None)  # type: ignore[type-var]
        if scope.cancel_called:
            assert scope.by == "supervisor"
            assert scope.reason in {f"cancel {j}" for j in above & set(cancelled)}


def test_a_parent_deadline_passing_cancels_the_child_by_deadline() -> None:
    """A child made under a parent whose deadline has passed is cancelled by the deadline."""
    parent = CancelScope(deadline=0.0)
    child = CancelScope(parent=parent, deadline=FAR)
    assert child.deadline == 0.0
    assert child.cancel_called and child.by == "deadline"
    error = child.error()
    assert isinstance(error, Cancelled) and error.by == "deadline"


def test_contexts_nest_and_carry_ids_depth_and_agent() -> None:
    """top() under a current context is its child; ids are unique; depth and agent carry."""
    outer = RunContext.top("message", agent="kv:1", timeout=FAR)
    assert outer.parent is None and outer.depth == 0 and current_context() is None
    with using_context(outer):
        inner = RunContext.top("run")
        assert current_context() is outer
    assert current_context() is None
    assert inner.parent == outer.id and inner.depth == 1 and inner.agent == "kv:1"
    assert inner.id != outer.id
    tool = inner.child("tool", id="x/t#1", timeout=5.0)
    assert tool.id == "x/t#1" and tool.parent == inner.id and tool.depth == 2
    remaining = tool.remaining()
    assert remaining is not None and remaining <= 5.0
    outer.stop("the asker went away")
    assert tool.cancelled and tool.cancel.reason == "the asker went away"
    with pytest.raises(Cancelled, match="the asker went away"):
        tool.check()


def test_a_callers_scope_and_the_context_both_reach_a_child() -> None:
    """A child given the caller's own cancel scope is cancelled by it, or by the context."""
    context = RunContext.top("run")
    own = CancelScope()
    child = context.child("run", cancel=own)
    own.cancel("the caller's")
    assert child.cancelled and not context.cancelled
    other = context.child("run", cancel=CancelScope())
    context.stop("the context's")
    assert other.cancelled and other.cancel.reason == "the context's"


@given(
    st.text(max_size=3000), st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False))
)
@settings(max_examples=100, deadline=None)
def test_progress_is_bounded_and_a_raising_listener_is_dropped(
    text: str, done: float | None
) -> None:
    """Progress text is cut to MAX_PROGRESS_TEXT; a listener that raises is not called again."""
    heard: list[Progress] = []
    ctx = RunContext.top("tool", on_progress=heard.append)
    ctx.progress(text, done=done)
    assert len(heard[0].message) <= MAX_PROGRESS_TEXT and heard[0].done == done
    calls = []

    def broken(report: Progress) -> None:
        calls.append(report)
        raise OSError("the pipe is gone")

    noisy = RunContext.top("tool", on_progress=broken)
    noisy.progress("a")
    noisy.progress("b")
    assert len(calls) == 1


def test_progress_refuses_numbers_that_are_not_finite() -> None:
    """done/total must be finite numbers."""
    ctx = RunContext.top("tool", on_progress=lambda report: None)
    with pytest.raises(ValueError, match="finite"):
        ctx.progress("x", done=float("nan"))
    with pytest.raises(ValueError, match="finite"):
        ctx.progress("x", total=True)  # type: ignore[arg-type]


def test_cancel_from_another_thread_is_seen() -> None:
    """A cancel from any thread is seen by a child on another."""
    context = RunContext.top("run")
    child = context.child("tool")
    seen = threading.Event()

    def watch() -> None:
        while not child.cancelled:
            pass
        seen.set()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    context.stop("from the main thread")
    assert seen.wait(30)
