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
import enum
import functools
import itertools
import logging
import math
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import cbor2
from pydantic import ValidationError

from mighty._cbor import loads_untrusted
from mighty._errors import (
    BadInput,
    BudgetExceeded,
    Cancelled,
    GuestError,
    HostError,
    MightyError,
)
from mighty.abi import Err, Ok
from mighty.agents._hibernate import Hibernator
from mighty.agents._host import AGENT_PROCESS, AgentHostProvider
from mighty.agents._introspect import (
    CANCELLED,
    CRASHED,
    FAILED,
    HISTORY,
    INSPECT,
    OK,
    REFUSED,
    History,
    agent_snapshot,
    top_snapshot,
    tree_snapshot,
)
from mighty.agents._journal import Journal, Recovery, RecoveryRefused, hooks_of
from mighty.agents._mailbox import Mailbox, MailboxClosed, MailboxFull
from mighty.agents._output import (
    OUTPUT_TAIL_BYTES,
    OUTPUT_TAIL_LINES,
    AgentOutput,
    LineSplitter,
    OutputTail,
    Stream,
    stream_level,
)
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
    AgentState,
    AgentType,
    Ask,
    AskCycle,
    AskTimeout,
    BadSpawn,
    CircuitOpen,
    Envelope,
    HandlerFailed,
    MailboxFullError,
    MessageCancelled,
    MessageDropped,
    NoProc,
    Refused,
)
from mighty.budget import (
    DEFAULT_TIMEOUT,
    Budget,
    CancelScope,
    RunContext,
    current_context,
    enter_context,
    interrupting,
    leave_context,
)
from mighty.capabilities import (
    AGENT_TOOLS,
    AgentTools,
    AgentToolsProvider,
    Capabilities,
    CapabilityBroker,
)
from mighty.engine import Component, MemoryState
from mighty.gate import Gate, Scope, Seed
from mighty.instance import Instance
from mighty.reload import ReloadReport, SwapVerifier
from mighty.wasi import IDEMPOTENCY_KEYS, LOG_SINK, STDERR_SINK, STDOUT_SINK, WasiProvider

if TYPE_CHECKING:
    from mighty.telemetry import Telemetry

__all__ = ["AgentProcess", "AgentStats", "RemoteRouter", "Runtime"]

# How much longer than the target's per-message budget a host ask waits by default.
_ASK_GRACE = 1.0
_TIMER_SEND = 5.0
"""How long a timer's send waits for room in a full mailbox before the timer is dropped."""

_BATCH = 16
# An agent's work is light when its messages take under this fuel (about 10-100 us of guest
# code, less than the Python around a message) and this wall time each (longer with little
# fuel: it waits, for I/O, a sleep, an ask): a second worker would not pay (see the scheduler).
_LIGHT_FUEL = 100_000
_LIGHT_WALL = 0.0005
"""The agent an instance serves: ``mighty:agent/host`` answers as that agent (seeded by
``AgentProcess._instantiate``, and by a hot swap for the new version's instance)."""
_EVENTS_KEPT = 10_000
HOST = "host"

_log = logging.getLogger(__name__)


def encode_body(body: Any) -> bytes:
    """A message body as CBOR (None is the empty body)."""
    return b"" if body is None else cbor2.dumps(body)


def decode_body(data: bytes | None) -> Any:
    return None if not data else loads_untrusted(data)


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


@dataclass
class AgentStats:
    """Counters of one agent."""

    handled: int = 0
    failed: int = 0
    crashes: int = 0
    restarts: int = 0
    fuel: int = 0
    dropped: int = 0
    unhandled: int = 0
    """Accepted into the mailbox but never handled: the agent was stopped for good first."""
    hibernations: int = 0
    wakes: int = 0


class _Life(enum.Enum):
    """An agent's life, kept in one field (``AgentProcess._life``) and changed in one place
    (``AgentProcess._become``, by the moves :data:`_MOVES` lists). Awake (``ALIVE``), whether
    it is idle, scheduled or running is read from the two fields that say so on every message
    (``_scheduled``, ``current``): writing a life there too would put a lock and a second
    write on each message's path for a value those fields already hold.
    ``AgentProcess.state`` reads all of it as one :class:`AgentState`."""

    STARTING = "starting"
    """Made, ``start`` not yet through."""
    ALIVE = "alive"
    """Awake: an instance, taking messages (idle, scheduled or running)."""
    ASLEEP = "asleep"
    """Hibernated: its state in the snapshot store, no instance; its next turn wakes it."""
    SWAPPING = "swapping"
    """A hot swap holds it (mailbox paused, turn lock taken) while its new instance is made."""
    CRASHED = "crashed"
    """Reported to its supervisor, which has not yet revived, stopped or retired it."""
    HALTED = "halted"
    """Stopped (``stop``/``halt``: a migration, a supervisor, a shutdown); may start again."""
    RETIRED = "retired"
    """Buried: out of the registry for good."""

    def __str__(self) -> str:
        return self.value


_ALIVE = _Life.ALIVE
_ENDS = frozenset({_Life.CRASHED, _Life.HALTED, _Life.RETIRED})
_MOVES: dict[_Life, frozenset[_Life]] = {
    _Life.STARTING: frozenset(_Life),
    # fall asleep; be held by a swap; crash on a message; stop
    _Life.ALIVE: frozenset({_Life.ALIVE, _Life.ASLEEP, _Life.SWAPPING, *_ENDS}),
    # woken by its next turn, or failing to wake (a crash); stop
    _Life.ASLEEP: frozenset({_Life.ALIVE, *_ENDS}),
    # the swap ends (confirmed or rolled back); the message it waits for crashes; stop
    _Life.SWAPPING: frozenset({_Life.ALIVE, *_ENDS}),
    # revived by its supervisor (start), or stopped
    _Life.CRASHED: frozenset({_Life.ALIVE, *_ENDS}),
    _Life.HALTED: frozenset({_Life.ALIVE, *_ENDS}),
    _Life.RETIRED: frozenset({_Life.RETIRED}),
}
"""The moves of an agent's life: what each may become."""
_LIVING = frozenset({_Life.ALIVE, _Life.ASLEEP, _Life.SWAPPING})
"""The lives in which an agent takes messages (``alive``)."""
_STATE_OF = {
    _Life.STARTING: AgentState.STARTING,
    _Life.ASLEEP: AgentState.HIBERNATED,
    _Life.SWAPPING: AgentState.SWAPPING,
    _Life.CRASHED: AgentState.CRASHED,
    _Life.HALTED: AgentState.STOPPED,
    _Life.RETIRED: AgentState.STOPPED,
}


