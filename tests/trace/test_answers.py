"""TraceAnswers, the policy that answers a different build's imports from a trace, by key."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.gate import Binding
from mighty.trace import HandleRef, NondeterminismError, TraceAnswers

CLOCK = Binding("wasi:clocks/wall-clock", "now", lambda ctx: None)
RANDOM = Binding("wasi:random/random", "get-random-bytes", lambda ctx, n: None)


def records(calls: list[tuple[Binding, list[Any]]]) -> list[dict[str, Any]]:
    """Recorded import records, each answered with its own position."""
    return [
        {"k": "import", "i": 1, "s": step, "if": b.interface, "fn": b.name, "args": args,
         "res": f"answer {step}", "out": "ok", "fuel": 0}
        for step, (b, args) in enumerate(calls, 1)
    ]  # fmt: skip


recorded_calls = st.lists(
    st.one_of(
        st.just((CLOCK, [])),
        st.integers(1, 3).map(lambda n: (RANDOM, [n])),
    ),
    max_size=15,
)


def live(result: str) -> Any:
    return lambda: result


@given(recorded_calls, st.randoms())
def test_any_order_gets_each_keys_answers_in_recorded_order(
    recorded: list[tuple[Binding, list[Any]]], rnd: Any
) -> None:
    """A member making the same calls in any order gets, per key, the n-th recorded answer."""
    answers = TraceAnswers(records(recorded), instance=1)
    order = list(recorded)
    rnd.shuffle(order)
    expected: dict[str, list[str]] = {}
    for step, (b, args) in enumerate(recorded, 1):
        expected.setdefault(repr((b.name, args)), []).append(f"answer {step}")
    for b, args in order:
        got = answers(None, b, args, live("live"))  # type: ignore[arg-type]
        assert got == expected[repr((b.name, args))].pop(0)
    assert all(a.source == "trace" for a in answers.calls)
    assert answers.divergence is None
    assert answers.live_from is None


@given(recorded_calls)
def test_one_call_too_many_diverges_when_strict(recorded: list[tuple[Binding, list[Any]]]) -> None:
    """A call past its key's recorded count is a NondeterminismError naming what the trace has."""
    answers = TraceAnswers(records(recorded), instance=1, policy="strict")
    for b, args in recorded:
        answers(None, b, args, live("live"))  # type: ignore[arg-type]
    with pytest.raises(NondeterminismError) as caught:
        answers(None, CLOCK, [], live("live"))  # type: ignore[arg-type]
    assert answers.divergence is caught.value
    assert "wasi:clocks/wall-clock#now" in caught.value.message
    assert "after the last recorded import" in caught.value.message


@given(recorded_calls, st.integers(0, 15))
def test_live_from_the_first_mismatch_on(
    recorded: list[tuple[Binding, list[Any]]], cut: int
) -> None:
    """Live: the first unmatched call and every later one, even a matching one, go live."""
    answers = TraceAnswers(records(recorded), instance=1, policy="live")
    made = recorded[:cut]
    for b, args in made:
        answers(None, b, args, live("live"))  # type: ignore[arg-type]
    assert answers(None, RANDOM, [99], live("real")) == "real"  # never recorded
    for b, args in recorded[cut:]:
        assert answers(None, b, args, live("real")) == "real"
    assert answers.live_from is not None
    assert answers.live_from.index == len(made) + 1
    sources = Counter(a.source for a in answers.calls)
    assert sources == Counter({"trace": len(made), "live": 1 + len(recorded[cut:])})


def test_mismatch_names_the_recorded_call_of_that_function() -> None:
    """The divergence shows the earliest unused recorded call of the same function."""
    answers = TraceAnswers(records([(RANDOM, [2]), (CLOCK, [])]), instance=3)
    with pytest.raises(NondeterminismError, match=r"instance 3 step 1: the trace has "
                       r"wasi:random/random#get-random-bytes\(2\), the guest called "
                       r"wasi:random/random#get-random-bytes\(7\)"):  # fmt: skip
        answers(None, RANDOM, [7], live("x"))  # type: ignore[arg-type]


def test_policy_is_checked() -> None:
    """Only strict, live and resume exist."""
    with pytest.raises(ValueError, match="policy"):
        TraceAnswers([], instance=1, policy="lenient")  # type: ignore[arg-type]


def test_local_imports_are_answered_by_the_caller_whatever_the_trace() -> None:
    """A `local` import (an agent's log line) never diverges and never consumes the trace."""
    log = Binding("mighty:agent/host", "log", lambda ctx, level, text: None)
    lines: list[list[Any]] = []
    answers = TraceAnswers(
        records([(CLOCK, [])]), instance=1, local={(log.interface, log.name): lines.append}
    )
    assert answers(None, log, ["info", "one more line"], live("live")) is None  # type: ignore[arg-type]
    assert answers(None, CLOCK, [], live("live")) == "answer 1"  # type: ignore[arg-type]
    assert lines == [["info", "one more line"]]
    assert [a.source for a in answers.calls] == ["own", "trace"]


