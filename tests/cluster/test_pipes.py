"""Pipelined sends to another node (``Runtime.send_future``): in order, each acknowledged, bounded.

Two runtimes joined through a real nats-server; the receiving agent's mailbox is paused so the
test reads what arrived, in the order it arrived, from the mailbox itself.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mighty.cluster._pipes as pipes
from mighty.agents import (
    AgentError,
    AskTimeout,
    MailboxFullError,
    MailboxSettings,
    NoProc,
    Runtime,
)
from mighty.cluster import Frame
from mighty.cluster._replies import acknowledged_failures, acknowledgement
from tests.cluster.conftest import LONG, STEADY, Nodes, until


@pytest.fixture(autouse=True)
def _steady(nodes: Nodes) -> None:
    """No node dies in these tests: a stall of the loaded machine must not fence one."""
    nodes.defaults["dead_after"] = STEADY


class _Held:
    """Node a sending to an echo agent on node b whose mailbox (room for one, ``block``) is
    paused: the first message goes in, the next frame waits on b for space."""

    def __init__(self, nodes: Nodes, count: int) -> None:
        self.a, self.node_a = nodes("a", ask_timeout=LONG)
        self.b, self.node_b = nodes(
            "b", mailbox=MailboxSettings(capacity=1, on_full="block", block_timeout=LONG)
        )
        local = self.b.spawn("echo")
        self.target = f"b:{local}"
        self.mailbox = self.b.process(local).mailbox
        self.mailbox.pause()
        self.futures = [self.send(i) for i in range(count)]
        until(lambda: self.node_b.waiting == 1, "nothing waited for space on b")

    def send(self, body: int, timeout: float | None = None) -> Future[None]:
        return self.a.send_future(self.target, "x", body, timeout=timeout)

    def take(self) -> list[int]:
        """What the mailbox holds, oldest first, taken out (room for the next)."""
        return [cbor2.loads(e.body) for e in self.mailbox.drain()]


def _bodies(runtime: Runtime, address: str) -> list[int]:
    """What the agent's paused mailbox holds, oldest first, taken out."""
    return [cbor2.loads(e.body) for e in runtime.process(address).mailbox.drain()]


def _settled(futures: list[Future[None]]) -> list[str]:
    """Each future's outcome: "ok" or its error's class name."""
    out = []
    for future in futures:
        error = future.exception(LONG)
        out.append("ok" if error is None else type(error).__name__)
    return out


def test_pipelined_sends_arrive_in_order_each_acknowledged(nodes: Nodes) -> None:
    a, _ = nodes("a")
    b, node_b = nodes("b", mailbox=MailboxSettings(capacity=5000))
    target = b.spawn("echo")
    b.process(target).mailbox.pause()
    futures = [a.send_future(f"b:{target}", "x", i) for i in range(3000)]
    assert _settled(futures) == ["ok"] * 3000
    assert _bodies(b, target) == list(range(3000))
    # Fewer frames than messages: the ones queued behind a frame in flight went together.
    assert node_b.stats.received < 3000
    # A synchronous send goes the same way, behind what was queued before it.
    more = [a.send_future(f"b:{target}", "x", i) for i in range(3000, 3100)]
    a.send(f"b:{target}", "x", 3100)
    assert all(f.done() for f in more)
    assert _bodies(b, target) == list(range(3000, 3101))


