"""Composition helpers: pipelines and fan-out over agents."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

from mighty._errors import BadInput
from mighty.agents._process import decode_body, encode_body
from mighty.agents._runtime import Runtime
from mighty.agents._types import AgentError, MessageDropped

__all__ = ["broadcast", "pipe"]


def pipe(
    runtime: Runtime,
    stages: Sequence[tuple[str, str]],
    items: Iterable[Any],
    *,
    window: int = 32,
    timeout: float = 30.0,
) -> list[Any]:
    """Send each item through ``stages`` (address, message name): a stage's reply is the next
    stage's body. Results come back in input order.

    At most ``window`` items are in flight at once (backpressure: the input is read only as
    results come out), and every stage works on a different item at the same time. An item a
    stage's full ``"drop"`` mailbox dropped is left out of the results (the stage's policy
    says to lose it); any other failure fails the pipe.
    """
    if not stages:
        raise BadInput("a pipe needs at least one stage")
    if window < 1:
        raise BadInput("window must be at least 1")
    results: list[Any] = []
    in_flight: deque[Future[Any]] = deque()

    def start(item: Any) -> Future[Any]:
        done: Future[Any] = Future()
        _advance(runtime, stages, 0, encode_body(item), done)
        return done

    def collect() -> None:
        with suppress(MessageDropped):
            results.append(in_flight.popleft().result(timeout))

    for item in items:
        if len(in_flight) >= window:
            collect()
        in_flight.append(start(item))
    while in_flight:
        collect()
    return results


def _advance(
    runtime: Runtime, stages: Sequence[tuple[str, str]], index: int, body: bytes, done: Future[Any]
) -> None:
    address, name = stages[index]
    try:
        reply = runtime.ask_future(address, name, decode_body(body))
    except AgentError as exc:
        done.set_exception(exc)
        return

    def next_stage(future: Future[bytes | None]) -> None:
        error = future.exception()
        if error is not None:
            done.set_exception(error)
        elif index + 1 == len(stages):
            done.set_result(decode_body(future.result() or b""))
        else:
            _advance(runtime, stages, index + 1, future.result() or b"", done)

    reply.add_done_callback(next_stage)


def broadcast(
    runtime: Runtime,
    name: str,
    body: Any,
    addresses: Sequence[str],
    *,
    timeout: float = 10.0,
) -> dict[str, Any]:
    """Ask every address at once; gather replies (or the AgentError each one raised)."""
    futures: dict[str, Future[bytes | None] | AgentError] = {}
    for address in addresses:
        try:
            futures[address] = runtime.ask_future(address, name, body)
        except AgentError as exc:
            futures[address] = exc
    gathered: dict[str, Any] = {}
    for address, future in futures.items():
        if isinstance(future, AgentError):
            gathered[address] = future
            continue
        try:
            gathered[address] = decode_body(future.result(timeout) or b"")
        except AgentError as exc:
            gathered[address] = exc
        except TimeoutError:
            gathered[address] = TimeoutError(f"no reply from {address} within {timeout:g} s")
    return gathered
