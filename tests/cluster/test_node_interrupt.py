"""Ctrl-C stops a busy `mty node` at once: its spinning agent's call is interrupted, and the
message counts as unhandled (before, the node waited its 10 s shutdown timeout and then
abandoned the call, counting nothing for a send)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from mighty.cluster import NatsServer
from tests.cli.test_interrupt_run import SPINNER
from tests.cluster.conftest import Mty


@pytest.mark.timing
def test_ctrl_c_interrupts_a_spinning_agent_of_a_node(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    """SIGINT while the node's one agent spins (fuel 1e15, 600 s): the node leaves with the
    message unhandled, no crash; exit 1 because something accepted was left."""
    (tmp_path / "spinner.py").write_text(SPINNER)
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(
        '[agents.spinner]\nsource = "spinner.py"\nfuel = 1_000_000_000_000_000\n'
        "timeout = 600.0\n\n"
        '[supervisor]\nchildren = [{ name = "spinner", type = "spinner" }]\n\n'
        '[[start]]\nto = "spinner"\nmessage = "spin"\nask = false\n\n'
        f'[cluster]\nservers = ["{nats_server.url}"]\n[cluster.peers]\na = {{}}\n'
    )
    node = Mty("node", str(manifest), "--name", "a", "--json")
    node.wait_line("] spinning")
    code = node.finish(signal.SIGINT, timeout=120)
    doc = json.loads(node.out.strip().splitlines()[-1])
    [agent] = doc["agents"]
    assert (agent["accepted"], agent["unhandled"], agent["crashes"]) == (1, 1, 0), agent
    assert code == 1, "".join(node.lines)
