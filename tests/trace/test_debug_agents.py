"""`mty debug` over agents: recorded order across agents, peek with decoded state, the ask
chain and supervision path in bt, going back (issue 35)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty._cbor import loads_untrusted
from mighty.cli import main
from mighty.trace import Debugger, ReplayEvent, ReplayLimits, replay_trace
from mighty.trace._debug import DEBUG_TIMEOUT
from mighty.trace._model import RunModel
from mighty.trace._replay import _Sequencer, state_at


def _quiet(_message: str) -> None:
    return None


def _run(debugger: Debugger, *commands: str) -> list[list[str]]:
    return [debugger.command(c)[0] for c in commands]


def _until(debugger: Debugger, command: str, text: str) -> list[str]:
    """Run ``command`` until the event it stops at has ``text`` in it."""
    for _ in range(500):
        lines, _done = debugger.command(command)
        if text in lines[0] or lines[0].startswith("replay finished"):
            return lines
    raise AssertionError(f"{command!r} never reached {text!r}")


def _state(peek: list[str]) -> str:
    """The JSON of a peek's state line (``  state: {...} (after N export call(s))``)."""
    (line,) = [line for line in peek if line.startswith("  state: ")]
    return line[len("  state: ") : line.rindex(" (after ")]


def test_events_come_in_the_recorded_order_across_agents(relay_trace: Path) -> None:
    """A replay in recorded order shows a -> b -> c handling before b's and a's asks return."""
    events: list[ReplayEvent] = []
    ordered = replay_trace(relay_trace, observer=events.append, order="recorded", progress=_quiet)
    assert [e.offset for e in events] == sorted(e.offset for e in events)
    assert [e.index for e in events] == list(range(1, len(events) + 1))
    plain = replay_trace(relay_trace, progress=_quiet)
    assert ordered.digest == plain.digest
    story = [(e.agent, e.kind, e.function) for e in events if e.function in ("handle", "ask")]
    first = story[: story.index(("relay:1", "export", "handle")) + 1]
    assert first == [
        ("relay:1", "call", "handle"),
        ("relay:2", "call", "handle"),
        ("relay:3", "call", "handle"),
        ("relay:3", "export", "handle"),
        ("relay:2", "import", "ask"),
        ("relay:2", "export", "handle"),
        ("relay:1", "import", "ask"),
        ("relay:1", "export", "handle"),
    ]


def test_peek_shows_the_state_the_live_agent_had(relay_trace: Path) -> None:
    """At every handle return, peek's decoded state is what the live agent replied it had."""
    model = RunModel(relay_trace)
    checked = 0
    for info in model.instances.values():
        for message in info.messages:
            assert message.end_offset is not None and message.ok
            live = loads_untrusted(message.reply.value["body"])
            found = state_at(relay_trace, info.instance, message.end_offset + 1, progress=_quiet)
            assert found.state is not None, found.why
            state = loads_untrusted(found.state)["state"]
            assert state == {"relayed": live["relayed"], "seen": live["seen"]}
            checked += 1
    assert checked == 6


def test_peek_and_bt_in_the_debugger(relay_trace: Path) -> None:
    """At c's first relay: bt is c <- b <- a <- host; peek a/b/c by name show state, messages."""
    debugger = Debugger(relay_trace, progress=_quiet)
    try:
        debugger.start()
        debugger.command("break relay:3")
        stop = _until(debugger, "continue", "handle relay")
        assert "[relay:3]" in stop[0] and 'handle relay {"via": [], "tag": "first"}' in stop[0]
        bt = debugger.command("bt")[0]
        text = "\n".join(bt)
        assert (
            'relay:3 (c) instance 3: handling relay {"via": [], "tag": "first"} from relay:2'
            in text
        )
        assert "asked by relay:2, waiting in ask(c, relay" in text
        assert "asked by relay:1, waiting in ask(b, relay" in text
        assert "sent by the host" in text
        assert bt[-1] == "  supervision: relay:3 started by the supervisor as child 'c'"
        peek_c = debugger.command("peek c")[0]
        assert peek_c[0] == "relay:3 (c) instance 3, at #" + stop[0].split()[0][1:] + ":"
        assert _state(peek_c) == '{"relayed": 0, "seen": null}'
        peek_a = debugger.command("peek a")[0]
        assert any(line.startswith("  running: handle relay") for line in peek_a)
        assert 'relay {"via": ["b", "c"], "tag": "second"} from host' in "\n".join(peek_a)
        assert "b'\\xa" not in "\n".join(peek_a + peek_c + bt)  # bodies decoded, not CBOR
    finally:
        debugger.close()


