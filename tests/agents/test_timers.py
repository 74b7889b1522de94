"""Durable timers (mighty.agents._timers): a send later, once or on a period, from the host or a
guest, that survives a restart of the runtime; every bound refused with a typed error."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component
from mighty.agents import AgentProcess, AgentType, Grants, Runtime
from mighty.agents._timers import (
    MAX_DELAY,
    MAX_TIMERS_PER_SENDER,
    MIN_EVERY,
    BadTimer,
    check_timing,
)
from mighty.agents.hosting import SnapshotStore
from tests.agents.conftest import GUESTS, ROOT, _build_path

WAIT = 120.0


def _until(check: Callable[[], bool], what: str) -> None:
    """Wait for ``check()`` (a bounded poll for an event, not a timing assertion)."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """tests/agents/guests/timed.py, built once."""
    return Component.load(_build_path("timed", tmp_path_factory.mktemp("timed"), GUESTS))


def test_a_host_timer_sends_once_and_is_gone(kvstore: Component) -> None:
    """send_after: the message arrives (as from the host), the timer is no longer pending."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", kvstore))
        kv = rt.spawn("kv", name="kv")
        timer = rt.send_after(0.01, "kv", "put", {"key": "a", "value": 7})
        assert isinstance(timer, int)
        _until(lambda: rt.ask(kv, "get", {"key": "a"}) == {"value": 7}, "the timer's put")
        _until(lambda: rt.timers() == [], "the timer done")
        assert rt.cancel_timer(timer) is False


def test_a_cancelled_timer_never_fires(kvstore: Component) -> None:
    """A timer cancelled before it is due sends nothing; cancelling twice says so."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", kvstore))
        kv = rt.spawn("kv", name="kv")
        timer = rt.send_after(3600, kv, "put", {"key": "a", "value": 1})
        assert [t.id for t in rt.timers()] == [timer]
        assert rt.cancel_timer(timer) is True
        assert rt.cancel_timer(timer) is False
        assert rt.timers() == []
        assert rt.ask(kv, "size") == {"size": 0}


def test_a_guest_sets_a_periodic_timer_and_cancels_it(timed: Component) -> None:
    """A guest's send_after with every=: ticks keep coming to it until it cancels the timer;
    the timer is the guest's (sender), listed until then."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("timed", timed))
        agent = rt.spawn("timed")
        timer = rt.ask(agent, "start", {"delay": 0, "every": 0.02})
        assert [t.id for t in rt.timers(sender=agent)] == [timer]
        _until(lambda: rt.ask(agent, "count") >= 3, "three ticks")
        assert rt.ask(agent, "stop") is True
        assert rt.timers() == []
        settled = rt.ask(agent, "count")
        assert rt.ask(agent, "stop") is False  # nothing pending
        # At most the one fire already under way when it was cancelled lands after.
        assert rt.ask(agent, "count") in (settled, settled + 1)


def test_a_guest_may_time_only_what_it_may_send(timed: Component, kvstore: Component) -> None:
    """A timer to a target the agent's grants do not cover is refused, as the send would be;
    a bad delay is refused with the bound it broke."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", kvstore))
        rt.register(AgentType("timed", timed, grants=Grants(message=frozenset({"timed"}))))
        kv, agent = rt.spawn("kv"), rt.spawn("timed")
        refused = rt.ask(agent, "start_to", {"delay": 0, "to": kv})
        assert "may not message" in refused["refused"]
        bad = rt.ask(agent, "start_to", {"delay": -1, "to": agent})
        assert "delay must be within 0 and" in bad["refused"]
        assert rt.timers() == []


def test_a_timer_outlives_its_runtime(kvstore: Component, tmp_path: Path) -> None:
    """With a state_dir a timer is stored before send_after returns: the next runtime on the
    directory has it, and fires it when due (made due here while no runtime runs), into the
    durable agent it names."""
    state = tmp_path / "state"
    durable = AgentType("kv", kvstore, durable=True)
    with Runtime(workers=1, state_dir=state) as rt:
        rt.register(durable)
        kv = rt.spawn("kv")
        timer = rt.send_after(3600, kv, "put", {"key": "a", "value": 3})
        due = rt.timers()[0].due
    store = SnapshotStore(state)
    try:
        assert [row[0] for row in store.timers(10)] == [timer]
        store.timer_next(timer, time.time())  # it came due while no runtime ran
    finally:
        store.close()
    with Runtime(workers=1, state_dir=state) as rt:
        assert [t.id for t in rt.timers()] == [timer]
        assert rt.timers()[0].due < due
        rt.register(durable)
        _until(lambda: rt.ask(kv, "get", {"key": "a"}) == {"value": 3}, "the stored timer fired")
        _until(lambda: rt.timers() == [], "the timer done")
    store = SnapshotStore(state)
    try:
        assert store.timers(10) == []
        assert store.inbox_addresses() == []  # journaled with the timer's row, then handled
    finally:
        store.close()


def test_a_timer_to_a_missing_target_is_dropped_with_an_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A target that never appears: tried again for the grace period, then dropped (event)."""
    from mighty.agents import _timers

    monkeypatch.setattr(_timers, "NOPROC_GRACE", 0.0)  # dropped on the first miss
    with Runtime(workers=1) as rt:
        rt.send_after(0, "nobody", "put", None)
        _until(lambda: any(e.kind == "timer.dropped" for e in rt.events), "the drop")
        dropped = next(e for e in rt.events if e.kind == "timer.dropped")
        assert dropped.address == "nobody"
        assert "no target" in dropped.data["reason"]
        assert rt.timers() == []


