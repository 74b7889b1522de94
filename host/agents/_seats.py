"""Seats: agent instances made from a warmed state and reused after hibernation.

A CPython agent's instance costs more to make than to use: instantiation (~0.6-1 ms here) and a
first call that runs the interpreter's one-time start-up (arguments, environment, the ``random``
seed: 12 imports) and takes a copy-on-write fault for every image page it writes (~1.7 ms),
then ~0.5 ms to close (the ``munmap``). A hibernated agent paid all of it on every wake. Seats,
one set per agent type, take that off the wake and the spawn, for agent types whose component
exports ``reseed`` (the SDK's, see wit/agent/agent.wit) in a runtime that records nothing:

- **The warmed state.** The type's first instance calls ``state-schema`` (a call that reads
  nothing of any agent and opens no stream: checked, else the type gets no seats), which runs
  the start-up; its linear memory is captured then (``Instance.capture_memory``), before any
  agent used it. Every later instance of the type is made from that state copy-on-write.
- **Reseeding.** Every instance the type's agents get, new or reused, is called ``reseed``
  before ``init`` or ``restore``: the guest seeds ``random`` from the host's secure random and
  opens stdout and stderr (so every instance holds them under the same handles). The state
  holds the first instance's ``random`` state, which every instance would otherwise replay.
- **Rewound instances.** The first instance made from the warmed state is captured again right
  after its ``reseed`` (the rewind target). When an agent hibernates, its instance, if made from
  the warmed state, is rewound instead of closed (``Instance.rewind``: the target's bytes copied
  back over the pages it may have changed; its own pages stay its own, so the next agent takes
  no fault for them) and kept as a free seat; the next agent of the type to wake or spawn takes
  it, rebound to itself, and reseeded. What is not linear memory must then be as in a new
  instance, so an instance is rewound only when (else it is closed, as before): it is not
  poisoned (a trap leaves the wasm stack pointer mid-call); its memory did not grow; its guest
  holds exactly the resources the target's instance held and was given no other since (an
  agent that made an HTTP request was: its handle numbers would differ); it has served fewer
  agents than its life limit; the type's component, policy and memory budget are those it was
  made for (a hot swap drops the seats). The wasm globals hold after a call what they held
  before it, except the WASI adapter's pointer to its state, which every instance made from the
  warmed state sets in its first import at the same address (the same memory, the same
  deterministic allocation), where the target holds that state. A rewind that goes wrong
  anyway fails the ``reseed`` that follows (the adapter checks its state's magic numbers):
  that instance is closed and the type gets no more seats.

Each instance's slots forward to the agent it serves now (:class:`Tenancy`): the agent
process, its log, stdout and stderr, its granted tools. A free seat serves no one.

Not for: a runtime without a ``state_dir`` (no agent hibernates, so no instance comes back:
the ``reseed`` call would be all cost), a runtime with a recorder or an outside import journal,
durable types (their imports are journaled), an agent being recovered (its instance answers
from its journal), a hot swap's new instance. Those make every instance anew from the
component's image, as before: a trace holds the start-up's imports, which an instance from the
warmed state would skip, and a replay makes its instances from the image (the determinism
contract).

Rejected: seating an agent's instance when it stops or crashes (a stopped agent's instance is
rarely followed by another of its type soon; a crash poisons it anyway); a background thread
making seats ahead (the wake's thread makes one from the warmed state in ~1 ms, and a thread
per type would hold memory for agents that may never come); sharing a warmed state between
agent types of one component (the policy's environment and arguments are in the guest's
memory after start-up); seeding ``random`` from the host without a guest export (the host
cannot run code in the guest, and writing the generator's state into its memory would tie the
host to CPython's layout).
"""

from __future__ import annotations

import logging
import random
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mighty._errors import HostError, MightyError
from mighty.agents._host import AGENT_PROCESS
from mighty.capabilities import AGENT_TOOLS, AgentTools
from mighty.engine import Component, MemoryState
from mighty.gate import Seed
from mighty.wasi import LOG_SINK, STDERR_SINK, STDOUT_SINK

