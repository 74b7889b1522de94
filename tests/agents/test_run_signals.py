"""`mty run --keep-running` stopped by SIGINT and SIGTERM, sent to a real subprocess."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

WORK = 40  # slow messages (~0.1 s each) queued at start: a signal finds some unhandled


def manifest(tmp_path: Path, counter_wasm: Path) -> Path:
    sends = "".join(
        f'[[start]]\nto = "{"counter" if n % 2 else "second"}"\nmessage = "work"\n'
        f"body = {{ n = 1000000 }}\nask = false\n\n"
        for n in range(WORK)
    )
    path = tmp_path / "mighty.toml"
    path.write_text(
        "workers = 2\n\n"
        f'[agents.counter]\ncomponent = "{counter_wasm}"\naccepts = ["incr", "get", "work"]\n\n'
        "[supervisor]\nchildren = [\n"
        '  { name = "counter", type = "counter" },\n'
        '  { name = "second", type = "counter" },\n]\n\n'
        '[[start]]\nto = "counter"\nmessage = "incr"\nbody = { by = 5 }\n\n' + sends
    )
    return path


def start(path: Path, as_json: bool) -> subprocess.Popen[str]:
    """`mty run --keep-running`, returned once it says it is running (handlers installed)."""
    args = [sys.executable, "-m", "mighty.cli", "run", str(path), "--keep-running"]
    proc = subprocess.Popen(
        [*args, "--json"] if as_json else args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert proc.stderr is not None
    seen = []
    while True:
        line = proc.stderr.readline()
        seen.append(line)
        assert line, f"mty run ended before running: {''.join(seen)}"
        if line.startswith("mty: running"):
            return proc


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"mty run did not exit after the signal:\n{err}")
    return proc.returncode, out, err


def check_accounting(doc: dict[str, Any]) -> None:
    """Every accepted message was handled or is counted as unhandled, per agent and in all."""
    assert {a["name"] for a in doc["agents"]} == {"counter", "second"}
    for agent in doc["agents"]:
        done = agent["handled"] + agent["failed"] + agent["crashes"]
        assert agent["accepted"] == done + agent["unhandled"], agent
    assert doc["unhandled"] == sum(a["unhandled"] for a in doc["agents"])


# 20 tries: SIGINT and SIGTERM alternately, with and without --json, every fifth followed by a
# second Ctrl-C while it shuts down.
TRIES = [
    (signal.SIGINT if i % 2 == 0 else signal.SIGTERM, i % 4 < 2, 2 if i % 5 == 4 else 1)
    for i in range(20)
]


def test_signals_stop_mty_run_cleanly_at_random_moments(tmp_path: Path, counter_wasm: Path) -> None:
    """SIGINT exits 130, SIGTERM 143, with one line or JSON object and what was left undone."""
    path = manifest(tmp_path, counter_wasm)
    rng = random.Random(10)
    unhandled_seen = []
    for signum, as_json, times in TRIES:
        proc = start(path, as_json)
        time.sleep(rng.uniform(0, 1.5))
        proc.send_signal(signum)
        for _ in range(times - 1):
            time.sleep(rng.uniform(0, 0.2))
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        code, out, err = finish(proc)
        assert code == 128 + signum, err
        assert "Traceback" not in out + err
        if as_json:
            [line] = out.strip().splitlines()
            doc = json.loads(line)
            assert doc["ok"] is False
            assert doc["error"]["kind"] == "cancelled"
            assert doc["error"]["signal"] == signal.Signals(signum).name
            check_accounting(doc)
            unhandled_seen.append(doc["unhandled"])
        else:
            how = "interrupted" if signum == signal.SIGINT else "terminated"
            report = err.strip().splitlines()
            assert report[-1].startswith(f"mty: {how} by {signal.Signals(signum).name}; ")
            assert "left unhandled" in report[-1]
            assert [line for line in report if line.startswith("mty: ")] == report[-1:]
            if "; 0 accepted" not in report[-1]:
                assert "(counter)" in report[-1] or "(second)" in report[-1]  # per agent
    # The moments are random, but 40 slow messages are never all done within 1.5 s.
    assert any(unhandled_seen)
