"""Two recording `mty node`s whose manifests differ: `mty migrate` ships the agent's component
to the node without it, the agent keeps its state and asks across nodes from there, both
traces show the cross-node messages, and `mty replay` replays its history across both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mighty.agents import Runtime
from mighty.cluster import NatsServer, Node, parse_cluster
from mighty.engine import CompiledCache
from mighty.trace import read_trace
from tests.cluster.conftest import ROOT, Mty

pytestmark = pytest.mark.slow

MANIFEST = """
[agents.pingpong]
{agent}

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.5

[cluster.peers]
a = {{}}
b = {{}}
t = {{ spawn = false }}
"""


def _records(path: Path, address: str) -> list[dict[str, Any]]:
    return [r for r in read_trace(path).records() if r.get("a") == address]


def test_mty_migrate_ships_the_component_and_the_history_replays_across_nodes(
    tmp_path: Path, echo_wasm: Path
) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    # Node b has its own component store (so it has never seen node a's pingpong); its
    # compiled cache is the shared one, only so that the test does not compile for a minute.
    b_cache = tmp_path / "b-cache"
    b_cache.mkdir()
    (b_cache / "compiled").symlink_to(CompiledCache().directory.parents[1])
    with NatsServer() as server:
        pingpong = ROOT / "examples" / "agents" / "pingpong.py"
        a_manifest, b_manifest = tmp_path / "a.toml", tmp_path / "b.toml"
        a_manifest.write_text(MANIFEST.format(agent=f'source = "{pingpong}"', url=server.url))
        # b's pingpong is another component (the echo agent) under the same type name.
        b_manifest.write_text(MANIFEST.format(agent=f'component = "{echo_wasm}"', url=server.url))
        socket = str(tmp_path / "a.sock")
        b = Mty(
            "node", str(b_manifest), "--name", "b", "-q", "--record", str(traces / "b.bin"),
            env={"MTY_CACHE_DIR": str(b_cache)},
        )  # fmt: skip
        a = Mty(
            "node", str(a_manifest), "--name", "a", "-q", "--record", str(traces / "a.bin"),
            env={"RUNTIME_CONTROL_SOCK": socket},
        )  # fmt: skip
        runtime = Runtime(workers=1)
        data = {"servers": [server.url], "peers": {"a": {}, "b": {}, "t": {"spawn": False}}}
        config = parse_cluster(data | {"heartbeat": 0.2, "dead_after": 1.5})
        node = Node(runtime, config, name="t")
        try:
            b.wait_line("joined cluster")
            a.wait_line("control socket")
            node.start()
            assert node.wait_for(["a", "b"], 10)
            pinger = node.spawn_on("a", "pingpong")
            ponger = node.spawn_on("a", "pingpong")
            reply = runtime.ask(pinger, "start", {"peer": ponger, "rounds": 3}, timeout=30)
            assert reply == {"rounds": 3, "pongs": 3}

            done = subprocess.run(
                [sys.executable, "-m", "mighty.cli", "migrate", pinger, "b", "--socket", socket],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert f"{pinger}: moved to b:pingpong:" in done.stdout
            moved = done.stdout.split("moved to ")[1].split(" ")[0]
            # The state moved; the migrated pinger (on b) asks the ponger on a, from the guest.
            reply = runtime.ask(pinger, "start", {"peer": ponger, "rounds": 2}, timeout=30)
            assert reply == {"rounds": 2, "pongs": 5}
            assert runtime.ask(ponger, "ping", {"n": 9}, timeout=10)["pong"] == 9
        finally:
            runtime.shutdown(drain=False, timeout=2)
            node.close()
            status_a, status_b = a.finish(), b.finish()
    assert (status_a, status_b) == (0, 0), "".join(a.lines + b.lines)
    sha = next(r for r in read_trace(traces / "a.bin").records() if r.get("a") == "pingpong:1")
    # b took node a's component: shipped into b's own store, by sha256.
    assert (b_cache / "components" / f"{sha['component']}.wasm").is_file()

    # Each agent's trace holds its cross-node messages: the pinger on b asked the ponger on a
    # (an import of the pinger, in b's trace), which handled the asks (in a's trace).
    local_b = moved.partition(":")[2]
    asks = [
        r for r in _records(traces / "b.bin", local_b) if r["k"] == "import" and r["fn"] == "ask"
    ]
    assert len(asks) == 2
    assert all(r["args"][0] == ponger for r in asks)
    handled = [
        r
        for r in _records(traces / "a.bin", ponger.partition(":")[2])
        if r["k"] == "call" and r["fn"] == "handle"
    ]
    assert [r["args"][0] for r in handled].count(moved) == 2  # the sender: b's pinger
    assert handled[-1]["args"][0] == "t:host"  # and the host of node t, across nodes too

    # The pinger's history, end to end: before the move from a's trace, after from b's.
    replayed = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "replay", str(traces / "a.bin"),
         str(traces / "b.bin"), "--agent", pinger, "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert [s["address"] for s in report["segments"]] == [pinger, moved]
    before, after = report["segments"]
    assert before["snapshot"] is not None and after["snapshot"] is None
    assert sum(i["exports"] for i in after["instances"]) >= 3  # init, restore, start
    # A directory of traces does the same; a trace left out is a one-line error.
    again = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "replay", str(traces), "--agent", pinger, "--json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert json.loads(again.stdout)["digest"] == report["digest"]
    os.rename(traces / "b.bin", tmp_path / "b.bin")
    missing = subprocess.run(
        [sys.executable, "-m", "mighty.cli", "replay", str(traces), "--agent", pinger],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "no trace of node b was given" in missing.stderr
    assert "Traceback" not in missing.stderr
