"""The agent mailbox: bounded FIFO, full policies, counters, close, pause, and thread safety."""

from __future__ import annotations

import threading
import time
from collections import deque

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mighty._errors import BadInput, HostError
from mighty.agents._mailbox import Mailbox, MailboxClosed, MailboxEmpty, MailboxFull


def test_fifo_order() -> None:
    """Envelopes come out in the order they went in."""
    box: Mailbox[int] = Mailbox(10)
    for i in range(10):
        assert box.put(i)
    assert [box.get_nowait() for _ in range(10)] == list(range(10))


def test_errors_are_host_errors_with_kinds() -> None:
    """Mailbox errors belong to the host family and carry stable kinds."""
    assert issubclass(MailboxFull, HostError)
    assert (MailboxFull.kind, MailboxEmpty.kind, MailboxClosed.kind) == (
        "mailbox_full",
        "mailbox_empty",
        "mailbox_closed",
    )


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 1, "on_full": "explode"}, "on_full"),
        ({"capacity": 1, "block_timeout": -1}, "block_timeout"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], fragment: str) -> None:
    """Nonsense construction arguments raise BadInput naming the argument."""
    with pytest.raises(BadInput, match=fragment):
        Mailbox(**kwargs)  # type: ignore[arg-type]


def test_fail_policy_raises_at_once_naming_capacity() -> None:
    """'fail' raises MailboxFull immediately when full, with the capacity in the message."""
    box: Mailbox[str] = Mailbox(2, on_full="fail")
    box.put("a")
    box.put("b")
    with pytest.raises(MailboxFull, match="capacity 2") as info:
        box.put("c")
    assert info.value.capacity == 2
    assert (box.accepted, box.rejected, box.dropped, len(box)) == (2, 1, 0, 2)


def test_drop_policy_returns_false_and_counts() -> None:
    """'drop' never raises: it returns False and counts the drop."""
    box: Mailbox[str] = Mailbox(1, on_full="drop")
    assert box.put("a")
    assert not box.put("b")
    assert not box.put("c", timeout=5)
    assert (box.accepted, box.dropped, box.rejected) == (1, 2, 0)
    assert box.get_nowait() == "a"


def test_block_policy_times_out_with_mailbox_full() -> None:
    """'block' waits the timeout, then raises MailboxFull and counts a rejection."""
    box: Mailbox[int] = Mailbox(1, on_full="block", block_timeout=0.05)
    box.put(1)
    started = time.monotonic()
    with pytest.raises(MailboxFull):
        box.put(2)
    assert time.monotonic() - started >= 0.04
    with pytest.raises(MailboxFull):
        box.put(3, timeout=0)
    assert (box.accepted, box.rejected) == (1, 2)


def test_block_policy_succeeds_when_a_consumer_frees_space() -> None:
    """A blocked put completes as soon as another thread takes an envelope."""
    box: Mailbox[int] = Mailbox(1, on_full="block", block_timeout=5.0)
    box.put(1)
    result: list[bool] = []
    producer = threading.Thread(target=lambda: result.append(box.put(2)))
    producer.start()
    time.sleep(0.05)  # let the producer block
    assert box.get(timeout=1) == 1
    producer.join(timeout=5)
    assert result == [True]
    assert box.get(timeout=1) == 2


@pytest.mark.timing
def test_injected_clock_decides_the_deadline() -> None:
    """A clock that jumps past the deadline ends a 100 s block at once."""
    readings = iter([0.0, 200.0])  # the deadline is set at 0, then the clock reads 200
    box: Mailbox[int] = Mailbox(1, block_timeout=100.0, clock=lambda: next(readings))
    box.put(1)
    with pytest.raises(MailboxFull, match="stayed full"):
        box.put(2)
    assert next(readings, None) is None  # both readings taken: the injected clock decided


def test_get_times_out_with_mailbox_empty() -> None:
    """get on an empty mailbox raises MailboxEmpty after its timeout; get_nowait at once."""
    box: Mailbox[int] = Mailbox(1)
    with pytest.raises(MailboxEmpty):
        box.get(timeout=0.02)
    with pytest.raises(MailboxEmpty):
        box.get_nowait()


def test_get_without_timeout_waits_for_a_put() -> None:
    """get() with no timeout waits until another thread puts."""
    box: Mailbox[str] = Mailbox(1)
    threading.Timer(0.05, lambda: box.put("late")).start()
    assert box.get() == "late"


