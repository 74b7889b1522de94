"""The agent runtime with real components: messages, protocols, mailboxes, crashes, supervisors."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from mighty import Budget, Component
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentError,
    AgentType,
    BreakerSettings,
    CircuitOpen,
    HandlerFailed,
    MailboxFullError,
    MailboxSettings,
    NoProc,
    Refused,
    Runtime,
    SupervisorSpec,
    broadcast,
    pipe,
    start_tree,
)
from mighty.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_spawn_send_ask_and_names(echo_agent: Component) -> None:
    """Agents get type:pid addresses, optional names, and answer asks from the host."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("echo", echo_agent))
        first = rt.spawn("echo")
        second = rt.spawn("echo", name="second")
        assert first == "echo:1"
        assert second == "echo:2"
        assert rt.whereis("second") == second
        assert rt.ask(first, "x", {"a": [1, 2]}) == {"a": [1, 2]}
        assert rt.ask("second", "x", "by name") == "by name"
        rt.send(first, "x", 1)
        assert rt.drain(5)
        assert rt.process(first).stats.handled == 2


def test_a_runtime_hold_keeps_every_mailbox_until_lifted(echo_agent: Component) -> None:
    """While the runtime's hold check is true, no agent (one spawned during the hold too) is
    handed a message, in-place asks included; once it is false and ``hold_lifted`` is called,
    what waited is handled in order. ``hold_while(None)`` ends it outright."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("echo", echo_agent))
        before = rt.spawn("echo")
        held = threading.Event()
        held.set()
        rt.hold_while(held.is_set)
        during = rt.spawn("echo")
        answers: dict[str, object] = {}

        def ask(address: str) -> None:
            answers[address] = rt.ask(address, "x", address, timeout=120)

        askers = [threading.Thread(target=ask, args=(a,)) for a in (before, during)]
        for asker in askers:
            asker.start()
        rt.send(before, "x", "sent")
        assert all(rt.process(a).mailbox.held for a in (before, during))
        with pytest.raises(AgentError) as waited:
            rt.ask(during, "x", "short", timeout=0.2)
        assert waited.value.code == "timeout"
        assert rt.process(before).stats.handled == 0 and rt.process(during).stats.handled == 0
        held.clear()
        rt.hold_lifted()
        for asker in askers:
            asker.join(120)
        assert answers == {before: before, during: during}
        assert rt.drain(60)
        assert rt.process(before).stats.handled == 2
        held.set()
        rt.hold_while(None)
        assert rt.ask(before, "x", "free") == "free"


def test_unknown_and_dead_addresses_are_noproc(echo_agent: Component) -> None:
    """Sends to an unknown or stopped agent fail with NoProc naming it."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("echo", echo_agent))
        address = rt.spawn("echo")
        with pytest.raises(NoProc, match="echo:99"):
            rt.send("echo:99", "x")
        rt.stop(address)
        with pytest.raises(NoProc):
            rt.ask(address, "x")


class Put(BaseModel):
    key: str
    value: int


