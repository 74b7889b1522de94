"""An HTTP handler for `mty serve`: GET / says hello, POST /echo streams the body back."""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    Method_Get,
    Method_Post,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


def respond(out: ResponseOutparam, status: int, body: bytes, kind: bytes = b"text/plain") -> None:
    """Send a whole response: status, two headers and ``body``."""
    headers = Fields.from_list(
        [("content-type", kind), ("content-length", str(len(body)).encode())]
    )
    response = OutgoingResponse(headers)
    response.set_status_code(status)
    outgoing = response.body()
    ResponseOutparam.set(out, Ok(response))
    with outgoing.write() as stream:
        stream.blocking_write_and_flush(body)
    OutgoingBody.finish(outgoing, None)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        method = request.method()
        path = request.path_with_query() or "/"
        if isinstance(method, Method_Get) and path == "/":
            respond(response_out, 200, b"hello from a component\n")
        elif isinstance(method, Method_Post) and path == "/echo":
            # Stream the request body back as it arrives, chunk by chunk.
            response = OutgoingResponse(Fields.from_list([("content-type", b"text/plain")]))
            outgoing = response.body()
            ResponseOutparam.set(response_out, Ok(response))
            incoming = request.consume()
            with incoming.stream() as source, outgoing.write() as sink:
                while True:
                    try:
                        chunk = source.blocking_read(65536)
                    except Err:  # stream-error.closed: the end of the body
                        break
                    sink.blocking_write_and_flush(chunk)
            OutgoingBody.finish(outgoing, None)
        else:
            respond(response_out, 404, b"not found\n")