def test_high_water_is_the_greatest_length() -> None:
    """high_water remembers the longest the mailbox has been."""
    box: Mailbox[int] = Mailbox(5)
    for i in range(3):
        box.put(i)
    box.get_nowait()
    box.get_nowait()
    box.put(9)
    assert (len(box), box.high_water) == (2, 3)


def test_close_refuses_puts_then_drains_then_raises() -> None:
    """After close, puts raise; gets hand out what is left, then raise MailboxClosed."""
    box: Mailbox[int] = Mailbox(3)
    box.put(1)
    box.put(2)
    box.close()
    box.close()  # idempotent
    assert box.closed
    with pytest.raises(MailboxClosed):
        box.put(3)
    assert box.get_nowait() == 1
    assert box.get(timeout=0.01) == 2
    with pytest.raises(MailboxClosed):
        box.get(timeout=1)
    with pytest.raises(MailboxClosed):
        box.get()


@pytest.mark.timing
def test_close_wakes_blocked_producers_and_consumers() -> None:
    """Threads waiting in put or get are released by close with MailboxClosed."""
    full: Mailbox[int] = Mailbox(1, block_timeout=10)
    full.put(0)
    empty: Mailbox[int] = Mailbox(1)
    errors: list[type[BaseException]] = []

    def attempt(call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except MailboxClosed as exc:
            errors.append(type(exc))

    threads = [
        threading.Thread(target=attempt, args=(lambda: full.put(1),)),
        threading.Thread(target=attempt, args=(lambda: empty.get(timeout=10),)),
        threading.Thread(target=attempt, args=(empty.get,)),
    ]
    for t in threads:
        t.start()
    time.sleep(0.05)  # most likely blocked by now; a close before they block is fine too
    full.close()
    empty.close()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)  # woken by close, not by their timeouts
    assert errors == [MailboxClosed] * 3


def test_drain_takes_everything_in_order_and_frees_space() -> None:
    """drain returns all envelopes oldest first and leaves room for new puts."""
    box: Mailbox[int] = Mailbox(3, on_full="fail")
    for i in range(3):
        box.put(i)
    assert box.drain() == [0, 1, 2]
    assert len(box) == 0
    assert box.put(3)
    box.close()
    assert box.drain() == [3]
    assert box.drain() == []


def test_pause_holds_gets_but_accepts_puts_within_capacity() -> None:
    """A paused mailbox takes puts up to capacity but gives nothing until resumed."""
    box: Mailbox[int] = Mailbox(2, on_full="fail")
    box.put(1)
    box.pause()
    assert box.paused
    box.put(2)
    with pytest.raises(MailboxFull):
        box.put(3)
    with pytest.raises(MailboxEmpty, match="paused"):
        box.get(timeout=0.02)
    with pytest.raises(MailboxEmpty):
        box.get_nowait()
    box.resume()
    assert [box.get_nowait(), box.get_nowait()] == [1, 2]


def test_resume_wakes_a_waiting_consumer() -> None:
    """A consumer waiting on a paused mailbox gets its envelope once resume is called."""
    box: Mailbox[str] = Mailbox(2)
    box.pause()
    box.put("held")
    got: list[str] = []
    consumer = threading.Thread(target=lambda: got.append(box.get(timeout=5)))
    consumer.start()
    time.sleep(0.05)
    assert got == []
    box.resume()
    consumer.join(timeout=5)
    assert got == ["held"]


def test_drain_works_while_paused() -> None:
    """drain hands over the held envelopes during a hot swap."""
    box: Mailbox[int] = Mailbox(4)
    box.pause()
    box.put(1)
    box.put(2)
    assert box.drain() == [1, 2]


def test_close_ends_a_pause_so_consumers_can_finish() -> None:
    """Closing a paused mailbox lets consumers drain the rest instead of hanging."""
    box: Mailbox[int] = Mailbox(2)
    box.pause()
    box.put(7)
    box.close()
    assert box.get(timeout=1) == 7
    with pytest.raises(MailboxClosed):
        box.get(timeout=1)


def test_a_hold_takes_effect_without_a_call_and_poke_wakes_a_waiting_consumer() -> None:
    """A hold check turned on holds consumers back from that instant (no call to the mailbox);
    turned off, ``poke`` wakes a consumer that waited through it."""
    held = [False]
    box: Mailbox[str] = Mailbox(2, hold=lambda: held[0])
    box.put("first")
    held[0] = True
    assert box.held and not box.paused and not box.ready() and not box.claim()
    with pytest.raises(MailboxEmpty, match="paused"):
        box.get_nowait()
    got: list[str] = []
    consumer = threading.Thread(target=lambda: got.append(box.get(timeout=30)))
    consumer.start()
    box.put("second")  # wakes the consumer, which finds the hold on and waits again
    held[0] = False
    box.poke()
    consumer.join(timeout=30)
    assert got == ["first"] and box.get_nowait() == "second"
    box.hold_while(None)
    held[0] = True
    assert not box.held


