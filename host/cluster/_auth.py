"""Node identity from NATS: a nats-server ``authorization`` block giving each node its own user,
allowed to publish only on its own sender subjects.

A node believes a frame's sender from the subject it came on (``<prefix>.node.<to>.<sender>``,
``<prefix>.hb.<sender>``; see ``_frames``). That is an identity only if nobody else may publish
there, which is NATS's job: each node's user may publish on ``<prefix>.node.*.<node>`` and
``<prefix>.hb.<node>`` (and refresh only its own key of ``<prefix>_nodes``), subscribe on its
own request subjects, the heartbeats and inboxes, and answer requests it received
(``allow_responses``). The server refuses anything else with a permissions violation, before
any node sees it.

Rejected: signing each frame with a per-node key (nkeys, HMAC) and checking it in the node. It
costs a signature and a verification per frame on the hot path, needs key distribution of its
own, and NATS already authenticates the connection (password, creds, TLS client certificate):
binding the subject to that identity in the server costs nothing per frame. Rejected too:
decentralised JWT accounts generated here (operator, account and user JWTs): right for
production with `nsc`, but a plain ``authorization`` block is what a single server (and a
test) can run as is; the permissions are the same in both, so this block is also the list to
copy into `nsc edit user --allow-pub ...`.

What the permissions leave shared: JetStream's API (``$JS.API.>``: a node creates its buckets
and streams, so a node's user can also delete them), the names, leases and durable-state
buckets (any node may claim a free name or take over the supervisor's lease by
compare-and-set), and the durable and journal streams' subjects (a node may append to the
import journal of any durable message: the new owner of an agent reads what the old one
wrote). A node with valid credentials can still misbehave there; what it can no longer do is
speak as another node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from mighty._errors import BadInput
from mighty.cluster._config import ClusterConfig

__all__ = ["node_permissions", "server_authorization"]


def node_permissions(config: ClusterConfig, node: str) -> dict[str, object]:
    """The nats-server ``permissions`` of ``node``'s user (see the module docstring)."""
    if node not in config.peers:
        raise BadInput(f"node {node!r} is not in [cluster.peers]")
    p = config.name
    return {
        "publish": {
            "allow": [
                f"{p}.node.*.{node}",
                f"{p}.hb.{node}",
                f"{p}.dur.>",
                f"{p}.jrn.>",
                f"$KV.{p}_nodes.{node}",
                f"$KV.{p}_names.>",
                f"$KV.{p}_leases.>",
                f"$KV.{p}_state.>",
                "$JS.API.>",
                "$JS.ACK.>",
            ]
        },
        "subscribe": {"allow": [f"{p}.node.{node}.*", f"{p}.hb.*", "_INBOX.>"]},
        "allow_responses": True,
    }


def server_authorization(config: ClusterConfig, passwords: Mapping[str, str]) -> str:
    """A nats-server ``authorization { users = [...] }`` block: one user per node of
    ``passwords`` (node name -> password; the user is the node's name) with its permissions.

    Put the passwords in each node's server URL (``nats://a:PASSWORD@host:4222``) or use creds
    files with the same permissions; the block is JSON-compatible nats-server syntax.
    """
    users = []
    for node, password in passwords.items():
        if not password:
            raise BadInput(f"node {node!r} needs a password")
        users.append(
            {"user": node, "password": password, "permissions": node_permissions(config, node)}
        )
    return "authorization " + json.dumps({"users": users}, indent=2) + "\n"
