"""An agent's life: one :class:`AgentProcess` per address, its states, its turns and crashes.

The process is the agent as the runtime keeps it: its mailbox, its instance (or none, asleep
or dead), its supervisor link and its life (``_Life``, one state of an explicit machine whose
moves ``_MOVES`` lists). A worker runs its turn (``run_batch``): the guest's ``handle`` under
the type's budget, the reply, a crash turned into a report to its supervisor. The runtime
(``_runtime.py``) makes processes, routes messages to them and answers asks; its module notes
say which locks are held where (``AgentProcess._run`` is the one held across calls out).

Rejected: the process and the runtime in one module (2,356 lines, two classes of ~1,000 each
reaching into each other's fields; the review's "files that hold one concept").
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cbor2
from pydantic import ValidationError

from mighty._cbor import loads_untrusted
from mighty._errors import BudgetExceeded, Cancelled, GuestError, HostError, MightyError
from mighty.abi import Err, Ok
from mighty.agents._host import AGENT_PROCESS
from mighty.agents._introspect import CANCELLED, CRASHED, FAILED, INSPECT, OK, REFUSED, History
from mighty.agents._journal import Recovery, RecoveryRefused, hooks_of
from mighty.agents._mailbox import Mailbox, MailboxClosed, MailboxFull
from mighty.agents._output import LineSplitter, OutputTail
from mighty.agents._types import (
    AgentCrashed,
    AgentError,
    AgentState,
    AgentType,
    AskTimeout,
    BadSpawn,
    Envelope,
    HandlerFailed,
    MailboxFullError,
    MessageCancelled,
    MessageDropped,
    NoProc,
    Refused,
)
from mighty.budget import Budget, CancelScope, RunContext, enter_context, leave_context
from mighty.capabilities import AGENT_TOOLS, AgentTools
from mighty.engine import Component, MemoryState
from mighty.gate import Seed
from mighty.instance import Instance
from mighty.wasi import IDEMPOTENCY_KEYS, LOG_SINK, STDERR_SINK, STDOUT_SINK

if TYPE_CHECKING:
    from mighty.agents._hibernate import Hibernator
    from mighty.agents._runtime import Runtime
    from mighty.telemetry import Telemetry

__all__ = ["AgentProcess", "AgentStats", "decode_body", "encode_body"]

_log = logging.getLogger(__name__)

_BATCH = 16
# An agent's work is light when its messages take under this fuel (about 10-100 us of guest
# code, less than the Python around a message) and this wall time each (longer with little
# fuel: it waits, for I/O, a sleep, an ask): a second worker would not pay (see the scheduler).
_LIGHT_FUEL = 100_000
_LIGHT_WALL = 0.0005


def encode_body(body: Any) -> bytes:
    """A message body as CBOR (None is the empty body)."""
    return b"" if body is None else cbor2.dumps(body)


def decode_body(data: bytes | None) -> Any:
    return None if not data else loads_untrusted(data)


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
        (awake or hibernated, not scheduled, its mailbox empty and not paused) and a worker is
        free, the calling thread takes ``envelope`` at once (``Mailbox.claim``: counted as
        accepted, never queued) and runs the turn itself, no thread hop either way; a
        hibernated agent is woken first, on this thread too (``_wake_here``). False (nothing
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
        if (self.instance is None and not self.hibernated) or depth >= _NESTED_TURNS:
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
                if self._scheduled or not self.alive or not run.acquire(False):
                    return False
                asleep = self.instance is None
                if asleep:
                    # Woken here first (``_wake_here``), then the envelope claimed.
                    if not self.hibernated or not self.mailbox.claimable():
                        run.release()
                        return False
                elif not self.mailbox.claim():
                    run.release()
                    return False
                self._scheduled = True
            if asleep and not self._wake_here(deadline):
                return False
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
        self._install_woken(instance, hibernation)
        return None

    def _install_woken(self, instance: Instance, hibernation: Hibernator) -> bool:
        """(``_run`` held) the woken instance becomes the agent's; False (it is closed) when
        the agent stopped while it woke."""
        with self._state:
            installed = self.alive
            if installed:
                self.instance = instance
                self._become(_ALIVE)
        if not installed:  # stopped while it woke
            instance.close()
            return False
        hibernation.woke(self)
        return True

    def _wake_here(self, deadline: float) -> bool:
        """``run_here`` for a hibernated agent (``_run`` held, ``_scheduled`` set, nothing
        claimed yet): wake it on the asking thread, then claim the ask's envelope if its
        message still ends before ``deadline``. False when any of it fails (the turn ended,
        the agent awake or asleep as the wake left it): the caller then puts the envelope in
        the mailbox as usual, and a worker takes it from there; a failed wake is not reported
        here (the worker's wake, ``_wake_in_turn``, tries again and reports or crashes as it
        always does), so a wake that fails fails the same way on either path.

        Measured (benchmarks/README.md, stop 54): an ask to a hibernated agent that wakes and
        runs it in place instead of on a worker costs ~0.6x the process CPU per wake cycle (no
        hand-off to the worker and back, no asker spinning for the reply beside it)."""
        self._owner = threading.get_ident()
        hibernation = self.runtime.hibernation
        try:
            woken = False
            if hibernation is not None:
                try:
                    instance = hibernation.wake(self, report=False)
                except Exception:  # noqa: BLE001 -- the worker's wake tries again, reports it
                    instance = None
                woken = instance is not None and self._install_woken(instance, hibernation)
        except BaseException:  # a signal's handler raised out of the wake: the turn ends
            self._end_turn(0, 0, 0.0, None)
            raise
        if woken and self.type.budget.timeout <= deadline - time.monotonic():
            with self._state:
                if self.mailbox.claim():
                    return True
        if self._end_turn(0, 0, 0.0, None):  # messages came meanwhile: a worker takes them
            self.runtime.scheduler.schedule(self)
        return False

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
