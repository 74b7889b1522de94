"""The test guest of tests/serve: one route per behaviour a server must survive."""

import os
import time

from componentize_py_types import Err, Ok
from mighty_agent import http
from wit_world import exports
from wit_world.imports import poll
from wit_world.imports.monotonic_clock import subscribe_duration
from wit_world.imports.types import (
    ErrorCode_InternalError,
    Fields,
    IncomingRequest,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


def start(out: ResponseOutparam, status: int, headers: list[tuple[str, bytes]]) -> OutgoingBody:
    """Set the response head; the body to write."""
    response = OutgoingResponse(Fields.from_list(headers))
    response.set_status_code(status)
    body = response.body()
    ResponseOutparam.set(out, Ok(response))
    return body


def send(out: ResponseOutparam, status: int, data: bytes) -> None:
    """A whole response with a content-length."""
    body = start(out, status, [("content-length", str(len(data)).encode())])
    with body.write() as stream:
        stream.blocking_write_and_flush(data)
    OutgoingBody.finish(body, None)


def read_all(request: IncomingRequest) -> bytes:
    """The whole request body."""
    data = bytearray()
    incoming = request.consume()
    with incoming.stream() as source:
        while True:
            try:
                data += source.blocking_read(65536)
            except Err:
                break
    return bytes(data)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        path = request.path_with_query() or "/"
        route, _, query = path.partition("?")
        if route == "/hello":
            send(response_out, 200, b"hello")
        elif route == "/info":
            headers = request.headers()
            seen = [f"{k}={v.decode()}" for k, v in headers.entries() if k.startswith("x-")]
            text = f"{type(request.method()).__name__} {path} {request.authority()} {seen}"
            send(response_out, 200, text.encode())
        elif route == "/echo":
            data = read_all(request)
            send(response_out, 200, b"got %d bytes: " % len(data) + data[:64])
        elif route == "/stream":
            # Echo the body as it comes, without a content-length (a chunked response).
            body = start(response_out, 200, [("content-type", b"application/octet-stream")])
            incoming = request.consume()
            with incoming.stream() as source, body.write() as sink:
                while True:
                    try:
                        chunk = source.blocking_read(65536)
                    except Err:
                        break
                    sink.blocking_write_and_flush(chunk)
            OutgoingBody.finish(body, None)
        elif route == "/big":
            size = int(query or "0")
            body = start(response_out, 200, [])
            with body.write() as stream:
                for _ in range(size // 65536):
                    stream.blocking_write_and_flush(b"x" * 65536)
                stream.blocking_write_and_flush(b"x" * (size % 65536))
            OutgoingBody.finish(body, None)
        elif route == "/trap":
            raise ValueError("the handler failed on purpose")
        elif route == "/spin":
            while True:
                pass
        elif route == "/sleep":
            poll.poll([subscribe_duration(int(float(query or "60") * 1e9))])
            send(response_out, 200, b"woke")
        elif route == "/noreply":
            return
        elif route == "/error":
            ResponseOutparam.set(response_out, Err(ErrorCode_InternalError("secret detail")))
        elif route == "/env":
            send(response_out, 200, os.environ.get("GREETING", "none").encode())
        elif route == "/fetch":
            # An outgoing request of the handler's own: it passes the server's policy.
            try:
                fetched = http.get(query, timeout=5.0)
            except http.HttpError as exc:
                send(response_out, 502, str(exc.code).encode())
            else:
                send(response_out, 200, f"{fetched.status} {fetched.text}".encode())
        elif route == "/time":
            send(response_out, 200, str(time.time()).encode())
        else:
            send(response_out, 404, b"not found")