class MailboxModel(RuleBasedStateMachine):
    """Single-threaded, a Mailbox behaves like a bounded deque with closed and paused flags,
    and a hold that goes on and off without a call to the mailbox (a lease going stale)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.box: Mailbox[int] = Mailbox(4, on_full="fail", hold=lambda: self.hold)
        self.model: deque[int] = deque()
        self.closed = False
        self.paused = False
        self.next = 0
        self.accepted = 0
        self.rejected = 0
        self.high = 0

    @rule()
    def put(self) -> None:
        """Put the next number."""
        item = self.next
        self.next += 1
        if self.closed:
            with pytest.raises(MailboxClosed):
                self.box.put(item)
        elif len(self.model) >= 4:
            with pytest.raises(MailboxFull):
                self.box.put(item)
            self.rejected += 1
        else:
            assert self.box.put(item)
            self.model.append(item)
            self.accepted += 1
            self.high = max(self.high, len(self.model))

    @rule()
    def get(self) -> None:
        """Take one."""
        if (self.paused or self.hold) and not self.closed:
            with pytest.raises(MailboxEmpty):
                self.box.get_nowait()
        elif self.model:
            assert self.box.get_nowait() == self.model.popleft()
        elif self.closed:
            with pytest.raises(MailboxClosed):
                self.box.get_nowait()
        else:
            with pytest.raises(MailboxEmpty):
                self.box.get_nowait()

    @rule()
    def claim(self) -> None:
        """Accept and hand out at once (an ask run in place): only from an empty, open,
        unpaused mailbox, so that nothing queued is passed over; counted as accepted."""
        claimable = not self.model and not self.closed and not (self.paused or self.hold)
        assert self.box.claim() is claimable
        if claimable:
            self.next += 1
            self.accepted += 1
            self.high = max(self.high, 1)

    @rule()
    def drain(self) -> None:
        """Take everything."""
        assert self.box.drain() == list(self.model)
        self.model.clear()

    @rule()
    def pause(self) -> None:
        """Hold consumers back."""
        self.box.pause()
        self.paused = True

    @rule()
    def resume(self) -> None:
        """Let consumers go."""
        self.box.resume()
        self.paused = False

    @rule(on=st.booleans())
    def flip_hold(self, on: bool) -> None:
        """The hold's check turns on or off; the mailbox is not told."""
        self.hold = on

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self) -> None:
        """Close it."""
        self.box.close()
        self.closed = True

    @invariant()
    def counters_match(self) -> None:
        """Length and counters agree with the model."""
        assert len(self.box) == len(self.model)
        held = self.paused or self.hold
        assert self.box.ready() is (bool(self.model) and (self.closed or not held))
        assert self.box.held is held and self.box.paused is self.paused
        assert self.box.accepted == self.accepted
        assert self.box.rejected == self.rejected
        assert self.box.high_water == self.high


TestMailboxModel = MailboxModel.TestCase
TestMailboxModel.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_stress_nothing_lost_nothing_duplicated_order_per_producer() -> None:
    """8 producers x 2000 items through 2 consumers: each item once, each producer in order."""
    producers, per_producer = 8, 2000
    box: Mailbox[tuple[int, int]] = Mailbox(16, on_full="block", block_timeout=30)
    received: list[list[tuple[int, int]]] = [[], []]

    def produce(p: int) -> None:
        for i in range(per_producer):
            box.put((p, i))

    def consume(c: int) -> None:
        while True:
            try:
                received[c].append(box.get(timeout=30))
            except MailboxClosed:
                return

    consumers = [threading.Thread(target=consume, args=(c,)) for c in range(2)]
    workers = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in consumers + workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    box.close()
    for t in consumers:
        t.join(timeout=60)
    everything = received[0] + received[1]
    assert sorted(everything) == [(p, i) for p in range(producers) for i in range(per_producer)]
    # Each consumer sees any one producer's items in increasing order (one FIFO queue).
    for got in received:
        for p in range(producers):
            seq = [i for q, i in got if q == p]
            assert seq == sorted(seq)
    assert box.accepted == producers * per_producer
    assert box.high_water <= 16