def test_protocol_refuses_before_the_guest(echo_agent: Component) -> None:
    """Unknown message names and invalid bodies are refused with a clear error; the agent lives."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("echo", echo_agent, accepts={"put": Put, "ping": None}))
        address = rt.spawn("echo")
        with pytest.raises(Refused, match=r"does not accept 'nope' \(it accepts: ping, put\)"):
            rt.ask(address, "nope")
        with pytest.raises(Refused, match="invalid 'put' body"):
            rt.ask(address, "put", {"key": "a", "value": "not a number"})
        assert rt.ask(address, "put", {"key": "a", "value": 3}) == {"key": "a", "value": 3}
        assert rt.ask(address, "ping", [1]) == [1]


@pytest.mark.parametrize("policy", ["fail", "drop", "block"])
def test_full_mailbox_policies(echo_agent: Component, policy: str) -> None:
    """A full mailbox fails, drops (with an event) or blocks with a deadline, as configured."""
    with Runtime(workers=1) as rt:
        settings = MailboxSettings(capacity=2, on_full=policy, block_timeout=0.2)  # type: ignore[arg-type]
        rt.register(AgentType("echo", echo_agent, mailbox=settings))
        address = rt.spawn("echo")
        process = rt.process(address)
        with process._run:  # hold the agent so its mailbox fills
            rt.send(address, "x", 1)
            rt.send(address, "x", 2)
            if policy == "drop":
                rt.send(address, "x", 3)
                assert next(rt.events_of("message.dropped")).address == address
            else:
                started = time.monotonic()
                with pytest.raises(MailboxFullError):
                    rt.send(address, "x", 3)
                if policy == "block":
                    assert time.monotonic() - started >= 0.2
        assert rt.drain(5)
        assert process.stats.handled == 2
        assert process.mailbox.high_water == 2


@pytest.mark.slow
def test_stress_100k_messages_between_1000_agents(echo_agent: Component) -> None:
    """100,000 asks spread over 1,000 agents from 4 threads: every reply, none lost or doubled."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("echo", echo_agent, mailbox=MailboxSettings(capacity=4096)))
        agents = [rt.spawn("echo") for _ in range(1000)]
        errors: list[str] = []

        def producer(offset: int) -> None:
            futures = [
                (n, rt.ask_future(agents[n % 1000], "x", n)) for n in range(offset, 100_000, 4)
            ]
            for n, future in futures:
                reply = future.result(60)
                if reply is None or json.loads(json.dumps(rt_decode(reply))) != n:
                    errors.append(f"{n}: {reply!r}")

        threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert sum(p.stats.handled for p in rt.agents()) == 100_000
        assert sum(w.batches for w in rt.worker_stats()) > 0


def rt_decode(data: bytes) -> object:
    from mighty.agents import decode_body

    return decode_body(data)


def test_budget_exhaustion_is_a_crash_with_an_event(pingpong: Component) -> None:
    """A message that runs out of fuel crashes the agent and emits budget.exhausted."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("pp", pingpong, budget=Budget(fuel=200_000)))
        address = rt.spawn("pp")
        peer = rt.spawn("pp")
        # A peer, not itself: a guest SDK cheap enough reaches its first ask within the fuel,
        # and an ask of itself is a cycle error, not a crash. 1000 rounds cost far more.
        with pytest.raises(AgentCrashed, match="out_of_fuel"):
            rt.ask(address, "start", {"peer": peer, "rounds": 1000})
        assert next(rt.events_of("budget.exhausted")).data["reason"] == "out_of_fuel"
        with pytest.raises(NoProc):
            rt.ask(address, "ping", {"n": 1})


def test_guest_to_guest_asks_and_cycles(pingpong: Component) -> None:
    """Agents ask each other from inside handlers; asking yourself is a cycle, not a hang."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("pp", pingpong))
        a = rt.spawn("pp", name="a")
        rt.spawn("pp", name="b")
        assert rt.ask("a", "start", {"peer": "b", "rounds": 20}) == {"rounds": 20, "pongs": 20}
        with pytest.raises(HandlerFailed, match="Cycle"):
            rt.ask(a, "start", {"peer": a, "rounds": 1}, timeout=5)
        assert rt.ask("b", "ping", {"n": 5})["pong"] == 5


def test_supervisor_repairs_a_crashed_store_without_losing_queued_messages(
    kvstore: Component,
) -> None:
    """A crash restarts the store in place; messages queued behind the crash are all handled."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("kv", kvstore, budget=Budget(fuel=500_000_000)))
        root = start_tree(rt, SupervisorSpec("root", [AgentChild("kv", "kv", {"x": 1})]))
        process = rt.process("kv")
        with process._run:  # queue everything before the crash is handled
            crash = rt.ask_future("kv", "crash")
            puts = [rt.ask_future("kv", "put", {"key": f"k{i}", "value": i}) for i in range(20)]
        with pytest.raises(AgentCrashed):
            crash.result(30)
        assert all(f.result(30) is not None for f in puts)
        assert rt.ask("kv", "size") == {"size": 21}
        assert process.stats.restarts == 1
        assert root.state == "running"


def test_restart_intensity_fails_the_supervisor(kvstore: Component) -> None:
    """More crashes than the intensity allows stop the children and fail the supervisor."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", kvstore, budget=Budget(fuel=200_000_000)))
        root = start_tree(
            rt, SupervisorSpec("root", [AgentChild("kv", "kv")], intensity=1, period=60)
        )
        for _ in range(2):
            with pytest.raises(AgentCrashed):
                rt.ask("kv", "crash", timeout=30)
        deadline = time.monotonic() + 60  # a bound on the poll; it ends when the root fails
        while root.state != "failed" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert root.state == "failed"
        assert any(e.kind == "supervisor.failed" for e in rt.events)
        with pytest.raises(NoProc):
            rt.ask("kv", "size")


