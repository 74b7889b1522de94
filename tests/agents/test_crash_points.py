"""A hypothesis state machine over crash points of a durable agent (issue 33, Tests).

Each step is one real process (tests/agents/_crash_points_script.py) on the same state_dir: it
recovers what the last one left, sends a few ``work`` messages, and either asks the agent's
status and exits, or is killed with SIGKILL at the call hypothesis chose, before or after that
call's effect: a crash with a call in flight, possibly in the middle of the recovery of the
crash before. Two kinds of calls, one machine each: host tool calls (five a message; each
effect a line of a ledger file with the call's idempotency key, the process killing itself
in the tool), and HTTP requests (three a message, to a loopback server in this process that
counts them, notes their ``Idempotency-Key`` header and kills the process at the request). After each step the ledger, as the outside world saw it, must
say: each call seen once under its own key, except a call in flight at a crash, seen once more
with the same key (for each crash at it: a recovery can be killed at the same call); every accepted message done exactly once (its five calls, in order,
under five keys no other message has); and after a step that was not killed, the state a run
without crashes reaches (the status counts every message sent).

Cost: a step is a process start (about a second on a quiet machine, a few under load); the
settings keep each machine to about two dozen processes (some 20-40 s each on a loaded 2-core
machine, the guests' builds cached). No wall-clock assert: the processes get generous
deadlines, and a crash is a SIGKILL at a call, not a timer.

What they found: a durable agent's message number (from which its calls' idempotency keys are
derived) restarted at 1 whenever its inbox emptied, so later messages had earlier ones' keys
(the tool machine; mighty.agents._store now never reuses one); and a key's position counted
every import, so the request in flight at a crash, made again by a recovery that answered the
exchange before it with fewer polls, carried another key (the HTTP machine; the position now
counts keyed imports only, mighty.wasi.IdempotencyKeys.step).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.agents.test_journal import journaled_wasm  # noqa: F401 - the session's build

ROOT = Path(__file__).resolve().parents[2]
TOOL_WORK = [("count", 1), ("count", 2), ("count", 3), ("pause", 0), ("count", 4)]
"""The calls of one ``work`` message of tests/agents/guests/journaled.py, in order."""
HTTP_WORK = [("post", 1), ("post", 2), ("post", 3)]
"""The requests of one ``work`` message of tests/agents/guests/fetching.py, in order."""
SIGKILL_STATUS = -9
WAIT = 600.0
"""Seconds a process, or a request waiting for its process's sends, may take (a start on a
loaded machine): a hang fails the test, never a wait cut short."""

_killed = st.tuples(st.integers(1, 6), st.sampled_from(["before", "after"]))
crash_points = st.one_of(st.none(), _killed, _killed)
"""No crash (a third of the steps), or the step's n-th call (counted from 1) killed before or
after its effect; past the calls the step makes, no crash."""


@pytest.fixture(scope="session")
def fetching_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The durable HTTP client of tests/agents/guests/fetching.py, built once."""
    from tests.agents.conftest import GUESTS, _build_path

    return _build_path("fetching", tmp_path_factory.mktemp("fetching"), GUESTS)


def _script(*args: str) -> list[str]:
    return [sys.executable, "-m", "tests.agents._crash_points_script", *args]


class CrashPoints(RuleBasedStateMachine):
    """Durable work under crashes at chosen calls, checked from outside after each step."""

    wasm: Path
    work: list[tuple[str, int]]

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="crash-points-"))
        self.sent = 0
        self.last_clean: int | None = None
        """The status printed by the last step that was not killed (None: it was killed)."""
        self.steps = 0

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def launch(self, sends: int, at: int, phase: str) -> tuple[int, str]:
        """Run one step's process; its exit status and output."""
        raise NotImplementedError

    def lines(self) -> list[tuple[str, int, str]]:
        """Each effect the outside world saw, in order: (call, step, idempotency key)."""
        raise NotImplementedError

    def crashes(self) -> list[tuple[str, str]]:
        """(phase, key) of each call a step was killed at."""
        raise NotImplementedError

    @rule(sends=st.sampled_from([1, 2, 0]), crash=crash_points)
    def step(self, sends: int, crash: tuple[int, str] | None) -> None:
        """One process: recover, send ``sends`` work messages, finish or die at ``crash``."""
        at, phase = crash if crash is not None else (0, "before")
        status, output = self.launch(sends, at, phase)
        self.steps += 1
        self.sent += sends  # the sends return before any call may kill the process
        if status == SIGKILL_STATUS:
            self.last_clean = None
            return
        assert status == 0, output
        self.last_clean = json.loads(output.splitlines()[-1])["status"]

    @invariant()
    def each_call_once_but_the_one_in_flight_once_more_per_crash(self) -> None:
        """A key seen more than once is a call a crash interrupted after its effect: once
        more for each such crash (the recovery of a crash killed at the same call again)."""
        seen = Counter(key for _name, _step, key in self.lines())
        interrupted = Counter(key for phase, key in self.crashes() if phase == "after")
        for key, times in seen.items():
            assert times <= 1 + interrupted[key], (key, times, interrupted[key])

    @invariant()
    def every_message_is_its_calls_in_order_under_keys_of_its_own(self) -> None:
        """The effects without their repeats are the calls of whole messages in order, then
        the first calls of at most one in flight; no more messages than were sent."""
        first: list[tuple[str, int]] = []
        keys: set[str] = set()
        for name, step, key in self.lines():
            assert len(key) == 32, key
            if key not in keys:
                keys.add(key)
                first.append((name, step))
        whole, rest = divmod(len(first), len(self.work))
        assert first == (self.work * (whole + 1))[: len(first)], first
        assert whole + (rest > 0) <= self.sent, (whole, rest, self.sent)

    @invariant()
    def a_step_that_was_not_killed_ends_where_a_run_without_crashes_does(self) -> None:
        """Every message sent handled once: the status counts them and the effects are each
        one's calls, under calls x sent distinct keys."""
        if self.last_clean is None or self.steps == 0:
            return
        keys = {key for _name, _step, key in self.lines()}
        assert self.last_clean == self.sent
        assert len(keys) == len(self.work) * self.sent


