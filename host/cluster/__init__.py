"""Cluster: runtimes on several nodes joined through NATS, with send/ask across them.

A layer above ``mighty.agents`` (which knows nothing of it: a Node installs itself as the
runtime's ``router``) and below the CLI (``mty node``). See docs/cluster.md.
"""

from mighty.cluster._application import PEERS_WAIT, NodeApplication
from mighty.cluster._auth import node_permissions, server_authorization
from mighty.cluster._config import (
    ClusterChildModel,
    ClusterConfig,
    ClusterSupervisorModel,
    TlsModel,
    check_node_name,
    parse_cluster,
)
from mighty.cluster._frames import (
    MAX_FRAME,
    VERSION,
    Frame,
    FrameError,
    decode,
    encode,
    heartbeat_subject,
    node_subject,
    sender_of,
)
from mighty.cluster._lease import SupervisorLease
from mighty.cluster._migrate import MigrationFailed, MigrationReport
from mighty.cluster._node import ClusterError, Node, NodeStats
from mighty.cluster._replies import error_of
from mighty.cluster._server import NatsServer, free_port, nats_server_binary
from mighty.cluster._supervisor import ClusterChild, ClusterSupervisor, RemoteChild

__all__ = [
    "MAX_FRAME",
    "PEERS_WAIT",
    "VERSION",
    "ClusterChild",
    "ClusterChildModel",
    "ClusterConfig",
    "ClusterError",
    "ClusterSupervisor",
    "ClusterSupervisorModel",
    "Frame",
    "FrameError",
    "MigrationFailed",
    "MigrationReport",
    "NatsServer",
    "Node",
    "NodeApplication",
    "NodeStats",
    "RemoteChild",
    "SupervisorLease",
    "TlsModel",
    "check_node_name",
    "decode",
    "encode",
    "error_of",
    "free_port",
    "heartbeat_subject",
    "nats_server_binary",
    "node_permissions",
    "node_subject",
    "parse_cluster",
    "sender_of",
    "server_authorization",
]
