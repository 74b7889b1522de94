"""An agent system from its manifest, run from Python exactly as `mty run` runs it.

``Application.from_manifest(path)`` builds what `mighty.toml` describes: the agent types (their
components built or loaded), a ``Runtime`` with the manifest's workers and state directory, and
optionally a recorder and telemetry. ``start()`` registers the types and starts the supervision
tree, ``send_start()`` sends the ``[[start]]`` messages in order (waiting for each ask),
``wait()`` runs until every accepted message is handled, and ``shutdown()`` stops the tree in
reverse start order within its deadline. ``run()`` does all four and returns a ``RunReport``:
the replies, the failures and the per-agent summary that `mty run` prints. ``serve_http()``
puts the manifest's ``[http]`` routes on the network (``mighty.serve.AgentFront``, stopped
first at shutdown), as `mty run --http` does.

Waiting never blocks for long: every wait is in short slices that look at ``interrupted`` (a
callable), so a caller that notes signals in a handler (as `mty run` does: a handler may not
raise or take a lock) can stop a run at any point. Whoever stacks services on a running
application (the control socket) registers their stop with ``on_shutdown``: they are stopped
first, before the runtime.

Rejected: the CLI assembling the runtime, the tree and the start messages itself (the Python
API could not do what `mty run` does without copying it); an ``Application`` that starts the
control socket (``mighty.control`` builds on agents, so the control layer attaches itself).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mighty._errors import BadInput
from mighty.agents._introspect import jsonable
from mighty.agents._manifest import (
    Manifest,
    StartModel,
    agent_types,
    capabilities,
    http_routes,
    load_manifest,
    state_dir,
    supervisor_spec,
)
from mighty.agents._output import AgentOutput, level_number
from mighty.agents._process import decode_body, encode_body
from mighty.agents._runtime import Runtime
from mighty.agents._supervisor import Supervisor
from mighty.agents._tree import start_tree
from mighty.agents._types import AgentError, AgentEvent
from mighty.gate import Scope, Waitable
from mighty.trace import FlushMode, Recorder

if TYPE_CHECKING:
    from mighty.serve import AgentFront
    from mighty.telemetry import Telemetry

__all__ = [
    "Application",
    "RunReport",
    "StartReply",
    "run_manifest",
    "run_summary",
    "send_start_messages",
    "telemetry_from",
]

SHUTDOWN_TIMEOUT = 10.0
_SLICE = 0.05


def _never() -> bool:
    return False


class _Interrupted(Exception):
    """``interrupted()`` turned true while a start message's reply was awaited."""


@dataclass(frozen=True, slots=True)
class StartReply:
    """The reply to one ``[[start]]`` ask, decoded from CBOR."""

    to: str
    message: str
    reply: Any

    def to_json(self) -> dict[str, Any]:
        return {"to": self.to, "message": self.message, "reply": self.reply}


@dataclass
class RunReport:
    """What a run did: what `mty run` prints (``to_json`` is its ``--json`` object)."""

    supervisor: str
    """The root supervisor's state at the end (``failed`` when it gave up)."""
    replies: list[StartReply] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """One line per start message that failed (``to <- message: why``)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Per agent, per worker, events by kind, ``unhandled``, ``hibernation``: see run_summary."""
    interrupted: bool = False
    """``interrupted()`` stopped the run before it drained."""

    @property
    def unhandled(self) -> int:
        """Messages accepted into a mailbox and never handled."""
        return int(self.summary.get("unhandled", 0))

    @property
    def ok(self) -> bool:
        """Everything accepted was handled, no start message failed, the tree did not fail."""
        return self.supervisor != "failed" and not self.failures and self.unhandled == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "replies": [r.to_json() for r in self.replies],
            "failures": list(self.failures),
            **self.summary,
        }