class ToolCrashPoints(CrashPoints):
    """The durable worker's tool calls; the process kills itself in the chosen one."""

    work = TOOL_WORK

    def __init__(self) -> None:
        super().__init__()
        self.ledger = self.folder / "ledger"
        self.ledger.touch()

    def launch(self, sends: int, at: int, phase: str) -> tuple[int, str]:
        state, ledger = str(self.folder / "state"), str(self.ledger)
        done = subprocess.run(
            _script(str(self.wasm), state, ledger, str(sends), str(at), phase),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
        )
        return done.returncode, done.stdout + done.stderr

    def lines(self) -> list[tuple[str, int, str]]:
        found = []
        for line in self.ledger.read_text().splitlines():
            name, step, key = line.split()
            found.append((name, int(step), key))
        return found

    def crashes(self) -> list[tuple[str, str]]:
        path = Path(f"{self.ledger}.crash")
        if not path.exists():
            return []
        return [(p, k) for p, k in (line.split() for line in path.read_text().splitlines())]


class _Effects(ThreadingHTTPServer):
    """The outside world of the HTTP machine: ``POST /effect`` notes the request's step and
    ``Idempotency-Key`` and answers 200, once the step's process has said ``GET /sent``; the
    chosen request of a step kills that process with SIGKILL, before or after its note, and is
    never answered."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EffectHandler)
        self.lock = threading.Lock()
        self.lines: list[tuple[str, int, str]] = []
        self.crashes: list[tuple[str, str]] = []
        self.sent = threading.Event()
        self.pid = 0
        self.calls = 0
        self.at, self.phase = 0, "before"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def begin(self, pid: int, at: int, phase: str) -> None:
        """A step's process starts: its requests are counted from 1."""
        with self.lock:
            self.pid, self.calls, self.at, self.phase = pid, 0, at, phase
            self.sent.clear()

    def effect(self, step: int, key: str) -> bool:
        """Note one request's effect, or kill the process at it; whether to answer."""
        assert self.sent.wait(WAIT), "the process never said its sends were done"
        with self.lock:
            self.calls += 1
            crash = self.calls == self.at
            if crash and self.phase == "after":
                self.lines.append(("post", step, key))
            if crash:
                self.crashes.append((self.phase, key))
                os.kill(self.pid, signal.SIGKILL)
                return False
            self.lines.append(("post", step, key))
            return True

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(WAIT)


class _EffectHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Effects

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return b"".join(self._chunks())

    def _chunks(self) -> Iterator[bytes]:
        while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
            yield self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass  # trailer fields

    def do_GET(self) -> None:
        self.server.sent.set()
        self._answer(b"{}")

    def do_POST(self) -> None:
        step = json.loads(self._body())["step"]
        key = self.headers.get("Idempotency-Key") or ""
        if self.server.effect(int(step), key):
            self._answer(b'{"ok": true}')
        else:
            self.close_connection = True

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class HttpCrashPoints(CrashPoints):
    """The durable HTTP client's requests; the server kills the process at the chosen one."""

    work = HTTP_WORK

    def __init__(self) -> None:
        super().__init__()
        self.server = _Effects()

    def teardown(self) -> None:
        self.server.close()
        super().teardown()

    def launch(self, sends: int, at: int, phase: str) -> tuple[int, str]:
        state, ledger = str(self.folder / "state"), str(self.folder / "unused")
        args = [str(self.wasm), state, ledger, str(sends), "0", "before", self.server.origin]
        with subprocess.Popen(
            _script(*args),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as process:
            self.server.begin(process.pid, at, phase)
            try:
                output, _ = process.communicate(timeout=WAIT)
            finally:
                process.kill()
        return process.returncode, output

    def lines(self) -> list[tuple[str, int, str]]:
        with self.server.lock:
            return list(self.server.lines)

    def crashes(self) -> list[tuple[str, str]]:
        with self.server.lock:
            return list(self.server.crashes)


SETTINGS = settings(
    max_examples=3,
    stateful_step_count=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_crash_points_of_tool_calls(journaled_wasm: Path) -> None:  # noqa: F811
    """Killed at hypothesis-chosen tool calls: exactly once from outside, state as uncrashed."""
    ToolCrashPoints.wasm = journaled_wasm
    run_state_machine_as_test(ToolCrashPoints, settings=SETTINGS)


def test_crash_points_of_http_requests(fetching_wasm: Path) -> None:
    """Killed at hypothesis-chosen HTTP requests: the same, keys from the requests' headers."""
    HttpCrashPoints.wasm = fetching_wasm
    run_state_machine_as_test(HttpCrashPoints, settings=SETTINGS)
