"""Asks run in place (``AgentProcess.run_here``: the asking thread claims the message from an
empty mailbox and runs the turn) against queued sends and asks to the same agent: every
message is handled exactly once, in the order each sender sent it, and a message accepted
behind others is never run ahead of them.

A hypothesis state machine drives one WAT echo agent with sends, asks run in place, asks that
go by a worker (timeout shorter than the budget), futures, sends queued while the mailbox is
paused, and bursts from a second thread racing the main thread's asks. After each step it
drains the runtime and reads the agent's history (what it handled, in order): single-threaded
steps must appear exactly in the order made; a burst's messages in each sender's order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

import cbor2
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mighty import Component
from mighty.agents import AgentProcess, AgentType, Runtime
from mighty.agents.hosting import Envelope
from mighty.budget import Budget

BUDGET = Budget(timeout=30.0)
"""Within a default ask's wait (budget plus a second): such asks may run in place."""


class AskOrder(RuleBasedStateMachine):
    component: Component

    def __init__(self) -> None:
        super().__init__()
        self.rt = Runtime(workers=2)
        self.rt.register(AgentType("echo", self.component, budget=BUDGET))
        self.address = self.rt.spawn("echo")
        self.process: AgentProcess = self.rt.process(self.address)
        self.total = 0
        self.serial = 0
        self.futures: list[tuple[Future[bytes | None], int]] = []

    def _name(self) -> str:
        self.serial += 1
        return f"m{self.serial}"

    def _check(self, made: list[tuple[str, str]], *, per_sender: bool = False) -> None:
        """Drain, then the history's last ``len(made)`` entries are ``made`` (sender, name):
        exactly, or (``per_sender``) the same messages, each sender's in its order."""
        assert self.rt.drain(30)
        self.total += len(made)
        got = [(sender, name) for name, sender, *_ in self.process.recent.items()]
        tail = got[len(got) - len(made) :] if made else []
        if per_sender:
            assert sorted(tail) == sorted(made)
            for sender in {s for s, _ in made}:
                assert [m for m in tail if m[0] == sender] == [m for m in made if m[0] == sender]
        else:
            assert tail == made
        assert self.process.stats.handled == self.total
        assert self.process.mailbox.accepted == self.total
        assert self.process.stats.failed == self.process.stats.crashes == 0

    @initialize()
    def start(self) -> None:
        assert self.rt.ask(self.address, "warm", 0) == 0
        self.total = 1
        self._check([])

    @rule(steps=st.lists(st.sampled_from(["send", "ask", "ask_worker", "future"]), max_size=12))
    def sequence(self, steps: list[str]) -> None:
        made: list[tuple[str, str]] = []
        futures: list[tuple[Future[bytes | None], int]] = []
        for n, step in enumerate(steps):
            name = self._name()
            made.append(("host", name))
            if step == "send":
                self.rt.send(self.address, name, n)
            elif step == "ask":
                assert self.rt.ask(self.address, name, n) == n
            elif step == "ask_worker":  # a timeout shorter than the budget: via a worker
                # 29 s, not 0.9 (of a 1 s budget): a loaded machine may take a second to reply.
                assert self.rt.ask(self.address, name, n, timeout=29.0) == n
            else:
                futures.append((self.rt.ask_future(self.address, name, n), n))
        for future, n in futures:
            assert future.result(30) == cbor2.dumps(n)
        self._check(made)

    @rule(sends=st.integers(0, 6))
    def paused(self, sends: int) -> None:
        """Queued while paused (as during a hot swap): an ask then cannot claim an empty
        mailbox, so it waits its turn behind them."""
        made = []
        self.process.mailbox.pause()
        for n in range(sends):
            name = self._name()
            made.append(("host", name))
            self.rt.send(self.address, name, n)
        name = self._name()
        made.append(("host", name))
        replies: list[object] = []
        asker = threading.Thread(target=lambda: replies.append(self.rt.ask(self.address, name, 7)))
        asker.start()
        for _ in range(10_000):  # the ask queues behind the sends (10 s at most)
            if len(self.process.mailbox) == sends + 1:
                break
            threading.Event().wait(0.001)
        assert len(self.process.mailbox) == sends + 1  # nothing ran while it was paused
        self.process.mailbox.resume()
        self.process.wake()
        asker.join(30)
        assert replies == [7]
        assert self.process.mailbox.high_water >= sends + 1
        self._check(made)

    @rule(n=st.integers(0, 23))
    def put_before_wake(self, n: int) -> None:
        """A send caught between its put and its wake (another thread's): the ask behind it
        finds the agent unscheduled but its mailbox not empty, and must not run first."""
        early, late = self._name(), self._name()
        assert self.process.mailbox.put(Envelope("host", early, cbor2.dumps(n)))
        assert self.rt.ask(self.address, late, n) == n
        self._check([("host", early), ("host", late)])

    @rule(
        theirs=st.lists(st.sampled_from(["send", "ask"]), min_size=1, max_size=10),
        ours=st.lists(st.sampled_from(["send", "ask"]), min_size=1, max_size=10),
    )
    def burst(self, theirs: list[str], ours: list[str]) -> None:
        """A second thread's sends and asks race the main thread's: both try to claim."""
        plans = {
            sender: [(step, self._name()) for step in steps]
            for sender, steps in (("other", theirs), ("host", ours))
        }
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def run(sender: str) -> None:
            try:
                start.wait(10)
                for n, (step, name) in enumerate(plans[sender]):
                    if step == "send":
                        self.rt.send(self.address, name, n, sender=sender)
                    else:
                        assert self.rt.ask(self.address, name, n, sender=sender) == n
            except BaseException as exc:  # noqa: BLE001 -- reported by the main thread
                errors.append(exc)

        other = threading.Thread(target=run, args=("other",))
        other.start()
        run("host")
        other.join(30)
        assert not errors, errors
        made = [(sender, name) for sender in plans for _, name in plans[sender]]
        self._check(made, per_sender=True)

    @invariant()
    def idle_between_steps(self) -> None:
        assert not self.process.busy

    def teardown(self) -> None:
        self.rt.shutdown()
        assert self.process.stats.unhandled == 0


@pytest.fixture
def ask_order(echo_agent: Component) -> Callable[[], None]:
    AskOrder.component = echo_agent
    case = AskOrder.TestCase
    case.settings = settings(
        max_examples=25,
        stateful_step_count=8,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    return lambda: case().runTest()


@pytest.mark.timing
def test_in_place_asks_keep_the_order_of_queued_messages(ask_order: Callable[[], None]) -> None:
    ask_order()
