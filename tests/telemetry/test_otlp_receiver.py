"""`mty run` exporting to real OTLP receivers: a small HTTP server decoding the protobuf with
opentelemetry-proto, and a gRPC server on the collector's own service definitions."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

_REQUESTS = {
    "/v1/traces": (
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "/v1/logs": (
        logs_service_pb2.ExportLogsServiceRequest,
        logs_service_pb2.ExportLogsServiceResponse,
    ),
    "/v1/metrics": (
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
}


class Receiver:
    """What an OTLP/HTTP receiver got, decoded, by path."""

    def __init__(self) -> None:
        self.received: dict[str, list[Any]] = {path: [] for path in _REQUESTS}
        self.lock = threading.Lock()

    def spans(self) -> list[Any]:
        with self.lock:
            return [
                span
                for request in self.received["/v1/traces"]
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]

    def log_records(self) -> list[Any]:
        with self.lock:
            return [
                record
                for request in self.received["/v1/logs"]
                for resource in request.resource_logs
                for scope in resource.scope_logs
                for record in scope.log_records
            ]

    def service_names(self) -> set[str]:
        with self.lock:
            return {
                attribute.value.string_value
                for request in self.received["/v1/traces"]
                for resource in request.resource_spans
                for attribute in resource.resource.attributes
                if attribute.key == "service.name"
            }


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            kinds = _REQUESTS.get(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if kinds is None or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            request = kinds[0]()
            request.ParseFromString(body)
            with got.lock:
                got.received[self.path].append(request)
            reply = kinds[1]().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _manifest(tmp_path: Path, relay_wasm: Path, telemetry: str) -> Path:
    path = tmp_path / "mighty.toml"
    path.write_text(
        "workers = 2\n\n"
        f'[agents.relay]\ncomponent = "{relay_wasm}"\n\n'
        "[supervisor]\nchildren = [\n"
        '  { name = "a", type = "relay" },\n'
        '  { name = "b", type = "relay" },\n'
        '  { name = "c", type = "relay" },\n]\n\n'
        '[[start]]\nto = "a"\nmessage = "relay"\nbody = { path = ["b", "c"] }\n\n' + telemetry
    )
    return path


def _run(manifest: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mighty.cli", "run", str(manifest)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _chain_is_one_trace(spans: list[Any]) -> None:
    by_id = {s.span_id: s for s in spans}
    handles = [s for s in spans if s.name == "agent.handle"]
    asks = [s for s in spans if s.name == "agent.ask"]
    assert len(handles) == 3
    assert len(asks) == 3
    assert len({s.trace_id for s in handles + asks}) == 1
    # Every handle's parent is an ask, every ask but the host's has a handle for parent.
    for handle in handles:
        assert by_id[handle.parent_span_id].name == "agent.ask"
    roots = [a for a in asks if not a.parent_span_id]
    assert len(roots) == 1
    for ask in asks:
        if ask.parent_span_id:
            assert by_id[ask.parent_span_id].name == "agent.handle"
    spawns = [s for s in spans if s.name == "agent.spawn"]
    assert len(spawns) == 3
    assert {
        a.value.string_value for s in spawns for a in s.attributes if a.key == "agent.type"
    } == {"relay"}


def test_mty_run_exports_one_trace_over_otlp_http(
    tmp_path: Path, relay_wasm: Path, receiver: tuple[Receiver, str]
) -> None:
    """A [telemetry] block: the ask chain host -> a -> b -> c arrives as one trace, the agents'
    log() and emit() as log records, under the configured service name."""
    got, url = receiver
    block = f'[telemetry]\nendpoint = "{url}"\nservice_name = "relay-test"\n'
    done = _run(_manifest(tmp_path, relay_wasm, block))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    _chain_is_one_trace(got.spans())
    assert got.service_names() == {"relay-test"}
    bodies = [r.body.string_value for r in got.log_records()]
    assert bodies.count("relaying, 2 left") == 1
    assert "agent.hop" in bodies
    trace_ids = {s.trace_id for s in got.spans() if s.name == "agent.handle"}
    logged = {r.trace_id for r in got.log_records() if r.body.string_value.startswith("relaying")}
    assert logged == trace_ids


def test_environment_turns_it_on_and_stderr_lines_when_off(
    tmp_path: Path, relay_wasm: Path, receiver: tuple[Receiver, str]
) -> None:
    """MTY_OTLP_ENDPOINT alone turns export on; without it the events are lines on stderr."""
    got, url = receiver
    manifest = _manifest(tmp_path, relay_wasm, "")
    done = _run(manifest, {"MTY_OTLP_ENDPOINT": url})
    assert done.returncode == 0, done.stderr
    _chain_is_one_trace(got.spans())
    off = _run(manifest)
    assert off.returncode == 0, off.stderr
    assert '] event hop {"hops": 1, "left": 2}' in off.stderr
    assert "] info: relaying, 2 left" in off.stderr


def test_refused_endpoint_and_bad_block(tmp_path: Path, relay_wasm: Path) -> None:
    """An endpoint refusing connections: the run succeeds, one line says so; an unknown key in
    [telemetry]: exit 2 with one line naming it."""
    refused = _run(
        _manifest(
            tmp_path, relay_wasm, '[telemetry]\nendpoint = "http://127.0.0.1:9"\ntimeout = 0.5\n'
        )
    )
    assert refused.returncode == 0, refused.stderr
    assert refused.stderr.count("telemetry: exporting") == 1
    assert "Failed to export" not in refused.stderr  # the exporters' own lines are silenced
    assert "Traceback" not in refused.stderr
    bad = _run(_manifest(tmp_path, relay_wasm, '[telemetry]\nendpoint = "http://x"\ncolor = 1\n'))
    assert bad.returncode == 2
    assert "'color'" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[Any] = []

    def Export(self, request: Any, context: Any) -> Any:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_mty_run_exports_over_otlp_grpc(tmp_path: Path, relay_wasm: Path) -> None:
    """protocol = "grpc": the same trace reaches a gRPC OTLP trace service."""
    import grpc

    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        block = f'[telemetry]\nendpoint = "http://127.0.0.1:{port}"\nprotocol = "grpc"\n'
        done = _run(_manifest(tmp_path, relay_wasm, block))
    finally:
        server.stop(0)
    assert done.returncode == 0, done.stderr
    spans = [
        span
        for request in service.requests
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    _chain_is_one_trace(spans)
