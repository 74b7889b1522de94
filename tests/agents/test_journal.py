"""The journal of durable agents: an accepted message survives a kill -9 of the process, and
recovery answers the imports that completed before the crash from the log, so a tool call the
outside world saw is not made again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.agents._store import MAX_INBOX_BODY, SnapshotCorrupt, SnapshotStore, StoredSnapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def journaled_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The durable worker of tests/agents/guests/journaled.py, built once."""
    from tests.agents.conftest import GUESTS, _build_path

    return _build_path("journaled", tmp_path_factory.mktemp("journaled"), GUESTS)


def _script(mode: str, wasm: Path, tmp: Path) -> list[str]:
    args = [str(wasm), str(tmp / "state"), str(tmp / "counter"), str(tmp / "marker")]
    return [sys.executable, "-m", "tests.agents._journal_script", mode, *args]


def _wait_for(condition: object, what: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 600  # a cold build and start on a loaded machine
    while not condition():  # type: ignore[operator]
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the process ended before {what}: {out}{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"no {what} within 600 s")
        time.sleep(0.05)


def _killed_after_three_calls(journaled_wasm: Path, tmp_path: Path) -> Path:
    """Run ``first`` and kill it -9 once the message is paused after three tool calls; the
    import log it left."""
    first = subprocess.Popen(
        _script("first", journaled_wasm, tmp_path),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for((tmp_path / "marker").exists, "the agent paused mid-message", first)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        first.wait(timeout=60)
        first.communicate()
    return tmp_path / "state" / "journal" / "worker_1.trace"


def test_a_message_in_flight_survives_kill_9_without_repeating_tool_calls(
    journaled_wasm: Path, tmp_path: Path
) -> None:
    """Killed after three tool calls: the restart finishes the message; each call seen once."""
    counter = tmp_path / "counter"
    log = _killed_after_three_calls(journaled_wasm, tmp_path)
    assert counter.read_text().split() == ["1", "2", "3"]
    assert log.is_file()
    second = subprocess.run(
        _script("second", journaled_wasm, tmp_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert second.returncode == 0, second.stdout + second.stderr
    report = json.loads(second.stdout.strip().splitlines()[-1])
    assert report["status"] == 1
    assert "agent.journal_recovered" in report["events"]
    # Steps 1-3 were answered from the log; the pause and step 4 ran live, once.
    assert counter.read_text().split() == ["1", "2", "3", "4"]
    assert not log.exists()
    # The pause was in flight at the crash: made again, with the same idempotency key.
    keys = (tmp_path / "marker.keys").read_text().split()
    assert len(keys) == 2
    assert keys[0] == keys[1]
    assert len(keys[0]) == 32


def test_a_log_the_guest_does_not_retrace_stops_the_recovered_message(
    journaled_wasm: Path, tmp_path: Path
) -> None:
    """A log whose first tool call is not the one the guest makes (rewritten here, as a log
    that is not this message's would be): the recovery stops the message at that call with
    replay's divergence, a crash for the supervisor; no tool call runs live."""
    from mighty import Component
    from mighty.agents import AgentType, Grants, Runtime
    from mighty.budget import Budget
    from mighty.capabilities import Capabilities
    from mighty.trace import Recorder, TraceReader

    log = _killed_after_three_calls(journaled_wasm, tmp_path)
    counter = tmp_path / "counter"
    assert counter.read_text().split() == ["1", "2", "3"]
    with TraceReader(log) as reader:
        records = list(reader.records())
    first_call = next(r for r in records if r.get("fn") == "call" and r.get("k") == "import")
    assert first_call["args"] == ["count", b'{"args": [], "kwargs": {"step": 1}}']
    first_call["args"] = ["count", b'{"args": [], "kwargs": {"step": 9}}']
    log.unlink()
    with Recorder(log, flush="record") as recorder:
        for record in records:
            recorder.append(record)
    seen: list[int] = []
    capabilities = Capabilities().with_tool("count", seen.append).with_tool("pause", lambda: "")
    worker = AgentType(
        "worker",
        Component.load(journaled_wasm),
        budget=Budget(timeout=600.0),
        durable=True,
        grants=Grants(tools=frozenset({"count", "pause"})),
    )
    with Runtime(workers=1, state_dir=tmp_path / "state", capabilities=capabilities) as rt:
        rt.register(worker)
        deadline = time.monotonic() + 600
        while not any(e.kind == "agent.crashed" for e in rt.events):
            assert time.monotonic() < deadline, [e.kind for e in rt.events]
            time.sleep(0.05)
        crash = next(e for e in rt.events if e.kind == "agent.crashed")
    reason = str(crash.data["reason"])
    assert reason.startswith("nondeterminism: "), reason
    assert "the trace has mighty:agent/tools#call" in reason
    assert '"step": 9' in reason and '"step": 1' in reason  # what the log has, what came
    assert seen == []  # nothing ran live: not count(1), nor pause, nor count(4)
    assert counter.read_text().split() == ["1", "2", "3"]


def test_a_message_handled_before_the_crash_is_not_run_again(
    journaled_wasm: Path, tmp_path: Path
) -> None:
    """A runtime that ends cleanly leaves no journal: a new one recovers nothing."""
    code = (
        "import sys\n"
        "from mighty import Component\n"
        "from mighty.agents import AgentType, Grants, Runtime\n"
        "from mighty.capabilities import Capabilities\n"
        "out = open(sys.argv[2], 'a')\n"
        "caps = Capabilities().with_tool('count', lambda step: out.write(f'{step}\\n') and step)"
        ".with_tool('pause', lambda: 'go')\n"
        "t = AgentType('worker', Component.load(sys.argv[1]), durable=True,"
        " grants=Grants(tools=frozenset({'count', 'pause'})))\n"
        "with Runtime(workers=1, state_dir=sys.argv[3], capabilities=caps) as rt:\n"
        "    rt.register(t)\n"
        "    if sys.argv[4] == 'first':\n"
        "        a = rt.spawn('worker')\n"
        "        print(rt.ask(a, 'work'))\n"
        "    else:\n"
        "        print(rt.ask('worker:1', 'status'))\n"
        "    out.flush()\n"
    )
    counter = tmp_path / "counter"
    argv = [str(journaled_wasm), str(counter), str(tmp_path / "state")]
    for mode, expected in (("first", "1"), ("second", "1")):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv, mode],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == expected
    assert counter.read_text().split() == ["1", "2", "3", "4"]


def _snapshot(address: str = "worker:1") -> StoredSnapshot:
    return StoredSnapshot(address, "worker", None, "c" * 64, "s" * 64, True, b"state")


def test_inbox_rows_go_with_the_state_that_includes_them(tmp_path: Path) -> None:
    """put(done=seq) writes the state and deletes the row in one transaction."""
    store = SnapshotStore(tmp_path)
    try:
        first = store.inbox_put("worker:1", "host", "work", b"\x01")
        second = store.inbox_put("worker:1", "host", "work", b"\x02")
        assert (first, second) == (1, 2)
        assert store.inbox_addresses() == ["worker:1"]
        store.put(_snapshot(), sync=True, done=first)
        assert [row[0] for row in store.inbox("worker:1")] == [second]
        store.inbox_done("worker:1", second)
        assert store.inbox("worker:1") == []
        assert store.inbox_addresses() == []
    finally:
        store.close()


def test_a_seq_is_never_used_again(tmp_path: Path) -> None:
    """A message journaled after the inbox emptied gets the next seq, not 1 again (its calls'
    idempotency keys are derived from it), in this store and after a reopen."""
    store = SnapshotStore(tmp_path)
    try:
        first = store.inbox_put("worker:1", "host", "work", b"1")
        store.put(_snapshot(), sync=True, done=first)
        second = store.inbox_put("worker:1", "host", "work", b"2")
        store.inbox_done("worker:1", second)
        assert (first, second) == (1, 2)
        assert store.inbox("worker:1") == []
    finally:
        store.close()
    store = SnapshotStore(tmp_path)
    try:
        assert store.inbox_put("worker:1", "host", "work", b"3") == 3
        assert store.inbox_put("worker:2", "host", "work", b"x") == 1
    finally:
        store.close()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a:1", "b:2"]), st.binary(max_size=64)), max_size=12))
def test_inbox_keeps_each_agents_messages_in_order(
    tmp_path_factory: pytest.TempPathFactory, messages: list[tuple[str, bytes]]
) -> None:
    """Each agent's journaled messages come back in the order they were accepted, intact."""
    store = SnapshotStore(tmp_path_factory.mktemp("inbox"))
    try:
        for address, body in messages:
            store.inbox_put(address, "host", "m", body)
        for address in ("a:1", "b:2"):
            expected = [body for a, body in messages if a == address]
            rows = store.inbox(address)
            assert [row[3] for row in rows] == expected
            assert [row[0] for row in rows] == list(range(1, len(expected) + 1))
    finally:
        store.close()


def test_a_damaged_inbox_row_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A body over the bound (an edited database) is SnapshotCorrupt, checked in SQL first."""
    store = SnapshotStore(tmp_path)
    try:
        store.inbox_put("worker:1", "host", "work", b"x")
        with store._writing(False):
            store._db.execute(
                "UPDATE inbox SET body = zeroblob(?) WHERE address = 'worker:1'",
                (MAX_INBOX_BODY + 1,),
            )
        with pytest.raises(SnapshotCorrupt, match="over its bounds"):
            store.inbox("worker:1")
    finally:
        store.close()


def test_a_log_of_another_build_refuses_the_recovery(
    tmp_path: Path, budget_wasm_path: Path, journaled_wasm: Path
) -> None:
    """A log written by one component does not answer another: the recovery is refused,
    naming both, instead of running the message live."""
    from mighty import Component
    from mighty.agents._journal import Journal
    from mighty.trace import Recorder
    from mighty.wasi import Policy

    written, now = Component.load(budget_wasm_path), Component.load(journaled_wasm)
    store = SnapshotStore(tmp_path / "state")
    try:
        journal = Journal(store)
        path = journal.log_path("worker:1")
        path.parent.mkdir(parents=True)
        with Recorder(path) as recorder:
            recorder.attach(written, {"fuel": 1}, Policy(), agent="worker:1")
        recovery = journal.recovery("worker:1", now)
        assert recovery is not None
        assert recovery.answers is None
        assert written.sha256[:12] in recovery.refusal
        assert now.sha256[:12] in recovery.refusal
        same = journal.recovery("worker:1", written)
        assert same is not None
        assert same.refusal == ""
        assert same.answers is not None
        assert journal.recovery("worker:2", now) is None
    finally:
        store.close()


def test_a_log_of_a_checkpointed_message_does_not_answer_the_next(
    tmp_path: Path, journaled_wasm: Path
) -> None:
    """A crash between a message's checkpoint and its log's deletion leaves a stale log: it
    says which message it is of, and the next pending message's recovery takes no answer from
    it (an identical call would otherwise be answered, never made). A log of that message, or
    one too old to say, answers as before."""
    from mighty import Component
    from mighty.agents._journal import Journal
    from mighty.trace import Recorder
    from mighty.wasi import Policy

    component = Component.load(journaled_wasm)
    store = SnapshotStore(tmp_path / "state")
    try:
        journal = Journal(store)
        path = journal.log_path("worker:1")
        path.parent.mkdir(parents=True)
        with Recorder(path) as recorder:
            recorder.attach(component, {"fuel": 1}, Policy(), agent="worker:1")
            recorder.append({"k": "journal", "seq": 7})
        assert journal.recovery("worker:1", component, 8) is None  # stale: 7 was checkpointed
        fresh = journal.recovery("worker:1", component, 7)
        assert fresh is not None and fresh.answers is not None
        path.replace(path.with_name(path.name + ".prev"))  # kept as .prev: the same rule
        assert journal.recovery("worker:1", component, 8) is None
        with Recorder(path) as recorder:  # a log from before logs said their message
            recorder.attach(component, {"fuel": 1}, Policy(), agent="worker:1")
        old = journal.recovery("worker:1", component, 8)
        assert old is not None and old.answers is not None
    finally:
        store.close()


def test_an_idempotency_key_counts_only_the_calls_it_may_be_given_to() -> None:
    """Polls, reads and clock calls between a message's requests and tool calls do not move
    its keys (a re-run polls a response answered from the log fewer times); each keyed call
    has its own key, per message."""
    from mighty.wasi import IdempotencyKeys

    handle = ("wasi:http/outgoing-handler@0.2.0", "handle")
    tool = ("mighty:agent/tools", "call")
    poll = ("wasi:io/poll@0.2.0", "[method]pollable.block")
    read = ("wasi:io/streams@0.2.0", "[method]input-stream.read")

    def keys(message: int, calls: list[tuple[str, str]]) -> list[str]:
        found = IdempotencyKeys("worker:1")
        found.begin(message)
        made = []
        for interface, function in calls:
            found.step(interface, function)
            if (interface, function) in (handle, tool):
                made.append(found.key())
        return made

    slow = keys(7, [handle, poll, poll, read, read, tool, handle, poll])
    quick = keys(7, [handle, read, tool, handle])
    assert slow == quick
    assert len(set(slow)) == 3
    assert set(keys(8, [handle, tool, handle])).isdisjoint(slow)
