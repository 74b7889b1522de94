"""`mty node` processes on loopback: cross-node asks from the host and from a guest, and a node
SIGKILLed under a cluster supervisor (its children restart on the surviving node)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mighty.agents import AskTimeout, NoProc, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster
from tests.cluster.conftest import ROOT, Mty

pytestmark = pytest.mark.slow

MANIFEST = """
workers = 2

[agents.echo]
component = "{echo}"

[agents.pingpong]
source = "{pingpong}"

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.5

[cluster.peers]
a = {{}}
b = {{}}
t = {{ spawn = false }}

[cluster.supervisor]
node = "a"
strategy = "one_for_one"
children = [
  {{ name = "ponger", type = "pingpong", node = "b" }},
  {{ name = "pinger", type = "pingpong", node = "a" }},
]
"""


@pytest.fixture
def cluster(tmp_path: Path, echo_wasm: Path) -> Iterator[tuple[NatsServer, Path]]:
    with NatsServer() as server:
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            MANIFEST.format(
                echo=echo_wasm,
                pingpong=ROOT / "examples" / "agents" / "pingpong.py",
                url=server.url,
            )
        )
        yield server, manifest


def test_cross_node_asks_and_a_killed_node(cluster: tuple[NatsServer, Path]) -> None:
    server, manifest = cluster
    b = Mty("node", str(manifest), "--name", "b", "-q")
    a = Mty("node", str(manifest), "--name", "a", "-q")
    runtime = Runtime(workers=1)
    data = {"servers": [server.url], "peers": {"a": {}, "b": {}, "t": {"spawn": False}}}
    node = Node(runtime, parse_cluster(data | {"heartbeat": 0.2, "dead_after": 1.5}), name="t")
    try:
        b.wait_line("joined cluster")
        a.wait_line("cluster supervisor started")
        node.start()
        assert (node.whereis("ponger") or "").startswith("b:pingpong:")
        assert (node.whereis("pinger") or "").startswith("a:pingpong:")
        # From the host API of a third process, by name and by node:type:pid.
        assert runtime.ask("ponger", "ping", {"n": 7}, timeout=10)["pong"] == 7
        assert runtime.ask(node.whereis("ponger") or "", "ping", {"n": 8})["pong"] == 8
        # From a guest: the pinger on node a asks the ponger on node b, by name.
        reply = runtime.ask("pinger", "start", {"peer": "ponger", "rounds": 5}, timeout=30)
        assert reply == {"rounds": 5, "pongs": 5}
        # SIGKILL node b: the supervisor on a restarts the ponger on the surviving node (a).
        b.kill()
        deadline = time.monotonic() + 20
        while not (node.whereis("ponger") or "").startswith("a:"):
            assert time.monotonic() < deadline, f"ponger not restarted: {node.whereis('ponger')}"
            time.sleep(0.05)
        with pytest.raises((NoProc, AskTimeout)):
            runtime.ask("b:pingpong:1", "ping", {"n": 1}, timeout=2)
        assert runtime.ask("ponger", "ping", {"n": 9}, timeout=10)["pong"] == 9
        reply = runtime.ask("pinger", "start", {"peer": "ponger", "rounds": 3}, timeout=30)
        assert reply == {"rounds": 3, "pongs": 8}  # 5 + 3: the pinger kept its state
    finally:
        runtime.shutdown(drain=False, timeout=2)
        node.close()
        status = a.finish()
        b.finish()
    assert status == 0, "".join(a.lines)
    assert '"name": "a"' in a.out or "node a:" in a.out
