"""kill -9 of a cluster node in the middle of a durable message: the new owner answers the
message's completed tool calls or HTTP requests from its journal in JetStream (each made once),
makes the one in flight again with the same idempotency key, and ends in the state of a run
without the crash.

Nodes a (the cluster supervisor) and b (the agent, pinned there) are `mty node` processes;
this process is node t and sends the message by name. The tool (journal_agent/counted.py)
notes each call in a file and, on node b only, holds the call of step HOLD_AT until the test
has SIGKILLed the node; the loopback HTTP server (conftest.Effects) notes each request and
holds the first of step HOLD_AT the same way. The test waits for that call (the counter), not
for time.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from pathlib import Path

import nats
import pytest

from mighty.agents import AgentError, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster
from tests.cluster.conftest import ROOT, Effects, Mty

pytestmark = pytest.mark.slow

AGENT = ROOT / "tests" / "cluster" / "journal_agent"

MANIFEST = """
[capabilities.step]
tool = "counted:step"

[agents.steps]
source = "{source}"
capabilities = ["step"]
http = ["{origin}"]

[cluster]
servers = ["{url}"]
heartbeat = 0.2
dead_after = 1.5
durable = ["steps"]

[cluster.peers]
a = {{}}
b = {{}}
t = {{ spawn = false }}

[cluster.supervisor]
node = "a"
children = [ {{ name = "steps", type = "steps", node = "b" }} ]
"""

_STEPS = 6
_HOLD_AT = 3


def _journal_entries(url: str) -> int:
    async def go() -> int:
        nc = await nats.connect(url)
        try:
            info = await nc.jetstream().stream_info("mighty_journal")
            return int(info.state.messages)
        finally:
            await nc.close()

    return asyncio.run(go())


def _status(runtime: Runtime) -> dict[str, object] | None:
    try:
        status = runtime.ask("steps", "status", timeout=5)
    except AgentError:
        return None
    assert isinstance(status, dict)
    return status


@pytest.mark.parametrize("kind", ["tool", "http"])
def test_a_killed_nodes_message_is_finished_from_its_journal(tmp_path: Path, kind: str) -> None:
    """Completed calls once, the call in flight twice under one key, the state as uncrashed."""
    counts, marker = tmp_path / "counts.txt", tmp_path / "held"
    shutil.copy(AGENT / "counted.py", tmp_path / "counted.py")
    web = Effects(hold_at=_HOLD_AT)
    with NatsServer() as server:
        manifest = tmp_path / "mighty.toml"
        manifest.write_text(
            MANIFEST.format(source=AGENT / "steps.py", url=server.url, origin=web.url)
        )
        env = {"COUNTS": str(counts), "MARKER": str(marker)}
        b = Mty("node", str(manifest), "--name", "b", "-q", env=env | {"HOLD_AT": str(_HOLD_AT)})
        a = Mty("node", str(manifest), "--name", "a", "-q", env=env)
        runtime = Runtime(workers=1)
        data = {"servers": [server.url], "peers": {"a": {}, "b": {}, "t": {"spawn": False}}}
        config = parse_cluster(data | {"heartbeat": 0.2, "dead_after": 1.5, "durable": ["steps"]})
        node = Node(runtime, config, name="t")
        try:
            b.wait_line("joined cluster")
            a.wait_line("cluster supervisor started")
            node.start()
            deadline = time.monotonic() + 300
            while not (node.whereis("steps") or "").startswith("b:"):
                assert time.monotonic() < deadline, "the agent never started on b"
                time.sleep(0.05)
            if kind == "tool":
                runtime.send("steps", "run", {"n": _STEPS}, timeout=30)
            else:
                body = {"n": _STEPS, "url": f"{web.url}/effect"}
                runtime.send("steps", "fetch", body, timeout=30)
            # Steps 0.._HOLD_AT-1 returned (the guest saw them: journaled); _HOLD_AT is held.
            while not (marker.exists() or web.holding.is_set()):
                assert time.monotonic() < deadline, f"no held call: {web.seen}, {counts}"
                time.sleep(0.02)
            assert _journal_entries(server.url) >= _HOLD_AT  # an entry per import at least
            b.kill()
            web.release.set()
            status = None
            while status is None or status.get("handled") != 1:
                assert time.monotonic() < deadline, f"not recovered: {status}, {a.lines[-5:]}"
                assert a.process.poll() is None, "".join(a.lines)
                time.sleep(0.1)
                status = _status(runtime)
            assert (node.whereis("steps") or "").startswith("a:")
            answer = (lambda i: 10 * i + 1) if kind == "tool" else (lambda i: 100 + i)
            assert status == {"handled": 1, "results": [answer(i) for i in range(_STEPS)]}
            if kind == "tool":
                lines = counts.read_text().splitlines()
                calls = [(int(step), key) for step, key in (line.split(" ") for line in lines)]
            else:
                calls = list(web.seen)
            made = Counter(step for step, _key in calls)
            assert made == {i: 2 if i == _HOLD_AT else 1 for i in range(_STEPS)}, calls
            keys = [key for step, key in calls if step == _HOLD_AT]
            assert len(keys[0]) == 32 and keys[0] == keys[1], keys
            assert len({key for _step, key in calls}) == _STEPS  # one key per call position
            while _journal_entries(server.url) > 0:  # purged once stored and acknowledged
                assert time.monotonic() < deadline, "the journal was not purged"
                time.sleep(0.1)
        finally:
            marker.with_suffix(".release").write_text("")
            web.close()
            runtime.shutdown(drain=False, timeout=2)
            node.close()
            a.finish()
            b.finish()