class Application:
    """An agent system built from a manifest: its runtime, supervision tree and start messages.

    Use it as a context manager (or call :meth:`shutdown`): the runtime's workers, the recorder
    and telemetry are released at the end.
    """

    def __init__(
        self,
        manifest: Manifest,
        base: str | os.PathLike[str],
        *,
        record: str | os.PathLike[str] | Literal[True] | None = None,
        flush: FlushMode = "call",
        on_output: Callable[[AgentOutput], None] | None = None,
        on_event: Callable[[AgentEvent], None] | None = None,
        introspect: bool = False,
        telemetry: Telemetry | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        """Build the agent types of ``manifest`` (paths relative to ``base``) and a runtime.

        ``record`` writes a trace of every agent to that path (``True``: the default trace
        path) with durability ``flush``; ``on_output`` and ``on_event`` see every agent line
        and event; ``introspect`` lets inspect snapshots and spans carry bodies (also on when
        the manifest says so); ``telemetry`` exports spans and metrics and is shut down with the
        application; ``progress`` hears about builds and compiles.
        """
        if manifest.cluster is not None:
            raise BadInput("the manifest has a [cluster] block: run each node with `mty node`")
        self.manifest = manifest
        self.base = Path(base)
        self.capabilities = capabilities(manifest, self.base)
        self.types = agent_types(manifest, self.base, progress, self.capabilities)
        self.telemetry = telemetry
        self.recorder: Recorder | None = None
        if record is not None:
            where = None if record is True else Path(record)
            self.recorder = Recorder(where, flush=flush)
        try:
            self.runtime = Runtime(
                workers=manifest.workers,
                recorder=self.recorder,
                on_output=on_output,
                state_dir=state_dir(manifest, self.base),
                on_event=on_event,
                introspect=introspect or manifest.introspect,
                telemetry=telemetry,
                capabilities=self.capabilities,
            )
        except BaseException:
            if self.recorder is not None:
                self.recorder.close()
            raise
        self.root: Supervisor | None = None
        self.http: AgentFront | None = None
        """The HTTP front of the ``[http]`` routes, once :meth:`serve_http` started it."""
        self._failed = threading.Event()
        self._on_shutdown: list[Callable[[], None]] = []
        self._closed = False

    @classmethod
    def from_manifest(
        cls,
        path: str | os.PathLike[str],
        *,
        record: str | os.PathLike[str] | Literal[True] | None = None,
        flush: FlushMode = "call",
        on_output: Callable[[AgentOutput], None] | None = None,
        on_event: Callable[[AgentEvent], None] | None = None,
        introspect: bool = False,
        telemetry: Telemetry | Literal["manifest"] | None = "manifest",
        progress: Callable[[str], None] | None = None,
    ) -> Application:
        """Load and validate ``path`` (BadInput naming the problem otherwise) and build it.

        ``telemetry="manifest"`` (the default) exports as the manifest's ``[telemetry]`` block
        or ``MTY_OTLP_ENDPOINT`` ask, as `mty run` does (off when neither does); ``None`` is
        off. The other arguments are the constructor's.
        """
        manifest, base = load_manifest(Path(path))
        if manifest.cluster is not None:
            raise BadInput(f"{path} has a [cluster] block: run each node with `mty node`")
        chosen = telemetry_from(manifest.telemetry) if telemetry == "manifest" else telemetry
        try:
            return cls(
                manifest,
                base,
                record=record,
                flush=flush,
                on_output=on_output,
                on_event=on_event,
                introspect=introspect,
                telemetry=chosen,
                progress=progress,
            )
        except BaseException:
            if chosen is not None:
                chosen.shutdown()
            raise

    # -- the parts of a run -------------------------------------------------------------------

    def start(self, *, on_failed: Callable[[str], None] | None = None) -> Supervisor:
        """Register the agent types and start the supervision tree; returns its root.

        ``on_failed`` hears the reason when the root supervisor gives up (``wait`` returns
        then, too)."""
        if self._closed:
            raise BadInput("the application was shut down")
        if self.root is not None:
            raise BadInput("the application was already started")
        for agent_type in self.types:
            self.runtime.register(agent_type)

        def failed(reason: str) -> None:
            self._failed.set()
            if on_failed is not None:
                on_failed(reason)

        self.root = start_tree(
            self.runtime, supervisor_spec(self.manifest.supervisor), on_failed=failed
        )
        return self.root

    def send_start(
        self,
        *,
        interrupted: Callable[[], bool] = _never,
        on_reply: Callable[[StartReply], None] | None = None,
        on_failure: Callable[[str, str, str], None] | None = None,
    ) -> tuple[list[StartReply], list[str]]:
        """Send the manifest's ``[[start]]`` messages in order; returns (replies, failures)."""
        return send_start_messages(
            self.runtime,
            self.manifest.start,
            interrupted=interrupted,
            on_reply=on_reply,
            on_failure=on_failure,
        )

    def wait(self, *, keep_running: bool = False, interrupted: Callable[[], bool] = _never) -> bool:
        """Run until every accepted message is handled (no mailbox left, no restart pending),
        the root supervisor fails or ``interrupted()``; with ``keep_running`` until one of the
        last two. True when it drained."""
        while not interrupted() and not self._failed.is_set():
            if keep_running:
                time.sleep(_SLICE)
            elif self.runtime.drain(_SLICE):
                return True
        return False

    def summary(self, threshold: str | int = 0) -> dict[str, Any]:
        """The run so far (see :func:`run_summary`); agent lines below ``threshold`` left out."""
        return run_summary(self.runtime, threshold)

    def serve_http(
        self, listen: str | None = None, *, log: Callable[[str], None] | None = None
    ) -> AgentFront:
        """Serve the manifest's ``[http]`` routes on ``listen`` ("HOST:PORT", port 0: any
        free one; default its ``listen``) on a thread of their own, until the shutdown (which
        stops it first, letting requests in flight finish). Returns the front:
        ``front.address`` is where it listens, ``front.snapshot()`` its counts."""
        from mighty.serve import serve_application

        if self.manifest.http is None:
            raise BadInput("the manifest has no [http] block")
        front, stop = serve_application(
            self.manifest.http,
            http_routes(self.manifest),
            self.runtime,
            self.base,
            listen=listen,
            to_json=jsonable,
            log=log,
        )
        self.http = front
        self.on_shutdown(stop)
        return front

    def on_shutdown(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` first when the application shuts down (before the runtime stops)."""
        self._on_shutdown.append(stop)

    def shutdown(self, timeout: float = SHUTDOWN_TIMEOUT, *, interrupt: int | None = None) -> None:
        """Stop what was registered with ``on_shutdown``, then the tree in reverse start order
        (within ``timeout``; ``interrupt``, a signal number: running guest calls are interrupted
        instead of waited for), then close the recorder and telemetry. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for stop in reversed(self._on_shutdown):
                stop()
        finally:
            try:
                self.runtime.shutdown(drain=False, timeout=timeout, interrupt=interrupt)
            finally:
                if self.recorder is not None:
                    self.recorder.close()
                if self.telemetry is not None:
                    self.telemetry.shutdown()

    def run(
        self,
        *,
        keep_running: bool = False,
        interrupted: Callable[[], bool] = _never,
        on_reply: Callable[[StartReply], None] | None = None,
        on_failure: Callable[[str, str, str], None] | None = None,
        on_started: Callable[[Supervisor], None] | None = None,
        threshold: str | int = 0,
        timeout: float = SHUTDOWN_TIMEOUT,
        signal: Callable[[], int | None] | None = None,
    ) -> RunReport:
        """``start``, ``send_start``, ``wait``, ``shutdown``: what `mty run` does; the report.

        ``on_started`` is called once the tree runs, before the start messages. ``signal``
        says which signal stopped the run, if one did: the shutdown interrupts running guest
        calls with it. The summary is taken after the shutdown, so it counts what the shutdown
        left unhandled."""
        replies: list[StartReply] = []
        failures: list[str] = []
        try:
            root = self.root or self.start()
            if on_started is not None:
                on_started(root)
            if not interrupted():
                replies, failures = self.send_start(
                    interrupted=interrupted, on_reply=on_reply, on_failure=on_failure
                )
            self.wait(keep_running=keep_running, interrupted=interrupted)
        finally:
            self.shutdown(timeout, interrupt=None if signal is None else signal())
        return RunReport(
            root.state, replies, failures, self.summary(threshold), interrupted=interrupted()
        )

    def __enter__(self) -> Application:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def run_manifest(path: str | os.PathLike[str], **options: Any) -> RunReport:
    """Build the manifest at ``path`` and run it to the end, as `mty run PATH` does.

    ``options`` go to :meth:`Application.from_manifest` (``record``, ``flush``, ``on_output``,
    ``on_event``, ``introspect``, ``telemetry``, ``progress``) and :meth:`Application.run`
    (``keep_running``, ``interrupted``, ``on_reply``, ``on_failure``, ``threshold``)."""
    run_keys = {"keep_running", "interrupted", "on_reply", "on_failure", "on_started", "threshold"}
    run_options = {k: v for k, v in options.items() if k in run_keys}
    build_options = {k: v for k, v in options.items() if k not in run_keys}
    with Application.from_manifest(path, **build_options) as app:
        return app.run(**run_options)


def telemetry_from(block: dict[str, Any] | None) -> Telemetry | None:
    """A Telemetry when a manifest's ``[telemetry]`` block or ``MTY_OTLP_ENDPOINT`` asks for one.

    Off (the default) imports nothing of OpenTelemetry, which is an optional extra.
    """
    if block is None and not os.environ.get("MTY_OTLP_ENDPOINT"):
        return None
    try:
        # An optional extra: imported only when asked for.
        from mighty.telemetry import Telemetry, load_config
    except ImportError:
        raise BadInput("telemetry needs OpenTelemetry: pip install 'mighty-host[otel]'") from None
    config = load_config(block, os.environ)
    return None if config is None else Telemetry(config)


class _Interruptible(Scope):
    """What a start ask waits through on the main thread: in slices, until ``interrupted()``
    (a Ctrl-C the command caught), which ends the wait with ``_Interrupted``."""

    __slots__ = ("_interrupted",)

    def __init__(self, interrupted: Callable[[], bool]) -> None:
        self._interrupted = interrupted

    def checkpoint(self) -> None:
        if self._interrupted():
            raise _Interrupted

    def paused(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wait(self, what: Waitable, timeout: float | None) -> bool:
        if not isinstance(what, Future):
            raise BadInput(f"a start ask waits for a reply's future, not {what!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.checkpoint()
            left = _SLICE if deadline is None else min(_SLICE, deadline - time.monotonic())
            if left <= 0:
                return what.done()
            try:
                what.exception(left)
            except FutureTimeout:
                continue
            except CancelledError:
                return True
            return True


def send_start_messages(
    runtime: Runtime,
    items: Sequence[StartModel],
    *,
    interrupted: Callable[[], bool] = _never,
    on_reply: Callable[[StartReply], None] | None = None,
    on_failure: Callable[[str, str, str], None] | None = None,
) -> tuple[list[StartReply], list[str]]:
    """Send ``items`` (a manifest's ``[[start]]``) in order, waiting for asks, until
    ``interrupted()``; returns (replies, failures). A failed message does not stop the rest;
    ``on_failure`` hears (to, message, why) of each."""
    replies: list[StartReply] = []
    failures: list[str] = []

    scope = _Interruptible(interrupted)

    for item in items:
        if interrupted():
            break
        try:
            if item.ask:
                raw = runtime.ask_raw(
                    item.to, item.message, encode_body(item.body), timeout=item.timeout, scope=scope
                )
                reply = StartReply(item.to, item.message, decode_body(raw))
                replies.append(reply)
                if on_reply is not None:
                    on_reply(reply)
            else:
                runtime.send(item.to, item.message, item.body)
        except _Interrupted:
            break
        except AgentError as exc:
            failures.append(f"{item.to} <- {item.message}: {exc.message}")
            if on_failure is not None:
                on_failure(item.to, item.message, exc.message)
    return replies, failures


def run_summary(runtime: Runtime, threshold: str | int = 0) -> dict[str, Any]:
    """Per agent (live and retired, by address): accepted, handled, failed, crashes, restarts,
    unhandled, dropped, fuel, mailbox high water, hibernation counts and its last lines (at
    ``threshold`` or above); per worker its counters; events by kind; the total ``unhandled``;
    hibernation stats; the reused instances' counters (mighty.agents._seats)."""
    least = level_number(threshold) if isinstance(threshold, str) else threshold
    processes = sorted(
        {id(p): p for p in (*runtime.retired(), *runtime.agents())}.values(),
        key=lambda p: int(p.address.rpartition(":")[2]),
    )
    agents = [
        {
            "address": p.address,
            "name": p.name,
            "accepted": p.mailbox.accepted,
            "handled": p.stats.handled,
            "failed": p.stats.failed,
            "crashes": p.stats.crashes,
            "restarts": p.stats.restarts,
            "unhandled": p.stats.unhandled,
            "dropped": p.stats.dropped,
            "fuel": p.stats.fuel,
            "mailbox_high_water": p.mailbox.high_water,
            "hibernated": p.hibernated,
            "hibernations": p.stats.hibernations,
            "wakes": p.stats.wakes,
            "output": [o.to_json() for o in p.output.items() if level_number(o.level) >= least],
            "output_dropped": p.output.dropped,
        }
        for p in processes
    ]
    workers = [
        {"name": w.name, "messages": w.messages, "batches": w.batches, "steals": w.steals}
        for w in runtime.worker_stats()
    ]
    events: dict[str, int] = {}
    for event in list(runtime.events):
        events[event.kind] = events.get(event.kind, 0) + 1
    return {
        "agents": agents,
        "workers": workers,
        "events": events,
        "unhandled": sum(a["unhandled"] for a in agents),
        "hibernation": runtime.hibernation_stats(),
        "instances": runtime.seats.stats.to_json(),
    }
