"""The embedded agent runtime: spawn, send, ask; mailboxes; worker threads; crashes.

Each agent is one component instance in its own store, with its own budget and mailbox, served
by the gate (WASI under the type's policy, plus ``mighty:agent/host``). Agents talk only by
messages. An agent runs on one worker at a time; a message is handled by calling the guest's
``handle`` export under the type's per-message budget.

What a message can do to its agent:
- the handler returns a reply (or none): the agent goes on;
- the handler returns an error: the sender gets ``HandlerFailed``; the agent goes on;
- the guest traps or exhausts a budget: the agent has crashed. The sender gets
  ``AgentCrashed``; a ``budget.exhausted`` event is emitted when a budget ran out. A supervised
  agent is revived by its supervisor (a fresh instance, ``init`` again, the same address and
  the same mailbox, so nothing queued is lost); an unsupervised one is dead: queued asks fail
  with ``NoProc``, queued sends and asks are counted as unhandled (``AgentStats.unhandled``,
  a ``message.unhandled`` event).
- anything else raising in a turn (a bug in a hook, a codec, the host) is a crash too: the
  worker lives on and the supervisor handles it.

Every message accepted into a mailbox is handled, or is counted as unhandled when its agent is
stopped for good first (buried: no supervisor, a supervisor that gave up or will not restart
it, ``Runtime.stop``, ``shutdown``). ``drain`` waits for the restarts: it is true only when
every mailbox is empty and no agent is running, scheduled, or crashed with its supervisor's
decision still to come.

Locks. ``AgentProcess._run`` is held while a worker runs the agent's turn (guest calls, reply
futures); it is the only lock held across calls out. The others (the runtime's registry lock,
``_state``, mailbox and scheduler locks) guard a few fields and call nothing while held. The
order is: a supervisor's runner role, then any agent's ``_run``, then the leaf locks. Nothing
holding a ``_run`` waits for a runner role or for another ``_run``: a crash is reported to the
supervisor only after the worker released the crashed agent's lock, so the supervisor can stop,
revive or retire any agent, that one included; and ``stop`` called from inside the agent's own
turn does not wait for it. The one acquisition against the order, an ask's claim of an idle
agent (``run_here``), tries ``_run`` under ``_state`` without waiting, which cannot deadlock.
Rejected: a reentrant run lock (the supervisor would close the instance under the turn still
using it) and a supervisor thread (one more thread per supervisor, and stop/start would still
have to wait for it).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Protocol

import cbor2

from mighty._cbor import loads_untrusted
from mighty._errors import BadInput
from mighty.agents._hibernate import Hibernator
from mighty.agents._host import AgentHostProvider
from mighty.agents._introspect import (
    HISTORY,
    INSPECT,
    History,
    agent_snapshot,
    top_snapshot,
    tree_snapshot,
)
from mighty.agents._journal import Journal
from mighty.agents._mailbox import Mailbox
from mighty.agents._output import (
    OUTPUT_TAIL_BYTES,
    OUTPUT_TAIL_LINES,
    AgentOutput,
    OutputTail,
    Stream,
    stream_level,
)
from mighty.agents._process import AgentProcess, _Life, _settle, _Turn, encode_body
from mighty.agents._reply import Reply
from mighty.agents._scheduler import Scheduler, WorkerStats
from mighty.agents._seats import Seats
from mighty.agents._store import SnapshotStore, StoreError
from mighty.agents._swap import reload_agent_type
from mighty.agents._timers import Timer, Timers
from mighty.agents._types import (
    AgentCrashed,
    AgentError,
    AgentEvent,
    AgentType,
    Ask,
    AskCycle,
    AskTimeout,
    BadSpawn,
    CircuitOpen,
    Envelope,
    HandlerFailed,
    MessageCancelled,
    NoProc,
)
from mighty.budget import DEFAULT_TIMEOUT, CancelScope, RunContext, current_context, interrupting
from mighty.capabilities import AgentToolsProvider, Capabilities, CapabilityBroker
from mighty.gate import Gate, Scope
from mighty.reload import ReloadReport, SwapVerifier
from mighty.wasi import WasiProvider

if TYPE_CHECKING:
    from mighty.telemetry import Telemetry

__all__ = ["RemoteRouter", "Runtime"]

# How much longer than the target's per-message budget a host ask waits by default.
_ASK_GRACE = 1.0
_TIMER_SEND = 5.0
"""How long a timer's send waits for room in a full mailbox before the timer is dropped."""
_EVENTS_KEPT = 10_000
HOST = "host"

_log = logging.getLogger(__name__)


class RemoteRouter(Protocol):
    """Where messages to other nodes go: installed by a layer above (``mighty.cluster``).

    The runtime consults it only for an address it does not hold itself (no local agent or
    name by that address), so agents never import the cluster and a runtime without a router
    behaves as before. ``route`` returns the local form of an address that names this node
    (``node:type:pid`` -> ``type:pid``), or None when another node handles it; ``send`` and
    ``ask`` then carry the message there, with the same errors as a local one (``ask``'s
    future fails with the AgentError the remote side raised, or AskTimeout). ``claim`` and
    ``release`` make a registered name cluster-wide (``claim`` raises BadSpawn on a clash).
    """

    def route(self, address: str) -> str | None: ...

    def send(
        self, to: str, name: str, body: bytes, *, sender: str, timeout: float | None
    ) -> None: ...

    def send_future(
        self, to: str, name: str, body: bytes, *, sender: str, timeout: float | None
    ) -> Future[None]: ...

    def ask(
        self,
        to: str,
        name: str,
        body: bytes,
        *,
        sender: str,
        timeout: float,
        chain: tuple[str, ...],
    ) -> Future[bytes | None]: ...

    def claim(self, name: str, address: str) -> None: ...

    def release(self, name: str, address: str) -> None: ...


