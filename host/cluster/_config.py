"""The ``[cluster]`` block of `mighty.toml`: how a node joins, who may join, what it supervises.

[cluster]
servers = ["nats://127.0.0.1:4222"]   # one or more NATS servers (the client fails over)
node = "a"                            # this node's name (also: `mty node --name`)
heartbeat = 0.5                       # seconds between heartbeats
dead_after = 2.0                      # silent this long: the node is dead
fence_after = 1.0                     # no lease renewed this long: agents paused (< dead_after)
max_component = 67108864              # largest component a migration ships here (0: none)
tls = { ca = "ca.pem", cert = "a.pem", key = "a.key" }   # optional; relative to the manifest
creds = "a.creds"                     # optional NATS credentials file

[cluster.peers]                       # the static topology: only these nodes may take part
a = {}
b = { components = false }            # take no shipped component from b

[cluster.supervisor]                  # optional: children placed on nodes, run by `node`
node = "a"
strategy = "one_for_one"
placement = "round_robin"             # or "least_loaded"; a child's `node` pins it
children = [ { name = "ledger", type = "ledger", node = "b" } ]
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mighty._errors import BadInput

__all__ = [
    "ClusterChildModel",
    "ClusterConfig",
    "ClusterSupervisorModel",
    "TlsModel",
    "check_node_name",
    "parse_cluster",
]

_NODE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_node_name(name: str) -> str:
    """``name`` if it is a node name (letters, digits, '-' and '_', at most 64), else BadInput."""
    if not _NODE_NAME.match(name):
        raise BadInput(
            f"{name!r} is not a node name (letters, digits, '-' and '_', at most 64 characters)"
        )
    return name


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsModel(_Model):
    ca: str
    cert: str | None = None
    key: str | None = None


class PeerModel(_Model):
    spawn: bool = True
    """The cluster supervisor may place children on this node."""
    components: bool = True
    """This node takes components shipped from this peer (a migrating agent's, by sha256)."""


class ClusterChildModel(_Model):
    name: str
    type: str
    init: Any = None
    node: str | None = None
    """Pinned to this node (while it lives); placement decides otherwise."""


class ClusterSupervisorModel(_Model):
    node: str | None = None
    """The node that runs the supervisor (default: the first peer)."""
    strategy: Literal["one_for_one", "rest_for_one", "one_for_all"] = "one_for_one"
    intensity: int = Field(3, ge=0)
    period: float = Field(30.0, gt=0)
    placement: Literal["round_robin", "least_loaded"] = "round_robin"
    children: list[ClusterChildModel] = []


class ClusterConfig(_Model):
    """A validated ``[cluster]`` block."""

    servers: list[str] = Field(min_length=1)
    node: str | None = None
    name: str = "mighty"
    """The cluster's name: the prefix of its subjects and buckets (several may share NATS)."""
    heartbeat: float = Field(0.5, gt=0, le=60)
    dead_after: float = Field(2.0, gt=0, le=600)
    fence_after: float | None = Field(None, gt=0, le=600)
    """Seconds without a renewed lease before a node pauses its agents (default dead_after/2)."""
    connect_timeout: float = Field(5.0, gt=0, le=300)
    ask_timeout: float = Field(5.0, gt=0)
    """The wait for a send's acknowledgement (an ask has its own timeout)."""
    max_frame: int = Field(1 << 20, ge=1024, le=64 << 20)
    max_inflight: int = Field(1024, ge=1, le=1 << 20)
    """Incoming messages that may wait for a full mailbox at once; more answer mailbox-full."""
    # At most mighty.engine's MAX_COMPONENT_BYTES (not imported: it loads wasmtime).
    max_component: int = Field(64 << 20, ge=0, le=256 << 20)
    """The largest component a migration may ship to this node (bytes; 0: none is taken)."""
    durable: list[str] = []
    """Agent types whose sends by name are at-least-once over JetStream (see _durable)."""
    tls: TlsModel | None = None
    creds: str | None = None
    peers: dict[str, PeerModel] = Field(min_length=1)
    supervisor: ClusterSupervisorModel | None = None

    @field_validator("node", "name")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        if value is not None and not _NODE_NAME.match(value):
            raise ValueError("letters, digits, '-' and '_' only, at most 64 characters")
        return value

    @field_validator("peers")
    @classmethod
    def _peers(cls, value: dict[str, PeerModel]) -> dict[str, PeerModel]:
        for name in value:
            if not _NODE_NAME.match(name):
                raise ValueError(f"{name!r} is not a node name")
        return value

    @field_validator("servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        for url in value:
            if not re.match(r"^(nats|tls)://[^\s/]+$", url):
                raise ValueError(f"{url!r} is not a NATS URL (nats://HOST:PORT)")
        return value

    def resolve(self, base: Path) -> ClusterConfig:
        """Paths (tls, creds) made absolute against the manifest's folder."""
        changes: dict[str, Any] = {}
        if self.tls is not None:
            changes["tls"] = TlsModel(
                ca=str(base / self.tls.ca),
                cert=None if self.tls.cert is None else str(base / self.tls.cert),
                key=None if self.tls.key is None else str(base / self.tls.key),
            )
        if self.creds is not None:
            changes["creds"] = str(base / self.creds)
        return self.model_copy(update=changes) if changes else self


def parse_cluster(data: Any, *, where: str = "[cluster]") -> ClusterConfig:
    """Validate a ``[cluster]`` block (a dict from TOML); BadInput naming the problem."""
    if not isinstance(data, dict):
        raise BadInput(f"{where} must be a table")
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise BadInput(f"{where}: {problems}") from None
    if config.fence_after is not None and not (
        config.heartbeat < config.fence_after < config.dead_after
    ):
        raise BadInput(f"{where}: fence_after must be between heartbeat and dead_after")
    if config.fence_after is None and config.dead_after / 2 <= config.heartbeat:
        raise BadInput(
            f"{where}: dead_after must be over twice the heartbeat (a node fences itself after "
            "half of it without a renewed lease), or set fence_after"
        )
    if config.supervisor is not None:
        sup = config.supervisor
        for node in [sup.node, *(c.node for c in sup.children)]:
            if node is not None and node not in config.peers:
                raise BadInput(f"{where}.supervisor: node {node!r} is not in [cluster.peers]")
    return config
