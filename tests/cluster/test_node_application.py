"""mighty.cluster.NodeApplication: two nodes of one manifest, from Python, as `mty node` runs them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mighty import BadInput
from mighty.cluster import NatsServer, NodeApplication

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0


def _manifest(tmp_path: Path, wat: Callable[[str], bytes], url: str) -> Path:
    echo_wasm = tmp_path / "echo.wasm"
    echo_wasm.write_bytes(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(
        f'[agents.echo]\ncomponent = "{echo_wasm}"\n\n'
        f'[cluster]\nservers = ["{url}"]\ndead_after = 30.0\n'
        "[cluster.peers]\na = {}\nb = {}\n\n"
        '[cluster.supervisor]\nnode = "a"\n'
        'children = [ { name = "e", type = "echo", node = "b" } ]\n\n'
        '[[start]]\nto = "e"\nmessage = "ping"\nask = true\nbody = { x = 1 }\n'
    )
    return manifest


def test_two_nodes_from_python(tmp_path: Path, wat: Callable[[str], bytes]) -> None:
    """The leader starts the cluster supervisor, whose child runs on b; the start ask crosses
    nodes; a's shutdown is heard by b as a leave."""
    notes: list[str] = []
    with NatsServer() as server:
        manifest = _manifest(tmp_path, wat, server.url)
        b = NodeApplication.from_manifest(manifest, name="b", on_note=notes.append).start()
        try:
            a = NodeApplication.from_manifest(manifest, name="a", on_note=notes.append).start()
            try:
                assert a.leads and not b.leads
                assert any("cluster supervisor started on a" in n for n in notes), notes
                replies, failures = a.send_start()
                assert failures == []
                assert [r.reply for r in replies] == [{"x": 1}]
                assert b.runtime.whereis("e") is not None  # the child runs on b
            finally:
                a.shutdown()
            deadline = time.monotonic() + WAIT
            while not b.node.has_left("a"):
                assert time.monotonic() < deadline, "b never heard a leave"
                time.sleep(0.01)
        finally:
            b.shutdown()
    assert any(n.startswith("node a joined cluster") for n in notes)


def test_a_manifest_without_a_cluster_is_refused(tmp_path: Path) -> None:
    """No [cluster] block: a BadInput naming the manifest, nothing started."""
    manifest = tmp_path / "mighty.toml"
    manifest.write_text('[agents.echo]\ncomponent = "echo.wasm"\n')
    with pytest.raises(BadInput, match=r"no \[cluster\] block"):
        NodeApplication.from_manifest(manifest)
