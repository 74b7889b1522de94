"""The HTTP front seen from outside: `mty run --http` answering a real client, `mty top` and
`mty inspect` showing requests in flight and per-route counts over the control socket, and
one http.server span per request, parent of the agent's ask and handle spans."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mighty.agents import Application
from mighty.control import ControlServer, application_ops
from mighty.telemetry import Telemetry
from tests.serve import gate_tool
from tests.serve.test_front import manifest_text

ROOT = Path(__file__).resolve().parents[2]
MTY = [sys.executable, "-m", "mighty.cli"]


@pytest.fixture(autouse=True)
def _gates() -> Iterator[None]:
    gate_tool.reset()
    yield
    gate_tool.reset()


def _mty(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MTY, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_top_and_inspect_show_requests_in_flight_and_per_route_counts(
    front_agent_wasm: Path, tmp_path: Path
) -> None:
    """With one request held in its handler: in flight 1 for its route; after it, its 200."""
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(manifest_text(front_agent_wasm))
    sock = tmp_path / "control.sock"
    with Application.from_manifest(manifest, telemetry=None) as app:
        app.start()
        front = app.serve_http("127.0.0.1:0")
        assert front.address is not None
        control = ControlServer(sock, application_ops(app)).start()
        app.on_shutdown(control.stop)
        url = f"http://127.0.0.1:{front.address[1]}"
        with httpx.Client(base_url=url, timeout=120.0) as client:
            assert client.post("/echo", json=1).status_code == 200
            held: list[Any] = []
            thread = threading.Thread(target=lambda: held.append(client.post("/hold/top")))
            thread.start()
            try:
                assert gate_tool.entered("top").wait(120)
                top = _mty("top", "--once", "--json", "--interval", "0.1", "--socket", str(sock))
                assert top.returncode == 0, top.stderr
                http = json.loads(top.stdout)["http"]
                assert http["in_flight"] == 1
                assert http["listen"] == f"127.0.0.1:{front.address[1]}"
                assert http["routes"]["POST /hold/{name}"] == {
                    "requests": 1,
                    "in_flight": 1,
                    "statuses": {},
                }
                assert http["routes"]["POST /echo"]["statuses"] == {"200": 1}
                shown = _mty("inspect", "--socket", str(sock))
                assert shown.returncode == 0, shown.stderr
                assert "1 in flight" in shown.stdout
                assert "POST /hold/{name}: 1 in flight, 1 requests (none answered)" in shown.stdout
                table = _mty("top", "--once", "--interval", "0.1", "--socket", str(sock))
                assert "POST /hold/{name}" in table.stdout
            finally:
                gate_tool.release("top")
                thread.join(120)
            assert held[0].status_code == 200
        after = _mty("inspect", "--json", "--socket", str(sock))
        routes = json.loads(after.stdout)["http"]["routes"]
        assert routes["POST /hold/{name}"] == {
            "requests": 1,
            "in_flight": 0,
            "statuses": {"200": 1},
        }
        one = _mty("inspect", "front", "--json", "--socket", str(sock))
        assert "http" not in json.loads(one.stdout)  # one agent's snapshot: no front


def test_each_routed_request_is_an_http_server_span_parent_of_the_ask(
    front_agent_wasm: Path, tmp_path: Path
) -> None:
    """http.server span with the semantic conventions' attributes; agent.ask its child,
    agent.handle the ask's; a failed ask's span has the status and error.type; a request's
    traceparent is continued."""
    spans = InMemorySpanExporter()
    telemetry = Telemetry(span_exporter=spans, batch=False)
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(manifest_text(front_agent_wasm))
    app = Application.from_manifest(manifest, telemetry=telemetry)
    try:
        app.start()
        front = app.serve_http("127.0.0.1:0")
        assert front.address is not None
        port = front.address[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120.0) as client:
            assert client.post("/kv/k1?x=1", json={"value": 3}).status_code == 200
            assert client.post("/fail").status_code == 500
            assert client.get("/nowhere").status_code == 404
            remote = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            assert client.get("/kv/k1", headers={"traceparent": remote}).status_code == 200
    finally:
        app.shutdown()
    finished = spans.get_finished_spans()
    (put,) = [s for s in finished if s.name == "POST /kv/{key}"]
    assert put.kind.name == "SERVER"
    assert put.parent is None
    assert dict(put.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/kv/{key}",
        "url.path": "/kv/k1",
        "url.scheme": "http",
        "server.address": "127.0.0.1",
        "server.port": port,
        "network.protocol.version": "1.1",
        "http.response.status_code": 200,
    }
    (ask,) = [
        s for s in finished if s.name == "agent.ask" and s.context.trace_id == put.context.trace_id
    ]
    assert ask.parent is not None and ask.parent.span_id == put.context.span_id
    (handle,) = [
        s
        for s in finished
        if s.name == "agent.handle" and s.context.trace_id == put.context.trace_id
    ]
    assert handle.parent is not None and handle.parent.span_id == ask.context.span_id
    assert handle.attributes is not None and handle.attributes["protocol.msg"] == "put"
    (fail,) = [s for s in finished if s.name == "POST /fail"]
    assert fail.attributes is not None
    assert fail.attributes["http.response.status_code"] == 500
    assert fail.attributes["error.type"] == "failed"
    assert fail.status.status_code.name == "ERROR"
    assert not [s for s in finished if "nowhere" in s.name]  # no route: no route span
    (continued,) = [s for s in finished if s.name == "GET /kv/{key}"]
    assert continued.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert continued.parent is not None and continued.parent.span_id == 0xB7AD6B7169203331


def test_mty_run_http_answers_a_client_and_stops_on_sigterm(
    front_agent_wasm: Path, tmp_path: Path
) -> None:
    """`mty run MANIFEST --http 127.0.0.1:0`: says where, answers routes, exits on SIGTERM."""
    manifest = tmp_path / "mighty.toml"
    manifest.write_text(manifest_text(front_agent_wasm))
    process = subprocess.Popen(
        [*MTY, "run", str(manifest), "--http", "127.0.0.1:0", "-q"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr is not None
    try:
        address = None
        for line in process.stderr:
            found = re.search(r"serving \[http\] on (http://\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address is not None, "mty run never said where it serves"
        with httpx.Client(base_url=address, timeout=60.0) as client:
            assert client.post("/kv/a", json={"value": "b"}).json() == {"ok": True, "key": "a"}
            assert client.get("/kv/a").json() == {"key": "a", "value": "b"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def test_mty_run_http_without_an_http_block_is_refused(
    front_agent_wasm: Path, tmp_path: Path
) -> None:
    """--http on a manifest with no [http] block: exit 2 and a line saying so."""
    manifest = tmp_path / "mighty.toml"
    text = manifest_text(front_agent_wasm)
    manifest.write_text(text[: text.index("[http]")])
    done = _mty("run", str(manifest), "--http", "127.0.0.1:0", "-q")
    assert done.returncode == 2, done.stderr
    assert "no [http] block" in done.stderr


def test_a_taken_address_is_refused_in_one_line(front_agent_wasm: Path, tmp_path: Path) -> None:
    """serve_http on an address another socket holds: BadInput naming it, not an OSError."""
    import socket

    from mighty._errors import BadInput

    manifest = tmp_path / "mighty.toml"
    manifest.write_text(manifest_text(front_agent_wasm))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with Application.from_manifest(manifest, telemetry=None) as app:
            app.start()
            with pytest.raises(BadInput, match=f"cannot listen on 127.0.0.1:{port}"):
                app.serve_http(f"127.0.0.1:{port}")
            assert app.http is None
