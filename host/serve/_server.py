"""``mty serve``: a component that exports ``wasi:http/incoming-handler`` behind an HTTP server.

The connections, limits and timeouts are :class:`~mighty.serve.HttpServer`'s (shared with
the agents' HTTP front); each request runs in a fresh instance on a worker thread, under the
server's per-request :class:`Budget` (fuel, memory, deadline) and the policy's grants. The
request body streams from the socket into the guest (a :class:`~mighty.wasi.RequestBody`;
the server stops reading while the guest is a window behind), the response streams from the
guest to the socket as it writes (the head when it calls ``response-outparam.set``; chunked
unless it set a ``content-length``).

The client is hostile. Every quantity is bounded (:class:`ServeLimits`): open connections,
requests in flight (the excess answered 503 at once, never queued), header bytes (431), body
bytes (413), the time to send headers (slow headers, from the first byte), the idle time of a
kept-alive connection, the time between body reads, the time a write waits for a client that
does not read. A failed request is a 4xx/5xx whose body is a short JSON object naming the
kind (``trap``, ``out_of_fuel``, ``deadline_exceeded`` as 504, ``no_response``...) and nothing
of the host: no message, path or traceback; those go to the server's log. After a failure the
instance is discarded (every request has its own anyway) and the server stays up. A failure
after the head was sent can only cut the connection (the client sees an incomplete body).

With ``record_dir``, every request (or ``record_share`` of them, spread evenly) is recorded to
its own trace (``request-000001.bin``..., numbered by request):
the request the guest read and everything it did, which ``mty replay`` replays with no server.

Instances are made ahead on a background thread (:class:`InstancePool`, ``pool`` of them
ready; none when recording, whose instance records from its instantiation), and closed on
it after their one request. :meth:`Server.swap` replaces the component under load: requests
that start after it run the new one, those in flight finish on theirs, none is refused
(``mty serve --control SOCKET`` takes ``mty reload`` for it).

Rejected: uvicorn (already the MCP server's, but an optional extra, and it has no timeout
for a request's headers or body: a client sending a byte a minute holds its slot forever);
a thread per connection (10,000 idle connections would be 10,000 threads); keeping one
instance for many requests (one request could leave state or a secret for the next; a fresh
instance costs ~1 ms with the engine's copy-on-write memory images, off the request's path
with the pool).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11

from mighty._errors import BadInput, ExportNotFound, GuestError
from mighty.budget import Budget, CancelScope
from mighty.engine import Component
from mighty.instance import Instance
from mighty.serve._http import HttpServer, _Closed, _first, _reason, _Timeout
from mighty.serve._limits import ServeLimits
from mighty.serve._pool import InstancePool
from mighty.trace import Recorder
from mighty.wasi import (
    Policy,
    RequestBody,
    ServedRequest,
    ServedResponse,
    error_code,
    incoming_handler_args,
)

__all__ = ["Server", "handler_export"]

_CHUNK = 64 << 10
_WINDOW = 1 << 20
"""Request body bytes read ahead of the guest before the server stops reading the socket."""
_INTERFACE = "wasi:http/incoming-handler@0.2."


def handler_export(component: Component) -> str:
    """The name of ``component``'s ``wasi:http/incoming-handler@0.2.x#handle`` export;
    :class:`ExportNotFound` if it has none (it does not target the ``wasi:http/proxy`` world)."""
    names = sorted(component.export_functions())
    for name in names:
        if name.startswith(_INTERFACE) and name.endswith("#handle"):
            return name
    raise ExportNotFound(
        f"{component.origin} does not export wasi:http/incoming-handler@0.2.x (build it for "
        f"the wasi:http/proxy world: docs/serve.md); it exports: {', '.join(names) or 'nothing'}",
        name=f"{_INTERFACE}x#handle",
        available=names,
    )


@dataclass(slots=True)
class _Outcome:
    kind: str | None = None
    """None: the call returned; else the kind of its failure."""


class Server(HttpServer):
    """Serves one component's ``wasi:http/incoming-handler`` over HTTP/1.1.

    ``policy`` grants what every request's instance may reach (default: nothing);
    ``budget`` bounds each request (its ``timeout`` is the request's deadline: 504 past it);
    ``record_dir`` keeps one trace per request; ``limits``, ``token`` and ``log`` are
    :class:`~mighty.serve.HttpServer`'s.
    """

    def __init__(
        self,
        component: Component,
        *,
        policy: Policy | None = None,
        budget: Budget | None = None,
        limits: ServeLimits | None = None,
        record_dir: str | Path | None = None,
        token: str | None = None,
        log: Callable[[str], None] | None = None,
        pool: int = 4,
        record_share: float = 1.0,
    ) -> None:
        super().__init__(limits=limits, token=token, log=log)
        self._current = (component, handler_export(component))
        self.policy = policy or Policy()
        self.budget = budget or Budget()
        self.record_dir = Path(record_dir) if record_dir is not None else None
        if isinstance(record_share, bool) or not isinstance(record_share, int | float):
            raise BadInput(f"record_share must be a number in (0, 1], got {record_share!r}")
        if not 0 < record_share <= 1:
            raise BadInput(f"record_share must be in (0, 1], got {record_share!r}")
        self.record_share = float(record_share)
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)
        self._ids = itertools.count(1)
        self._hot = False
        # A recorded request's instance records from its instantiation: it is made inline;
        # a server that records every request has no pool.
        everything = self.record_dir is not None and self.record_share == 1.0
        self._pool_size = 0 if everything else pool
        # Filled from start() on: a server never started holds no thread and no instance.
        self._pool = InstancePool(component, self._make, 0, self.log)

    @property
    def component(self) -> Component:
        """The component new requests run (the latest :meth:`swap`'s)."""
        return self._current[0]

    @property
    def export(self) -> str:
        """Its ``wasi:http/incoming-handler@0.2.x#handle`` export."""
        return self._current[1]

    def swap(self, component: Component) -> dict[str, Any]:
        """Serve ``component`` from now on, with no request refused or dropped: every request
        that starts after this returns runs it; the ones in flight finish on the old one
        (each request has its own instance). :class:`ExportNotFound` (and nothing changes)
        if it does not export the handler. Returns the two components' sha256 and the pause,
        in ms, during which no request could take an instance."""
        export = handler_export(component)
        started = time.perf_counter()
        with self._lock:
            old = self._current[0]
            self._current = (component, export)
            self._hot = False
        pause = time.perf_counter() - started
        self._pool.swap(component)
        self.log(f"swapped {old.sha256[:12]} -> {component.sha256[:12]}")
        return {
            "old_component": old.sha256,
            "new_component": component.sha256,
            "max_pause_ms": round(pause * 1000, 3),
        }

    def _make(self, component: Component) -> Instance:
        return Instance(component, budget=self.budget, policy=self.policy, prefault=self._hot)

    def _started(self) -> None:
        if self._pool_size:
            self._pool = InstancePool(self.component, self._make, self._pool_size, self.log)
            self._pool_size = 0  # once: a second start keeps this pool

    def _stopped(self) -> None:
        self._pool.close()

    async def _answer(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: h11.Request,
    ) -> int:
        limits = self.limits
        headers = [(k.decode("latin-1"), bytes(v)) for k, v in head.headers]
        if not self._admit():
            return await self._refuse(conn, writer, 503, "busy", close=True)

        loop = asyncio.get_running_loop()
        changed = asyncio.Event()
        room = asyncio.Event()

        def wake(event: asyncio.Event) -> Callable[[], None]:
            def fire() -> None:
                with suppress(RuntimeError):  # the loop is gone: nothing waits any more
                    loop.call_soon_threadsafe(event.set)

            return fire

        body = RequestBody(on_read=wake(room))
        authority = next((v.decode("latin-1") for k, v in head.headers if k == b"host"), None)
        request = ServedRequest(
            method=head.method.decode("ascii"),
            path_with_query=head.target.decode("ascii", "replace"),
            scheme="http",
            authority=authority,
            headers=headers,
            body=body,
        )
        served = ServedResponse(wake(changed), limit=limits.max_response_bytes)
        cancel = CancelScope()
        self._running.add(cancel)
        self.stats.in_flight += 1
        guest = loop.run_in_executor(self._workers, self._run, request, served, cancel)

        self._guests.add(guest)

        def finished(_future: Any) -> None:
            self._leave()
            self.stats.in_flight -= 1
            self._running.discard(cancel)
            self._guests.discard(guest)

        guest.add_done_callback(finished)
        pump = asyncio.create_task(self._pump(conn, reader, writer, body, room, guest))
        try:
            status = await self._respond(
                conn, writer, served, guest, pump, changed, cancel, head.method == b"HEAD"
            )
        except BaseException:
            cancel.cancel("the client went away")
            pump.cancel()
            with suppress(BaseException):
                await pump
            raise
        await self._settle(pump, body)
        return status

    async def _settle(self, pump: asyncio.Task[str | None], body: RequestBody) -> None:
        """The pump once the response is out: stopped if it only watches for a close (a
        cancelled read loses no data), else left to read the rest of a body the guest
        answered before it was whole (bounded as ever), so that the connection can be kept,
        not reset under a client still sending."""
        if pump.done():
            return
        if body.eof:
            pump.cancel()
            with suppress(BaseException):
                await pump
            return
        body.cancel()
        with suppress(BaseException):
            await asyncio.wait_for(pump, self.limits.body_timeout)

    async def _pump(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        body: RequestBody,
        room: asyncio.Event,
        guest: asyncio.Future[_Outcome],
    ) -> str | None:
        """Feed the request body to the guest; None once it is whole, else why it failed
        (``too_large``, ``body_timeout``, ``gone``: the body is failed with its code)."""
        limits = self.limits
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:  # a bad chunk, or the client closed mid-body
                body.fail(error_code("connection-terminated"))
                return "gone"
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    # `Expect: 100-continue` (curl's, for a body over 1 KiB): the body
                    # comes once we say so; the guest is waiting for it now.
                    writer.write(
                        conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                    )
                try:
                    data = await self._read(reader, limits.body_timeout)
                except _Timeout:
                    body.fail(error_code("connection-read-timeout"))
                    return "body_timeout"
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                if body.received + len(event.data) > limits.max_request_bytes:
                    body.fail(error_code("HTTP-request-body-size", body.received + len(event.data)))
                    return "too_large"
                body.feed(event.data)
                while body.buffered > _WINDOW and not body.cancelled and not guest.done():
                    room.clear()
                    if body.buffered <= _WINDOW:
                        break
                    await _first(room, guest)
                continue
            if isinstance(event, h11.EndOfMessage):
                body.end()
                return await self._watch(conn, reader, body)
            body.fail(error_code("connection-terminated"))
            return "gone"

    async def _watch(
        self, conn: h11.Connection, reader: asyncio.StreamReader, body: RequestBody
    ) -> str | None:
        """After the body, while the guest works: "gone" if the client closes the connection
        (its request is then cancelled at once, not left to run to its deadline). A
        pipelined next request is kept for the next cycle, up to a head's worth; the
        caller cancels this once the response is out."""
        while not body.cancelled:
            try:
                data = await reader.read(_CHUNK)
            except ConnectionError:
                data = b""
            if not data:
                return "gone"
            conn.receive_data(data)
            if len(conn.trailing_data[0]) > self.limits.max_header_bytes:
                return None  # enough read ahead: the rest waits in the socket
        return None

    async def _respond(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        served: ServedResponse,
        guest: asyncio.Future[_Outcome],
        pump: asyncio.Task[str | None],
        changed: asyncio.Event,
        cancel: CancelScope,
        head_only: bool,
    ) -> int:
        # Until the guest answers, returns, or the body fails.
        while True:
            changed.clear()
            if served.answered or guest.done() or (pump.done() and pump.result() is not None):
                break
            await _first(changed, guest, *([] if pump.done() else [pump]))
        failure = pump.result() if pump.done() else None
        if failure is not None:
            # The body failed before any of the response was sent: the request is answered
            # for its body, even if the guest answered after its read failed (a guest that
            # reads the whole body, then answers, is woken by that failure and may answer
            # before this task runs: which one came first was the machine's speed).
            if served.body is not None:
                served.body.close()  # what the guest writes now goes nowhere
            cancel.cancel(f"the request body failed: {failure}")
            if failure == "gone":
                self.stats.failures[failure] += 1
                raise _Closed
            status = 413 if failure == "too_large" else 408
            return await self._refuse(conn, writer, status, failure, close=True)
        if served.status is not None and 200 <= served.status <= 599 and served.body is not None:
            return await self._stream(conn, writer, served, guest, changed, cancel, head_only)
        if served.answered:
            # An error-code, or a status h11 cannot send (1xx, 6xx+): the guest's fault.
            code = served.error.case if served.error is not None else "bad_status"
            self.log(f"  the handler answered {code}")
            cancel.cancel("answered")
            return await self._refuse(
                conn, writer, 500, "handler_error", code=code, close=not pump.done()
            )
        outcome = await guest
        kind = outcome.kind or "no_response"
        status = 504 if kind == "deadline_exceeded" else 500
        return await self._refuse(conn, writer, status, kind, close=not pump.done())

    async def _stream(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        served: ServedResponse,
        guest: asyncio.Future[_Outcome],
        changed: asyncio.Event,
        cancel: CancelScope,
        head_only: bool,
    ) -> int:
        assert served.status is not None
        assert served.body is not None
        body = served.body
        headers = served.headers
        status = served.status
        try:
            head = h11.Response(status_code=status, headers=headers, reason=_reason(status))
            self.stats.statuses[status] += 1  # counted before the client can see it
            # The head goes with what the body has so far (often all of it, and its end):
            # one write, one segment, for a small response.
            out = conn.send(head) or b""
            while True:
                changed.clear()
                data, done, aborted = body.take(_CHUNK)
                if data and head_only:
                    continue  # a HEAD response has no body: what the guest writes is dropped
                if data:
                    out += conn.send(h11.Data(data=data)) or b""
                    if len(out) < _CHUNK:
                        continue
                if done and not data:
                    out += conn.send(h11.EndOfMessage()) or b""
                    await self._send(writer, out)
                    break
                await self._send(writer, out)
                out = b""
                if data:
                    continue
                if aborted or guest.done():
                    # The guest failed or abandoned the body after the head: cut the
                    # connection, so the client cannot take a part for the whole.
                    outcome = await guest
                    kind = outcome.kind or "body_unfinished"
                    self.stats.failures[kind] += 1
                    self.log(f"  the response body was cut: {kind}")
                    raise _Closed
                await _first(changed, guest)
        except (_Closed, ConnectionError, h11.LocalProtocolError) as exc:
            body.close()
            cancel.cancel("the response could not be completed")
            if isinstance(exc, h11.LocalProtocolError):
                self.log(f"  the response broke HTTP framing: {exc}")
                self.stats.failures["bad_response"] += 1
            raise _Closed from None
        return status

    # -- the guest, on a worker thread ------------------------------------------------------

    def _run(self, request: ServedRequest, served: ServedResponse, cancel: CancelScope) -> _Outcome:
        number = next(self._ids)
        recorder = None
        share = self.record_share
        if self.record_dir is not None and int(number * share) != int((number - 1) * share):
            # A share of the requests, spread evenly: request n when n * share crosses an
            # integer (share 0.25: requests 4, 8, 12...).
            recorder = Recorder(self.record_dir / f"request-{number:06d}.bin")
        instance: Instance | None = None
        try:
            with self._lock:
                component, export = self._current
            if recorder is None:
                instance = self._pool.take(component)
            if instance is None:
                instance = Instance(
                    component,
                    budget=self.budget,
                    policy=self.policy,
                    cancel=cancel,
                    record=recorder,
                )
            args = incoming_handler_args(instance.context, request, served)
            instance.call(export, *args, cancel=cancel)
            if not self._hot and self._current[0] is component:
                # Which pages a request writes, learned once: pooled instances copy them
                # when made, so the requests take no copy-on-write fault for each.
                instance.learn_hot_pages()
                self._hot = True
            return _Outcome()
        except GuestError as exc:
            self.log(f"  request {number}: {exc.kind}: {str(exc).splitlines()[0][:300]}")
            return _Outcome(exc.kind)
        except Exception as exc:  # noqa: BLE001 - a host failure is answered 500, never raised
            self.log(f"  request {number}: host error: {type(exc).__name__}: {exc}")
            self.log(traceback.format_exc())
            return _Outcome("host_error")
        finally:
            if instance is not None:
                if recorder is None:
                    self._pool.release(instance)
                else:
                    instance.close()
            if recorder is not None:
                recorder.close()
            request.body.cancel()
