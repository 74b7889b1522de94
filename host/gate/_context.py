"""What a host function sees: the per-instance :class:`GuestContext`, the :class:`Binding`
that names it, the resource kinds and handles it trades in, and the errors it may raise.

The gate's public vocabulary, apart from the machinery that serves imports (``_gate.py``,
``_frames.py``): providers, hooks and the layers above import these types and never the
trampoline. Rejected: one module for all of it (the gate was 1,970 lines, seven public types
among ~60 frame builders, and a reader of ``Binding`` had to scroll past ctypes prototypes).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import wasmtime

from mighty._errors import HostError
from mighty.gate._scope import UNSCOPED, MissingSlot, Scope, Slot

__all__ = [
    "Binding",
    "CallHook",
    "Direct",
    "GuestContext",
    "GuestViolation",
    "Handle",
    "HostFunctionFailed",
    "Provider",
    "ResourceKind",
    "StaleHandle",
    "unversioned",
]

_VERSION = re.compile(r"@[0-9][^/#]*$")


def unversioned(name: str) -> str:
    """``wasi:io/streams@0.2.9`` -> ``wasi:io/streams``."""
    return _VERSION.sub("", name)


class HostFunctionFailed(HostError):
    """A host function raised instead of answering; the guest was stopped. ``__cause__`` is it."""

    kind = "host_error"


class GuestViolation(Exception):
    """Raise from a host function when the guest broke an interface's contract (the WIT says
    "traps", e.g. ``poll`` of an empty list): the guest traps and the call fails with
    ``GuestTrap(trap_code="contract_violation")`` carrying this message."""


class StaleHandle(HostError):
    """A guest handle named a host object that no longer exists (a host bookkeeping bug)."""


_NEXT_TYPE_ID = itertools.count(1)


@dataclass(frozen=True, eq=False)
class ResourceKind:
    """A host-defined resource type, e.g. ``wasi:io/streams`` ``output-stream``.

    ``on_drop(ctx, obj)`` runs when the guest drops its last handle; the gate has already removed
    the object from the instance's table.
    """

    interface: str
    name: str
    on_drop: Callable[[GuestContext, Any], None] | None = None
    type_id: int = field(default_factory=lambda: next(_NEXT_TYPE_ID))

    def __repr__(self) -> str:
        return f"ResourceKind({self.interface}/{self.name})"


@dataclass(frozen=True, slots=True)
class Handle:
    """A host object handed to the guest as an owned resource; ``GuestContext.new`` makes one."""

    kind: ResourceKind
    rep: int


@dataclass(frozen=True, slots=True)
class Direct:
    """A host function's state-taking form, for the calls no hook watches.

    ``call(state, *args)``, where ``state`` is what the instance holds in ``slot``, answers
    exactly what the binding's ``fn(ctx, *args)`` answers, except that a record comes back as
    the tuple of its fields' values in the WIT's order (no dict to build and read again). The
    gate uses it where it serves an import in one fused frame (a clock's ``now``,
    ``get-random-bytes``); hooks always see ``fn``. The simplest way to keep the two equal is
    to write ``fn`` as ``call(ctx.slot(slot), *args)``.
    """

    slot: Slot[Any]
    call: Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Binding:
    """One host function: ``fn(ctx, *args)`` serving ``interface#name``.

    ``name`` follows the component model: ``get-stdout``, ``[method]output-stream.write``,
    ``[static]descriptor.x``, ``[constructor]x``. ``interface`` is unversioned; the gate binds it
    under whatever version a component imports. ``direct``: the same function taking its
    provider's state instead of the context (see :class:`Direct`), optional. ``hooked``
    False: no hook sees the calls of this binding (recorders, replayers, journals): they are
    served as if the instance had none, so they take no step of a trace and replay needs no
    record of them (``mighty:agent/debug``, the guest's source positions, is such a binding).
    """

    interface: str
    name: str
    fn: Callable[..., Any]
    direct: Direct | None = None
    hooked: bool = True


class Provider(Protocol):
    """A set of interfaces implemented on the host (WASI, mighty:agent, sandbox tools)."""

    def resources(self) -> Iterable[ResourceKind]: ...

    def bindings(self) -> Iterable[Binding]: ...

    def setup(self, ctx: GuestContext) -> None:
        """Fill this provider's slots of ``ctx`` (called once per instance)."""

    # A provider may also define ``teardown(ctx)``: called once when the instance closes, to
    # release what its state holds (file descriptors, sockets).


class CallHook(Protocol):
    """Wraps every import call: ``around(ctx, binding, args, call)`` returns the result.

    ``call()`` runs the implementation (or the next hook). A replayer returns recorded results
    without calling it; a recorder calls it and writes down what came back.

    A hook that only watches may also define ``watch_import(ctx, binding, args, value,
    failed)``: when it is the only hook, the gate runs the implementation itself and then calls
    that with the result (``failed`` False) or with the exception it raised (``failed`` True,
    raised again after). It must do what ``__call__`` would have done around ``call()``.

    Such a hook may also define ``tap_import(binding, nparams, self_kind)``, asked once per
    instance and import when the hook is the only one: it returns None, or a *tap* that the
    gate calls instead of ``watch_import`` after each call of that import that returned
    (a failed one still goes to ``watch_import``), as ``tap(context_ptr, result, *args)``:
    ``context_ptr`` is the raw store context of the call (an int), ``args`` the arguments as
    ``watch_import`` would see them, except that for a method on a borrowed resource of
    ``self_kind`` the first is its rep (an int) instead of a :class:`Handle`. The gate taps
    only imports of the common shapes (up to two plain arguments; a method with up to one), in
    one frame that lifts, calls, taps and lowers, with no list or Handle made per call; the
    other imports go to ``watch_import``.

    Two optional members serve ``mighty:agent/debug`` (``_source.py``): ``keeps_positions``
    (true on every hook: the guest is told to send its source positions) and
    ``take_position(file, line, function)`` (receives one, bounded, for the next import).
    """

    def __call__(
        self,
        ctx: GuestContext,
        binding: Binding,
        args: Sequence[Any],
        call: Callable[[], Any],
    ) -> Any: ...


_T = TypeVar("_T")


class GuestContext:
    """Per-instance host state: resource tables, provider slots, hooks, the call's scope."""

    def __init__(self, store: wasmtime.Store, hooks: Sequence[CallHook] = ()) -> None:
        self.store = store
        self.hooks = tuple(hooks)
        self.scope: Scope = UNSCOPED
        """The guest call being served (the budget layer's ``CallScope``); UNSCOPED between."""
        self._slots: dict[Slot[Any], Any] = {}
        self._store_key: int | None = None
        self._address = 0
        """The address of the store's context (what each import of this store comes with)."""
        self.calls = 0
        """How many imports this instance has made."""
        self.replaying = False
        """True while a replayer answers the imports: resources are stand-ins, not objects."""
        self.call_store: Any = store
        """The store context of the import being served (set by the gate for each call)."""
        self._tables: dict[int, dict[int, Any]] = {}
        self._known_kinds: dict[int, ResourceKind] = {}
        self.made = 0
        """How many resources the guest has been given so far (each one's rep is its number)."""
        # The hooked call of each import, made on its first call (None: the hook chain); keyed
        # by the import's ``_native._Registered`` (typed loosely here: this module is below it).
        self._frames: dict[object, Callable[..., None] | None] = {}

    # -- slots: typed per-instance state of the providers -------------------------------------

    def slot(self, key: Slot[_T]) -> _T:
        """The value in slot ``key``; :class:`MissingSlot` if nothing was put there."""
        try:
            value: _T = self._slots[key]
        except KeyError:
            raise MissingSlot(f"this instance has nothing in {key!r}") from None
        return value

    def find(self, key: Slot[_T]) -> _T | None:
        """The value in slot ``key``, or None."""
        value: _T | None = self._slots.get(key)
        return value

    def put(self, key: Slot[_T], value: _T) -> None:
        """Fill slot ``key`` with ``value`` (replacing what was there)."""
        self._slots[key] = value

    def take(self, key: Slot[_T]) -> _T | None:
        """Empty slot ``key``; what it held, or None."""
        value: _T | None = self._slots.pop(key, None)
        return value

    # -- resources ---------------------------------------------------------------------------

    def new(self, kind: ResourceKind, obj: Any) -> Handle:
        """Store ``obj`` as a new resource of ``kind``; return it from a host function."""
        self._known_kinds[kind.type_id] = kind
        self.made += 1
        rep = self.made
        self._tables.setdefault(kind.type_id, {})[rep] = obj
        return Handle(kind, rep)

    def get(self, kind: ResourceKind, rep: int) -> Any:
        """The host object behind a handle; StaleHandle if it is gone."""
        try:
            return self._tables[kind.type_id][rep]
        except KeyError:
            raise StaleHandle(f"no live {kind.name} with handle {rep}") from None

    def live(self, kind: ResourceKind) -> int:
        """How many resources of ``kind`` the guest holds (for leak tests)."""
        return len(self._tables.get(kind.type_id, {}))

    def holdings(self) -> frozenset[tuple[str, int]]:
        """Every resource the guest holds, as ``(interface/name, rep)`` (reps count from 1 in
        the order resources were made, so two instances that made the same resources in the
        same order hold the same pairs)."""
        names = {key: f"{kind.interface}/{kind.name}" for key, kind in self._known_kinds.items()}
        return frozenset(
            (names.get(type_id, str(type_id)), rep)
            for type_id, table in self._tables.items()
            for rep in table
        )

    def _drop(self, type_id: int, rep: int) -> Any:
        return self._tables.get(type_id, {}).pop(rep, None)