def test_a_sender_has_a_bounded_number_of_timers(kvstore: Component) -> None:
    """The limit per sender is refused with a typed error; a cancel makes room again."""
    with Runtime(workers=1) as rt:
        ids = [rt.send_after(3600, "kv", "put") for _ in range(MAX_TIMERS_PER_SENDER)]
        with pytest.raises(BadTimer, match="pending already"):
            rt.send_after(3600, "kv", "put")
        assert rt.cancel_timer(ids[0])
        rt.send_after(3600, "kv", "put")
        assert len(rt.timers()) == MAX_TIMERS_PER_SENDER


numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)


@given(numbers, st.one_of(st.none(), numbers))
def test_timings_are_seconds_within_bounds_or_refused(delay: object, every: object) -> None:
    """A delay in [0, MAX_DELAY] and a period None or in [MIN_EVERY, MAX_DELAY] (numbers, not
    bools) are taken as floats; anything else is BadTimer."""

    def ok(value: object, low: float) -> bool:
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and low <= value <= MAX_DELAY
        )

    valid = ok(delay, 0.0) and (every is None or ok(every, MIN_EVERY))
    if valid:
        assert check_timing(delay, every) == (
            float(delay),  # type: ignore[arg-type]
            None if every is None else float(every),  # type: ignore[arg-type]
        )
    else:
        with pytest.raises(BadTimer):
            check_timing(delay, every)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e10),
            st.one_of(st.none(), st.floats(MIN_EVERY, MAX_DELAY)),
            st.text(min_size=1, max_size=20),
            st.text(min_size=1, max_size=20),
            st.text(min_size=1, max_size=20),
            st.binary(max_size=64),
        ),
        max_size=5,
    )
)
def test_stored_timers_read_back_as_written(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[float, float | None, str, str, str, bytes]],
) -> None:
    """Timer rows round-trip through the store; a fired one moves or goes."""
    store = SnapshotStore(tmp_path_factory.mktemp("timers"))
    try:
        ids = [store.timer_put(*row) for row in rows]
        assert store.timers(10) == [(i, *row) for i, row in zip(ids, rows, strict=True)]
        for timer_id in ids:
            store.timer_next(timer_id, None)
        assert store.timers(10) == []
    finally:
        store.close()


def test_damaged_or_too_many_timer_rows_are_refused(tmp_path: Path) -> None:
    """A row of the wrong type, or more rows than the limit, is SnapshotCorrupt, not a crash."""
    import sqlite3

    from mighty.agents import SnapshotCorrupt

    store = SnapshotStore(tmp_path)
    try:
        store.timer_put(1.0, None, "host", "kv", "put", b"")
        store.timer_put(2.0, None, "host", "kv", "put", b"")
        with pytest.raises(SnapshotCorrupt, match="over their bounds"):
            store.timers(1)
    finally:
        store.close()
    db = sqlite3.connect(tmp_path / "agents.sqlite3")
    db.execute("UPDATE timers SET due = 'soon' WHERE id = 1")
    db.commit()
    db.close()
    store = SnapshotStore(tmp_path)
    try:
        with pytest.raises(SnapshotCorrupt, match="damaged"):
            store.timers(10)
    finally:
        store.close()
    with Runtime(workers=1, state_dir=tmp_path) as rt:  # runs, and says why it has no timers
        assert rt.timers() == []
        [event] = [e for e in rt.events if e.kind == "timers.not_loaded"]
        assert "damaged" in event.data["reason"]
        assert isinstance(rt.send_after(3600, "kv", "put"), int)  # new ones are stored


plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)  # fmt: skip
requests = st.one_of(
    st.binary(max_size=48),  # not even CBOR, or CBOR of anything
    plain.map(cbor2.dumps),
    st.fixed_dictionaries(
        {},
        optional={
            "delay": plain,
            "to": plain,
            "name": plain,
            "body": plain,
            "every": plain,
            "id": plain,
        },
    ).map(cbor2.dumps),
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["after", "cancel", "later", ""]), requests)
def test_hostile_timer_requests_are_refused_never_raised(
    echo_runtime: tuple[Runtime, AgentProcess], name: str, body: bytes
) -> None:
    """Whatever a guest asks the timer address with: an Ok (a timer set only from a well-formed
    `after`, cancelled here again) or a `refused` error; never an exception into the host."""
    from mighty.abi import Err, Ok
    from mighty.agents._host import _timer_ask

    rt, process = echo_runtime
    answer = _timer_ask(rt, process, name, body)
    if isinstance(answer, Err):
        assert answer.value.case == "refused"
        assert rt.timers() == []
        return
    assert isinstance(answer, Ok)
    reply = cbor2.loads(answer.value["body"])
    if name == "after":
        assert [t.id for t in rt.timers()] == [reply]
        assert rt.cancel_timer(reply)
    else:
        assert name == "cancel" and reply is False
    assert rt.timers() == []


@pytest.fixture(scope="module")
def echo_runtime(wat: Callable[[str], bytes]) -> Iterator[tuple[Runtime, AgentProcess]]:
    """One runtime with an echo agent whose timers the hostile requests go through."""
    echo = Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    with Runtime(workers=1) as rt:
        rt.register(AgentType("echo", echo))
        yield rt, rt.process(rt.spawn("echo"))
