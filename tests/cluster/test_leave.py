"""A node that shuts down cleanly says so: its peers report it as having left (not "dead
(silent for ...)" a `dead_after` later), and its cluster children as stopped, not crashed."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mighty.cluster import ClusterChild, ClusterSupervisor, NatsServer
from mighty.control import request
from tests.cluster.conftest import ECHO_WAT, Mty, Nodes

pytestmark = pytest.mark.timing  # .ci/stress runs it beside busy loops


def _until(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_closed_node_is_reported_left_and_its_child_stopped(
    nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    """b closes: t hears "left" (has_left, no "dead"), its child restarts off b as "stopped:
    node b left"; b back under its name is live again and no longer "left"."""
    # A silence must last 30 s to count as a death: a loaded machine never declares one here,
    # and a node that left is reported at once (before: "dead" 30 s later).
    slow = 30.0
    _, node_a = nodes("a", dead_after=slow)
    b, node_b = nodes("b", dead_after=slow)
    _, node_t = nodes("t", dead_after=slow)
    assert node_t.wait_for(["a", "b", "t"], 60)
    supervisor = ClusterSupervisor(node_t, [ClusterChild("e", "echo", node="b")]).start()
    assert (node_t.whereis("e") or "").startswith("b:")
    heard: list[tuple[str, bool, bool]] = []
    done = threading.Event()

    def listener(node: str, alive: bool) -> None:  # added after the supervisor's: heard after
        heard.append((node, alive, node_t.has_left(node)))
        done.set()

    node_t.on_membership(listener)
    with caplog.at_level(logging.WARNING, logger="mighty.cluster"):
        b.shutdown(drain=False, timeout=2)
        node_b.close()
        assert done.wait(60), "t never heard b go"
        _until(lambda: (node_t.whereis("e") or "b:").partition(":")[0] in ("a", "t"), "e stayed")
    assert heard == [("b", False, True)]
    assert "b" not in node_t.live_nodes() and "b" not in node_a.live_nodes()
    assert "node t: node b left the cluster" in caplog.text
    assert "is dead" not in caplog.text
    stops = [e.reason for e in supervisor.events if e.kind == "child_stopped"]
    assert stops == ["stopped: node b left"], supervisor.events
    assert supervisor.state == "running"
    supervisor.stop()

    # Back under the same name: live again, and not "left" any more.
    _, node_b2 = nodes("b", dead_after=slow)
    assert node_t.wait_for(["b"], 60) and node_b2.wait_for(["t"], 60)
    assert not node_t.has_left("b")


def test_a_node_stopped_with_ctrl_c_is_reported_left_by_its_peer(
    tmp_path: Path, nats_server: NatsServer, wat: Callable[[str], bytes]
) -> None:
    """Two `mty node`s; once a sees b live, SIGINT b: a's log says "node b left the cluster"
    and never "dead", and a's status no longer lists b."""
    echo = tmp_path / "echo.wasm"
    echo.write_bytes(wat(ECHO_WAT.read_text()))
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(
        f'[agents.echo]\ncomponent = "{echo}"\n\n'
        f'[cluster]\nservers = ["{nats_server.url}"]\nheartbeat = 0.2\ndead_after = 30.0\n'
        "[cluster.peers]\na = {}\nb = {}\n"
    )
    with tempfile.TemporaryDirectory(prefix="mty-leave-", dir="/tmp") as sockets:
        os.chmod(sockets, 0o700)
        sock = str(Path(sockets) / "a.sock")
        a = Mty("node", str(manifest), "--name", "a", env={"RUNTIME_CONTROL_SOCK": sock})
        b = Mty("node", str(manifest), "--name", "b")
        try:
            a.wait_line("control socket at")
            b.wait_line("joined cluster")
            _until(lambda: "b" in request(sock, "status")["live"], "a never saw b live")
            assert b.finish(signal.SIGINT) == 0, "".join(b.lines)
            a.wait_line("node b left the cluster")
            assert request(sock, "status")["live"] == ["a"]
        finally:
            a_status = a.finish()
    assert a_status == 0, "".join(a.lines)
    assert not any("is dead" in line for line in a.lines), a.lines