@given(recorded_calls, st.randoms())
def test_resume_goes_live_once_the_log_is_used_up(
    recorded: list[tuple[Binding, list[Any]]], rnd: Any
) -> None:
    """Resume: a guest that retraces the whole log (in any order) goes live at the next import,
    as a recovered message does at its crash point."""
    answers = TraceAnswers(records(recorded), instance=1, policy="resume")
    order = list(recorded)
    rnd.shuffle(order)
    for b, args in order:
        assert answers(None, b, args, live("real")) != "real"  # type: ignore[arg-type]
    assert answers(None, RANDOM, [99], live("real")) == "real"  # type: ignore[arg-type]
    assert answers.live_from is not None and answers.divergence is None


@given(recorded_calls.filter(bool), st.data())
def test_resume_diverges_when_the_guest_leaves_the_log_early(
    recorded: list[tuple[Binding, list[Any]]], data: st.DataObject
) -> None:
    """Resume: an import the log cannot answer while a logged one is still unused is the
    strict divergence, naming the unused record; nothing goes live."""
    cut = data.draw(st.integers(0, len(recorded) - 1))
    answers = TraceAnswers(records(recorded), instance=1, policy="resume")
    for b, args in recorded[:cut]:
        answers(None, b, args, live("real"))  # type: ignore[arg-type]
    with pytest.raises(NondeterminismError) as caught:
        answers(None, RANDOM, [99], live("real"))  # type: ignore[arg-type]
    assert answers.divergence is caught.value
    left = [step for step, (b, _) in enumerate(recorded, 1) if step > cut]
    same = [step for step in left if recorded[step - 1][0] is RANDOM]
    assert caught.value.step == (same or left)[0]  # the first unused, of that function if any
    assert answers.live_from is None


def test_resume_does_not_wait_for_imports_that_always_run_for_real() -> None:
    """Resume: the guest's own stdout (get-stdout and writes to that stream), passthrough and
    local imports are in the log but never answered from it, so they do not hold live back;
    a call on a resource a counted import returned does."""
    stdout = Binding("wasi:cli/stdout", "get-stdout", lambda ctx: None)
    write = Binding("wasi:io/streams", "[method]output-stream.blocking-write-and-flush",
                    lambda ctx, s, b: None)  # fmt: skip
    open_ = Binding("wasi:filesystem/types", "[method]descriptor.open-at", lambda ctx: None)
    read = Binding("wasi:filesystem/types", "[method]descriptor.read", lambda ctx, d: None)
    out = HandleRef("wasi:io/streams", "output-stream", 7)
    fd = HandleRef("wasi:filesystem/types", "descriptor", 9)
    log = [
        {"k": "import", "i": 1, "s": 1, "if": stdout.interface, "fn": stdout.name, "args": [],
         "res": out, "out": "ok", "fuel": 0},
        {"k": "import", "i": 1, "s": 2, "if": write.interface, "fn": write.name,
         "args": [out, b"hi"], "res": None, "out": "ok", "fuel": 0},
        {"k": "import", "i": 1, "s": 3, "if": CLOCK.interface, "fn": CLOCK.name, "args": [],
         "res": "answer 3", "out": "ok", "fuel": 0},
    ]  # fmt: skip
    answers = TraceAnswers(log, instance=1, policy="resume")
    assert answers(None, CLOCK, [], live("real")) == "answer 3"  # type: ignore[arg-type]
    assert answers(None, RANDOM, [1], live("real")) == "real"  # type: ignore[arg-type]
    assert answers.divergence is None
    counted = [
        {"k": "import", "i": 1, "s": 1, "if": open_.interface, "fn": open_.name, "args": [],
         "res": fd, "out": "ok", "fuel": 0},
        {"k": "import", "i": 1, "s": 2, "if": read.interface, "fn": read.name, "args": [fd],
         "res": b"data", "out": "ok", "fuel": 0},
    ]  # fmt: skip
    answers = TraceAnswers(counted[1:], instance=1, policy="resume")  # its maker not logged
    assert answers(None, RANDOM, [1], live("real")) == "real"  # type: ignore[arg-type]
    answers = TraceAnswers(counted, instance=1, policy="resume")
    with pytest.raises(NondeterminismError, match="step 1"):
        answers(None, RANDOM, [1], live("real"))  # type: ignore[arg-type]
