"""A node that cannot reach NATS says why, never an empty reason."""

from __future__ import annotations

import socket

import pytest

from mighty.agents import Runtime
from mighty.cluster import ClusterError, Node, parse_cluster


def test_connect_failure_has_a_reason() -> None:
    """Connecting to a closed port fails with a ClusterError whose reason is not empty."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = parse_cluster(
        {"servers": [f"nats://127.0.0.1:{port}"], "peers": {"a": {}}, "connect_timeout": 1}
    )
    with Runtime(workers=1) as runtime:
        node = Node(runtime, config, name="a")
        try:
            with pytest.raises(ClusterError) as caught:
                node.start()
        finally:
            node.close()
    reason = caught.value.message.rsplit(": ", 1)[-1]
    assert caught.value.message.startswith("no NATS server answered at nats://127.0.0.1:")
    assert reason.strip(), caught.value.message
