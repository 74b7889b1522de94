"""``pipe`` through a stage whose full mailbox drops: the dropped items are left out, the pipe
goes on (it failed whole), on one node and across two (the drop keeps its type over NATS)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mighty import Component
from mighty.agents import AgentType, MailboxSettings, Runtime, pipe
from mighty.agents._types import MessageDropped
from tests.cluster.conftest import STEADY, Nodes


@pytest.fixture(autouse=True)
def _steady(nodes: Nodes) -> None:
    """No node dies in these tests: a stall of the loaded machine must not fence one."""
    nodes.defaults["dead_after"] = STEADY


DROP = MailboxSettings(capacity=1, on_full="drop")


def _until(check: Any, what: str) -> None:
    """Wait for an event (a bounded poll, not a timing assertion)."""
    give_up = time.monotonic() + 60
    while not check():
        assert time.monotonic() < give_up, f"never: {what}"
        time.sleep(0.01)


def _piped_while_paused(asker: Runtime, target: Runtime, address: str, to: str) -> list[Any]:
    """pipe([1, 2, 3]) into ``to`` while its mailbox (of one) is paused: 2 and 3 are dropped."""
    process = target.process(address)
    process.mailbox.pause()
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.extend(pipe(asker, [(to, "x")], [1, 2, 3], window=3, timeout=60))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    _until(lambda: process.stats.dropped >= 2, "two items dropped")
    process.mailbox.resume()
    process._wake()  # as a hot swap's resume does
    thread.join(60)
    assert not failed, failed
    return out


@pytest.mark.timing
def test_a_local_drop_stage_drops_items_and_the_pipe_goes_on(echo: Component) -> None:
    """The accepted item comes out; the two dropped ones are left out."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("echo", echo, mailbox=DROP))
        address = rt.spawn("echo")
        assert _piped_while_paused(rt, rt, address, address) == [1]


@pytest.mark.timing
def test_a_remote_drop_stage_drops_items_and_the_pipe_goes_on(nodes: Nodes) -> None:
    """Across nodes the drop is a MessageDropped too, so the pipe leaves the items out."""
    a, _ = nodes("a")
    b, _ = nodes("b", mailbox=DROP)
    address = b.spawn("echo")
    assert _piped_while_paused(a, b, address, f"b:{address}") == [1]
    process = b.process(address)
    process.mailbox.pause()
    a.send(f"b:{address}", "x", 0)  # the mailbox of one is full now
    with pytest.raises(MessageDropped):
        a.ask(f"b:{address}", "x", 1, timeout=30)
    process.mailbox.resume()