if TYPE_CHECKING:
    from mighty.agents._process import AgentProcess
    from mighty.instance import Instance

__all__ = ["MAX_SEATS", "RESEED", "SeatStats", "Seats", "Tenancy"]

_log = logging.getLogger(__name__)

RESEED = "reseed"
"""The export an agent component offers to take seats (wit/agent/agent.wit)."""
MAX_SEATS = 32
"""Free seats kept per agent type (each holds the pages its agents wrote, ~1 MB)."""
_LIVES = (10_000, 20_000)
"""Agents one seat serves at least and at most (drawn per seat, as the sandbox's pool does, so
that seats made together are not all replaced together)."""
_WARM_GAP = 256 << 10
"""The warmed state copies clean pages between changed ones up to this far apart, so that an
instance made from it maps it in a few ``mmap`` calls (as the sandbox's pool does)."""
_stagger = random.Random()  # noqa: S311 - scheduling jitter, not a secret


def _drop(*_: object) -> None:
    """A free seat's sinks: it serves no one."""


class Tenancy:
    """The agent an instance serves now: its slots forward to this object's sinks, which the
    seat rebinds when it changes hands (a free seat's drop everything)."""

    __slots__ = ("err", "log", "out")

    def __init__(self) -> None:
        self.out: Callable[[bytes], None] = _drop
        self.err: Callable[[bytes], None] = _drop
        self.log: Callable[[str, str, str], None] = _drop

    def stdout(self, data: bytes) -> None:
        self.out(data)

    def stderr(self, data: bytes) -> None:
        self.err(data)

    def line(self, level: str, context: str, message: str) -> None:
        self.log(level, context, message)


@dataclass(eq=False)
class _Seat:
    """What a seated instance carries beside it (never the instance itself: the seats map
    instances to these weakly, and a value that held its key would keep it alive)."""

    tenancy: Tenancy
    made_from: MemoryState | None
    max_lives: int
    lives: int = 0


@dataclass(eq=False)
class _Kind:
    """One agent type's seats, for one component, policy and memory budget."""

    key: tuple[Any, ...]
    warmed: MemoryState | None = None
    target: tuple[MemoryState, frozenset[tuple[str, int]], int] | None = None
    free: list[tuple[_Seat, Instance]] = field(default_factory=list)
    broken: bool = False
    warming: bool = False
    """The first instance is being made and captured (other agents meanwhile make theirs the
    old way)."""


@dataclass
class SeatStats:
    """What seats did (``Runtime.seat_stats``)."""

    reused: int = 0
    """Instances handed to an agent after another agent used them (rewound)."""
    from_state: int = 0
    """Instances made from a type's warmed state."""
    rewound: int = 0
    """Instances rewound after their agent hibernated (kept as free seats)."""
    closed: int = 0
    """Instances of seated types closed when their agent hibernated (could not be rewound, or
    no room)."""

    def to_json(self) -> dict[str, int]:
        return {
            "reused": self.reused,
            "from_state": self.from_state,
            "rewound": self.rewound,
            "closed": self.closed,
        }


Make = Callable[[MemoryState | None, tuple[Seed, ...]], "Instance"]
"""Makes an instance of the agent's type with these slots (and the type's budget, policy and
gate), from ``memory`` when given."""


