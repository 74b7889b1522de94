"""`mty history` and `mty fork` on a durable agent killed with -9 mid-message: its checkpoint,
journaled messages and logged imports in order, a fork that runs from a past position, a
replayable trace of its message in flight, and typed errors for damaged or missing state."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty.agents import JournalCorrupt, read_history
from mighty.agents.hosting import SnapshotStore
from tests.agents.test_journal import journaled_wasm  # noqa: F401 - the session's build

ROOT = Path(__file__).resolve().parents[2]
MTY = [sys.executable, "-m", "mighty.cli"]
KINDS = ["checkpoint", "message", "import", "import", "import", "message", "message"]


def _script(mode: str, wasm: Path, tmp: Path, *names: str) -> list[str]:
    args = [str(wasm), str(tmp / "state"), str(tmp / "counter"), str(tmp / "marker")]
    return [sys.executable, "-m", "tests.agents._history_script", mode, *args, *names]


def mty(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MTY, *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def crashed(journaled_wasm: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:  # noqa: F811
    """Worker ``w`` handled two messages, then was sent work, status, work and killed with -9
    three tool calls into the first; what `mty history --json` said while it was alive."""
    tmp = tmp_path_factory.mktemp("crashed")
    clean = subprocess.run(
        _script("clean", journaled_wasm, tmp),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout.splitlines()[-1]) == [1, 2]
    process = subprocess.Popen(
        _script("crash", journaled_wasm, tmp),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600  # a start on a loaded machine
        while not (tmp / "marker").exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the agent never paused"
            time.sleep(0.05)
        live = mty("history", "w", "--state-dir", tmp / "state", "--json")
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=60)
        process.communicate()
    return {"dir": tmp, "wasm": journaled_wasm, "live": live}


def _copy(crashed: dict[str, Any], tmp_path: Path) -> Path:
    shutil.copytree(crashed["dir"] / "state", tmp_path / "state")
    return tmp_path / "state"


def test_history_lists_the_checkpoint_messages_and_imports_in_order(
    crashed: dict[str, Any],
) -> None:
    """The checkpoint, the message in flight and its three logged calls, then the two pending."""
    done = mty("history", "w", "--state-dir", crashed["dir"] / "state")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("worker:1 (w), type worker")
    kinds = [line.split()[1] for line in lines[1:]]
    assert kinds == KINDS
    assert [int(line.split()[0]) for line in lines[1:]] == list(range(7))
    assert "work from host" in lines[2]
    assert "(in flight)" in lines[2]
    for step, line in zip((1, 2, 3), lines[3:6], strict=True):
        assert f'"step": {step}' in line
    assert "status from host" in lines[6]
    assert "work from host" in lines[7]


def test_history_json_parses_and_matches_what_a_live_runtime_showed(
    crashed: dict[str, Any],
) -> None:
    """--json is one object; read while the runtime held the store, it said the same."""
    done = mty("history", "w", "--state-dir", crashed["dir"] / "state", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["ok"] is True
    assert found["agent"] == "worker:1"
    assert [e["kind"] for e in found["entries"]] == KINDS
    # Numbered past the two messages handled before the crash: a seq is never used again.
    assert [e["seq"] for e in found["entries"] if e["kind"] == "message"] == [3, 4, 5]
    assert (
        found["entries"][0]["component"]
        == json.loads(crashed["live"].stdout)["entries"][0]["component"]
    )
    live = crashed["live"]
    assert live.returncode == 0, live.stderr
    assert json.loads(live.stdout)["entries"] == found["entries"]


def test_history_limit_lists_some_and_counts_the_rest(crashed: dict[str, Any]) -> None:
    """--limit 3 lists three entries and says how many more there are."""
    done = mty("history", "w", "--state-dir", crashed["dir"] / "state", "--limit", "3", "--json")
    found = json.loads(done.stdout)
    assert [e["kind"] for e in found["entries"]] == KINDS[:3]
    assert found["more"] == 4
    text = mty("history", "w", "--state-dir", crashed["dir"] / "state", "--limit", "3")
    assert "… 4 more" in text.stdout


def test_a_fork_runs_from_its_position_with_its_own_log(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """Forks at the checkpoint and two calls into the message: each runs to the state of
    then; the second's first two calls come from the copied log; the original's log is
    untouched."""
    state = _copy(crashed, tmp_path)
    log = state / "journal" / "worker_1.trace"
    before = log.read_bytes()
    for at, name in ((0, "then"), (3, "mid")):
        done = mty("fork", "w", "--at", str(at), "--as", name, "--state-dir", state, "--json")
        assert done.returncode == 0, done.stderr
    assert log.read_bytes() == before
    forked = json.loads(mty("history", "mid", "--state-dir", state, "--json").stdout)
    assert [e["kind"] for e in forked["entries"]] == KINDS[:4]
    assert forked["log"] != str(log)
    ran = subprocess.run(
        _script("status", crashed["wasm"], tmp_path, "then", "mid", "w"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    # then: the checkpoint (two messages handled); mid: the message finished (3); w: all (4).
    assert json.loads(ran.stdout.splitlines()[-1]) == {"then": 2, "mid": 3, "w": 4}
    # Made live: w's last call of its message and its second work (4; 1 2 3 4), mid's 3 and 4.
    calls = sorted(int(x) for x in (tmp_path / "counter").read_text().split())
    assert calls == sorted([4, 1, 2, 3, 4, 3, 4])


def test_fork_refuses_a_position_past_the_history_and_a_taken_name(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """Position 7 and the name w are refused in one typed line; nothing is stored."""
    state = _copy(crashed, tmp_path)
    past = mty("fork", "w", "--at", "7", "--as", "x", "--state-dir", state, "--json")
    assert past.returncode == 2
    error = json.loads(past.stdout)["error"]
    assert error["kind"] == "fork_refused"
    assert "from 0 (its checkpoint) to 6" in error["message"]
    taken = mty("fork", "w", "--at", "0", "--as", "w", "--state-dir", state)
    assert taken.returncode == 2
    assert taken.stderr.startswith("mty: error: the name 'w' is already")
    assert len(taken.stderr.splitlines()) == 1
    assert mty("history", "x", "--state-dir", state).returncode == 2


def test_fork_refuses_a_state_dir_a_runtime_holds(crashed: dict[str, Any], tmp_path: Path) -> None:
    """A fork writes the store, so it waits for no runtime: the lock held is a typed error."""
    state = _copy(crashed, tmp_path)
    holder = SnapshotStore(state)
    try:
        done = mty("fork", "w", "--at", "0", "--as", "x", "--state-dir", state, "--json")
    finally:
        holder.close()
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"]["kind"] == "bad_state_dir"


def test_replay_takes_the_history_trace_not_the_bare_log(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """The import log alone has no call that ended (typed refusal); --trace writes one that
    replays (restore, then the message up to where the log ends) and steps in mty debug."""
    state = crashed["dir"] / "state"
    bare = mty("replay", state / "journal" / "worker_1.trace")
    assert bare.returncode == 2
    assert "holds no call to replay" in bare.stderr
    out = tmp_path / "past.trace"
    wrote = mty("history", "w", "--state-dir", state, "--trace", out, "--json")
    assert wrote.returncode == 0, wrote.stderr
    assert json.loads(wrote.stdout) == {"ok": True, "trace": str(out), "imports": 3}
    replayed = mty("replay", out, "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["ok"] is True
    assert "interrupted in handle" in mty("replay", out).stdout
    debug = mty("debug", out, stdin="break mighty:agent/tools\ncontinue\ncontinue\nquit\n")
    assert debug.returncode == 0, debug.stderr
    assert debug.stdout.count("mighty:agent/tools#call") >= 2


def test_history_errors_are_one_typed_line(crashed: dict[str, Any], tmp_path: Path) -> None:
    """An unknown agent, a missing state_dir, one without a store, a manifest without one."""
    state = crashed["dir"] / "state"
    cases: list[tuple[tuple[str | Path, ...], str, str]] = [
        (("history", "nobody", "--state-dir", state), "unknown_agent", "stored: worker:1 (w)"),
        (("history", "w", "--state-dir", tmp_path / "none"), "bad_state_dir", "no such"),
        (("history", "w", "--state-dir", tmp_path), "bad_state_dir", "no snapshot store"),
    ]
    manifest = tmp_path / "mighty.toml"
    manifest.write_text("[agents]\n")
    cases.append((("history", "w", manifest), "bad_input", "no [runtime] state_dir"))
    for args, kind, words in cases:
        done = mty(*args, "--json")
        assert done.returncode == 2, args
        error = json.loads(done.stdout)["error"]
        assert (error["kind"], words in error["message"]) == (kind, True), error
        text = mty(*args)
        assert text.stderr.startswith("mty: error: ")
        assert len(text.stderr.splitlines()) == 1


@pytest.mark.parametrize("damage", ["half", "garbage", "not_sqlite"])
def test_a_damaged_store_is_a_typed_error(
    crashed: dict[str, Any], tmp_path: Path, damage: str
) -> None:
    """A cut, overwritten or foreign database file is one line, never a traceback."""
    state = _copy(crashed, tmp_path)
    db = state / "agents.sqlite3"
    with sqlite3.connect(db) as conn:  # fold the WAL in, so the damage is what is read
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = db.read_bytes()
    if damage == "half":
        db.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        db.write_bytes(data[:4096] + bytes(range(256)) * ((len(data) - 4096) // 256))
    else:
        db.write_bytes(b"this is not a database" * 200)
    done = mty("history", "w", "--state-dir", state, "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["kind"] in ("bad_state_dir", "snapshot_corrupt", "unknown_agent"), error
    assert "internal" not in error["kind"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_a_cut_or_flipped_log_reads_as_its_whole_records_or_a_typed_error(
    crashed: dict[str, Any], tmp_path: Path, data: st.DataObject
) -> None:
    """Any truncation point or byte flip of the log: the entries are a prefix of the whole
    history's (a torn tail is what a crash leaves), or the read is JournalCorrupt."""
    state = tmp_path / "state"
    if not state.exists():
        _copy(crashed, tmp_path)
    whole = read_history(crashed["dir"] / "state", "w")
    log = state / "journal" / "worker_1.trace"
    original = (crashed["dir"] / "state" / "journal" / "worker_1.trace").read_bytes()
    if data.draw(st.booleans(), label="cut"):
        damaged = original[: data.draw(st.integers(0, len(original) - 1), label="at")]
    else:
        at = data.draw(st.integers(0, len(original) - 1), label="at")
        flip = data.draw(st.integers(1, 255), label="xor")
        damaged = original[:at] + bytes([original[at] ^ flip]) + original[at + 1 :]
    log.write_bytes(damaged)
    try:
        found = read_history(state, "w")
    except JournalCorrupt as exc:
        message = exc.message
        found = None
    if found is None:
        assert str(log) in message
        assert "\n" not in message
        return
    kinds = [e.kind for e in found.entries]
    listed = [e.to_json() for e in found.entries if e.kind != "message"]
    full = [e.to_json() for e in whole.entries if e.kind != "message"]
    assert listed == full[: len(listed)]
    assert kinds.count("message") == 3


