"""Crashes and the messages behind them: drain, unexpected errors in a turn, giving up."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentEvent,
    AgentProcess,
    AgentType,
    MailboxSettings,
    NoProc,
    Runtime,
    SupervisorSpec,
    decode_body,
    start_tree,
)
from mighty.agents import _process as process_module
from mighty.agents.hosting import Scheduler
from mighty.cli import main

# 14 messages, the 7th and the 14th crash the agent.
SCRIPT = ["crash" if n in (7, 14) else "x" for n in range(1, 15)]


@contextlib.contextmanager
def holding(*processes: AgentProcess) -> Iterator[None]:
    """Hold the agents' run locks, so that everything sent meanwhile queues up."""
    with contextlib.ExitStack() as stack:
        for process in processes:
            stack.enter_context(process._run)
        yield


def outcome(future: Future[bytes | None]) -> Any:
    """The decoded reply, or the type of the error the ask settled with."""
    error = future.exception(timeout=60)
    return type(error) if error is not None else decode_body(future.result())


def shutdown_returns(rt: Runtime, timeout: float = 10.0) -> bool:
    """Run shutdown on a thread; whether it returned (a deadlock would hang the test)."""
    done = threading.Thread(target=rt.shutdown, kwargs={"timeout": timeout}, daemon=True)
    done.start()
    done.join(timeout + 30)
    return not done.is_alive()


# -- A: messages queued behind a crash ------------------------------------------------------


def test_drain_waits_until_the_messages_behind_crashes_are_handled(
    crasher_agent: Component,
) -> None:
    """drain returns True only once the agent is restarted and its whole queue handled."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("c", crasher_agent))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "c")]))
        process = rt.process("c")
        with holding(process):
            for n, name in enumerate(SCRIPT):
                rt.send("c", name, n)
        assert rt.drain(60)
        assert len(process.mailbox) == 0
        assert process.stats.handled == 12
        assert process.stats.crashes == 2
        assert process.stats.restarts == 2
        assert process.alive


def manifest(tmp_path: Path, component: Path, body: str) -> Path:
    path = tmp_path / "mighty.toml"
    path.write_text(f'[agents.c]\ncomponent = "{component}"\n\n{body}')
    return path


def sends(script: list[str]) -> str:
    return "".join(
        f'[[start]]\nto = "c"\nmessage = "{name}"\nbody = {n}\nask = false\n\n'
        for n, name in enumerate(script)
    )


def run_json(path: Path) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["run", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


def test_mty_run_handles_every_message_queued_behind_crashes(
    tmp_path: Path, crasher_wasm: Path
) -> None:
    """`mty run` waits for the restarts: all 12 good messages are handled, none unhandled."""
    path = manifest(
        tmp_path,
        crasher_wasm,
        '[supervisor]\nchildren = [{ name = "c", type = "c" }]\n\n' + sends(SCRIPT),
    )
    code, doc = run_json(path)
    assert code == 0, doc
    assert doc["ok"] is True
    assert doc["unhandled"] == 0
    [agent] = doc["agents"]
    assert (agent["accepted"], agent["handled"], agent["crashes"]) == (14, 12, 2)
    assert (agent["restarts"], agent["unhandled"]) == (2, 0)


def test_mty_run_reports_messages_left_when_the_supervisor_gives_up(
    tmp_path: Path, crasher_wasm: Path
) -> None:
    """Messages accepted but never handled are counted, and `mty run` exits 1 with ok false."""
    path = manifest(
        tmp_path,
        crasher_wasm,
        "[supervisor]\nintensity = 0\n"
        'children = [{ name = "c", type = "c" }]\n\n' + sends(["crash"] + ["x"] * 5),
    )
    code, doc = run_json(path)
    assert code == 1
    assert doc["ok"] is False
    [agent] = doc["agents"]
    # The crash races with the sends: each later one was either refused (the agent was gone
    # already) or accepted and then left unhandled; none was handled, none vanished.
    assert agent["handled"] == 0
    assert agent["accepted"] == 1 + agent["unhandled"]
    assert agent["unhandled"] + len(doc["failures"]) == 5
    assert doc["unhandled"] == agent["unhandled"]


# -- B: unexpected exceptions in a turn -----------------------------------------------------


class AnyBody(BaseModel):
    """Accepts any body; present so that the protocol check decodes every body."""


def test_an_unexpected_error_in_a_turn_is_a_crash_and_the_worker_survives(
    crasher_agent: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A codec raising RuntimeError crashes the agent; it is restarted and the worker goes on."""
    real = process_module.decode_body

    def broken(data: bytes | None) -> Any:
        if real(data) == "boom":
            raise RuntimeError("codec bug")
        return real(data)

    monkeypatch.setattr(process_module, "decode_body", broken)
    with Runtime(workers=1) as rt:
        rt.register(AgentType("c", crasher_agent, accepts={"x": None, "y": AnyBody}))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "c")]))
        process = rt.process("c")
        with holding(process):
            before = rt.ask_future("c", "x", 1)
            boom = rt.ask_future("c", "y", "boom")
            after = [rt.ask_future("c", "x", n) for n in range(5)]
        assert outcome(before) == 1
        with pytest.raises(AgentCrashed, match="internal error: RuntimeError: codec bug"):
            boom.result(60)
        assert [outcome(f) for f in after] == list(range(5))
        assert process.stats.restarts == 1
        assert rt.ask("c", "x", "later") == "later"
        assert rt.scheduler.threads == 1
        assert all(t.is_alive() for t in rt.scheduler._threads)