class Runtime:
    """Agents in this process: registry, scheduler, send/ask, events.

    Use as a context manager, or call :meth:`shutdown`.
    """

    _hold: Callable[[], bool] | None = None
    """Held back while true: every mailbox (:meth:`hold_while`)."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        recorder: Any = None,
        on_event: Callable[[AgentEvent], None] | None = None,
        on_output: Callable[[AgentOutput], None] | None = None,
        output_lines: int = OUTPUT_TAIL_LINES,
        output_bytes: int = OUTPUT_TAIL_BYTES,
        state_dir: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] | None = None,
        introspect: bool = False,
        history: int = HISTORY,
        telemetry: Telemetry | None = None,
        capabilities: Capabilities | None = None,
        reuse_instances: bool = True,
    ) -> None:
        """``on_output`` hears every line an agent writes (``log()``, stdout, stderr) as it is
        written, on the thread running the agent; each agent also keeps its last
        ``output_lines`` lines (at most ``output_bytes`` characters) in ``AgentProcess.output``.

        ``state_dir`` holds the snapshot store of hibernated and durable agents (BadStateDir,
        one line, when it cannot be used); ``clock`` replaces the idle timer's clock and its
        thread (the caller then calls ``runtime.hibernation.tick()``), for tests.

        ``introspect`` is the introspect capability: snapshots (:meth:`inspect`) then carry
        message bodies; without it only names and counters leave the runtime. Each agent keeps
        its last ``history`` handled messages for its snapshot.

        ``telemetry`` (a :class:`mighty.telemetry.Telemetry`) turns spans, metrics and event
        export on; None (the default) costs nothing on the message path.

        ``capabilities``: the host tools, MCP servers and HTTP grants agent types may be
        granted by name (``AgentType.grants.tools``); its MCP servers start with the runtime
        and stop at its shutdown.

        ``reuse_instances``: with a ``state_dir``, agents of types built with the SDK get
        instances made from a warmed state and, after one of them hibernates, its instance
        rewound (see docs/hibernation.md, "Reused instances"); False makes every instance from
        the image.
        """
        # First: an unusable state_dir raises before any thread starts.
        store = SnapshotStore(state_dir) if state_dir is not None else None
        self.scheduler = Scheduler(workers or os.cpu_count() or 1)
        self.recorder = recorder
        self.import_journal: Callable[[AgentProcess, Any], Any] | None = None
        """An import journal kept outside this process (mighty.cluster's, in JetStream): given
        an agent being instantiated and the record sink its instance would record into (the
        runtime's ``recorder`` or None), the sink it records into instead. None: none."""
        self.capabilities = capabilities if capabilities is not None else Capabilities()
        self.broker = CapabilityBroker(self.capabilities)
        self.gate = Gate([WasiProvider(), AgentHostProvider(self), AgentToolsProvider()])
        self._types: dict[str, AgentType] = {}
        self._agents: dict[str, AgentProcess] = {}
        self._names: dict[str, str] = {}
        self._pids = itertools.count(1)
        self._lock = threading.Lock()
        self._breakers: dict[str, Any] = {}
        self.events: deque[AgentEvent] = deque(maxlen=_EVENTS_KEPT)
        self._on_event = on_event
        self._on_output = on_output
        self._output_lines = output_lines
        self._output_bytes = output_bytes
        # Agents buried (stopped for good), kept for reports of what they did and left undone.
        self._retired: deque[AgentProcess] = deque(maxlen=_EVENTS_KEPT)
        self._closing = False
        # Crash reports to supervisors in progress, and how many ever began: a supervisor that
        # gives up retires its children (out of the registry) before its parent starts fresh
        # ones, all inside the report, so no agent looks busy meanwhile (see idle()).
        self._reporting = 0
        self._reports = 0
        self.seats = Seats(enabled=reuse_instances)
        """Agent instances made from warmed states and reused (see mighty.agents._seats)."""
        self.hibernation: Hibernator | None = None
        """Hibernation and durability (None without a ``state_dir``)."""
        self.journal: Journal | None = None
        """The inbox and import logs of durable agents (None without a ``state_dir``)."""
        if store is not None:
            store.discard_volatile()
            self._pids = itertools.count(store.max_pid() + 1)
            self.hibernation = Hibernator(self, store, clock=clock)
            self.journal = Journal(store)
        self.introspect = introspect
        self._history = max(0, min(history, 4096))
        self.supervisors: dict[str, str | None] = {}
        """Supervisor name -> its parent supervisor's name (None at the root), for inspect."""
        self.telemetry = telemetry
        if telemetry is not None:
            telemetry.observe(self.agents, self.scheduler.steals, bodies=introspect)
        self.router: RemoteRouter | None = None
        """Consulted for addresses this runtime does not hold (see RemoteRouter)."""
        self._timers = Timers(self._fire_timer, store=store, on_dropped=self._timer_dropped)
        try:
            self._timers.load()  # an earlier runtime's timers fire (targets may come later)
        except StoreError as exc:
            # Damaged rows: the runtime runs (the agents' state is not at stake), loudly, and
            # the rows stay for inspection; a timer set now is stored beside them.
            _log.error("stored timers not loaded: %s", exc.message)
            self.emit("timers.not_loaded", HOST, {"reason": exc.message})

    @property
    def closing(self) -> bool:
        """``shutdown`` has begun: no agent starts or restarts any more."""
        return self._closing

    # -- types and processes ---------------------------------------------------------------

    def register(self, agent_type: AgentType) -> None:
        granted = self.capabilities.check(
            agent_type.grants.tools, f"agent type {agent_type.name!r}"
        )
        for name in granted:  # the MCP servers it may use start now, in the background
            client = self.broker.clients.get(name.partition(".")[0])
            if client is not None:
                client.start()
        if self.hibernation is None and (agent_type.durable or agent_type.hibernate_after):
            raise BadInput(
                f"agent type {agent_type.name!r}: hibernate_after and durable need a "
                "runtime with a state_dir"
            )
        with self._lock:
            self._types[agent_type.name] = agent_type
        if agent_type.durable:
            self._recover_journaled(agent_type)

    def _recover_journaled(self, agent_type: AgentType) -> None:
        """Bring back the agents of ``agent_type`` that a crash left with journaled messages:
        each from its snapshot, its pending messages in its mailbox in order, the first run
        with the answers of its import log (see mighty.agents._journal)."""
        journal = self.journal
        if journal is None:
            return
        for address in journal.pending():
            if address.rpartition(":")[0] != agent_type.name or address in self._agents:
                continue
            process = self._recover(address)
            if process is None:
                continue
            messages = journal.messages(address)
            first = messages[0][0] if messages else None
            process._recovery = journal.recovery(address, agent_type.component, first)
            self.emit("agent.journal_recovered", address, {"messages": len(messages)})
            for seq, sender, name, body in messages:
                process.deliver(Envelope(sender, name, body, journal=seq))

    def agent_type(self, name: str) -> AgentType:
        try:
            return self._types[name]
        except KeyError:
            known = ", ".join(sorted(self._types)) or "none"
            raise BadSpawn(f"unknown agent type {name!r} (registered: {known})") from None

    def spawn(self, type_name: str, init: Any = None, *, name: str | None = None) -> str:
        """Start an agent; returns its address ``type:pid``. ``name`` registers it too."""
        return self.spawn_process(type_name, encode_body(init), name=name).address

    def spawn_process(
        self,
        type_name: str,
        init: bytes,
        *,
        name: str | None = None,
        on_exit: Callable[[AgentProcess, bool, str], None] | None = None,
        parent: str | None = None,
        agent_type: AgentType | None = None,
    ) -> AgentProcess:
        """Start an agent of ``type_name``; ``agent_type`` (of that name) overrides the
        registered type for this one agent (a live migration brings its own component)."""
        if agent_type is None:
            agent_type = self.agent_type(type_name)
        elif agent_type.name != type_name:
            raise BadSpawn(f"spawn: agent type {agent_type.name!r} is not {type_name!r}")
        stored = None
        if self.hibernation is not None and agent_type.durable and name is not None:
            # A durable agent an earlier runtime on this state_dir left: it comes back asleep.
            stored = self.hibernation.stored_address(agent_type, name)
            if stored is not None and stored in self._agents:
                stored = None
        address = stored or f"{type_name}:{next(self._pids)}"
        settings = agent_type.mailbox
        process = AgentProcess(
            self,
            address,
            agent_type,
            init,
            Mailbox(settings.capacity, settings.on_full, settings.block_timeout),
            name=name,
            on_exit=on_exit,
            output=OutputTail(self._output_lines, self._output_bytes),
            parent=parent,
            recent=History(self._history),
        )
        with self._lock:
            if name is not None and name in self._names:
                raise BadSpawn(f"the name {name!r} is already registered")
            self._agents[address] = process
            if self._hold is not None:  # under the lock: hold_while sets it on all or on none
                process.mailbox.hold_while(self._hold)
            if name is not None:
                self._names[name] = address
        if stored is not None:
            self._adopt(process)
            return process
        telemetry = self.telemetry
        span = None if telemetry is None else telemetry.spawn_begin(type_name)
        try:
            if name is not None and self.router is not None:
                self.router.claim(name, address)
            process.start()
        except BaseException as exc:
            self._forget(process)
            if span is not None:
                assert telemetry is not None
                telemetry.spawn_end(span, address, exc)
            raise
        if span is not None:
            assert telemetry is not None
            telemetry.spawn_end(span, address, None)
        return process

    def _adopt(self, process: AgentProcess) -> None:
        """Bring back ``process`` asleep: its state is a durable row of the store."""
        assert self.hibernation is not None
        with process._state:
            process.in_store = True
            process._become(_Life.ASLEEP)
        self.hibernation.adopted(process)

    def _recover(self, address: str) -> AgentProcess | None:
        """A durable agent stored by an earlier runtime, registered again asleep (no supervisor)."""
        if self.hibernation is None or self._closing:
            return None
        row = self.hibernation.recoverable(address)
        if row is None or row.type not in self._types:
            return None
        agent_type = self._types[row.type]
        if not agent_type.durable:
            return None
        settings = agent_type.mailbox
        process = AgentProcess(
            self,
            address,
            agent_type,
            b"",
            Mailbox(settings.capacity, settings.on_full, settings.block_timeout),
            name=row.name,
            output=OutputTail(self._output_lines, self._output_bytes),
        )
        with self._lock:
            if address in self._agents:
                return self._agents[address]
            self._agents[address] = process
            if self._hold is not None:
                process.mailbox.hold_while(self._hold)
            if row.name is not None and row.name not in self._names:
                self._names[row.name] = address
        self._adopt(process)
        return process

    def register_name(self, name: str, address: str) -> None:
        """Register ``name`` for the live agent at ``address`` (cluster-wide with a router)."""
        process = self.process(address)
        with self._lock:
            if name in self._names or process.name is not None:
                raise BadSpawn(f"the name {name!r} is already registered (or {address} has one)")
            self._names[name] = process.address
            process.name = name
        if self.router is None:
            return
        try:
            self.router.claim(name, process.address)
        except BaseException:
            with self._lock:
                self._names.pop(name, None)
                process.name = None
            raise

    def detach(self, address: str) -> AgentProcess:
        """Take an agent out of the registry, its mailbox untouched (a live migration's last
        step): the caller owns it now, and stops it."""
        process = self.process(address)
        self._forget(process)
        return process

    def whereis(self, name: str) -> str | None:
        """The address registered under ``name``, if any."""
        with self._lock:
            return self._names.get(name)

    def process(self, address: str) -> AgentProcess:
        # Read without the lock (every ask and send passes here): each dict read is atomic,
        # and each write is one item, so the answer is the registry as it was at some instant
        # of the call, as a locked read's would be by the time it returns.
        target = self._names.get(address, address)
        process = self._agents.get(target)
        if process is None:
            process = self._recover(target)
        if process is None or (not process.alive and process.on_exit is None):
            raise NoProc(f"no agent at {address!r}")
        return process

    def inspect(self, address: str | None = None) -> dict[str, Any]:
        """A snapshot of the agent at ``address`` (or name), or of the whole runtime when None.

        NoProc for an unknown or dead agent. Every snapshot carries ``version``.
        """
        if address is None:
            return tree_snapshot(self, bodies=self.introspect)
        return agent_snapshot(self.process(address), bodies=self.introspect)

    def top(self) -> dict[str, Any]:
        """One frame of counters for ``mty top``: per agent and per worker (no bodies)."""
        return top_snapshot(self)

    def cancel(self, message_id: str, reason: str = "cancelled") -> bool:
        """Cancel one message of a local agent by its id (``msg-N``: its context's, shown by
        ``inspect``). Waiting in a mailbox, it is skipped when its turn comes (an asker hears
        ``MessageCancelled``); its handler running, the handler is stopped at the next epoch
        tick (the agent crashes, as for any stop mid-handler, and its asker hears it); done,
        nothing. Returns whether it was found. Any thread."""
        if not isinstance(message_id, str) or not message_id.startswith("msg-"):
            raise BadInput(f"a message id looks like 'msg-12', got {message_id!r}")
        reason = str(reason)[:1000]
        for process in self.agents():
            current = process.current
            if current is not None and current.context_id == message_id:
                current.cancelled = reason
                context = current.context
                if context is not None:
                    context.stop(reason)
                return True
            for envelope in process.mailbox.waiting():
                if envelope.context_id == message_id:
                    envelope.cancelled = reason
                    context = envelope.context
                    if context is not None:  # taken since: its handler may have started
                        context.stop(reason)
                    return True
        return False

    def agents(self) -> list[AgentProcess]:
        with self._lock:
            return list(self._agents.values())

    def hold_while(self, hold: Callable[[], bool] | None) -> None:
        """Hold back every agent's mailbox, now and later spawned, whenever ``hold()`` is true
        (None: no hold): nothing is handed out of it, asks run in place included (see
        mighty.agents._mailbox). A cluster node's fence holds its agents while its lease is
        stale. Whoever sees the hold lift calls :meth:`hold_lifted`."""
        with self._lock:
            self._hold = hold
            for process in self._agents.values():
                process.mailbox.hold_while(hold)
        if hold is None:
            self.hold_lifted()

    def hold_lifted(self) -> None:
        """The hold is off again: every agent with messages is scheduled."""
        for process in self.agents():
            process.mailbox.poke()
            process.wake()

    def _forget(self, process: AgentProcess) -> None:
        with self._lock:
            self._agents.pop(process.address, None)
            named = process.name is not None and self._names.get(process.name) == process.address
            if named:
                del self._names[process.name]  # type: ignore[arg-type]
        router = self.router
        if named and router is not None:
            assert process.name is not None
            try:
                router.release(process.name, process.address)
            except Exception:  # noqa: BLE001 -- a name left behind expires with its node
                _log.exception("releasing the name %r failed", process.name)

    def _remote(self, address: str) -> tuple[RemoteRouter | None, str]:
        """(the router, the address) when another node holds ``address``; (None, local form)."""
        router = self.router
        if router is None:
            return None, address
        with self._lock:
            if address in self._agents or address in self._names:
                return None, address
        local = router.route(address)
        return (router, address) if local is None else (None, local)

    def retired(self) -> list[AgentProcess]:
        """The agents stopped for good (crashed unsupervised, given up on, stopped, shut down)."""
        with self._lock:
            return list(self._retired)

    def _bury(self, process: AgentProcess, reason: str) -> None:
        """Stop ``process`` for good: out of the registry, its queue settled and counted."""
        with process._state:
            first = not process._retired
            process._become(_Life.RETIRED)
        self._forget(process)
        process.mailbox.close()
        envelopes = process.mailbox.drain()
        asks = 0
        for envelope in envelopes:
            if envelope.reply is not None:
                asks += 1
                cancelled = envelope.cancelled
                _settle(
                    envelope,
                    error=NoProc(f"{process.address} is gone ({reason})")
                    if cancelled is None
                    else MessageCancelled(
                        f"{process.address}: {envelope.name!r} was cancelled: {cancelled}"
                    ),
                )
        process.stats.unhandled += len(envelopes)
        if first:
            with self._lock:
                self._retired.append(process)
        if envelopes:
            self.emit(
                "message.unhandled",
                process.address,
                {"count": len(envelopes), "asks": asks, "reason": reason},
            )

    def stop(self, address: str) -> None:
        """Stop one agent for good; queued asks fail with NoProc, queued sends are counted."""
        process = self.process(address)
        process.stop()
        self._bury(process, "stopped")
        if self.hibernation is not None:
            self.hibernation.store.delete(process.address)

    def hibernate(self, address: str, *, timeout: float = 1.0) -> bool:
        """Put an agent to sleep now, waiting up to ``timeout`` s for a turn in progress to end.

        False when it has messages queued, is still running at the deadline, is asleep
        already, or its snapshot could not be stored. Needs a ``state_dir``. Its next message
        wakes it (see docs/hibernation.md).
        """
        process = self.process(address)
        if self.hibernation is None:
            raise BadInput("hibernation needs a runtime with a state_dir")
        return self.hibernation.hibernate(process, wait=timeout)

    def hibernation_stats(self) -> dict[str, Any]:
        """Hibernation counters and wake latency (empty without a ``state_dir``)."""
        return {} if self.hibernation is None else self.hibernation.to_json()

    def stored_schemas(self, type_name: str) -> dict[str, str | None]:
        """Schema hash -> JSON of every stored snapshot of ``type_name`` (for hot swap)."""
        return {} if self.hibernation is None else self.hibernation.store.schemas_of(type_name)

    # -- messages ---------------------------------------------------------------------------

    def set_breaker(self, address: str, breaker: Any) -> None:
        """Sends to ``address`` consult ``breaker`` (see supervisors' circuit breakers)."""
        with self._lock:
            self._breakers[address] = breaker

    def _check_breaker(self, address: str) -> Any:
        breaker = self._breakers.get(address)
        if breaker is not None and not breaker.allow():
            raise CircuitOpen(
                f"{address}: circuit open",
                name=address,
                retry_after=float(getattr(breaker, "retry_after", 0.0)),
            )
        return breaker

    def send(
        self,
        to: str,
        name: str,
        body: Any = None,
        *,
        sender: str = HOST,
        timeout: float | None = None,
    ) -> None:
        """Put a message in ``to``'s mailbox; returns when it is accepted."""
        self.send_raw(to, name, encode_body(body), sender=sender, timeout=timeout)

    def send_future(
        self,
        to: str,
        name: str,
        body: Any = None,
        *,
        sender: str = HOST,
        timeout: float | None = None,
    ) -> Future[None]:
        """``send`` without waiting for the acknowledgement: the future settles when the
        message is accepted, or with the AgentError ``send`` would raise.

        Messages from one sender to one address are put in the mailbox in the order sent.
        To an agent on another node, many are in flight at once (``mighty.cluster``: pipes);
        here the message is accepted at once, or waits for space in a full ``block`` mailbox
        before this returns, as ``send`` does."""
        data = encode_body(body)
        future: Future[None] = Future()
        try:
            router, to = self._remote(to)
            if router is not None:
                return router.send_future(to, name, data, sender=sender, timeout=timeout)
            self.send_raw(to, name, data, sender=sender, timeout=timeout)
        except AgentError as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)
        return future

    def ask(
        self,
        to: str,
        name: str,
        body: Any = None,
        *,
        timeout: float | None = None,
        sender: str = HOST,
        cancel: CancelScope | None = None,
    ) -> Any:
        """Send and wait for the reply body (decoded), at most ``timeout`` seconds.

        The message runs in the caller's context (``mighty.budget.current_context``: a tool,
        a sandbox run, an agent's message) and, for a ``cancellable`` type, ends by
        ``timeout`` and is cancelled with that context or with ``cancel``.

        By default (None) the ask waits as long as the target's handler may run (its type's
        per-message budget) plus a second, so the asker hears how the message ended (the
        reply, or the crash when the budget runs out), not a timeout while it still runs; and
        the ask may take the shortest path (:meth:`AgentProcess.run_here`). An agent on
        another node: the default budget's timeout plus a second."""
        data = self.request(
            Ask(
                to, name, b"" if body is None else cbor2.dumps(body), sender, timeout, cancel=cancel
            )
        )
        return loads_untrusted(data) if data else None

    def ask_future(
        self, to: str, name: str, body: Any = None, *, sender: str = HOST
    ) -> Future[bytes | None]:
        """Send an ask and return at once; the future holds the raw reply body."""
        router, to = self._remote(to)
        if router is not None:
            return router.ask(to, name, encode_body(body), sender=sender, timeout=30.0, chain=())
        process = self.process(to)
        self._check_breaker(process.address)
        future: Future[bytes | None] = Future()
        envelope = Envelope(sender, name, encode_body(body), future, parent=current_context())
        telemetry = self.telemetry
        if telemetry is not None:
            span = telemetry.ask_begin(process.address, name, sender)
            envelope.trace = telemetry.carry(span)
            future.add_done_callback(
                lambda done: telemetry.ask_end(span, None if done.cancelled() else done.exception())
            )
        process.deliver(envelope)
        return future

    def ask_raw(
        self,
        to: str,
        name: str,
        body: bytes,
        *,
        timeout: float,
        sender: str = HOST,
        chain: tuple[str, ...] = (),
        scope: Scope | None = None,
    ) -> bytes | None:
        """``ask`` with the body already encoded and the reply left raw (CBOR)."""
        return self.request(Ask(to, name, body, sender, timeout, chain, scope))

    def _outer_turn(self, context: RunContext) -> _Turn | None:
        """The turn this thread runs for the agent whose work ``context`` is (a message, or a
        tool it called), if any: an ask made here is nested in it (``run_here``)."""
        agent = context.agent
        if agent is None:
            return None
        process = self._agents.get(agent)
        if process is None or process._owner != threading.get_ident():
            return None
        return process._turn

    def request(self, ask: Ask) -> bytes | None:
        """The one path of an ask that waits for its reply: local or remote, in place or by
        the mailbox; the raw reply body. ``ask.timeout`` None: the target's budget plus a
        grace (see ``ask``)."""
        to, name, body, sender, timeout, chain, scope, within, cancel = ask
        router, local = (None, to) if self.router is None else self._remote(to)
        if router is not None:
            if timeout is None:
                timeout = DEFAULT_TIMEOUT + _ASK_GRACE
            future = router.ask(local, name, body, sender=sender, timeout=timeout, chain=chain)
            return self._await_reply(local, name, future, None, timeout, scope)
        process = self.process(local)
        if timeout is None:
            timeout = process.type.budget.timeout + _ASK_GRACE
        # The calling thread may run the target's turn itself (AgentProcess.run_here), except
        # on the main thread, outside any turn, waiting through a scope of its own: that wait
        # watches for signals, which must not interrupt the guest.
        parent = current_context()
        outer = None if parent is None else self._outer_turn(parent)
        here = (
            scope is None
            or outer is not None
            or threading.current_thread() is not threading.main_thread()
        )
        telemetry = self.telemetry
        if telemetry is None:
            future, breaker = self._deliver_ask(
                process,
                name,
                body,
                sender=sender,
                chain=chain,
                timeout=timeout,
                trace=None,
                here=here,
                reply=Reply,
                within=within,
                cancel=cancel,
                deadline=time.monotonic() + timeout,
                parent=parent,
                outer=outer,
            )
            if breaker is None and future.done():  # answered in place: nothing to wait for
                if scope is not None:
                    scope.checkpoint()  # past the asker's own deadline: it stops
                return future.result()
            return self._await_reply(local, name, future, breaker, timeout, scope)
        span = telemetry.ask_begin(process.address, name, sender)
        try:
            future, breaker = self._deliver_ask(
                process,
                name,
                body,
                sender=sender,
                chain=chain,
                timeout=timeout,
                trace=telemetry.carry(span),
                here=here,
                reply=Reply,
                within=within,
                cancel=cancel,
                deadline=time.monotonic() + timeout,
                parent=parent,
                outer=outer,
            )
            result = self._await_reply(local, name, future, breaker, timeout, scope)
        except BaseException as exc:
            telemetry.ask_end(span, exc)
            raise
        telemetry.ask_end(span, None)
        return result

    def _await_reply(
        self,
        to: str,
        name: str,
        future: Future[bytes | None],
        breaker: Any,
        timeout: float,
        scope: Scope | None,
    ) -> bytes | None:
        try:
            result = future.result(timeout) if scope is None else self._wait(future, timeout, scope)
        except FutureTimeout:
            raise AskTimeout(f"no reply from {to} to {name!r} within {timeout:g} s") from None
        except HandlerFailed:
            if breaker is not None:
                breaker.record_failure()
            raise
        except AgentCrashed:
            # Counted once, where the crash happened (AgentProcess._crashed), before this
            # reply was settled; counting it here as well opened the circuit at half its
            # threshold.
            raise
        if breaker is not None:
            breaker.record_success()
        return result

    def _wait(self, future: Future[bytes | None], timeout: float, scope: Scope) -> bytes | None:
        """Wait for a reply through the asker's scope (its deadline, cancel and signals apply
        while it waits); a worker thread waiting is lent to the scheduler meanwhile."""
        if future.done():  # answered in place (AgentProcess.run_here)
            scope.checkpoint()  # past the asker's own deadline: it stops, as below
            return future.result()
        scheduler = self.scheduler
        with scheduler.blocking() if scheduler.on_worker() else contextlib.nullcontext():
            if not scope.wait(future, timeout):
                raise FutureTimeout
        return future.result(0)

    def deliver_ask(
        self,
        to: str,
        name: str,
        body: bytes,
        *,
        sender: str,
        chain: tuple[str, ...] = (),
        timeout: float | None = None,
        trace: Any = None,
        here: bool = False,
        deadline: float | None = None,
        key: str | None = None,
    ) -> tuple[Future[bytes | None], Any]:
        """Put an ask in a local agent's mailbox: (the reply's future, the target's breaker).

        ``deadline`` (``time.monotonic()``): when the asker stops waiting; the handler of a
        ``cancellable`` type ends by then (a remote asker's time to live, for the cluster).

        The asker records the outcome in the breaker (if any) when it has waited for it.
        ``trace`` is the asker's span context (mighty.telemetry), carried in the envelope.
        ``here``: the calling thread is about to wait for the reply and may run the target's
        turn itself instead (see ``AgentProcess.run_here``); the future is then settled on
        return, and an ask answered later than ``timeout`` is an AskTimeout all the same.
        ``key``: the message's own id that outlives this process (``Envelope.key``).
        """
        return self._deliver_ask(
            self.process(to),
            name,
            body,
            sender=sender,
            chain=chain,
            timeout=timeout,
            trace=trace,
            here=here,
            reply=Future,
            deadline=deadline,
            key=key,
        )

    def _deliver_ask(
        self,
        process: AgentProcess,
        name: str,
        body: bytes,
        *,
        sender: str,
        chain: tuple[str, ...],
        timeout: float | None,
        trace: Any,
        here: bool,
        reply: Callable[[], Future[bytes | None]],
        within: float | None = None,
        cancel: CancelScope | None = None,
        deadline: float | None = None,
        parent: RunContext | None = None,
        outer: _Turn | None = None,
        key: str | None = None,
    ) -> tuple[Future[bytes | None], Any]:
        """``deliver_ask`` to ``process``, its future made by ``reply`` (``Reply`` for the
        runtime's own asks, whose futures never leave it); ``within`` as in ``_ask``;
        ``deadline`` when the asker stops waiting (``timeout`` bounds only the wait for space
        in the mailbox, or, run in place, the turn); ``parent``, the asker's context (default:
        the current one), and ``outer``, the turn the asker runs in on this thread (see
        ``_outer_turn``)."""
        if chain and process.address in chain and name != INSPECT:
            path = " -> ".join((*chain, process.address))
            raise AskCycle(f"ask cycle: {path}")
        breaker = self._check_breaker(process.address) if self._breakers else None
        future = reply()
        now = time.monotonic()
        envelope = Envelope(
            sender,
            name,
            body,
            future,
            asker_chain=chain,
            trace=trace,
            parent=current_context() if parent is None else parent,
            deadline=deadline,
            cancel=cancel,
            key=key,
        )
        if within is None:
            within = timeout
        if not here or within is None or process.type.budget.timeout > within:
            process.deliver(envelope, timeout)
            return future, breaker
        deadline = now + (within if timeout is None else timeout)
        # The shortest path first (``run_here``), else the mailbox; ``__inspect`` never runs a
        # turn (``deliver`` answers it).
        if name == INSPECT or not process.run_here(envelope, now + within, outer):
            process.deliver(envelope, timeout)
        if time.monotonic() > deadline and future.done():
            # Run in place and answered past the asker's deadline: the reply is too late.
            raise AskTimeout(f"no reply from {process.address} to {name!r} within {timeout:g} s")
        return future, breaker

    # -- timers (see mighty.agents._timers) ---------------------------------------------------

    def send_after(
        self,
        delay: float,
        to: str,
        name: str,
        body: Any = None,
        *,
        every: float | None = None,
        sender: str = HOST,
    ) -> int:
        """Send ``name`` with ``body`` to ``to`` in ``delay`` seconds (then every ``every``
        seconds until cancelled): the timer's id. With a ``state_dir`` the timer is stored
        before this returns and survives a restart (docs/durability.md)."""
        return self._timers.add(delay, to, name, encode_body(body), sender=sender, every=every).id

    def later(self, delay: float, call: Callable[[], None]) -> bool:
        """Run ``call`` on the timer thread in ``delay`` seconds (in memory: retries); False
        when the runtime is shutting down (the caller acts at once)."""
        return self._timers.call_later(delay, call)

    def cancel_timer(self, timer_id: int) -> bool:
        """Cancel a pending timer; False if there is none (fired, cancelled, unknown)."""
        return self._timers.cancel(timer_id)

    def timers(self, sender: str | None = None) -> list[Timer]:
        """The pending timers (those ``sender`` set, when given), soonest first."""
        return self._timers.pending(sender)

    def set_timer(
        self, delay: object, to: str, name: str, body: bytes, *, sender: str, every: object = None
    ) -> int:
        """``send_after`` for a guest (the host interface): the body already encoded, the
        delay and period unchecked (BadTimer)."""
        return self._timers.add(delay, to, name, body, sender=sender, every=every).id

    def cancel_timer_of(self, timer_id: int, sender: str) -> bool:
        """Cancel one of ``sender``'s own timers (a guest cancels only its own)."""
        return self._timers.cancel(timer_id, sender=sender)

    def _fire_timer(self, timer: Timer, next_due: float | None) -> None:
        """Deliver a due timer's message and settle its row (see ``Timers``' ``Fire``)."""
        store = None if self.hibernation is None else self.hibernation.store
        router, local = self._remote(timer.to)
        if router is None:
            process = self.process(local)
            if store is not None and self.journal is not None and process.type.durable:
                # Exactly once: the message journaled and the timer settled in one transaction.
                seq = store.timer_fired(
                    timer.id, next_due, process.address, timer.sender, timer.name, timer.body
                )
                process.deliver(
                    Envelope(timer.sender, timer.name, timer.body, journal=seq), _TIMER_SEND
                )
                return
        self.send_raw(timer.to, timer.name, timer.body, sender=timer.sender, timeout=_TIMER_SEND)
        if store is not None:
            store.timer_next(timer.id, next_due)

    def _timer_dropped(self, timer: Timer, why: str) -> None:
        self.emit(
            "timer.dropped", timer.to, {"timer": timer.id, "message": timer.name, "reason": why}
        )

    def send_raw(
        self, to: str, name: str, body: bytes, *, sender: str = HOST, timeout: float | None = None
    ) -> None:
        """``send`` with a body already encoded (CBOR), local or remote."""
        router, to = self._remote(to)
        if router is not None:
            router.send(to, name, body, sender=sender, timeout=timeout)
            return
        process = self.process(to)
        self._check_breaker(process.address)
        envelope = Envelope(sender, name, body)
        if self.telemetry is not None:
            envelope.trace = self.telemetry.send(process.address, name, sender)
        process.deliver(envelope, timeout)

    def reload(
        self,
        agent_type: str,
        source: str | os.PathLike[str] | bytes,
        *,
        drain_timeout: float = 5.0,
        verify: SwapVerifier | None = None,
    ) -> ReloadReport:
        """Hot-swap every live agent of ``agent_type`` to the component in ``source``.

        Returns a ReloadReport, or raises ReloadRefused (incompatible schema, or a cell of the
        ``verify`` suite failed; nothing touched) or ReloadFailed (rolled back; every agent
        runs its old version).
        """
        return reload_agent_type(
            self, agent_type, source, drain_timeout=drain_timeout, verify=verify
        )

    # -- events -----------------------------------------------------------------------------

    def emit(self, kind: str, address: str, data: Mapping[str, Any]) -> None:
        event = AgentEvent(kind, address, dict(data))
        self.events.append(event)
        if self.telemetry is not None:
            self.telemetry.event(kind, address, data)
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 -- an observer must not break an agent's turn
                _log.exception("on_event raised on %s", kind)

    def output(
        self, process: AgentProcess, stream: Stream, text: str, level: str | None = None
    ) -> None:
        """One line written by ``process``: kept in its tail and passed to ``on_output``."""
        item = AgentOutput(process.address, stream, text, level or stream_level(stream))
        process.output.add(item)
        if self._on_output is not None:
            try:
                self._on_output(item)
            except Exception:  # noqa: BLE001 -- an observer must not break an agent's turn
                _log.exception("on_output raised for %s", process.address)

    def events_of(self, kind: str) -> Iterator[AgentEvent]:
        return (e for e in list(self.events) if e.kind == kind)

    # -- the end ----------------------------------------------------------------------------

    def worker_stats(self) -> list[WorkerStats]:
        return self.scheduler.stats()

    def idle(self) -> bool:
        """Every mailbox empty, no agent running or scheduled, no crash awaiting its supervisor
        (nor a supervisor's reaction to one still under way: a subtree given up on and being
        started again by its parent has no agent in the registry for a moment)."""
        with self._lock:
            reporting, began = self._reporting, self._reports
        if reporting or any(p.busy for p in self.agents()):
            return False
        with self._lock:
            # A report that began (and maybe ended) while the agents were looked at: look again.
            return self._reporting == 0 and self._reports == began

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until :meth:`idle`; False on timeout.

        A crashed agent's supervisor has not decided yet, or is restarting it: not idle, since
        the messages queued behind the crash are still to be handled.
        """
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def unhandled(self) -> dict[str, int]:
        """Messages left unhandled, by agent address (only agents that left some)."""
        return {
            p.address: p.stats.unhandled
            for p in (*self.retired(), *self.agents())
            if p.stats.unhandled
        }

    def shutdown(
        self, *, drain: bool = True, timeout: float = 10.0, interrupt: int | None = None
    ) -> None:
        """Drain (optionally), stop every agent in reverse start order, stop the workers.

        Returns within ``timeout`` seconds, whatever the agents do: a message still running at
        the deadline is abandoned (its asker gets NoProc; it counts as unhandled) and its
        worker closes the instance when it returns. ``interrupt``, a signal number: running
        guest calls are interrupted at once instead (their messages count as unhandled).
        """
        deadline = time.monotonic() + timeout
        if drain:
            self.drain(timeout)
        # From here on a crash buries its agent instead of reporting it, and nothing starts:
        # a supervisor restarting an agent now would race with the stops below.
        self._closing = True
        self._timers.close()  # nothing fires into agents being stopped (stored ones stay)
        with interrupting(interrupt) if interrupt is not None else contextlib.nullcontext():
            self._stop_all(deadline)
        if self.hibernation is not None:
            self.hibernation.close()
        self.seats.close()
        self.broker.close()

    def _stop_all(self, deadline: float) -> None:
        for process in reversed(self.agents()):
            if not process.halt(timeout=deadline - time.monotonic()):
                current = process.current
                if current is not None and _settle(
                    current, error=NoProc(f"{process.address} is gone (shutdown)")
                ):
                    process.stats.unhandled += 1
            self._bury(process, "shutdown")
        self.scheduler.stop(timeout=deadline - time.monotonic())

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
