"""A hypothesis state machine over crash points of a durable agent (issue 33, Tests).

Each step is one real process (tests/agents/_crash_points_script.py) on the same state_dir: it
recovers what the last one left, sends a few ``work`` messages (five tool calls each, every
call's effect a line of a ledger file with the call's idempotency key), and either asks the
agent's status and exits, or is killed with SIGKILL by the tool call hypothesis chose, before
or after that call's effect: a crash with a call in flight, possibly in the middle of the
recovery of the crash before. After each step the ledger, as the outside world saw it, must
say: each call seen once under its own key, except a call in flight at a crash, seen at most
twice with the same key; every accepted message done exactly once (its five calls, in order,
under five keys no other message has); and after a step that was not killed, the state a run
without crashes reaches (the status counts every message sent).

Cost: a step is a process start (about a second on a quiet machine, a few under load); the
settings keep it to a few dozen processes. No wall-clock assert: the processes get generous
deadlines, and a crash is the process's own SIGKILL at a call, not a timer.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tests.agents.test_journal import journaled_wasm  # noqa: F401 - the session's build

ROOT = Path(__file__).resolve().parents[2]
WORK = [("count", 1), ("count", 2), ("count", 3), ("pause", 0), ("count", 4)]
"""The calls of one ``work`` message (tests/agents/guests/journaled.py), in order."""
SIGKILL_STATUS = -9

_killed = st.tuples(st.integers(1, len(WORK) + 1), st.sampled_from(["before", "after"]))
crash_points = st.one_of(st.none(), _killed, _killed)
"""No crash (a third of the steps), or the process's n-th tool call (counted from 1) killed
before or after its effect; past the calls the step makes, no crash."""


class CrashPoints(RuleBasedStateMachine):
    """Durable work under crashes at chosen tool calls, checked from outside after each step."""

    wasm: Path

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="crash-points-"))
        self.ledger = self.folder / "ledger"
        self.sent = 0
        self.last_clean: int | None = None
        """The status printed by the last step that was not killed (None: it was killed)."""
        self.steps = 0

    @initialize()
    def start(self) -> None:
        self.ledger.touch()

    def teardown(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @rule(sends=st.sampled_from([1, 2, 0]), crash=crash_points)
    def step(self, sends: int, crash: tuple[int, str] | None) -> None:
        """One process: recover, send ``sends`` work messages, finish or die at ``crash``."""
        at, phase = crash if crash is not None else (0, "before")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.agents._crash_points_script",
                str(self.wasm),
                str(self.folder / "state"),
                str(self.ledger),
                str(sends),
                str(at),
                phase,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,  # a start on a loaded machine; a hang is a failure, not a wait
            check=False,
        )
        self.steps += 1
        self.sent += sends  # the sends return before any tool call may kill the process
        if done.returncode == SIGKILL_STATUS:
            self.last_clean = None
            return
        assert done.returncode == 0, done.stdout + done.stderr
        self.last_clean = json.loads(done.stdout.splitlines()[-1])["status"]

    def _lines(self) -> list[tuple[str, int, str]]:
        found = []
        for line in self.ledger.read_text().splitlines():
            name, step, key = line.split()
            found.append((name, int(step), key))
        return found

    def _crashes(self) -> list[tuple[str, str]]:
        path = Path(f"{self.ledger}.crash")
        if not path.exists():
            return []
        return [(p, k) for p, k in (line.split() for line in path.read_text().splitlines())]

    @invariant()
    def each_call_once_but_the_one_in_flight_at_most_twice(self) -> None:
        """A key seen twice is a call a crash interrupted after its effect; none thrice."""
        seen = Counter(key for _name, _step, key in self._lines())
        interrupted = {key for phase, key in self._crashes() if phase == "after"}
        for key, times in seen.items():
            assert times == 1 or (times == 2 and key in interrupted), (key, times)

    @invariant()
    def every_message_is_its_five_calls_in_order_under_keys_of_its_own(self) -> None:
        """The ledger without its repeats is the calls of whole messages in order, then the
        first calls of at most one in flight; no more messages than were sent."""
        first: list[tuple[str, int]] = []
        keys: set[str] = set()
        for name, step, key in self._lines():
            if key not in keys:
                keys.add(key)
                first.append((name, step))
        whole, rest = divmod(len(first), len(WORK))
        assert first == (WORK * (whole + 1))[: len(first)], first
        assert whole + (rest > 0) <= self.sent, (whole, rest, self.sent)

    @invariant()
    def a_step_that_was_not_killed_ends_where_a_run_without_crashes_does(self) -> None:
        """Every message sent handled once: the status counts them and the ledger holds each
        one's five calls, under 5 x sent distinct keys."""
        if self.last_clean is None or self.steps == 0:
            return
        keys = {key for _name, _step, key in self._lines()}
        assert self.last_clean == self.sent
        assert len(keys) == len(WORK) * self.sent


def test_crash_points(journaled_wasm: Path) -> None:  # noqa: F811
    """Crashes at hypothesis-chosen tool calls: exactly once from outside, state as uncrashed."""
    CrashPoints.wasm = journaled_wasm
    run_state_machine_as_test(
        CrashPoints,
        settings=settings(
            max_examples=8,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        ),
    )