def test_a_raising_event_hook_does_not_break_a_turn(crasher_agent: Component) -> None:
    """An on_event observer that raises is logged; the crash it observes is still handled."""

    def bad(event: AgentEvent) -> None:
        raise RuntimeError("observer bug")

    with Runtime(workers=1, on_event=bad) as rt:
        rt.register(AgentType("c", crasher_agent))
        start_tree(rt, SupervisorSpec("root", [AgentChild("c", "c")]))
        with pytest.raises(AgentCrashed):
            rt.ask("c", "crash", timeout=60)
        assert rt.ask("c", "x", 2, timeout=60) == 2
        assert rt.process("c").stats.restarts == 1


class Raising:
    """A runnable whose turn raises (a bug the runtime failed to catch)."""

    def run_batch(self) -> tuple[int, bool]:
        raise RuntimeError("bug")


class Counting:
    """A runnable that counts its turns."""

    def __init__(self) -> None:
        self.ran = threading.Event()

    def run_batch(self) -> tuple[int, bool]:
        self.ran.set()
        return 1, False


def test_a_worker_survives_a_runnable_that_raises() -> None:
    """The scheduler logs a raising turn and its worker runs the next agent."""
    scheduler = Scheduler(1)
    try:
        scheduler.schedule(Raising())
        later = Counting()
        scheduler.schedule(later)
        assert later.ran.wait(30)
        assert scheduler.stats()[0].messages == 1
    finally:
        scheduler.stop()


# -- C: a supervisor that gives up ----------------------------------------------------------


def crash_asks(
    crasher_agent: Component, agents: int, asks: int, workers: int
) -> tuple[Runtime, list[Future[bytes | None]], list[AgentProcess]]:
    rt = Runtime(workers=workers)
    rt.register(AgentType("c", crasher_agent, mailbox=MailboxSettings(capacity=asks)))
    names = [f"c{i}" for i in range(agents)]
    root = start_tree(rt, SupervisorSpec("root", [AgentChild(n, "c") for n in names]))
    processes = [rt.process(n) for n in names]
    with holding(*processes):
        futures = [rt.ask_future(n, "crash") for _ in range(asks) for n in names]
        # Read while the agents are held: once released, the first crashes may make the
        # supervisor give up before this line would run.
        assert root.state == "running"
    return rt, futures, processes


def test_giving_up_with_two_agents_settles_every_ask(crasher_agent: Component) -> None:
    """Two children, four crashing asks each: 4 crash (3 restarts, then it gives up), 4 noproc."""
    rt, futures, processes = crash_asks(crasher_agent, agents=2, asks=4, workers=1)
    outcomes = [outcome(f) for f in futures]
    assert outcomes.count(AgentCrashed) == 4
    assert outcomes.count(NoProc) == 4
    assert sum(p.stats.restarts for p in processes) == 3
    assert sum(p.stats.unhandled for p in processes) == 4
    assert rt.agents() == []
    assert shutdown_returns(rt)


def test_giving_up_with_ten_agents_and_2000_asks_settles_every_ask(
    crasher_agent: Component,
) -> None:
    """Ten children, 2,000 crashing asks on two workers: every ask settles, shutdown returns."""
    rt, futures, processes = crash_asks(crasher_agent, agents=10, asks=200, workers=2)
    outcomes = [outcome(f) for f in futures]
    crashed = outcomes.count(AgentCrashed)
    # Each ask ends one way: it crashed its agent (an event each) or found it gone.
    assert crashed + outcomes.count(NoProc) == 2000
    assert crashed == sum(1 for _ in rt.events_of("agent.crashed"))
    assert crashed == sum(p.stats.crashes for p in processes)
    assert 2000 - crashed == sum(p.stats.unhandled for p in processes)
    assert sum(p.stats.restarts for p in processes) == 3
    assert rt.agents() == []
    assert shutdown_returns(rt)


def test_shutdown_returns_within_its_deadline_with_asks_still_queued(
    crasher_agent: Component,
) -> None:
    """Shutdown without draining settles every queued ask (NoProc) and counts it unhandled."""
    rt = Runtime(workers=1)
    rt.register(AgentType("c", crasher_agent))
    address = rt.spawn("c")
    process = rt.process(address)
    release = threading.Event()

    def stop() -> None:
        rt.shutdown(drain=False, timeout=0.5)
        release.set()

    with holding(process):
        futures = [rt.ask_future(address, "x", n) for n in range(10)]
        threading.Thread(target=stop, daemon=True).start()
        assert release.wait(60)  # returned while the agent was still held
    assert [outcome(f) for f in futures] == [NoProc] * 10
    assert process.stats.unhandled == 10
    assert rt.unhandled() == {address: 10}
