"""Ctrl-C and SIGTERM stop a busy `mty run` at once: the running guest call is interrupted.

A real `mty run` subprocess whose one agent spins in ``while True`` with a budget far longer
than the test (fuel 10^15, a 600 s deadline) and a 600 s shutdown timeout: before the signal
interrupted running calls, the exit waited for the call until the shutdown timeout. The test's
own deadline (120 s) is generous and far from both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SPINNER = """\
from mighty_agent import Agent, export, on


class Spinner(Agent):
    @on("spin")
    def spin(self, body, sender):
        print("spinning", flush=True)
        while True:
            pass


WitWorld = export(Spinner)
"""

# Far longer than the test waits for the exit: only an interrupt can end the call in time.
GUEST_TIMEOUT = 600.0
TEST_DEADLINE = 120.0


def _manifest(tmp_path: Path, *, ask: bool) -> Path:
    (tmp_path / "spinner.py").write_text(SPINNER)
    path = tmp_path / "mighty.toml"
    path.write_text(
        '[agents.spinner]\nsource = "spinner.py"\nfuel = 1_000_000_000_000_000\n'
        f"timeout = {GUEST_TIMEOUT}\n\n"
        '[supervisor]\nchildren = [{ name = "spinner", type = "spinner" }]\n\n'
        f'[[start]]\nto = "spinner"\nmessage = "spin"\nask = {"true" if ask else "false"}\n'
    )
    return path


def _spinning(path: Path, *extra: str) -> subprocess.Popen[str]:
    """`mty run PATH`, returned once its agent has printed that it is in its loop."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mighty.cli",
            "run",
            str(path),
            "--keep-running",
            "--shutdown-timeout",
            str(GUEST_TIMEOUT),
            *extra,
        ],
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
        if not line:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(
                f"mty run ended ({proc.returncode}) before its agent spun: {''.join(seen)}{err}{out}"
            )
        if line.rstrip().endswith("] spinning"):
            return proc


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TEST_DEADLINE)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(
            f"mty run still waited for its guest {TEST_DEADLINE} s after the signal:\n{err}"
        )
    return proc.returncode, out, err


@pytest.mark.timing
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_interrupts_a_spinning_agent_and_mty_run_exits(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """SIGINT (130) or SIGTERM (143) ends `mty run` while its agent spins; the message is
    unhandled, the agent did not crash."""
    proc = _spinning(_manifest(tmp_path, ask=False), "--json")
    proc.send_signal(signum)
    code, out, err = _ended(proc)
    assert code == 128 + signum, err
    assert "Traceback" not in out + err
    [line] = out.strip().splitlines()
    doc = json.loads(line)
    assert doc["error"]["kind"] == "cancelled"
    assert doc["error"]["signal"] == signum.name
    [agent] = doc["agents"]
    assert (agent["accepted"], agent["unhandled"], agent["crashes"]) == (1, 1, 0), agent
    assert doc["unhandled"] == 1


@pytest.mark.timing
def test_ctrl_c_interrupts_a_start_ask_that_spins(tmp_path: Path) -> None:
    """A start message that is an ask (its turn may run in place, on the main thread) is
    interrupted by Ctrl-C as well."""
    proc = _spinning(_manifest(tmp_path, ask=True))
    proc.send_signal(signal.SIGINT)
    code, out, err = _ended(proc)
    assert code == 130, err
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1].startswith("mty: interrupted by SIGINT; ")
