"""Cluster supervisor failover: SIGKILL the node running the cluster supervisor.

Three `mty node`s (a supervises; one ledger pinned to each node) and this process as node t.
Node a is SIGKILLed: b or c takes the supervisor's lease over, adopts the ledgers still running
(same address, state kept) and restarts a's ledger on a survivor. Then the other survivor is
SIGKILLed: the new supervisor restarts its ledger too, on the one node left.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mighty.agents import Runtime
from mighty.cluster import NatsServer, Node, parse_cluster
from tests.cluster.conftest import ROOT, Mty

pytestmark = pytest.mark.slow

MANIFEST = """
[agents.ledger]
source = "{counter}"

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.5

[cluster.peers]
a = {{}}
b = {{}}
c = {{}}
t = {{ spawn = false }}

[cluster.supervisor]
node = "a"
children = [
  {{ name = "la", type = "ledger", node = "a" }},
  {{ name = "lb", type = "ledger", node = "b" }},
  {{ name = "lc", type = "ledger", node = "c" }},
]
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[NatsServer, Path]]:
    with NatsServer() as server:
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            MANIFEST.format(counter=ROOT / "examples" / "agents" / "counter.py", url=server.url)
        )
        yield server, manifest


def _settled(node: Node, names: list[str], away: str, timeout: float = 60) -> dict[str, str]:
    """Each name's address once none is on node ``away`` and each answers."""
    deadline = time.monotonic() + timeout
    while True:
        where = {name: node.whereis(name) or "" for name in names}
        if all(a and not a.startswith(f"{away}:") for a in where.values()):
            return where
        assert time.monotonic() < deadline, f"not restarted off {away}: {where}"
        time.sleep(0.1)


def test_a_survivor_takes_the_supervisor_over_and_supervises(
    cluster: tuple[NatsServer, Path],
) -> None:
    server, manifest = cluster
    nodes = {name: Mty("node", str(manifest), "--name", name, "-q") for name in ("b", "c")}
    nodes["a"] = Mty("node", str(manifest), "--name", "a", "-q")
    runtime = Runtime(workers=1)
    data = {"servers": [server.url], "peers": {n: {} for n in "abc"} | {"t": {"spawn": False}}}
    node = Node(runtime, parse_cluster(data | {"heartbeat": 0.2, "dead_after": 1.5}), name="t")
    names = ["la", "lb", "lc"]
    try:
        for name in ("b", "c"):
            nodes[name].wait_line("joined cluster")
        nodes["a"].wait_line("cluster supervisor started on a")
        node.start()
        before = {name: node.whereis(name) or "" for name in names}
        assert {name: a.partition(":")[0] for name, a in before.items()} == {
            "la": "a",
            "lb": "b",
            "lc": "c",
        }
        for name in names:
            assert runtime.ask(name, "incr", {"by": 5}, timeout=30)["count"] == 5

        nodes["a"].kill()
        after = _settled(node, names, "a")
        # The ledgers on b and c were adopted as they ran: same address, same state.
        assert after["lb"] == before["lb"] and after["lc"] == before["lc"]
        assert runtime.ask("lb", "get", timeout=30)["count"] == 5
        assert runtime.ask("lc", "get", timeout=30)["count"] == 5
        # a's ledger was restarted on a survivor (not durable: from its init).
        assert runtime.ask("la", "get", timeout=30)["count"] == 0
        deadline = time.monotonic() + 30
        while True:
            leaders = [
                n for n in ("b", "c") if any("took over (2 adopted)" in x for x in nodes[n].lines)
            ]
            if leaders:
                break
            assert time.monotonic() < deadline, {n: nodes[n].lines for n in ("b", "c")}
            time.sleep(0.05)
        assert len(leaders) == 1, leaders
        leader = leaders[0]
        other = "c" if leader == "b" else "b"

        # The new supervisor supervises: kill the other survivor, its ledgers move to the leader.
        nodes[other].kill()
        last = _settled(node, names, other)
        assert all(a.startswith(f"{leader}:") for a in last.values()), last
        assert last[f"l{leader}"] == before[f"l{leader}"]
        assert runtime.ask(f"l{leader}", "get", timeout=30)["count"] == 5
        assert runtime.ask(f"l{other}", "get", timeout=30)["count"] == 0
    finally:
        runtime.shutdown(drain=False, timeout=2)
        node.close()
        for process in nodes.values():
            process.finish()
