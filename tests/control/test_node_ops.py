"""`mty inspect`, `mty ask` and `mty send` against a `mty node`'s control socket (real NATS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from mighty.cluster import NatsServer
from tests.cluster.conftest import Mty

ROOT = Path(__file__).resolve().parents[2]


def _mty(*args: str) -> subprocess.CompletedProcess[str]:
    """`mty ARGS` as a subprocess, to the end."""
    return subprocess.run(
        [sys.executable, "-m", "mighty.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_node_serves_inspect_and_messages(tmp_path: Path, wat: Callable[[str], bytes]) -> None:
    """A node's control socket answers inspect (tree and JSON), ask and send, as `mty run`'s;
    its closing line is text."""
    echo_wasm = tmp_path / "echo.wasm"
    echo_wasm.write_bytes(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    with (
        NatsServer() as server,
        tempfile.TemporaryDirectory(prefix="mty-node-", dir="/tmp") as sockets,
    ):
        os.chmod(sockets, 0o700)
        sock = str(Path(sockets) / "n.sock")
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            f'[agents.echo]\ncomponent = "{echo_wasm}"\n\n'
            '[supervisor]\nchildren = [{ name = "e", type = "echo" }]\n\n'
            f'[cluster]\nservers = ["{server.url}"]\n[cluster.peers]\na = {{}}\n'
        )
        node = Mty("node", str(manifest), "--name", "a", env={"RUNTIME_CONTROL_SOCK": sock})
        try:
            node.wait_line("control socket at")
            shown = _mty("inspect", "--socket", sock)
            assert shown.returncode == 0, shown.stderr
            assert "unknown_op" not in shown.stderr
            snapshot = json.loads(_mty("inspect", "e", "--socket", sock, "--json").stdout)
            assert snapshot["name"] == "e"
            asked = _mty("ask", "e", "ping", '{"x": 1}', "--socket", sock)
            assert asked.returncode == 0, asked.stderr
            assert json.loads(asked.stdout) == {"x": 1}
            sent = _mty("send", "e", "note", "--socket", sock)
            assert sent.returncode == 0, sent.stderr
        finally:
            status = node.finish()
    assert status == 0, "".join(node.lines)
    # The closing line reads as text, not a Python dict.
    last = node.out.strip().splitlines()[-1]
    assert last.startswith("node a: 1 agent(s); sent "), last
    assert "{" not in last