def test_circuit_breaker_fails_fast_then_probes(kvstore: Component) -> None:
    """After N crashes sends fail fast; after the cooldown one probe closes the circuit."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", kvstore, budget=Budget(fuel=200_000_000)))
        start_tree(
            rt,
            SupervisorSpec(
                "breaker",
                [AgentChild("kv", "kv")],
                intensity=10,
                period=60,
                # Long enough that a loaded machine still asks within it; the probe is then
                # awaited with a deadline instead of a fixed sleep.
                circuit_breaker=BreakerSettings(failure_threshold=2, window=30, cooldown=2.0),
            ),
        )
        for _ in range(2):
            with pytest.raises(AgentCrashed):
                rt.ask("kv", "crash", timeout=30)
        opened = time.monotonic()
        with pytest.raises(CircuitOpen):
            rt.ask("kv", "size")
        deadline = opened + 60
        while True:
            try:
                probe = rt.ask("kv", "size")
                break
            except CircuitOpen:
                assert time.monotonic() < deadline, "the circuit never let a probe through"
                time.sleep(0.05)
        assert time.monotonic() - opened >= 1.5  # not before (most of) the cooldown
        assert probe == {"size": 0}
        assert rt.ask("kv", "size") == {"size": 0}  # closed again


def test_pipe_and_broadcast(wordcount: Component, echo_agent: Component) -> None:
    """pipe feeds each reply to the next stage in order; broadcast gathers every reply."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("wc", wordcount))
        rt.register(AgentType("echo", echo_agent))
        rt.spawn("wc", name="tokenizer")
        rt.spawn("wc", name="counter")
        lines = ["a b", "b c", "c c d"]
        words = pipe(rt, [("tokenizer", "tokenize")], lines)
        assert words == [["a", "b"], ["b", "c"], ["c", "c", "d"]]
        for chunk in words:
            rt.send("counter", "count", chunk)
        assert rt.ask("counter", "top", {"n": 2})["top"] == [["c", 3], ["b", 2]]
        echoes = [rt.spawn("echo") for _ in range(5)]
        gathered = broadcast(rt, "x", {"hi": 1}, [*echoes, "echo:404"])
        assert [gathered[a] for a in echoes] == [{"hi": 1}] * 5
        assert isinstance(gathered["echo:404"], NoProc)


@pytest.mark.parametrize("example", ["pingpong", "wordcount", "kvstore"])
def test_mty_run_examples(example: str) -> None:
    """Each example manifest runs to completion with `mty run --json`."""
    result = CliRunner().invoke(
        main, ["run", str(ROOT / "examples" / "agents" / f"{example}.toml"), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert doc["ok"] is True
    if example == "pingpong":
        assert doc["replies"][0]["reply"] == {"rounds": 10, "pongs": 10}
    if example == "wordcount":
        assert doc["replies"][0]["reply"]["top"][0] == ["the", 6]
    if example == "kvstore":
        assert doc["replies"][-1]["reply"] == {"size": 2}
        assert doc["events"]["agent.restarted"] == 1


def test_mty_run_records_and_each_agent_replays(tmp_path: Path) -> None:
    """`mty run --record` records every agent; the trace replays whole and one agent alone."""
    trace = tmp_path / "pp.bin"
    runner = CliRunner()
    manifest = str(ROOT / "examples" / "agents" / "pingpong.toml")
    ran = runner.invoke(main, ["run", manifest, "--record", str(trace), "--json"])
    assert ran.exit_code == 0, ran.output
    whole = runner.invoke(main, ["replay", str(trace), "--json"])
    assert whole.exit_code == 0, whole.output
    report = json.loads(whole.stdout)
    assert [i["instance"] for i in report["instances"]] == [1, 2]
    asker = runner.invoke(main, ["replay", str(trace), "--agent", "2", "--json"])
    assert asker.exit_code == 0, asker.output
    assert json.loads(asker.stdout)["instances"][0]["imports"] > 10