def test_senders_each_keep_their_own_order(nodes: Nodes) -> None:
    a, _ = nodes("a")
    b, _ = nodes("b", mailbox=MailboxSettings(capacity=5000))
    target = b.spawn("echo")
    b.process(target).mailbox.pause()
    sent: dict[str, list[Future[None]]] = {}

    def stream(sender: str) -> None:
        sent[sender] = [
            a.send_future(f"b:{target}", "x", [sender, i], sender=sender) for i in range(500)
        ]

    threads = [threading.Thread(target=stream, args=(f"echo:{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(LONG)
    for futures in sent.values():
        assert _settled(futures) == ["ok"] * 500
    arrived = [cbor2.loads(e.body) for e in b.process(target).mailbox.drain()]
    for sender in sent:
        assert [i for s, i in arrived if s == sender] == list(range(500))


def test_a_full_block_mailbox_holds_the_rest_back_in_order(nodes: Nodes) -> None:
    """Messages that wait for space on the far node wait there, and those behind them too: the
    mailbox takes all of them in the order sent, each acknowledged once it is in."""
    a, _ = nodes("a", ask_timeout=LONG)
    b, node_b = nodes(
        "b", mailbox=MailboxSettings(capacity=10, on_full="block", block_timeout=LONG)
    )
    target = b.spawn("echo")
    mailbox = b.process(target).mailbox
    mailbox.pause()
    futures = [a.send_future(f"b:{target}", "x", i) for i in range(200)]
    until(lambda: len(mailbox) == 10 and node_b.waiting == 1, "nothing waited for space")
    assert not futures[-1].done()
    arrived: list[int] = []
    while len(arrived) < 200:
        until(lambda: len(mailbox) > 0, f"stuck after {len(arrived)} messages")
        arrived += _bodies(b, target)
    assert arrived == list(range(200))
    assert _settled(futures) == ["ok"] * 200


def test_a_short_deadline_does_not_fail_the_messages_beside_it(nodes: Nodes) -> None:
    """A frame waits at the far node as long as its furthest deadline: a message queued with a
    short one does not time the others out (it may fail unsent, or be taken late)."""
    held = _Held(nodes, 2)
    short = held.send(2, timeout=1.0)
    last = held.send(3)
    assert held.take() == [0]  # room for 1, then 2 and 3 go in one frame, and wait
    until(lambda: len(held.mailbox) == 1 and held.node_b.waiting == 1, "2 and 3 never waited")
    time.sleep(2.0)  # past the short deadline, with the frame still waiting for space
    arrived: list[int] = []
    while not last.done() or len(held.mailbox):
        until(lambda: len(held.mailbox) > 0 or last.done(), f"stuck after {arrived}")
        arrived += held.take()
    assert _settled([*held.futures, last]) == ["ok"] * 3
    assert _settled([short]) in (["ok"], ["AskTimeout"])
    assert arrived == ([1, 2, 3] if short.exception() is None else [1, 3])


def test_each_message_has_its_own_outcome(nodes: Nodes) -> None:
    a, _ = nodes("a")
    b, _ = nodes("b", mailbox=MailboxSettings(capacity=25, on_full="fail"))
    target = b.spawn("echo")
    b.process(target).mailbox.pause()
    futures = [a.send_future(f"b:{target}", "x", i) for i in range(100)]
    outcomes = _settled(futures)
    # The first 25 fit; every later one fails on its own, with the error a send would raise.
    assert outcomes == ["ok"] * 25 + ["MailboxFullError"] * 75
    with pytest.raises(MailboxFullError):
        futures[-1].result()
    assert _bodies(b, target) == list(range(25))


def test_an_unknown_agent_fails_every_message(nodes: Nodes) -> None:
    a, node_a = nodes("a")
    nodes("b")
    futures = [a.send_future("b:echo:999", "x", i) for i in range(50)]
    assert set(_settled(futures)) == {"NoProc"}
    # Named in the error as a send's is; no pipe is left behind.
    with pytest.raises(NoProc, match="echo:999"):
        futures[0].result()
    until(lambda: len(node_a.pipes) == 0, "a pipe kept messages")


def test_a_leaving_node_fails_what_it_still_holds(nodes: Nodes) -> None:
    held = _Held(nodes, 20)
    held.node_a.close()
    outcomes = _settled(held.futures)
    # Each settled at once (their deadlines are minutes away): one went into the mailbox (ok
    # if the reply came before the node left), those the far node was holding are unknown
    # (AskTimeout), any still queued here were not sent (NoProc).
    assert set(outcomes) <= {"ok", "AskTimeout", "NoProc"}
    assert outcomes.count("ok") <= 1
    assert "AskTimeout" in outcomes
    with pytest.raises(AgentError):
        held.send(99).result(LONG)


def test_an_ask_in_flight_when_its_node_leaves_settles_at_once(nodes: Nodes) -> None:
    _, node_a = nodes("a")
    b, node_b = nodes("b")
    target = b.spawn("echo")
    b.process(target).mailbox.pause()  # the ask waits there, unanswered
    future = node_a.ask(f"b:{target}", "x", b"", sender="host", timeout=3600.0, chain=())
    until(lambda: node_b.stats.received == 1, "the ask never reached b")
    node_a.close()
    with pytest.raises(AskTimeout, match="left before the reply"):
        future.result(LONG)


def test_a_full_pipe_makes_its_sender_wait_until_its_deadline(
    nodes: Nodes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipes, "PIPE_MESSAGES", 5)
    held = _Held(nodes, 2)
    # One in the mailbox, one waiting for space there; five more fill the pipe.
    futures = held.futures + [held.send(i) for i in range(2, 7)]
    assert len(held.node_a.pipes) == 5
    late = held.send(7, timeout=0.2)
    assert late.done()  # it waited for room until its deadline, then failed, not queued
    with pytest.raises(AskTimeout, match="still wait for their acknowledgement"):
        late.result()
    # Room again once the far mailbox takes them: the next send goes through.
    arrived: list[int] = []
    later: list[Future[None]] = []
    sender = threading.Thread(target=lambda: later.append(held.send(7)))
    sender.start()
    while len(arrived) < 8:
        until(lambda: len(held.mailbox) > 0, f"stuck after {len(arrived)} messages")
        arrived += held.take()
    sender.join(LONG)
    assert arrived == list(range(8))
    assert _settled(futures + later) == ["ok"] * 8


@given(
    st.integers(1, 40).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.dictionaries(
                st.integers(0, n - 1),
                st.sampled_from([NoProc, MailboxFullError, AskTimeout]),
                max_size=n,
            ),
        )
    )
)
def test_an_acknowledgement_reads_back_as_written(case: tuple[int, dict[int, type]]) -> None:
    count, failures = case
    errors = sorted((i, cls(f"message {i}")) for i, cls in failures.items())
    read = acknowledged_failures(acknowledgement("b", count, errors), count)
    assert read is not None
    assert {i: (type(e), e.message) for i, e in read.items()} == {
        i: (cls, f"message {i}") for i, cls in failures.items()
    }


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=25,
)


@given(st.dictionaries(st.sampled_from(["n", "e", "moved"]), _values), st.integers(1, 30))
def test_a_hostile_acknowledgement_is_refused_whole(extra: dict[str, object], count: int) -> None:
    """Whatever a peer puts in the reply: a dict of errors for indices in range, or None."""
    read = acknowledged_failures(Frame("ok", extra=extra), count)
    if read is not None:
        assert extra.get("n") == count
        assert all(0 <= i < count and isinstance(e, AgentError) for i, e in read.items())