@dataclass(eq=False)
class AgentProcess:
    """One live agent: its instance, mailbox and counters."""

    runtime: Runtime
    address: str
    type: AgentType
    init: bytes
    mailbox: Mailbox[Envelope]
    name: str | None = None
    instance: Instance | None = None
    stats: AgentStats = field(default_factory=AgentStats)
    on_exit: Callable[[AgentProcess, bool, str], None] | None = None
    current: Envelope | None = None
    _scheduled: bool = False
    _life: _Life = _Life.STARTING
    """Where the agent is in its life (see :class:`_Life`); changed only by :meth:`_become`."""
    _living: bool = False
    """``_life`` is one of :data:`_LIVING` (kept by :meth:`_become`: read on every message)."""
    # The thread holding ``_run`` (while it runs a batch), so that ``stop`` from inside the
    # agent's own turn (a reply callback, a hook) never waits on itself.
    _owner: int | None = None
    _turn: _Turn | None = None
    """The turn running now (``_run`` held), for asks made in it (see :class:`_Turn`)."""
    _state: threading.Lock = field(default_factory=threading.Lock)
    _run: threading.Lock = field(default_factory=threading.Lock)
    output: OutputTail = field(default_factory=OutputTail)
    """The agent's last lines of log(), stdout and stderr, across restarts (bounded)."""
    _splitters: tuple[LineSplitter, ...] = ()
    _staged_splitters: tuple[LineSplitter, ...] = ()
    in_store: bool = False
    """Its state is in the snapshot store (asleep, or durable): a wake or a restart restores it
    instead of running ``init`` (see mighty.agents._hibernate)."""
    # Durable agents (see _journal): the record sink of the current instance (its import
    # log), and the answers of a message being recovered after a crash.
    _log: Any = None
    _staged_log: Any = None
    _recovery: Recovery | None = None
    _retries: int = 0
    """Messages waiting out a retry's backoff (``_retry``): work left, for ``drain``."""

    @property
    def alive(self) -> bool:
        """Started and neither crashed nor stopped: it takes messages (awake, asleep, or
        held by a swap)."""
        return self._living

    @property
    def _exiting(self) -> bool:
        """A crash was reported to the supervisor, which has not yet revived, stopped or
        retired the agent: ``drain`` waits for that decision."""
        return self._life is _Life.CRASHED

    @property
    def _retired(self) -> bool:
        """Buried: out of the registry for good; ``start`` refuses."""
        return self._life is _Life.RETIRED

    def _become(self, life: _Life) -> None:
        """The one place the agent's life changes (``_state`` held, or the agent not yet
        shared). A move :data:`_MOVES` does not list is a host bug: logged, and made all the
        same (the agent must not be left in a state its callers did not ask for), except
        out of ``RETIRED``, which is for good."""
        now = self._life
        if life not in _MOVES[now]:
            if now is _Life.RETIRED:
                return
            _log.error("%s: %s -> %s is not a move of an agent's life", self.address, now, life)
        self._life = life
        self._living = life in _LIVING

    @property
    def state(self) -> AgentState:
        """Where the agent is in its life, read from its fields in this one place (racy by
        nature: a snapshot of a moment, for inspection and tests)."""
        life = self._life
        if life is not _ALIVE:
            return _STATE_OF[life]
        if self.current is not None:
            return AgentState.RUNNING
        if self._scheduled:
            return AgentState.SCHEDULED
        return AgentState.IDLE

    @property
    def hibernated(self) -> bool:
        """Asleep: alive, its state in the snapshot store, no instance in memory."""
        return self._life is _Life.ASLEEP

    parent: str | None = None
    """Who started it: its supervisor's name, or the address of the agent that spawned it."""
    started: float = 0.0
    """When the in-flight message (``current``) began (``time.monotonic``)."""
    recent: History = field(default_factory=History)
    """The last messages handled (see mighty.agents._introspect)."""
    _outcome: str = OK
    _fuel: int = 0
    _took: float = 0.0
    """How long the latest message took (``_message``), for the turn's lightness."""
    # The signal that interrupted the guest in a turn run by ``run_here``, if one did.
    _interrupted: int | None = None
    light: bool = False
    """Its last turn's messages did little guest work (fuel) and did not wait (wall time): the
    scheduler keeps such agents on one worker while another runs light work (see
    mighty.agents._scheduler)."""

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        """Instantiate the component and run ``init``; BadSpawn if either fails."""
        if self._retired or self.runtime.closing:
            raise BadSpawn(f"cannot start {self.address}: {self._refusal()}")
        hibernation = self.runtime.hibernation
        if self.in_store and hibernation is not None:
            # Its state is in the store (hibernated, durable): restore it, not init.
            try:
                instance = hibernation.wake(self)
            except MightyError as exc:
                raise BadSpawn(f"cannot start {self.address}: {exc}") from exc
        else:
            instance = self._init_instance()
        with self._state:
            # Checked again: a shutdown or a bury may have happened while init ran, and an
            # instance installed now would never be closed.
            refused = self._retired or self.runtime.closing
            if not refused:
                self.instance = instance
                self._become(_ALIVE)
        if refused:
            instance.close()
            raise BadSpawn(f"cannot start {self.address}: {self._refusal()}")
        if hibernation is not None:
            if self.in_store:
                hibernation.woke(self)
            hibernation.touch(self)
        self.mailbox.resume()
        self._wake()

    def seed(self) -> Seed:
        """The slot that makes an instance serve ``mighty:agent/host`` as this agent."""
        return AGENT_PROCESS.of(self)

    def instantiate(self, component: Component | None = None) -> Instance:
        """A new instance of this agent, not yet init'ed or restored: of its type's component,
        or of ``component`` (a new version, for a hot swap). It serves the agent's host
        interface, log sink, granted tools and journal, is recorded under the agent's address,
        and its output is streamed; hibernation and hot swap make theirs here too."""
        # Instantiation and init run under the default budget; the type's budget is for each
        # message (a tight per-message fuel must not make the agent unable to start).
        record = self.runtime.recorder
        outside = self.runtime.import_journal
        if outside is not None:
            record = outside(self, record)
        journal = self.runtime.journal
        splitters = (
            LineSplitter(functools.partial(self.runtime.output, self, "stdout")),
            LineSplitter(functools.partial(self.runtime.output, self, "stderr")),
        )
        if component is None:
            self._splitters = splitters
        else:  # the agent's until the swap is confirmed (``adopt``)
            self._staged_splitters = splitters
        if (
            component is None
            and record is None
            and self._recovery is None
            and not self.type.durable
            and self.runtime.hibernation is not None
        ):
            # Nothing records its imports, and agents may hibernate (only then is an instance
            # given back): an instance from its type's seats (a warmed state, or one another
            # agent hibernated out of; see mighty.agents._seats).
            instance = self.runtime.seats.seat(
                self,
                self._seated,
                (splitters[0].feed, splitters[1].feed),
                self._wasi_log,
                self._tools(),
            )
            if instance is not None:
                return instance
        # Its stdout and stderr, line by line, to the runtime's output.
        slots = (
            *self._slots(),
            STDOUT_SINK.of(splitters[0].feed),
            STDERR_SINK.of(splitters[1].feed),
        )
        recovery = self._recovery
        if journal is not None and self.type.durable:
            sink = journal.sink(self.address, record)
            if component is None:
                self._log, self._staged_log = sink, None
            else:  # the agent's until the swap is confirmed (``adopt``)
                self._staged_log = sink
            record = sink
            slots = (*slots, IDEMPOTENCY_KEYS.of(sink.keys))
            if recovery is not None:
                slots = (*slots, *recovery.seeds)
        return Instance(
            self.type.component if component is None else component,
            budget=Budget(memory=self.type.budget.memory),
            policy=self.type.policy,
            gate=self.runtime.gate,
            hooks=hooks_of(recovery),
            record=record,
            slots=slots,
            agent=self.address,
            agent_name=self.name,
        )

    def may_sleep(self) -> bool:
        """Awake, with nothing to do and doing nothing: may hibernate (turn lock held)."""
        return (
            self.alive
            and self.instance is not None
            and not self._scheduled
            and self.current is None
            and not self._exiting
            and not self.mailbox.paused
            and len(self.mailbox) == 0
        )

    def fall_asleep(self) -> Instance | None:
        """Give up the instance if the agent still may sleep (its state is stored already;
        turn lock held): the instance, for the caller to close, else None (a message came)."""
        with self._state:
            if not self.may_sleep():
                return None
            # Counted before the instance goes: a status read meanwhile (unlocked) that sees
            # the agent asleep sees it counted. Closing the instance takes a while.
            self.stats.hibernations += 1
            instance, self.instance = self.instance, None
            self.in_store = True
            self._become(_Life.ASLEEP)
        return instance

    def hold_for_swap(self) -> None:
        """A hot swap takes the agent: its mailbox pauses (it keeps accepting) and an awake
        agent is ``swapping`` until :meth:`release_from_swap` (an asleep one stays asleep: it
        wakes with the new component)."""
        self.mailbox.pause()
        with self._state:
            if self._life is _ALIVE:
                self._become(_Life.SWAPPING)

    def release_from_swap(self) -> None:
        """The swap is over (confirmed or rolled back): awake again, the mailbox resumed."""
        with self._state:
            if self._life is _Life.SWAPPING:
                self._become(_ALIVE)
        self.mailbox.resume()

    def adopt(self, instance: Instance, agent_type: AgentType) -> None:
        """Make ``instance`` (from ``instantiate(component)``, restored) the agent's, as of
        ``agent_type`` (a hot swap's confirm; the run lock is held by the swap)."""
        self.instance = instance
        self.type = agent_type
        if self._staged_log is not None:
            self._log, self._staged_log = self._staged_log, None
        if self._staged_splitters:
            self._splitters, self._staged_splitters = self._staged_splitters, ()

    def _slots(self) -> tuple[Seed, ...]:
        seeds = (self.seed(), LOG_SINK.of(self._wasi_log))
        tools = self._tools()
        return seeds if tools is None else (*seeds, AGENT_TOOLS.of(tools))

    def _tools(self) -> AgentTools | None:
        """The tools its type is granted, for a new instance (None: none)."""
        granted = self.type.grants.tools
        if not granted:
            return None
        return AgentTools(self.runtime.broker, granted, self.type.budget.timeout or 60.0)

    def _seated(self, memory: MemoryState | None, slots: tuple[Seed, ...]) -> Instance:
        """A new instance of its type for its type's seats (``slots`` forward to whichever
        agent the instance serves), from ``memory`` when given (mighty.agents._seats)."""
        return Instance(
            self.type.component,
            budget=Budget(memory=self.type.budget.memory),
            policy=self.type.policy,
            gate=self.runtime.gate,
            slots=slots,
            agent=self.address,
            agent_name=self.name,
            memory=memory,
        )

    def _init_instance(self) -> Instance:
        """A new instance that ran ``init`` (and, for a durable type, was stored); BadSpawn."""
        try:
            instance = self.instantiate()
        except MightyError as exc:
            raise BadSpawn(f"cannot start {self.address}: {exc}") from exc
        try:
            outcome = instance.call("init", self.init)
        except MightyError as exc:
            instance.close()
            raise BadSpawn(f"{self.address} failed in init: {exc}") from exc
        finally:
            self.flush_output()
        if isinstance(outcome, Err):
            instance.close()
            raise BadSpawn(f"{self.address} refused its init: {outcome.value}")
        hibernation = self.runtime.hibernation
        if self.type.durable and hibernation is not None:
            try:
                hibernation.persist(self, instance)
            except MightyError as exc:
                instance.close()
                raise BadSpawn(f"{self.address}: cannot store its state: {exc}") from exc
        return instance

    def _wasi_log(self, level: str, context: str, message: str) -> None:
        """A ``wasi:logging`` line: the agent's log, as its SDK's ``log()`` would be."""
        level = "debug" if level == "trace" else level
        data = {"level": level, "text": message}
        if context:
            data["context"] = context
        self.runtime.emit("log", self.address, data)
        self.runtime.output(self, "log", f"{context}: {message}" if context else message, level)

    def flush_output(self) -> None:
        """The turn is over: a partial line of stdout or stderr is a line now."""
        for splitter in self._splitters:
            if splitter._partial:  # most turns write nothing: no call for them
                splitter.flush()

    def _refusal(self) -> str:
        return "it was stopped for good" if self._retired else "the runtime is shutting down"

    def stop(self) -> None:
        """Stop the agent (idempotent): no more messages are taken; its mailbox stays.

        Waits for the message being handled, except when called from the agent's own turn.
        """
        self.halt()

    def halt(self, timeout: float | None = None) -> bool:
        """``stop``, waiting at most ``timeout`` seconds (None: as long as it takes).

        False when a message is still running, in which case its worker closes the instance
        as soon as the message ends.
        """
        with self._state:
            # Set first, so that a batch in progress ends after its current message.
            self._become(_Life.HALTED)
        if self._owner == threading.get_ident():
            return False  # our own turn: run_batch closes the instance when it returns
        if not self._run.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            return False
        try:
            self._close_instance()
        finally:
            self._run.release()
        return True

    def retire(self) -> None:
        """Stopped for good (its supervisor will not start it again): bury its mailbox."""
        self.stop()
        self.runtime._bury(self, "stopped for good by its supervisor")

    def _close_instance(self) -> None:
        """Close the instance if the agent is stopped (``_run`` held)."""
        with self._state:
            if self.alive:
                return
            instance, self.instance = self.instance, None
        if instance is not None:
            instance.close()

    def _wake(self) -> None:
        with self._state:
            if self._scheduled or not self.alive or not self.mailbox.ready():
                return
            self._scheduled = True
        self.runtime.scheduler.schedule(self)

    # -- for the layers above that move or swap an agent (cluster migration, durable sends) --

    @property
    def turn_lock(self) -> threading.Lock:
        """Held while a worker runs this agent's turn. Holding it keeps the agent between turns
        (a migration, a restore): pause the mailbox first, then take it; release it, resume
        the mailbox, then :meth:`wake`."""
        return self._run

    def wake(self) -> None:
        """Schedule the agent if it has messages and its mailbox is not paused."""
        self._wake()

    def deliver(self, envelope: Envelope, timeout: float | None = None) -> None:
        """Put ``envelope`` in the mailbox (the mailbox policy applies when it is full).

        ``__inspect`` is answered here and now, never queued (see mighty.agents._introspect).
        An ask may try ``run_here`` first (the runtime's asks do).
        """
        if envelope.name == INSPECT:
            _settle(envelope, value=cbor2.dumps(self.runtime.inspect(self.address)))
            return
        journal = self.runtime.journal
        if journal is not None and self.type.durable and envelope.journal is None:
            # Journaled (fsynced) before the send returns: accepted means it survives a crash.
            envelope.journal = journal.accept(
                self.address, envelope.sender, envelope.name, envelope.body
            )
        try:
            accepted = self.mailbox.put(envelope, timeout=timeout)
        except MailboxFull as exc:
            self._unjournal(envelope)
            raise MailboxFullError(f"{self.address}: {exc}") from None
        except MailboxClosed:
            self._unjournal(envelope)
            raise NoProc(f"{self.address} is not running") from None
        if not accepted:
            self._unjournal(envelope)
            self.stats.dropped += 1
            self.runtime.emit("message.dropped", self.address, {"message": envelope.name})
            if envelope.reply is not None:
                envelope.reply.set_exception(MessageDropped(f"{self.address}: dropped"))
            return
        self._wake()

    def _unjournal(self, envelope: Envelope) -> None:
        """The journaled message will not be handled (not accepted, refused, or it crashed
        the agent): its inbox row goes, so a recovery does not run it."""
        seq, envelope.journal = envelope.journal, None
        journal = self.runtime.journal
        if seq is not None and journal is not None:
            with contextlib.suppress(MightyError):
                journal.forget(self.address, seq)

    def _checkpointed(self) -> None:
        """The message's state is stored: its import log and any recovery answers are done."""
        log = self._log
        if log is not None and log.recording is not None:
            log.recording.discard()
        recovery = self._recovery
        if recovery is not None:
            recovery.finished = True
            self._recovery = None

    @property
    def busy(self) -> bool:
        """Work is left: messages queued, a turn scheduled or running, or a crash undecided."""
        with self._state:
            pending = (
                self._scheduled or self._exiting or self.current is not None or self._retries > 0
            )
        return pending or len(self.mailbox) > 0

    # -- running ----------------------------------------------------------------------------

    def run_batch(self) -> tuple[int, bool]:
        """One turn on a worker: up to a batch of messages. Never raises (a failure is a
        crash)."""
        self._run.acquire()
        self._owner = threading.get_ident()
        try:
            exit_reason = self._wake_in_turn() if self.hibernated else None
        except BaseException:  # a signal's handler raised out of the wake: the turn ends
            self._end_turn(0, 0, 0.0, None)
            raise
        if exit_reason is None:
            handled, more, exit_reason = self._run_turn(_Turn(1, math.inf), None, _BATCH)
        else:
            handled, more = 0, self._end_turn(0, 0, 0.0, exit_reason)
        if exit_reason is not None:
            # Outside the run lock: the supervisor may stop, revive or retire this very agent
            # (and its siblings), which takes their run locks.
            self._exit(exit_reason)
        return handled, more

    def _run_turn(
        self, turn: _Turn, first: Envelope | None, limit: int
    ) -> tuple[int, bool, str | None]:
        """The one turn, for a worker (``run_batch``) and for an ask run in place
        (``run_here``): ``first``, the message claimed for the ask, if any, then up to
        ``limit`` messages in all from the mailbox, ``_run`` held (released here): (handled,
        more to do, crash reason).

        ``_scheduled`` is cleared when there is no more to do; the caller reports a crash
        (``_exit``) once it holds no run lock of its own. A claimed message is handled even if
        a stop came since (as a message taken just before a stop is: the stop waits for the
        run lock, then closes the instance).
        """
        handled, fuel, wall = 0, 0, 0.0
        exit_reason: str | None = None
        self._owner = threading.get_ident()
        self._turn = turn
        try:
            runtime = self.runtime
            telemetry, introspect = runtime.telemetry, runtime.introspect
            envelope = first
            for _ in range(limit):
                if envelope is None:
                    if not self.alive:
                        break
                    envelope = self.mailbox.take()
                    if envelope is None:
                        break
                handled += 1
                exit_reason = self._message(envelope, telemetry, introspect)
                envelope = None
                fuel, wall = fuel + self._fuel, wall + self._took
                if exit_reason is not None:
                    break
        finally:
            self._turn = None
            more = self._end_turn(handled, fuel, wall, exit_reason)
        return handled, more, exit_reason

    def _end_turn(self, handled: int, fuel: int, wall: float, exit_reason: str | None) -> bool:
        """The end of a turn (run lock held; released here): whether there is more to do."""
        self.current = None
        self._owner = None
        if handled:
            self.light = fuel < _LIGHT_FUEL * handled and wall < _LIGHT_WALL * handled
        # One hold of the state lock, the run lock still held: an instance stopped meanwhile
        # (stop timed out, or was called from this turn) is taken to be closed here, and
        # whether there is more to do is read.
        with self._state:
            stopped = None
            if not self.alive:
                stopped, self.instance = self.instance, None
            # A paused mailbox (hot swap in progress) is woken again when it resumes.
            more = self.alive and self.mailbox.ready()
            if not more:
                self._scheduled = False
        try:
            if stopped is not None:
                stopped.close()
        finally:
            self._run.release()
        if exit_reason is None and not more and self.runtime.hibernation is not None:
            self.runtime.hibernation.touch(self)
        return more

    def run_here(self, envelope: Envelope, deadline: float, outer: _Turn | None = None) -> bool:
        """The shortest path of an ask about to be put in the mailbox: when the agent is idle
        (awake, not scheduled, its mailbox empty and not paused) and a worker is free, the
        calling thread takes ``envelope`` at once (``Mailbox.claim``: counted as accepted,
        never queued) and runs the turn itself, no thread hop either way. False (nothing
        done): the caller puts it in the mailbox as usual.

        The claim is made holding the agent's state lock, with the run lock taken (without
        waiting) and ``_scheduled`` set, so no worker, wake or other ask can run the agent
        until this turn ends, and a message put by another sender after the claim is handled
        after this one (it queues, and the turn's end schedules the agent for it).

        Only when the agent's per-message budget ends before the ask's ``deadline`` would (the
        asker cannot be held past its deadline by more than the budget allows: the caller
        checked that of ``deadline``, this checks it of a shorter deadline it is nested in),
        on a thread
        that is a worker in a turn (a guest's ask) or borrowed an idle worker's place (a host
        ask). A crash in the turn is reported to the supervisor from here when this thread
        holds no other run lock, else by a worker. A signal on the main thread interrupts the
        guest as a direct call would: the agent crashes and the caller gets the signal's
        exception. Asks made in that turn may run their targets in place too (nested up to
        :data:`_NESTED_TURNS`), each ending by ``deadline`` as well. ``outer``: the turn the
        calling thread is in, if any (``Runtime._outer_turn``).
        """
        depth = 0
        if outer is not None:
            depth = outer.depth
            if outer.limit < deadline:
                # Nested in a turn run in place for an ask: that ask's deadline bounds this
                # one too, and the budget must end before it (the caller checked its own).
                deadline = outer.limit
                if self.type.budget.timeout > deadline - time.monotonic():
                    return False
        if self.instance is None or depth >= _NESTED_TURNS:
            return False
        scheduler = self.runtime.scheduler
        borrowed = depth == 0 and not scheduler.on_worker()
        if borrowed and not scheduler.borrow():
            return False
        try:
            run = self._run
            with self._state:  # the claim (see above)
                # The run lock is taken without waiting under the state lock: a try cannot
                # deadlock, and a held one means a stop or a migration has the agent.
                if (
                    self._scheduled
                    or not self.alive
                    or self.instance is None
                    or not run.acquire(False)
                ):
                    return False
                if not self.mailbox.claim():
                    run.release()
                    return False
                self._scheduled = True
            self._interrupted = None
            try:
                _, more, exit_reason = self._run_turn(_Turn(depth + 1, deadline), envelope, 1)
            except BaseException:
                # A signal's handler raised (SystemExit) out of the guest call: the turn did
                # not finish its bookkeeping. The message counts as crashed-on.
                with self._state:
                    self._scheduled = False
                _settle(envelope, error=AgentCrashed(f"{self.address}: interrupted"))
                self._wake()
                raise
        finally:
            if borrowed:
                scheduler.give_back()
        if exit_reason is not None or more or self._interrupted is not None:
            self._after_here(depth, exit_reason, more)
        return True

    def _after_here(self, depth: int, exit_reason: str | None, more: bool) -> None:
        """What a turn run in place leaves to do (rarely anything): report its crash (from
        here when this thread holds no other run lock, else by a worker), schedule the agent
        for messages that came meanwhile, raise a Ctrl-C that interrupted the guest."""
        scheduler = self.runtime.scheduler
        if exit_reason is not None:
            if depth == 0:
                self._exit(exit_reason)
            else:
                scheduler.schedule(_Exit(self, exit_reason))
        elif more:  # messages came meanwhile: the turn's end left it scheduled, for us to queue
            scheduler.schedule(self)
        interrupted = self._interrupted
        if interrupted is not None and threading.current_thread() is threading.main_thread():
            self._interrupted = None
            if interrupted == signal.SIGINT:
                raise KeyboardInterrupt

    def _wake_in_turn(self) -> str | None:
        """Wake a hibernated agent before its next message (``_run`` held); a crash reason if
        it cannot (the error is typed; the stored snapshot is left as it was)."""
        hibernation = self.runtime.hibernation
        try:
            if hibernation is None:
                raise HostError(f"{self.address} is hibernated but the runtime has no store")
            instance = hibernation.wake(self)
        except MightyError as exc:
            return self._crashed(None, exc)
        except Exception as exc:  # noqa: BLE001 -- a host bug in a wake is this agent's crash
            _log.exception("%s: unexpected error waking it", self.address)
            error = HostError(f"internal error: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return self._crashed(None, error)
        with self._state:
            installed = self.alive
            if installed:
                self.instance = instance
                self._become(_ALIVE)
        if not installed:  # stopped while it woke
            instance.close()
            return None
        hibernation.woke(self)
        return None

    def _exit(self, reason: str) -> None:
        """Tell the supervisor (or bury the agent when there is none, or no more runtime)."""
        if self.on_exit is not None and not self.runtime.closing:
            runtime = self.runtime
            with runtime._lock:
                runtime._reports += 1
                runtime._reporting += 1
            try:
                self.on_exit(self, True, reason)
                return
            except Exception:  # noqa: BLE001 -- nobody will revive it: settle its queue
                _log.exception("%s: reporting the crash to the supervisor failed", self.address)
            finally:
                with runtime._lock:
                    runtime._reporting -= 1
        with self._state:
            self._become(_Life.HALTED)  # nobody revives it: stopped, then buried
        self.runtime._bury(self, reason)

    def _message(  # noqa: PLR0915 -- one frame per message on the hot path, on purpose
        self, envelope: Envelope, telemetry: Telemetry | None, introspect: bool
    ) -> str | None:
        """Handle one message in a turn (run lock held), count it and keep it in the history
        (``_fuel``, ``_took``); the crash reason when the agent crashed on it. One frame for
        the common case (a turn's loop, and an ask run in place, call it directly); the rare
        outcomes have their own."""
        self._outcome = OK
        self._fuel = 0
        self.started = started = time.monotonic()
        agent_type = self.type
        span = (
            None
            if telemetry is None
            else telemetry.handle_begin(
                self.address,
                agent_type.name,
                envelope.name,
                envelope.sender,
                envelope.trace,
                envelope.body,
            )
        )
        exit_reason: str | None = None
        try:
            refusal = None if agent_type.accepts is None else self._check_protocol(envelope)
            context = envelope.context = self._context_for(envelope)
            if refusal is not None:
                self._refuse(envelope, refusal)
            elif envelope.cancelled is not None or context.cancel.cancel_called:
                self._skip(envelope, context)
            else:
                instance = self.instance
                assert instance is not None
                self.current = envelope
                recovery = self._recovery
                if recovery is not None:
                    recovery.active = True
                if envelope.journal is not None and self._log is not None:
                    self._log.keys.begin(envelope.journal)
                token = enter_context(context)
                try:
                    if recovery is not None and recovery.refusal:
                        raise RecoveryRefused(recovery.refusal)
                    result = instance.call(
                        "handle",
                        envelope.sender,
                        {"name": envelope.name, "body": envelope.body},
                        budget=agent_type.budget,
                        cancel=context.cancel,
                    )
                except (GuestError, HostError) as exc:
                    # A recovered message: the log's divergence, not its wrapping.
                    failure = exc if recovery is None else recovery.failure(exc)
                    exit_reason = self._crashed(envelope, failure)
                finally:
                    leave_context(token)
                    self.current = None
                    for splitter in self._splitters:  # flush_output, inline
                        if splitter._partial:
                            splitter.flush()
                    usage = instance.last_usage
                    if usage is not None:
                        self._fuel = usage.fuel
                if exit_reason is None and usage is not None:
                    self.stats.fuel += usage.fuel
                if (
                    exit_reason is None
                    and agent_type.durable
                    and self.runtime.hibernation is not None
                ):
                    exit_reason = self._persist(envelope, instance)
                if exit_reason is None:
                    if isinstance(result, Ok):
                        self.stats.handled += 1
                        future = envelope.reply
                        if future is not None:
                            reply = result.value
                            body = None if reply is None else bytes(reply["body"])
                            # _settle, inline (no contextlib.suppress object either)
                            try:  # noqa: SIM105
                                future.set_result(body)
                            except InvalidStateError:  # settled by a shutdown that gave up
                                pass
                    else:
                        self._failed(envelope, result)
                    limit = agent_type.lifetime_fuel
                    if limit is not None and self.stats.fuel > limit:
                        exit_reason = self._out_of_lifetime(limit)
        except Exception as exc:  # noqa: BLE001 -- a host bug in a turn is this agent's crash
            _log.exception("%s: unexpected error handling %r", self.address, envelope.name)
            error = HostError(f"internal error: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            exit_reason = self._crashed(envelope, error)
        if envelope.journal is not None:  # not checkpointed with the state: not to be re-run
            if not envelope.retrying:  # (unless it is to run again: its row stays till then)
                self._unjournal(envelope)
            self._checkpointed()
        outcome = CRASHED if exit_reason is not None else self._outcome
        if span is not None:
            assert telemetry is not None
            telemetry.handle_end(span, agent_type.name, outcome, self._fuel)
        self._took = took = time.monotonic() - started
        self.recent.append(
            (
                envelope.name,
                envelope.sender,
                outcome,
                started,
                took,
                self._fuel,
                envelope.body if introspect else None,
            )
        )
        return exit_reason

    def _context_for(self, envelope: Envelope) -> RunContext:
        """The message's context: inside its sender's (cancelled with it, ending by the ask's
        deadline), unless the type is not ``cancellable``; ``msg-ID`` either way."""
        parent = envelope.parent
        if self.type.cancellable:
            deadline, outer, theirs = envelope.deadline, parent, envelope.cancel
        else:
            deadline, outer, theirs = None, None, None
        if outer is None:
            scope = CancelScope(deadline=deadline, parent=theirs)
        elif theirs is None:
            scope = CancelScope(deadline=deadline, parent=outer.cancel)
        else:
            scope = CancelScope.within(outer.cancel, theirs, deadline=deadline)
        return RunContext(
            envelope.context_id,
            scope,
            "message",
            None if parent is None else parent.id,
            0 if parent is None else parent.depth + 1,
            self.address,
        )

    def _skip(self, envelope: Envelope, context: RunContext) -> None:
        """Cancelled before its handler ran (while it waited, or its asker gave up): the
        agent never sees it; an asker still waiting hears why."""
        self.stats.failed += 1
        self._outcome = CANCELLED
        why = envelope.cancelled or context.cancel.reason or "cancelled"
        _settle(
            envelope,
            error=MessageCancelled(f"{self.address}: {envelope.name!r} was cancelled: {why}"),
        )

    def _refuse(self, envelope: Envelope, refusal: AgentError) -> None:
        """The message broke the type's protocol: refused, not handled."""
        self.stats.failed += 1
        self._outcome = REFUSED
        _settle(envelope, error=refusal)

    def _persist(self, envelope: Envelope, instance: Instance) -> str | None:
        """Write-ahead for a durable type: the state is on disk before the reply is released;
        the crash reason if it cannot be stored."""
        hibernation = self.runtime.hibernation
        assert hibernation is not None
        try:
            hibernation.persist(self, instance, done=envelope.journal)
        except MightyError as exc:
            return self._crashed(envelope, exc)
        envelope.journal = None  # its inbox row went with the state's write
        self._checkpointed()
        return None

    def _failed(self, envelope: Envelope, outcome: Any) -> None:
        """The handler returned an error: the asker gets Refused or HandlerFailed."""
        self.stats.failed += 1
        text = str(outcome.value if isinstance(outcome, Err) else outcome)
        self._outcome = REFUSED if text.startswith("refused: ") else FAILED
        error: AgentError = (
            Refused(f"{self.address}: {text[len('refused: ') :]}")
            if text.startswith("refused: ")
            else HandlerFailed(f"{self.address} failed on {envelope.name!r}: {text}")
        )
        _settle(envelope, error=error)

    def _out_of_lifetime(self, limit: int) -> str:
        """The agent used its lifetime fuel: it crashes (after this message's reply)."""
        self.runtime.emit(
            "budget.exhausted", self.address, {"reason": "lifetime_fuel", "limit": limit}
        )
        return self._crashed(None, HostError(f"{self.address} used its lifetime fuel of {limit}"))

    def _check_protocol(self, envelope: Envelope) -> AgentError | None:
        accepts = self.type.accepts
        if accepts is None:
            return None
        if envelope.name not in accepts:
            names = ", ".join(sorted(accepts)) or "nothing"
            return Refused(
                f"{self.address} does not accept {envelope.name!r} (it accepts: {names})"
            )
        model = accepts[envelope.name]
        if model is None:
            return None
        try:
            model.model_validate(decode_body(envelope.body))
        except (ValidationError, ValueError, cbor2.CBORDecodeError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return Refused(f"{self.address}: invalid {envelope.name!r} body: {first}")
        return None

    def _crashed(self, envelope: Envelope | None, exc: MightyError) -> str:
        """Record a crash (``_run`` held): the instance is closed; the caller reports it."""
        reason = f"{exc.kind}: {exc.message}"
        if isinstance(exc, Cancelled) and exc.reason == "interrupted":
            if self.runtime._closing:  # a shutdown after a signal: not handled, not a crash
                return self._abandoned(envelope, reason)
            self._interrupted = exc.signal or signal.SIGINT
        self.stats.crashes += 1
        if isinstance(exc, BudgetExceeded):
            self.runtime.emit("budget.exhausted", self.address, {"reason": exc.kind})
        self.runtime.emit("agent.crashed", self.address, {"reason": reason})
        breaker = self.runtime._breakers.get(self.address)
        if breaker is not None:
            # Once per crash, and before the asker hears of it: the asker's next call sees it.
            breaker.record_failure()
        if envelope is not None and not self._retry(envelope, exc, reason):
            _settle(envelope, error=self._crash_error(envelope, exc, reason))
            self._dead_letter(envelope, reason)
        with self._state:
            self._become(_Life.CRASHED)
        self._close_instance()
        return reason

    def _retry(self, envelope: Envelope, exc: MightyError, reason: str) -> bool:
        """Keep a message its handler crashed on for another attempt (the type's
        ``RetryPolicy``): True when it will be delivered again after the backoff."""
        policy = self.type.retry
        if policy is None or isinstance(exc, Cancelled):
            return False
        if envelope.reply is not None and envelope.reply.done():
            return False  # its asker was answered already (a shutdown gave up on it)
        envelope.attempts += 1
        if envelope.attempts >= policy.attempts:
            return False
        delay = policy.delay(envelope.attempts)
        if envelope.deadline is not None and time.monotonic() + delay >= envelope.deadline:
            return False  # its asker would have stopped waiting by then
        envelope.retrying = True
        with self._state:
            self._retries += 1
        if not self.runtime.later(delay, functools.partial(self._redeliver, envelope, reason)):
            with self._state:
                self._retries -= 1
            envelope.retrying = False
            return False
        self.runtime.emit(
            "message.retry",
            self.address,
            {
                "message": envelope.name,
                "attempt": envelope.attempts,
                "delay": delay,
                "reason": reason,
            },
        )
        return True

    def _redeliver(self, envelope: Envelope, reason: str) -> None:
        """The backoff is over: the message goes to the back of the mailbox (the agent was
        restarted meanwhile, or is gone: then its asker hears the crash)."""
        envelope.retrying = False
        try:
            self.deliver(envelope)
        except AgentError:
            _settle(envelope, error=AgentCrashed(f"{self.address} crashed: {reason}"))
            self._unjournal(envelope)
            self._dead_letter(envelope, reason)
        finally:
            with self._state:
                self._retries -= 1

    def _dead_letter(self, envelope: Envelope, reason: str) -> None:
        """Tell the type's dead-letter agent, if it has one, about a message given up on (a
        send; a failure to deliver it is logged, not raised: the crash is what matters)."""
        policy = self.type.retry
        to = None if policy is None else policy.dead_letter
        if to is None:
            return
        letter = {
            "to": self.address,
            "name": envelope.name,
            "body": envelope.body,
            "sender": envelope.sender,
            "reason": reason,
            "attempts": envelope.attempts or 1,
        }
        try:
            self.runtime.send_raw(to, "dead_letter", cbor2.dumps(letter), sender=self.address)
        except AgentError as exc:
            _log.warning("%s: dead letter to %s not sent: %s", self.address, to, exc)

    def _crash_error(self, envelope: Envelope, exc: MightyError, reason: str) -> AgentError:
        """What the asker of the message the agent crashed on hears: stopped by the asker's
        own deadline, that is no reply in time (``AskTimeout``), not the callee's crash."""
        if (
            isinstance(exc, Cancelled)
            and exc.by == "deadline"
            and envelope.deadline is not None
            and time.monotonic() >= envelope.deadline
        ):
            return AskTimeout(
                f"no reply from {self.address} to {envelope.name!r} by its asker's deadline "
                "(the handler was stopped there)"
            )
        return AgentCrashed(f"{self.address} crashed: {reason}")

    def _abandoned(self, envelope: Envelope | None, reason: str) -> str:
        """A shutdown interrupted the message (``_run`` held): it counts as unhandled."""
        gone = NoProc(f"{self.address} is gone (shutdown)")
        # An ask the shutdown gave up on was counted when it was settled.
        if envelope is not None and (envelope.reply is None or _settle(envelope, error=gone)):
            self.stats.unhandled += 1
        with self._state:
            self._become(_Life.CRASHED)
        self._close_instance()
        return reason

    def revive(self) -> None:
        """Start again after a crash: a fresh instance, ``init`` again, the same mailbox."""
        self.stats.restarts += 1
        self.start()
        self.runtime.emit("agent.restarted", self.address, {"restarts": self.stats.restarts})


class _Turn:
    """One turn of one agent (``AgentProcess._run_turn``), made by a worker (``run_batch``)
    or by an ask run in place (``run_here``), and kept in ``AgentProcess._turn`` while it
    runs. An ask made in a turn (by the guest, or by host code the guest called on the same
    thread) finds it through the run context (``Runtime._outer_turn``): the message's
    context names the agent, whose turn on this thread is the one the ask is nested in.

    Rejected: a thread-local of depth and deadline (state the reader cannot see, set and
    reset around every turn; the run context already says which agent's work this thread
    does); passing the turn down through the gate to the host functions (every import would
    carry it, for the one that asks).
    """

    __slots__ = ("depth", "limit")

    def __init__(self, depth: int, limit: float) -> None:
        self.depth = depth
        """How many turns the thread is inside, this one included (nested by ``run_here``)."""
        self.limit = limit
        """The deadline of the ask this turn runs in place for (``math.inf`` on a worker): a
        turn nested in it must end by then too."""


_NESTED_TURNS = 8
"""Turns nested on one thread by asks run in place (a chain of asks beyond goes by workers)."""


class _Exit:
    """A crash found by ``run_here`` in a nested turn, reported by a worker (which holds no run
    lock, as the supervisor needs)."""

    __slots__ = ("address", "process", "reason")

    def __init__(self, process: AgentProcess, reason: str) -> None:
        self.process = process
        self.address = process.address
        self.reason = reason

    def run_batch(self) -> tuple[int, bool]:
        self.process._exit(self.reason)
        return 0, False


def _settle(
    envelope: Envelope, *, value: bytes | None = None, error: Exception | None = None
) -> bool:
    """Settle an ask's future once; False when it had no future or was settled already."""
    future = envelope.reply
    if future is None:
        return False
    try:  # a settled future refuses with InvalidStateError: no done() first
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:  # settled already (by another thread: shutdown vs the worker)
        return False
    return True


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
                sender,
                chain,
                timeout,
                None,
                here,
                Reply,
                within,
                cancel,
                time.monotonic() + timeout,
                parent,
                outer,
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
                sender,
                chain,
                timeout,
                telemetry.carry(span),
                here,
                Reply,
                within,
                cancel,
                time.monotonic() + timeout,
                parent,
                outer,
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
            sender,
            chain,
            timeout,
            trace,
            here,
            Future,
            deadline=deadline,
            key=key,
        )

    def _deliver_ask(
        self,
        process: AgentProcess,
        name: str,
        body: bytes,
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