def test_a_huge_log_is_listed_in_bounded_memory(crashed: dict[str, Any], tmp_path: Path) -> None:
    """20,000 logged calls with 8 KiB results each (160 MB): --limit 5 lists five, counts the
    rest by frame, and the process grows by far less than the log."""
    from mighty.trace import Recorder, TraceReader

    state = _copy(crashed, tmp_path)
    log = state / "journal" / "worker_1.trace"
    with TraceReader(log) as reader:
        records = list(reader.records())
    log.unlink()
    recorder = Recorder(log, flush="call", positions=False)
    first = next(i for i, record in enumerate(records) if record.get("k") == "import")
    for record in records[:first]:  # the instance, the message it is of, the call
        recorder.append(record)
    template = records[first]
    for n in range(20_000):
        recorder.append({**template, "s": n + 2, "res": n.to_bytes(4, "big") * 2048})
    recorder.close()
    assert log.stat().st_size > 160_000_000
    code = (
        "import resource, sys, json\n"
        "from mighty.agents import read_history\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "h = read_history(sys.argv[1], 'w', limit=int(sys.argv[2]))\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps([len(h.entries), h.more, (after - before) // 1024]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(state), "5"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed, more, grown_mb = json.loads(done.stdout)
    assert listed == 5
    assert more == 20_000 - 3 + 2  # the calls not listed, and the two pending messages
    assert grown_mb < 40, f"grew {grown_mb} MB reading a 160 MB log"


def test_a_log_left_beside_a_recovery_is_read_as_recovery_reads_it(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """A crash during a recovery leaves the first log as ``.prev``: history reads the longer."""
    state = _copy(crashed, tmp_path)
    log = state / "journal" / "worker_1.trace"
    log.rename(log.with_name(log.name + ".prev"))
    found = read_history(state, "w")
    assert [e.kind for e in found.entries] == KINDS
    assert found.log == log.with_name(log.name + ".prev")


def test_a_log_whose_message_was_checkpointed_is_stale_and_not_forked(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """A log with no journaled message (a crash between the checkpoint and the log's deletion)
    is listed as stale; a fork inside it is refused, one at the checkpoint is not."""
    state = _copy(crashed, tmp_path)
    with sqlite3.connect(state / "agents.sqlite3") as db:
        db.execute("DELETE FROM inbox")
    found = read_history(state, "w")
    assert found.stale
    assert [e.kind for e in found.entries] == ["checkpoint", "import", "import", "import"]
    refused = mty("fork", "w", "--at", "2", "--as", "x", "--state-dir", state, "--json")
    assert json.loads(refused.stdout)["error"]["kind"] == "fork_refused"
    assert "already checkpointed" in json.loads(refused.stdout)["error"]["message"]
    assert mty("fork", "w", "--at", "0", "--as", "x", "--state-dir", state).returncode == 0
    assert not (state / "journal" / "worker_2.trace").exists()


def _call(
    template: dict[str, Any], interface: str, function: str, args: list[Any], res: Any
) -> dict[str, Any]:
    """``template`` (a logged import) as a call of ``interface.function``."""
    return {**template, "if": interface, "fn": function, "args": args, "res": res, "out": "ok"}


def _exchange(
    template: dict[str, Any], first: int, body: bytes, status: int | None
) -> list[dict[str, Any]]:
    """The wasi:http and wasi:io imports of one POST, its handles numbered from ``first``;
    without ``status``, it ends at ``handle`` (in flight at a crash)."""
    from mighty.abi import Err, Ok, Variant
    from mighty.trace import HandleRef

    types, streams = "wasi:http/types", "wasi:io/streams"
    fields, request, out_body, out, future, response, in_body, stream = (
        HandleRef(i, n, first + k)
        for k, (i, n) in enumerate(
            [
                (types, "fields"),
                (types, "outgoing-request"),
                (types, "outgoing-body"),
                (streams, "output-stream"),
                (types, "future-incoming-response"),
                (types, "incoming-response"),
                (types, "incoming-body"),
                (streams, "input-stream"),
            ]
        )
    )
    request_calls = [
        (types, "[static]fields.from-list", [[("content-type", b"application/json")]], Ok(fields)),
        (types, "[constructor]outgoing-request", [fields], request),
        (types, "[method]outgoing-request.set-method", [request, Variant("post")], Ok(None)),
        (types, "[method]outgoing-request.set-scheme", [request, Variant("HTTP")], Ok(None)),
        (types, "[method]outgoing-request.set-authority", [request, "127.0.0.1:9"], Ok(None)),
        (types, "[method]outgoing-request.set-path-with-query", [request, "/v1/x"], Ok(None)),
        (types, "[method]outgoing-request.body", [request], Ok(out_body)),
        ("wasi:http/outgoing-handler", "handle", [request, None], Ok(future)),
        (types, "[method]outgoing-body.write", [out_body], Ok(out)),
        (streams, "[method]output-stream.blocking-write-and-flush", [out, body], Ok(None)),
    ]
    response_calls = [
        (types, "[method]future-incoming-response.get", [future], Ok(Ok(response))),
        (types, "[method]incoming-response.status", [response], status),
        (types, "[method]incoming-response.consume", [response], Ok(in_body)),
        (types, "[method]incoming-body.stream", [in_body], Ok(stream)),
        (streams, "[method]input-stream.read", [stream, 65536], Ok(b'{"ok": true}')),
        (streams, "[method]input-stream.read", [stream, 65536], Err(Variant("closed"))),
    ]
    calls = request_calls + (response_calls if status is not None else [])
    return [_call(template, *call) for call in calls]


def test_an_http_request_is_one_entry_and_a_fork_takes_it_whole(
    crashed: dict[str, Any], tmp_path: Path
) -> None:
    """Two requests back to back and one cut at its ``handle``, among tool calls: one import
    entry each (method, URL, status or none), the log's imports numbered without a gap; --limit
    cuts between entries; a fork at the second request copies all of its calls."""
    from mighty.agents import fork_agent
    from mighty.trace import Recorder, TraceReader

    state = _copy(crashed, tmp_path)
    log = state / "journal" / "worker_1.trace"
    with TraceReader(log) as reader:
        records = list(reader.records())
    log.unlink()
    first = next(i for i, record in enumerate(records) if record.get("k") == "import")
    count1, count2, count3 = records[first : first + 3]
    body = [*records[:first], count1]
    body += _exchange(count1, 100, b'{"q": 1}', 200) + _exchange(count1, 200, b'{"q": 22}', 201)
    body += [count2, count3, *_exchange(count1, 300, b'{"q": 333}', None)]
    recorder = Recorder(log, flush="call", positions=False)
    for step, record in enumerate(body):
        recorder.append({**record, "s": step} if record.get("k") == "import" else record)
    recorder.close()
    found = read_history(state, "w")
    entries = [e.to_json() for e in found.entries]
    assert [e["kind"] for e in entries] == ["checkpoint", "message"] + ["import"] * 6 + [
        "message"
    ] * 2
    http = [e.get("http") for e in entries[2:8]]
    url = "http://127.0.0.1:9/v1/x"
    assert [None if h is None else (h["method"], h["url"], h["status"]) for h in http] == [
        None,
        ("POST", url, 200),
        ("POST", url, 201),
        None,
        None,
        ("POST", url, None),
    ]
    assert [h["request_bytes"] for h in http if h is not None] == [8, 9, 10]
    assert [e["import"] for e in entries[2:8]] == [1, 17, 33, 34, 35, 45]
    assert [e.get("imports", 1) for e in entries[2:8]] == [1, 16, 16, 1, 1, 10]
    assert entries[3]["summary"] == (
        f"http POST {url}, 8-byte body -> 200, 12-byte body read (16 imports)"
    )
    assert "no response logged" in entries[7]["summary"]
    limited = read_history(state, "w", limit=4)
    assert [e.to_json() for e in limited.entries] == entries[:4]
    assert limited.more > 0
    fork = fork_agent(state, "w", 4, "second")
    assert (fork.messages, fork.imports) == (1, 33)
    forked = read_history(state, "second")
    assert [(e.kind, e.summary) for e in forked.entries] == [
        (e["kind"], e["summary"]) for e in entries[:5]
    ]
