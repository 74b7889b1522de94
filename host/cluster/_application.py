"""A node of a cluster from its manifest, run from Python exactly as `mty node` runs it.

``NodeApplication.from_manifest(path)`` builds what ``mighty.toml`` (with its ``[cluster]``
block) describes for one node: the agent types, a ``Runtime`` with the manifest's workers and
capabilities, and the ``Node`` that joins it to the cluster. ``start()`` registers the types,
joins, starts and adopts the local supervision tree (``Node.start_tree``: children adopted
elsewhere while this node was gone are handed back to it) and takes (or stands by for) the
cluster supervisor;
``leads`` says whether this node sends the ``[[start]]`` messages (``send_start``);
``shutdown()`` stops the supervisor, the services stacked on the node (``on_shutdown``), the
runtime, then leaves the cluster (peers hear it left) and closes the trace.

Rejected: the CLI assembling all this itself (`mty node` was the one command whose runtime a
Python user could not get without copying it, and the only place its order of shutdown was
written down).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mighty._errors import BadInput
from mighty.agents import AgentOutput, Runtime, StartReply, load_manifest
from mighty.agents.hosting import agent_types, capabilities, send_start_messages, supervisor_spec
from mighty.cluster._config import ClusterConfig, parse_cluster
from mighty.cluster._lease import SupervisorLease
from mighty.cluster._node import Node

__all__ = ["PEERS_WAIT", "NodeApplication"]

PEERS_WAIT = 30.0
"""How long the supervisor's node waits for the nodes its children are pinned to."""


def _never() -> bool:
    return False


class NodeApplication:
    """One node of a cluster: its runtime, its ``Node``, its supervision (see the module)."""

    def __init__(
        self,
        manifest: Any,
        base: Path,
        config: ClusterConfig,
        *,
        name: str | None = None,
        on_output: Callable[[AgentOutput], None] | None = None,
        recorder: Any = None,
        progress: Callable[[str], None] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        """Build the agent types of ``manifest`` and a runtime and node for them (nothing
        joins yet). ``progress`` hears about builds; ``on_note`` the node's own lines (joined,
        the cluster supervisor started or taken over)."""
        self.manifest = manifest
        self.config = config
        self.recorder = recorder
        self._note = on_note or (lambda text: None)
        registry = capabilities(manifest, base)
        self.types = agent_types(manifest, base, progress, registry)
        self.runtime = Runtime(
            workers=manifest.workers,
            on_output=on_output,
            recorder=recorder,
            capabilities=registry,
        )
        self.node = Node(self.runtime, config, name=name)
        self.supervisor: Any = None
        """The cluster supervisor's lease (None: the manifest plans none)."""
        self._stops: list[Callable[[], None]] = []

    @classmethod
    def from_manifest(
        cls,
        path: str | Path,
        *,
        name: str | None = None,
        servers: Sequence[str] = (),
        **options: Any,
    ) -> NodeApplication:
        """The node ``name`` (default: ``[cluster] node``) of the manifest at ``path``;
        ``servers`` replace the manifest's NATS URLs. BadInput without a ``[cluster]``."""
        manifest, base = load_manifest(Path(path))
        return cls(
            manifest, base, cls.cluster_config(manifest, base, path, servers), name=name, **options
        )

    @staticmethod
    def cluster_config(
        manifest: Any, base: Path, path: str | Path, servers: Sequence[str] = ()
    ) -> ClusterConfig:
        """The manifest's ``[cluster]`` block, resolved against its directory."""
        if manifest.cluster is None:
            raise BadInput(f"{path}: no [cluster] block (use `mty run` for one machine)")
        data = dict(manifest.cluster)
        if servers:
            data["servers"] = list(servers)
        return parse_cluster(data).resolve(base)

    @property
    def leader(self) -> str:
        """The node that runs the cluster supervisor and sends the start messages."""
        plan = self.config.supervisor
        return (plan.node if plan is not None else None) or next(iter(self.config.peers))

    @property
    def leads(self) -> bool:
        """Whether this node sends the ``[[start]]`` messages: it is the leader and holds the
        cluster supervisor (or there is none)."""
        return self.node.name == self.leader and (
            self.supervisor is None or bool(self.supervisor.held)
        )

    def start(self) -> NodeApplication:
        """Register the types, join the cluster, adopt the local tree, and start (or stand by
        for) the cluster supervisor. Returns self."""
        for agent_type in self.types:
            self.runtime.register(agent_type)
        node = self.node
        node.start()
        where = ", ".join(self.config.servers)
        self._note(f"node {node.name} joined cluster {self.config.name} at {where}")
        node.start_tree(supervisor_spec(self.manifest.supervisor))
        self.supervisor = self._supervise()
        return self

    def _supervise(self) -> Any:
        plan, node = self.config.supervisor, self.node
        if plan is None or not plan.children:
            return None
        if node.name == self.leader:
            pinned = sorted({c.node for c in plan.children if c.node is not None})
            if not node.wait_for(pinned, PEERS_WAIT):
                missing = sorted(set(pinned) - set(node.live_nodes()))
                raise BadInput(f"pinned nodes not up after {PEERS_WAIT:g} s: {missing}")

        def started(supervisor: Any, took_over: bool) -> None:
            how = f"took over ({len(supervisor.adopted)} adopted)" if took_over else "started"
            self._note(f"cluster supervisor {how} on {node.name}")

        return SupervisorLease(node, plan, on_start=started).start()

    def send_start(
        self,
        *,
        interrupted: Callable[[], bool] = _never,
        on_reply: Callable[[StartReply], None] | None = None,
        on_failure: Callable[[str, str, str], None] | None = None,
    ) -> tuple[list[StartReply], list[str]]:
        """Send the ``[[start]]`` messages in order (waiting for asks) until ``interrupted()``
        (``mighty.agents.hosting.send_start_messages``); (replies, failures)."""
        return send_start_messages(
            self.runtime,
            self.manifest.start,
            interrupted=interrupted,
            on_reply=on_reply,
            on_failure=on_failure,
        )

    def on_shutdown(self, stop: Callable[[], None]) -> None:
        """Stop a service stacked on the node (a control socket) first at shutdown."""
        self._stops.append(stop)

    def shutdown(self, *, interrupt: int | None = None, timeout: float = 10.0) -> None:
        """Stop supervising, the stacked services, the runtime (guest calls still running are
        interrupted when ``interrupt`` is a signal, as `mty run` does), leave the cluster,
        close the trace. Idempotent enough to be called from a ``finally``."""
        if self.supervisor is not None:
            self.supervisor.stop()
        while self._stops:
            self._stops.pop()()
        self.runtime.shutdown(drain=False, timeout=timeout, interrupt=interrupt)
        self.node.close()
        if self.recorder is not None:
            self.recorder.close()
