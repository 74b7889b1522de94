"""TLS between nodes and NATS with a test CA (made with openssl here), client certificates too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mighty.agents import AgentType, Runtime
from mighty.cluster import ClusterError, NatsServer, Node, parse_cluster


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _pki(tmp: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=tmp,
    )
    (tmp / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "node"):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            cwd=tmp,
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
            cwd=tmp,
        )


def test_nodes_talk_over_tls_with_client_certificates(tmp_path: Path, echo: object) -> None:
    _pki(tmp_path)
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'tls {{\n  cert_file: "{tmp_path}/server.pem"\n  key_file: "{tmp_path}/server.key"\n'
        f'  ca_file: "{tmp_path}/ca.pem"\n  verify: true\n}}\n'
    )
    with NatsServer(config=conf) as server:
        base = {"servers": [server.url], "peers": {"a": {}, "b": {}}}
        tls = {"ca": "ca.pem", "cert": "node.pem", "key": "node.key"}
        secure = parse_cluster(base | {"tls": tls}).resolve(tmp_path)
        made = []
        try:
            for name in ("a", "b"):
                runtime = Runtime(workers=1)
                runtime.register(AgentType("echo", echo))  # type: ignore[arg-type]
                made.append((runtime, Node(runtime, secure, name=name).start()))
            (a, _), (b, _) = made
            address = b.spawn("echo")
            assert a.ask(f"b:{address}", "x", "over tls") == "over tls"
            # Without a client certificate the server refuses the node: a clear error.
            no_cert = parse_cluster(base | {"tls": {"ca": "ca.pem"}, "connect_timeout": 2})
            stray = Runtime(workers=1)
            try:
                with pytest.raises(ClusterError, match="no NATS server answered"):
                    Node(stray, no_cert.resolve(tmp_path), name="a").start()
            finally:
                stray.shutdown()
        finally:
            for runtime, node in reversed(made):
                runtime.shutdown(drain=False, timeout=2)
                node.close()