class Seats:
    """A runtime's seats, per agent type (see the module docstring). Thread-safe."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {}
        self._seats: weakref.WeakKeyDictionary[Instance, _Seat] = weakref.WeakKeyDictionary()
        self._reseeds: weakref.WeakKeyDictionary[Component, bool] = weakref.WeakKeyDictionary()
        self._closed = False
        self.stats = SeatStats()

    def seat(
        self,
        process: AgentProcess,
        make: Make,
        sinks: tuple[Callable[[bytes], None], Callable[[bytes], None]],
        log: Callable[[str, str, str], None],
        tools: AgentTools | None,
    ) -> Instance | None:
        """An instance for ``process`` (a spawn or a wake), reseeded and serving it: a free
        seat of its type, else one made from the type's warmed state (the first of the type
        also makes that state). None when the type takes no seats (no ``reseed`` export, a
        failure before): the caller makes one the old way. Raises what ``make`` raises."""
        agent_type = process.type
        component = agent_type.component
        if not self.enabled or not self._offers(component):
            return None
        claimed = self._claim(
            agent_type.name, (component, agent_type.policy, agent_type.budget.memory)
        )
        if claimed is None:
            return None
        kind, free, first = claimed
        warmed = kind.warmed
        if free is not None:
            instance = self._bind(*free, process, sinks, log, tools)
            if instance is not None:
                self._count("reused")
                return instance
            self._broke(kind, "a rewound instance failed its reseed")
            return None
        tenancy = Tenancy()
        slots = _slots(process, tenancy, tools)
        try:
            instance = make(warmed, slots)
        except BaseException:
            if first:
                with self._lock:
                    kind.warming = False
            raise
        seat = _Seat(tenancy, warmed, _stagger.randint(*_LIVES))
        _rebind(seat, sinks, log)
        try:
            if first:
                self._warm(kind, instance)
            instance.call(RESEED)
            if warmed is not None:
                self._count("from_state")
                self._take_target(kind, instance)
        except MightyError as exc:
            instance.close()
            self._broke(kind, f"its instance failed to warm or reseed: {exc.kind}: {exc}")
            return None
        finally:
            if first:
                with self._lock:
                    kind.warming = False
        with self._lock:
            self._seats[instance] = seat
        return instance

    def _offers(self, component: Component) -> bool:
        """Whether ``component`` exports ``reseed`` (looked up once per component: listing a
        component's exports walks its type, ~0.3 ms)."""
        with self._lock:
            known = self._reseeds.get(component)
        if known is None:
            known = RESEED in component.export_functions()
            with self._lock:
                self._reseeds[component] = known
        return known

    def _claim(
        self, name: str, key: tuple[Any, ...]
    ) -> tuple[_Kind, tuple[_Seat, Instance] | None, bool] | None:
        """The type's seats (new when its component, policy or memory budget changed: the old
        free seats are closed), a free seat if there is one, and whether the caller makes the
        type's first instance (and its warmed state). None: no seats now."""
        with self._lock:
            if self._closed:
                return None
            kind = self._kinds.get(name)
            stale = None
            if kind is None or not _same(kind.key, key):
                stale = kind
                kind = self._kinds[name] = _Kind(key)
            if kind.broken:
                return None
            free = kind.free.pop() if kind.free else None
            first = free is None and kind.warmed is None
            if first:
                if kind.warming:
                    return None
                kind.warming = True
        if stale is not None:
            self._close_free(stale)
        return kind, free, first

    def release(self, process: AgentProcess, instance: Instance) -> None:
        """``process`` hibernated and gave ``instance`` up: rewound and kept as a free seat of
        its type when it may be (see the module docstring), else closed."""
        with self._lock:
            seat = self._seats.get(instance)
        agent_type = process.type
        key = (agent_type.component, agent_type.policy, agent_type.budget.memory)
        with self._lock:
            kind = self._kinds.get(agent_type.name)
            room = (
                seat is not None
                and kind is not None
                and not self._closed
                and not kind.broken
                and _same(kind.key, key)
                and len(kind.free) < MAX_SEATS
            )
            target = kind.target if kind is not None else None
            warmed = kind.warmed if kind is not None else None
        if seat is None:  # not seated: made the old way (or by the type's first instance)
            instance.close()
            return
        if not room or kind is None or target is None or warmed is None:
            self._close(instance)
            return
        state, held, made = target
        if (
            seat.made_from is not warmed
            or seat.lives + 1 >= seat.max_lives
            or instance.context.made != made
            or instance.holdings() != held
            or not instance.rewind(state)
        ):
            self._close(instance)
            return
        _unbind(seat, instance)
        seat.lives += 1
        with self._lock:
            if not self._closed and len(kind.free) < MAX_SEATS and not kind.broken:
                self.stats.rewound += 1
                kind.free.append((seat, instance))
                return
        self._close(instance)

    def free(self, type_name: str) -> int:
        """How many free seats ``type_name`` has now."""
        with self._lock:
            kind = self._kinds.get(type_name)
            return 0 if kind is None else len(kind.free)

    def close(self) -> None:
        """Close every free seat; no more are kept (the runtime is shutting down)."""
        with self._lock:
            self._closed = True
            kinds = list(self._kinds.values())
            self._kinds.clear()
        for kind in kinds:
            self._close_free(kind)

    # -- inside ----------------------------------------------------------------------------

    def _warm(self, kind: _Kind, instance: Instance) -> None:
        """The type's first instance: run the start-up by a call that reads no agent's state
        and opens nothing, and capture its memory as the warmed state (before it serves)."""
        instance.call("state-schema")
        if instance.holdings():
            raise HostError("the start-up left the guest holding a host resource")
        state = instance.capture_memory(gap=_WARM_GAP)
        with self._lock:
            kind.warmed = state

    def _take_target(self, kind: _Kind, instance: Instance) -> None:
        """The first instance made from the warmed state, just reseeded (before it serves):
        its memory, resources and count of resources made are what a rewind brings back."""
        with self._lock:
            if kind.target is not None:
                return
        target = (instance.capture_memory(exact=True), instance.holdings(), instance.context.made)
        with self._lock:
            if kind.target is None:
                kind.target = target

    def _bind(
        self,
        seat: _Seat,
        instance: Instance,
        process: AgentProcess,
        sinks: tuple[Callable[[bytes], None], Callable[[bytes], None]],
        log: Callable[[str, str, str], None],
        tools: AgentTools | None,
    ) -> Instance | None:
        """A free seat rebound to ``process`` and reseeded; None (closed) if the reseed fails."""
        ctx = instance.context
        ctx.put(AGENT_PROCESS, process)
        if tools is None:
            ctx.take(AGENT_TOOLS)
        else:
            ctx.put(AGENT_TOOLS, tools)
        _rebind(seat, sinks, log)
        try:
            instance.call(RESEED)
        except MightyError:
            _log.warning("a rewound agent instance failed its reseed", exc_info=True)
            instance.close()
            return None
        with self._lock:
            self._seats[instance] = seat
        return instance

    def _broke(self, kind: _Kind, why: str) -> None:
        with self._lock:
            kind.broken = True
        _log.warning("agent instances of this type will not be reused: %s", why)
        self._close_free(kind)

    def _close_free(self, kind: _Kind) -> None:
        with self._lock:
            free, kind.free = kind.free, []
        for _, instance in free:
            self._close(instance)

    def _close(self, instance: Instance) -> None:
        with self._lock:
            self.stats.closed += 1
            self._seats.pop(instance, None)
        instance.close()

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same component object, and equal policy and memory budget."""
    return a[0] is b[0] and a[1] == b[1] and a[2] == b[2]


def _slots(process: AgentProcess, tenancy: Tenancy, tools: AgentTools | None) -> tuple[Seed, ...]:
    seeds = (
        AGENT_PROCESS.of(process),
        LOG_SINK.of(tenancy.line),
        STDOUT_SINK.of(tenancy.stdout),
        STDERR_SINK.of(tenancy.stderr),
    )
    return seeds if tools is None else (*seeds, AGENT_TOOLS.of(tools))


def _rebind(
    seat: _Seat,
    sinks: tuple[Callable[[bytes], None], Callable[[bytes], None]],
    log: Callable[[str, str, str], None],
) -> None:
    tenancy = seat.tenancy
    tenancy.out, tenancy.err = sinks
    tenancy.log = log


def _unbind(seat: _Seat, instance: Instance) -> None:
    """A free seat serves no one: no agent, no sinks, no tools."""
    ctx = instance.context
    ctx.take(AGENT_PROCESS)
    ctx.take(AGENT_TOOLS)
    tenancy = seat.tenancy
    tenancy.out = tenancy.err = _drop
    tenancy.log = _drop