def test_back_then_step_reaches_the_same_event_and_state(relay_trace: Path) -> None:
    """goto N, back, step: the same event line and the same peeked state as the first time."""
    debugger = Debugger(relay_trace, progress=_quiet)
    try:
        debugger.start()
        debugger.command("break relay:2")
        _until(debugger, "continue", "handle relay")
        (at,) = _run(debugger, "step")
        n = int(at[0].split()[0][1:])
        first = debugger.command("peek b")[0]
        (back,) = _run(debugger, "back")
        assert back[0].startswith(f"#{n - 1} ")
        (again,) = _run(debugger, "step")
        assert again == at
        assert debugger.command("peek b")[0] == first
        (there,) = _run(debugger, f"goto {n}")
        assert there == at  # already there: nothing moves
        (earlier,) = _run(debugger, "goto 2")
        assert earlier[0].startswith("#2 ")
        (later,) = _run(debugger, f"goto {n}")
        assert later == at
    finally:
        debugger.close()


def test_kvstore_crash_restart_and_bodies(kv_trace: Path) -> None:
    """The kvstore's crash: break on the message, peek shows the state before it and after
    the restart, bt the restart; bodies and replies are decoded."""
    debugger = Debugger(kv_trace, progress=_quiet)
    try:
        debugger.start()
        _run(debugger, "break crash")
        (crash,) = _run(debugger, "continue")
        assert crash[0].endswith("[kv:1]: handle crash from host")
        (peek,) = _run(debugger, "peek kv")
        assert _state(peek) == '{"data": {"greeting": "hello", "answer": 42}}'
        assert '    put {"key": "answer", "value": 42} from host -> ok reply {"ok": true}' in peek
        assert "    crash from host (in flight)" in peek
        _run(debugger, "delete crash", "break size")
        (size,) = _run(debugger, "continue")
        assert "handle size from host" in size[0]
        (bt,) = _run(debugger, "bt")
        assert "    instance 1 crashed in handle (out_of_fuel); restarted as the next" in bt
        assert "    now instance 2 (restart 1)" in bt
        (peek,) = _run(debugger, "peek kv")
        assert peek[0].startswith("kv:1 (kv) instance 2, at #")
        assert _state(peek) == '{"data": {"greeting": "hello", "after": "the crash"}}'
        (end,) = _run(debugger, "continue")
        assert end[0].startswith("replay finished: ok")
        # The live agent answered size 2; the replayed state at the end holds two keys.
        (final,) = _run(debugger, "peek kv")
        assert final[0] == "kv:1 (kv) instance 2, at the end:"
        assert '    size from host -> ok reply {"size": 2}' in final
        (wrong,) = _run(debugger, "peek nobody")
        assert wrong == ["HostError: no agent or instance 'nobody' (agents: kv:1; instances: 1, 2)"]
    finally:
        debugger.close()


def test_mty_debug_on_stdin(kv_trace: Path) -> None:
    """`mty debug` fed on stdin: break on a message, peek an agent by name, go back."""
    result = CliRunner().invoke(
        main,
        ["debug", str(kv_trace)],
        input="break put\ncontinue\nback 2\nagents\nquit\n",
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert '[kv:1]: handle put {"key": "answer", "value": 42} from host' in out
    assert "kv:1 (kv) instance 2: 2 message(s) handled" in out


@pytest.mark.timing
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=30))
def test_the_sequencer_lets_events_through_in_offset_order(owners: list[int]) -> None:
    """Instances on their own threads pass their events by offset, whatever the scheduling,
    records that are never events (skipped here) holding no one up."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for offset, owner in enumerate(owners):
        groups.setdefault(owner, []).append({"@": offset * 10})
    sequencer = _Sequencer(groups)
    seen: list[int] = []

    def run(instance: int) -> None:
        for n, record in enumerate(groups[instance]):
            if n % 3 == 2:
                continue  # a record that is not an event (a close, a call cut short)
            sequencer.wait(instance, record["@"])
            seen.append(record["@"])
            sequencer.passed(instance, record["@"])
        sequencer.finished(instance, False)

    threads = [threading.Thread(target=run, args=(i,)) for i in groups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == sorted(seen)
    assert len(seen) == sum(
        1 for records in groups.values() for n in range(len(records)) if n % 3 != 2
    )


def test_the_debugger_is_not_held_to_the_recorded_deadline(kv_trace: Path) -> None:
    """A call stopped at the prompt must not time out: under the debugger every call gets
    DEBUG_TIMEOUT, not the recorded timeout (replay otherwise keeps the recorded one)."""
    recorded = {"fuel": 10, "memory": 1 << 20, "timeout": 1.0}
    assert ReplayLimits(timeout=5.0).cap(recorded, 0)[0].timeout == 1.0
    relaxed = ReplayLimits(timeout=5.0, timeout_from_trace=False)
    assert relaxed.cap(recorded, 0)[0].timeout == 5.0
    debugger = Debugger(kv_trace, progress=_quiet)
    try:
        assert debugger.limits.timeout == DEBUG_TIMEOUT
        assert not debugger.limits.timeout_from_trace
    finally:
        debugger.close()


@pytest.mark.timing
def test_quit_mid_run_stops_every_instance(relay_trace: Path) -> None:
    """Quitting while one agent is stopped and the others wait for their turn ends them all."""
    debugger = Debugger(relay_trace, progress=_quiet)
    debugger.start()
    debugger.command("break relay:3")
    _until(debugger, "continue", "handle relay")
    debugger.command("quit")
    assert not debugger._thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name.startswith("mighty-replay-")]
