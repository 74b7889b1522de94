"""`mty node` and `mty migrate` refuse bad input with one line and exit 2 (no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mighty.cluster import NatsServer


def _mty(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mighty.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _manifest(tmp_path: Path, echo_wasm: Path, cluster: str) -> Path:
    path = tmp_path / "mighty.toml"
    path.write_text(f'[agents.echo]\ncomponent = "{echo_wasm}"\n{cluster}')
    return path


def test_node_without_a_cluster_block(tmp_path: Path, echo_wasm: Path) -> None:
    done = _mty("node", str(_manifest(tmp_path, echo_wasm, "")), "-q")
    assert done.returncode == 2
    assert "no [cluster] block" in done.stderr
    assert "Traceback" not in done.stderr


def test_node_with_a_bad_cluster_block(tmp_path: Path, echo_wasm: Path) -> None:
    block = '[cluster]\nservers = ["http://x"]\n[cluster.peers]\na = {}\n'
    done = _mty("node", str(_manifest(tmp_path, echo_wasm, block)), "--name", "a", "-q")
    assert done.returncode == 2
    assert "is not a NATS URL" in done.stderr


def test_node_with_nats_down_and_run_with_a_cluster_block(tmp_path: Path, echo_wasm: Path) -> None:
    with NatsServer() as server:
        url = server.url
    block = f'[cluster]\nservers = ["{url}"]\nconnect_timeout = 1\n[cluster.peers]\na = {{}}\n'
    manifest = _manifest(tmp_path, echo_wasm, block)
    done = _mty("node", str(manifest), "--name", "a", "-q", "--json")
    assert done.returncode == 2
    assert '"kind": "cluster_error"' in done.stdout
    assert "no NATS server answered" in done.stdout
    done = _mty("run", str(manifest), "-q")
    assert done.returncode == 2
    assert "mty node" in done.stderr


def test_migrate_without_a_socket(tmp_path: Path) -> None:
    done = _mty("migrate", "a:echo:1", "b", "--socket", str(tmp_path / "none.sock"))
    assert done.returncode == 1
    assert "migration refused" in done.stderr or "no control socket" in done.stderr
