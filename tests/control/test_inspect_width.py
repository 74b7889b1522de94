"""`mty inspect` piped (not a terminal) prints whole lines, not rich's 80 columns."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cli import main
from mighty.control import ControlServer, runtime_ops

ROOT = Path(__file__).resolve().parents[2]


def test_piped_inspect_keeps_long_lines(wat: Callable[[str], bytes]) -> None:
    """An agent's label (address, name, type, state, mailbox, counters) stays on one line."""
    echo = Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    with tempfile.TemporaryDirectory(prefix="mty-width-", dir="/tmp") as name:
        os.chmod(name, 0o700)
        path = Path(name) / "c.sock"
        long_name = "an-agent-with-a-rather-long-registered-name-" + "x" * 40
        with Runtime(workers=1) as rt, ControlServer(path, runtime_ops(rt)):
            rt.register(AgentType("echo", echo))
            rt.spawn("echo", name=long_name)
            rt.ask(long_name, "ping", 1)
            for args in (
                ["inspect", "--socket", str(path)],
                ["inspect", long_name, "--socket", str(path)],
            ):
                done = CliRunner().invoke(main, args)
                assert done.exit_code == 0, done.output
                label = [line for line in done.stdout.splitlines() if long_name in line]
                assert label, done.stdout
                assert "restarts 0" in label[0], done.stdout
                assert len(label[0]) > 100
