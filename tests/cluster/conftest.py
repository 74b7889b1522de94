"""Cluster tests: real nats-server processes on loopback ports, real runtimes and `mty node`s."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from mighty import Component
from mighty.agents import AgentType, MailboxSettings, Runtime
from mighty.capabilities import Capabilities
from mighty.cluster import ClusterConfig, NatsServer, Node, parse_cluster

ROOT = Path(__file__).resolve().parents[2]
LONG = 120.0
"""Deadlines for what comes at once on an idle machine: generous, so a loaded one passes."""


def until(check: Callable[[], bool], what: str, seconds: float = LONG) -> None:
    """Poll ``check`` until true (an event), failing with ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


ECHO_WAT = ROOT / "tests" / "fixtures" / "echo_agent.wat"


@pytest.fixture(scope="session")
def echo_wasm(wat: Callable[[str], bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster") / "echo.wasm"
    path.write_bytes(wat(ECHO_WAT.read_text()))
    return path


@pytest.fixture(scope="session")
def echo(echo_wasm: Path) -> Component:
    return Component.load(echo_wasm)


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    with NatsServer() as server:
        yield server


STEADY = 30.0
"""``dead_after`` for tests whose subject is not a node's death: the default (1.0 s, so that
tests of deaths and partitions see them quickly) fences every node of a process that a loaded
machine stalls for over half of it (four nodes fenced at once in a stress round, and a
migration then found its agent stopped)."""


def config(url: str, peers: tuple[str, ...] = ("a", "b", "t"), **extra: Any) -> ClusterConfig:
    return parse_cluster(
        {"servers": [url], "peers": {p: {} for p in peers}, "heartbeat": 0.2, "dead_after": 1.0}
        | extra
    )


class Nodes:
    """Runtimes joined as nodes in this process; all closed at the end."""

    def __init__(self, echo: Component, url: str) -> None:
        self.echo = echo
        self.url = url
        self.made: list[tuple[Runtime, Node]] = []
        self.defaults: dict[str, Any] = {}
        """Configuration every node gets unless the call says otherwise (see ``steady``)."""

    def __call__(
        self, name: str, *, mailbox: MailboxSettings | None = None, **extra: Any
    ) -> tuple[Runtime, Node]:
        runtime = Runtime(workers=1)
        runtime.register(AgentType("echo", self.echo, mailbox=mailbox or MailboxSettings()))
        runtime.register(
            AgentType("strict", self.echo, accepts={"put": None}, mailbox=MailboxSettings())
        )
        node = Node(runtime, config(self.url, **(self.defaults | extra)), name=name)
        self.made.append((runtime, node))
        node.start()
        return runtime, node

    def close(self) -> None:
        for runtime, node in reversed(self.made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


@pytest.fixture
def nodes(echo: Component, nats_server: NatsServer) -> Iterator[Nodes]:
    made = Nodes(echo, nats_server.url)
    yield made
    made.close()


class Mty:
    """`mty ARGS` as a subprocess; its stderr read on a thread (never a full pipe)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mighty.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def wait_line(self, text: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.process.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"mty ended before {text!r}: {''.join(self.lines)}")
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s: {self.lines}"
            time.sleep(0.02)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.finish()

    def finish(self, sig: int = signal.SIGINT, timeout: float = 20.0) -> int:
        """Signal it (if running), wait, collect stdout; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.out, _ = self.process.communicate()
        self._reader.join(5)
        return self.process.returncode


@pytest.fixture(scope="session")
def counter(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The counter example agent (state: count; snapshot/restore), built once (cached)."""
    from tests.agents.conftest import _build_path

    return Component.load(_build_path("counter", tmp_path_factory.mktemp("counter")))


class Effects:
    """A loopback HTTP server that answers each POST ``{"i": I}`` with ``{"answer": 100 + I}``
    and notes it (I and its Idempotency-Key header). With ``hold_at``, the first request for
    that I is held (``holding`` set) until ``release`` is set: a node killed meanwhile."""

    def __init__(self, hold_at: int | None = None) -> None:
        self.seen: list[tuple[int, str]] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        effects = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                effects.seen.append((body["i"], self.headers.get("Idempotency-Key", "")))
                if body["i"] == hold_at and not effects.holding.is_set():
                    effects.holding.set()
                    effects.release.wait(600)
                data = json.dumps({"answer": 100 + body["i"]}).encode()
                with contextlib.suppress(OSError):  # its client may have been killed
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def effects() -> Iterator[Effects]:
    """A loopback HTTP server that notes each request (see Effects)."""
    server = Effects()
    yield server
    server.close()


class DurablePair:
    """Node a (which runs the agents) and node t (which places nothing), in this process, each
    with one agent type of ``[cluster] durable``; all closed at the end."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[tuple[Runtime, Node]] = []

    def __call__(
        self, agent_type: AgentType, capabilities: Capabilities | None = None
    ) -> tuple[Node, Runtime]:
        """Start both with ``agent_type``: (node a, node t's runtime)."""
        data = {
            "servers": [self.url],
            "peers": {"a": {}, "t": {"spawn": False}},
            "heartbeat": 0.2,
            "dead_after": 1.0,
            "durable": [agent_type.name],
        }
        for name in ("a", "t"):
            runtime = Runtime(workers=1, capabilities=capabilities)
            runtime.register(agent_type)
            self.made.append((runtime, Node(runtime, parse_cluster(data), name=name).start()))
        (_ra, node_a), (rt, _nt) = self.made[-2:]
        return node_a, rt

    def close(self) -> None:
        for runtime, node in reversed(self.made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


@pytest.fixture
def durable_pair(nats_server: NatsServer) -> Iterator[DurablePair]:
    """Two in-process nodes with a durable type (see DurablePair), closed at the end."""
    made = DurablePair(nats_server.url)
    yield made
    made.close()


@pytest.fixture(scope="session")
def steps(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """tests/cluster/journal_agent/steps.py (a durable agent calling a counted tool), built once."""
    from tests.agents.conftest import _build_path

    source = ROOT / "tests" / "cluster" / "journal_agent"
    return Component.load(_build_path("steps", tmp_path_factory.mktemp("steps"), source))
