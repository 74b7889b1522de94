"""`mty node` finds NATS down before it builds anything, and says which server and why."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mighty.cli._reach import check_nats_reachable
from mighty.cluster import ClusterError, NatsServer

ROOT = Path(__file__).resolve().parents[2]


def _closed_port_url() -> str:
    """A loopback URL where nothing listens (a port just bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


def test_node_stops_before_building_when_nats_is_down(tmp_path: Path) -> None:
    """With no NATS server, `mty node` exits 2 naming the server, and never starts a build."""
    shutil.copy(ROOT / "examples" / "agents" / "counter.py", tmp_path / "counter.py")
    url = _closed_port_url()
    (tmp_path / "mighty.toml").write_text(
        f'[agents.counter]\nsource = "counter.py"\n\n[cluster]\nservers = ["{url}"]\n'
        "[cluster.peers]\na = {}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "node", str(tmp_path / "mighty.toml"), "--name", "a"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**__import__("os").environ, "MTY_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 2, done.stderr
    assert f"{url}: connection refused" in done.stderr
    assert "no NATS server answered" in done.stderr
    assert "building" not in done.stderr
    assert "Traceback" not in done.stderr


def test_a_running_nats_server_passes() -> None:
    """A real nats-server on loopback answers with its INFO greeting: the check returns."""
    with NatsServer() as server:
        check_nats_reachable([_closed_port_url(), server.url])


def test_a_listener_that_is_not_nats_is_named() -> None:
    """Something listening that does not greet as NATS is reported as such."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        thread = threading.Thread(target=serve)
        thread.start()
        with pytest.raises(ClusterError) as caught:
            check_nats_reachable([f"nats://127.0.0.1:{port}"])
        thread.join()
    assert "not a NATS server" in caught.value.message
