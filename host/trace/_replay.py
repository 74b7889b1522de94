"""Replay: run the recorded component again, answering every import from the trace.

The replayer is a gate hook placed in front of everything: it never calls a host function, so
replay touches no clock, entropy, file or network. For every import the guest makes it checks
that the guest asks for the recorded call (same interface, function and arguments, at the same
step) and answers with the recorded result, recreating recorded resources as stand-ins; then it
checks that each export returns the recorded value after the recorded fuel, and that the guest's
output is byte-identical. The first difference is a :class:`NondeterminismError` naming the
instance, the step, what the trace expected and what came.

Deadline and cancellation stops are wall-clock events and cannot happen at the same instruction
twice; such an export is replayed up to its last recorded import and then stopped on purpose
(the report marks it), so everything the guest did before the interruption is still checked.

A trace is hostile input (issue 11). Its records are schema-checked as they are read
(``TraceInvalid`` at the frame's offset); a trace with nothing to replay is refused, not
reported "ok". The budget written in it is a request, not a grant: every instance and call runs
under the recorded budget capped by the replayer's ``ReplayLimits`` (a rewritten sandbox trace
asking for 2**62 fuel and 4 GiB made replay allocate 2.59 GB and spin), and a call the cap
stops is a ``ReplayLimitExceeded`` naming the limit to raise, not a divergence. A component
named by the trace is opened without blocking, must be a regular file no larger than
``ReplayLimits.component_bytes`` (and of the recorded size), and must start with the wasm
magic, all before it is read whole.
"""

from __future__ import annotations

import bisect
import hashlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import cbor2

from mighty._errors import BadInput, HostError, MightyError
from mighty._files import FileRefused, read_regular_file
from mighty.abi import Err, Ok, Some, Variant
from mighty.budget import DEFAULT_FUEL, DEFAULT_MEMORY, Budget
from mighty.engine import Component, ComponentStore
from mighty.gate import (
    Binding,
    Gate,
    GuestContext,
    GuestViolation,
    Handle,
    ResourceKind,
    request_exit,
    resource_kind,
)
from mighty.instance import Instance, default_gate
from mighty.trace._emit import Refused, canonical_record, emit
from mighty.trace._errors import TraceInvalid
from mighty.trace._format import TraceReader
from mighty.trace._recorder import to_refs
from mighty.trace._values import HandleRef, encode_value, handle_ref

__all__ = [
    "DEFAULT_REPLAY_LIMITS",
    "InstanceReport",
    "NondeterminismError",
    "ReplayAborted",
    "ReplayEvent",
    "ReplayLimitExceeded",
    "ReplayLimits",
    "ReplayReport",
    "StateAt",
    "recorded_source",
    "replay_trace",
    "state_at",
]

_INTERRUPTIONS = ("deadline_exceeded", "cancelled")
_BUDGET_FAILURES = ("out_of_fuel", "out_of_memory", "deadline_exceeded")
_WASM_MAGIC = b"\x00asm"


@dataclass(frozen=True, slots=True)
class ReplayLimits:
    """The most a replay grants, whatever the trace asks: each recorded budget is capped here.

    ``fuel`` and ``memory`` per call (``memory`` also per instance), ``timeout`` seconds per
    call, ``component_bytes`` the largest component file a trace may make the replayer read.
    ``timeout_from_trace=False`` gives every call ``timeout`` whatever the trace recorded: the
    debugger's calls stop at its prompt for as long as a person reads, and a recorded deadline
    is replayed by stopping at the call's last recorded import, not by the clock.
    """

    fuel: int = DEFAULT_FUEL
    memory: int = DEFAULT_MEMORY
    timeout: float = 60.0
    component_bytes: int = 256 << 20
    timeout_from_trace: bool = True

    def __post_init__(self) -> None:
        Budget(fuel=self.fuel, memory=self.memory, timeout=self.timeout)  # same validation
        if type(self.component_bytes) is not int or self.component_bytes <= 0:
            raise BadInput(f"component_bytes must be a positive int, got {self.component_bytes}")

    def cap(self, recorded: dict[str, Any], offset: int) -> tuple[Budget, bool]:
        """The budget to run under for ``recorded``, and whether the cap lowered it."""
        try:
            asked = Budget(**recorded)
        except (TypeError, ValueError) as exc:
            raise TraceInvalid(f"record at byte {offset}: budget {exc}", offset=offset) from None
        granted = Budget(
            fuel=min(asked.fuel, self.fuel),
            memory=min(asked.memory, self.memory),
            timeout=min(asked.timeout, self.timeout) if self.timeout_from_trace else self.timeout,
        )
        return granted, granted != asked


DEFAULT_REPLAY_LIMITS = ReplayLimits()


class ReplayLimitExceeded(HostError):
    """A replayed call hit the replayer's own limit, below the budget the trace recorded."""

    kind = "replay_limit"


class NondeterminismError(HostError):
    """The replayed guest did something other than what the trace recorded."""

    kind = "nondeterminism"

    def __init__(self, message: str, *, instance: int, step: int, expected: Any, got: Any) -> None:
        super().__init__(message)
        self.instance = instance
        self.step = step
        self.expected = expected
        self.got = got


@dataclass(frozen=True)
class ReplayEvent:
    """One point of a replay, as an observer (the debugger) sees it.

    ``kind`` is ``call`` (an export is about to be called), ``import`` (the guest made a recorded
    import; ``result`` is what it gets back) or ``export`` (the export returned ``result``).
    ``offset`` is the byte offset of its record in the trace: records are appended in the order
    they happened across every instance of the run, so ``offset`` orders events globally;
    ``agent`` is the address the instance had, when it was an agent.
    """

    index: int
    instance: int
    step: int
    kind: str
    interface: str
    function: str
    args: Any
    result: Any = None
    fuel: int | None = None
    offset: int = -1
    agent: str | None = None
    source: tuple[str, int, str] | None = None
    """For an import: the guest's ``(file, line, function)`` as recorded (``"src"``), if any."""


class ReplayAborted(Exception):
    """Raise from an observer to end the replay at once."""


Observer = Callable[[ReplayEvent], None]

Progress = Callable[[str], None]
"""Receives a line when a wait starts (compiling a component the cache does not hold: a
minute for a large one) and ``done in N s`` when it ends."""


def _stderr_progress(message: str) -> None:
    # The default, as the sandbox's: a replay that compiles for a minute says so, terminal or not.
    with suppress(OSError, ValueError):
        print(f"mighty.trace: {message}", file=sys.stderr, flush=True)


class _StopReplay(Exception):
    """Stops a guest at the point a recorded interruption happened."""


@dataclass
class InstanceReport:
    """What was replayed of one instance."""

    instance: int
    component: str
    exports: int = 0
    imports: int = 0
    interrupted: list[str] = field(default_factory=list)


@dataclass
class ReplayReport:
    """The outcome of a successful replay: counts and a digest of everything replayed."""

    path: Path
    digest: str
    instances: list[InstanceReport]
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "digest": self.digest,
            "truncated": self.truncated,
            "instances": [
                {
                    "instance": r.instance,
                    "component": r.component,
                    "exports": r.exports,
                    "imports": r.imports,
                    "interrupted": r.interrupted,
                }
                for r in self.instances
            ],
        }


class _Stub:
    """Stands in for a host object during replay (nothing real is ever opened)."""

    __slots__ = ("ref",)

    def __init__(self, ref: HandleRef) -> None:
        self.ref = ref

    def close(self) -> None:
        return None


def _kind_named(interface: str, name: str) -> ResourceKind:
    kind = resource_kind(interface, name)
    if kind is not None:
        return kind
    raise NondeterminismError(
        f"the trace names a resource {interface}/{name} that this host does not define",
        instance=0,
        step=0,
        expected=f"{interface}/{name}",
        got=None,
    )


def _materialize(ctx: GuestContext, value: Any) -> Any:
    """A recorded result with every HandleRef turned into a fresh stand-in resource."""
    if isinstance(value, HandleRef):
        return ctx.new(_kind_named(value.interface, value.name), _Stub(value))
    if isinstance(value, list):
        return [_materialize(ctx, v) for v in value]
    if isinstance(value, tuple):
        return tuple(_materialize(ctx, v) for v in value)
    if isinstance(value, Ok):
        return Ok(_materialize(ctx, value.value))
    if isinstance(value, Err):
        return Err(_materialize(ctx, value.value))
    if isinstance(value, Some):
        return Some(_materialize(ctx, value.value))
    if isinstance(value, Variant):
        return Variant(value.case, _materialize(ctx, value.value))
    if isinstance(value, dict):
        return {k: _materialize(ctx, v) for k, v in value.items()}
    return value


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the trace holds it (without the offset ``_group`` added)."""
    return {k: v for k, v in record.items() if k != "@"}


def _canonical(value: Any) -> bytes:
    # emit(canonical=True) is byte for byte the reference below (tests/trace/test_emit.py),
    # in one pass; the reference stays for what emit refuses (it raises the same errors).
    try:
        return emit(value, canonical=True)
    except Refused:
        return cbor2.dumps(encode_value(value), canonical=True)


class _Sequencer:
    """Lets the instances of a replay, each on its own thread, pass their events in the order
    the trace recorded them across the run (``order="recorded"``).

    Each instance has a cursor: the offset of the next record it may pass (exact while it waits
    at one, a lower bound while its guest runs between two). An instance passes the event at
    ``offset`` once every other instance's cursor is beyond it, so exactly one event is in
    flight at a time and the observer sees them by offset. A record that is never an event (a
    close, a call the trace ends inside) holds no one up: the cursor moves past it when its
    instance passes the next event or finishes. After a failure every waiting instance is
    stopped with :class:`ReplayAborted`.
    """

    def __init__(self, groups: dict[int, list[dict[str, Any]]]) -> None:
        self._cond = threading.Condition()
        self._offsets = {i: [int(r["@"]) for r in records] for i, records in groups.items()}
        self._cursor = {i: offsets[0] for i, offsets in self._offsets.items()}
        self.failed = False

    def wait(self, instance: int, offset: int) -> None:
        with self._cond:
            self._cursor[instance] = offset
            self._cond.notify_all()
            while not self.failed and any(
                at < offset for other, at in self._cursor.items() if other != instance
            ):
                self._cond.wait()
            if self.failed:
                raise ReplayAborted

    def passed(self, instance: int, offset: int) -> None:
        offsets = self._offsets[instance]
        at = bisect.bisect_right(offsets, offset)
        with self._cond:
            self._cursor[instance] = offsets[at] if at < len(offsets) else _END
            self._cond.notify_all()

    def finished(self, instance: int, failed: bool) -> None:
        with self._cond:
            self._cursor[instance] = _END
            self.failed = self.failed or failed
            self._cond.notify_all()


_END = 1 << 62


def recorded_source(src: Any) -> tuple[str, int, str] | None:
    """A recorded ``"src"`` as ``(file, line, function)``, bounded as the gate bounds it; None
    for anything else (a trace is hostile input: the field is shown, never trusted)."""
    if type(src) is not list or len(src) != 3:
        return None
    file, line, function = src
    if type(file) is not str or type(line) is not int or type(function) is not str:
        return None
    # The gate's bounds (mighty.gate's _source.py: 160 and 80 characters), again here.
    if len(file) > 160:
        file = "..." + file[-157:]
    if len(function) > 80:
        function = function[:77] + "..."
    return file, min(max(line, 0), 0xFFFFFFFF), function


class _Replayer:
    """The gate hook answering one instance's imports from its recorded records."""

    def __init__(
        self,
        instance: int,
        observer: Observer | None,
        counter: list[int],
        canonical: dict[int, tuple[dict[str, Any], bytes]] | None = None,
        sequencer: _Sequencer | None = None,
        agent: str | None = None,
        *,
        positions: bool = False,
    ) -> None:
        self.instance = instance
        self.sequencer = sequencer
        self.agent = agent
        # ``mighty:agent/debug#positions`` answers what it answered when recorded (the
        # guest's work, and fuel, depend on it); ``at`` is not a hook's business here.
        self.keeps_positions = positions
        # Import records' canonical bytes as the reader worked them out, by the record's id.
        self.canonical = canonical if canonical is not None else {}
        self.observer = observer
        self.counter = counter
        self.expected: deque[dict[str, Any]] = deque()
        self.stop_when_empty = False
        self.digest = hashlib.sha256()
        self.imports = 0
        self.streams: dict[int, str] = {}
        self.output: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def __call__(
        self,
        ctx: GuestContext,
        binding: Binding,
        args: Sequence[Any],
        call: Callable[[], Any],
    ) -> Any:
        if not self.expected:
            got = {"if": binding.interface, "fn": binding.name, "args": _refs(args)}
            if self.stop_when_empty:
                raise _StopReplay
            raise NondeterminismError(
                f"instance {self.instance}: the guest called {binding.interface}#{binding.name} "
                "after the last recorded import",
                instance=self.instance,
                step=-1,
                expected=None,
                got=got,
            )
        record = self.expected.popleft()
        # The value encoding is lossless, so equal values compare equal; only NaN needs bytes.
        # ``_same_args`` is ``record["args"] == _refs(args)`` without building the list.
        if not (
            record["fn"] == binding.name
            and record["if"] == binding.interface
            and _same_args(record["args"], args)
        ):
            got_args = _refs(args)
            want = {"if": record["if"], "fn": record["fn"], "args": record["args"]}
            got = {"if": binding.interface, "fn": binding.name, "args": got_args}
            if want != got and _canonical(want) != _canonical(got):
                raise NondeterminismError(
                    f"instance {self.instance} step {record['s']}: the trace has "
                    f"{record['if']}#{record['fn']}{_brief(record['args'])}, the guest called "
                    f"{binding.interface}#{binding.name}{_brief(got['args'])}",
                    instance=self.instance,
                    step=int(record["s"]),
                    expected=want,
                    got=got,
                )
        self.imports += 1
        src = record.get("src")
        if "src" in record:
            # A source position is not part of what the run did: the digest leaves it out.
            record = {k: v for k, v in record.items() if k != "src"}
            fast: bytes | None = canonical_record(record, "@")
        else:
            known = self.canonical.get(id(record))
            if known is not None and known[0] is record:
                fast = known[1]
            else:
                fast = canonical_record(record, "@")
        self.digest.update(fast if fast is not None else _canonical(_plain(record)))
        result = record["res"]
        if self.observer is not None:
            self.notify(
                "import",
                record["s"],
                record["if"],
                record["fn"],
                _refs(args),
                result,
                record.get("fuel"),
                record["@"],
                src,
            )
        if binding.name in _OUTPUT_NAMES:
            self._track_output(binding.name, _refs(args), result)
        outcome = record["out"]
        if outcome != "ok":
            if outcome == "exit":
                request_exit(int(result))
            if outcome == "violation":
                raise GuestViolation(str(result))
            if outcome == "host_error":
                raise _RecordedHostError(str(result))
        t = type(result)
        if (
            t in _AS_RECORDED
            or (t is Ok and type(result.value) in _AS_RECORDED)
            or (t is dict and all(type(v) in _AS_RECORDED for v in result.values()))
        ):
            return result  # nothing in it to stand in for (a dict: a WIT record of plain values)
        return _materialize(ctx, result)

    def notify(
        self,
        kind: str,
        step: Any,
        interface: str,
        function: str,
        args: Any,
        result: Any = None,
        fuel: Any = None,
        offset: int = -1,
        src: Any = None,
    ) -> None:
        if self.observer is None:
            return
        sequencer = self.sequencer
        if sequencer is not None:
            sequencer.wait(self.instance, offset)
        self.counter[0] += 1
        try:
            self.observer(
                ReplayEvent(
                    self.counter[0],
                    self.instance,
                    int(step),
                    kind,
                    interface,
                    function,
                    args,
                    result,
                    fuel if isinstance(fuel, int) else None,
                    offset,
                    self.agent,
                    recorded_source(src),
                )
            )
        finally:
            if sequencer is not None:
                sequencer.passed(self.instance, offset)

    def _track_output(self, name: str, args: list[Any], result: Any) -> None:
        # Rebuild stdout/stderr from the writes on the streams get-stdout/get-stderr returned.
        if name in ("get-stdout", "get-stderr") and isinstance(result, HandleRef):
            self.streams[result.rep] = name[4:]
        elif (
            name
            in (
                "[method]output-stream.write",
                "[method]output-stream.blocking-write-and-flush",
            )
            and args
            and isinstance(args[0], HandleRef)
        ):
            stream = self.streams.get(args[0].rep)
            if stream is not None and isinstance(args[1], bytes | bytearray):
                self.output[stream] += args[1]


_OUTPUT_NAMES = frozenset(
    {
        "get-stdout",
        "get-stderr",
        "[method]output-stream.write",
        "[method]output-stream.blocking-write-and-flush",
    }
)
# Results handed back as the trace holds them: nothing in them to turn into a stand-in.
_AS_RECORDED = frozenset({bytes, int, str, bool, float, type(None)})
_PLAIN_ARGS = frozenset({bytes, int, str, bool, type(None), float})


def _same_args(recorded: Any, args: Sequence[Any]) -> bool:
    """``recorded == _refs(args)``, as list equality decides it (each pair by identity, then
    ``==``), for a flat argument list of plain values and Handles; anything else by
    ``to_refs``."""
    if type(recorded) is not list or len(recorded) != len(args):
        return bool(recorded == _refs(args))
    for want, value in zip(recorded, args, strict=True):
        t = type(value)
        if t is Handle:
            # handle_ref(...) == want: a HandleRef of the same three fields.
            kind = value.kind
            if not (
                type(want) is HandleRef
                and want.rep == value.rep
                and want.name == kind.name
                and want.interface == kind.interface
            ):
                return False
        elif t in _PLAIN_ARGS:
            if not (want is value or want == value):
                return False
        else:
            got = to_refs(value)
            if not (want is got or want == got):
                return False
    return True


def _refs(args: Sequence[Any]) -> list[Any]:
    """``to_refs(list(args))``: a flat argument list of plain values and Handles (what most
    imports take) converted in one loop, anything else by ``to_refs``."""
    out = []
    for value in args:
        t = type(value)
        if t in _PLAIN_ARGS:
            out.append(value)
        elif t is Handle:
            out.append(handle_ref(value.kind.interface, value.kind.name, value.rep))
        else:
            out.append(to_refs(value))
    return out


class _RecordedHostError(Exception):
    """A host function failed in the recorded run; it fails again, at the same point."""


def _brief(args: Any) -> str:
    text = repr(args)
    return "(" + (text[1:-1] if len(text) <= 120 else text[1:117] + "...") + ")"


def _group(
    reader: TraceReader,
    canonical: dict[int, tuple[dict[str, Any], bytes]] | None = None,
) -> dict[int, list[dict[str, Any]]]:
    """Records by instance, each with ``"@"``: its frame's byte offset (for error messages).

    ``canonical`` gets the canonical bytes the reader worked out, with the record, by the
    record's ``id`` (the replayer digests them).

    Rejected: loading the first instance's component on a thread while the trace is read
    (both halves are mostly Python, and on the 2-CPU machine every hand-off of the GIL
    between the two threads cost more than the overlap saved: the replay of the probe's trace
    took 140 ms with it and 121 ms without, the plain run 97 ms, medians of 15 interleaved)."""
    by_instance: dict[int, list[dict[str, Any]]] = {}
    records = reader.records(schema=True, canonical=canonical is not None)
    for record in records:
        instance = record.get("i")
        if type(instance) is int:
            record["@"] = reader.record_offset
            by_instance.setdefault(instance, []).append(record)
            if canonical is not None and reader.record_canonical is not None:
                canonical[id(record)] = record, reader.record_canonical
    return by_instance


def _mismatch(instance: int, step: int, what: str, expected: Any, got: Any) -> NondeterminismError:
    # Name the part that differs (``res.words[2]``) with its two values, not the whole outcome
    # records (``{'ok': True, 'res': {...}, 'error': None}``) side by side; the whole values
    # stay on the error (``expected``, ``got``) for --json.
    found = _difference(expected, got)
    if found is not None and found[0]:
        where, want, have = found
        detail = f"{where} differs: the trace has {_shown(want)}, the replay gave {_shown(have)}"
    else:
        detail = f"the trace has {_shown(expected)}, the replay gave {_shown(got)}"
    return NondeterminismError(
        f"instance {instance} step {step}: {what}: {detail}",
        instance=instance,
        step=step,
        expected=expected,
        got=got,
    )


def _shown(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _difference(a: Any, b: Any, path: str = "", depth: int = 0) -> tuple[str, Any, Any] | None:
    """The first place ``a`` and ``b`` differ, as ``(path, a's value, b's value)``; None when
    equal. An outcome's ``ok``/``res``/``error`` keys, a record's fields and list indexes make
    the path (``res.total``, ``args[1]``)."""
    if depth > 32 or type(a) is not type(b):
        return None if a == b else (path, a, b)
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return (_join(path, key), a.get(key, "(absent)"), b.get(key, "(absent)"))
            found = _difference(a[key], b[key], _join(path, key), depth + 1)
            if found is not None:
                return found
        return None
    if isinstance(a, list | tuple):
        for index, (x, y) in enumerate(zip(a, b, strict=False)):
            found = _difference(x, y, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
        if len(a) != len(b):
            return (f"{path} length" if path else "length", len(a), len(b))
        return None
    return None if a == b else (path, a, b)


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def replay_trace(
    path: str | Path,
    *,
    instance: int | None = None,
    components: dict[str, Path] | None = None,
    substitute: str | Path | None = None,
    observer: Observer | None = None,
    limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
    agent: str | Sequence[str] | None = None,
    component_dirs: Sequence[Path] = (),
    store: ComponentStore | None = None,
    progress: Progress | None = None,
    order: Literal["instance", "recorded"] = "instance",
) -> ReplayReport:
    """Replay a trace (or one instance of it); return the report or raise on divergence.

    Components are found by their recorded sha256, in this order: the component store
    (``store``, default the cache's), the absolute path recorded in the trace, ``components``
    (sha256 -> path), then any ``.wasm`` in ``component_dirs`` of the recorded size; their
    bytes must hash to the recorded sha256. ``agent`` (an address ``kv:3`` or a registered
    name, or several: a sub-graph) replays only those agents' instances, every restart and swap
    of each, in order; a name the trace does not hold is an error. Every import is answered
    from the trace, so agents replayed together get each other's messages as recorded.
    ``substitute`` replays every instance against that component instead (a new build): the
    report is then where it diverges.
    ``observer`` sees every call, import and export as it is replayed (the debugger pauses
    there); raising :class:`ReplayAborted` from it ends the replay. ``order="recorded"`` runs
    the instances side by side, one thread each, and shows the observer their events in the
    order the trace recorded them across the run (an ask's callee handles the message
    between the asker's call and its ask import); ``"instance"`` (the default) replays one
    instance after another. The digest is the same either way. ``limits`` caps every
    recorded budget and the component files read (see :class:`ReplayLimits`). ``progress``
    hears about the compile of a component the cache does not hold (default: to stderr).
    """
    report_to = progress or _stderr_progress
    canonical: dict[int, tuple[dict[str, Any], bytes]] = {}
    with TraceReader(path) as reader:
        groups = _group(reader, canonical)
        truncated = reader.truncated
    if not groups:
        raise TraceInvalid(
            f"{path} holds no instance to replay (no record with an int instance id)", offset=-1
        )
    if instance is not None:
        if instance not in groups:
            raise HostError(f"the trace has no instance {instance} (it has {sorted(groups)})")
        groups = {instance: groups[instance]}
    if agent is not None:
        groups = _agent_groups(groups, agent)
    _check_heads(groups)
    counter = [0]
    sequencer = _Sequencer(groups) if order == "recorded" and observer is not None else None
    replayers: dict[int, _Replayer] = {}
    reports: dict[int, InstanceReport] = {}
    for instance_id, records in groups.items():
        head = records[0]
        agent_of = head.get("a")
        replayers[instance_id] = _Replayer(
            instance_id,
            observer,
            counter,
            canonical,
            sequencer,
            agent_of if isinstance(agent_of, str) else None,
            positions=head.get("positions") is True,
        )
        reports[instance_id] = InstanceReport(instance_id, head["component"])

    def load(head: dict[str, Any]) -> Component:
        if substitute:
            return _read_component(Path(substitute), None, limits, report_to)
        return _load(head, components, limits, component_dirs, store, report_to)

    shared = _Loaded("" if substitute else None, load)

    def one(instance_id: int) -> None:
        records = groups[instance_id]
        head = records[0]
        component = shared.get(head)
        replayer = replayers[instance_id]
        steps = deque(records[1:])
        # Imports made while instantiating come before the first call record.
        while steps and steps[0]["k"] == "import":
            replayer.expected.append(steps.popleft())
        budget, _ = limits.cap(head["budget"], head["@"])
        live = Instance(component, budget=budget, hooks=[replayer], gate=_replay_gate(component))
        live.context.replaying = True
        try:
            _replay_calls(live, replayer, steps, reports[instance_id], limits)
        finally:
            live.close()

    if sequencer is None:
        for instance_id in groups:
            one(instance_id)
    else:
        _run_side_by_side(groups, one, sequencer)
    total = hashlib.sha256()
    for instance_id in groups:
        total.update(replayers[instance_id].digest.digest())
    if not any(r.exports or r.imports for r in reports.values()):
        raise TraceInvalid(f"{path} holds no call to replay", offset=-1)
    return ReplayReport(Path(path), total.hexdigest(), list(reports.values()), truncated)


@dataclass(frozen=True)
class StateAt:
    """What :func:`state_at` found: ``state`` (the bytes ``snapshot`` returned) or ``why``
    there is none; ``exports`` is how many of the instance's export calls were replayed."""

    state: bytes | None
    why: str
    exports: int


def state_at(
    path: str | Path,
    instance: int,
    before: int,
    *,
    limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
    component_dirs: Sequence[Path] = (),
    store: ComponentStore | None = None,
    progress: Progress | None = None,
) -> StateAt:
    """The state ``instance`` had at byte offset ``before`` of the trace: a fresh instance of
    its recorded component replays the export calls that ended before that point (checked as
    any replay), then its ``snapshot`` export is called (any import it makes is refused).

    The instance the debugger is stepping through is never asked: a ``snapshot`` call there
    would run guest code the recording did not, and its fuel and heap would differ after."""
    with TraceReader(path) as reader:
        groups = _group(reader)
    records = groups.get(instance)
    if not records or records[0].get("k") != "instance":
        raise HostError(f"the trace has no instance {instance}")
    head = records[0]
    steps = deque(r for r in records[1:] if int(r["@"]) < before)
    for record in steps:
        if record["k"] == "export" and not record["ok"]:
            kind = (record.get("error") or {}).get("kind", "failed")
            return StateAt(None, f"the instance failed in {record['fn']} ({kind}) by then", 0)
    if not any(record["k"] == "export" for record in steps):
        return StateAt(None, "no export call (init) has finished by then", 0)
    component = _load(head, None, limits, component_dirs, store, progress or _stderr_progress)
    if "snapshot" not in component.export_functions():
        return StateAt(None, "the component exports no snapshot", 0)
    replayer = _Replayer(instance, None, [0], positions=head.get("positions") is True)
    report = InstanceReport(instance, head["component"])
    while steps and steps[0]["k"] == "import":
        replayer.expected.append(steps.popleft())
    budget, _ = limits.cap(head["budget"], head["@"])
    live = Instance(component, budget=budget, hooks=[replayer], gate=_replay_gate(component))
    live.context.replaying = True
    try:
        _replay_calls(live, replayer, steps, report, limits)
        replayer.expected.clear()  # imports of a call still in flight at ``before``
        replayer.stop_when_empty = False
        try:
            state = live.call("snapshot", budget=Budget(fuel=limits.fuel, memory=limits.memory))
        except MightyError as exc:
            return StateAt(None, f"snapshot failed: {exc.message}", report.exports)
    finally:
        live.close()
    return StateAt(bytes(state), "", report.exports)


class _Loaded:
    """One load per component, shared by its instances (a restarted agent, several agents of
    one type): side by side, each replay thread would otherwise read and map its own copy (the
    three relays of tests/trace/agents took 345 MB and 0.6 s that way, 143 MB and 0.3 s
    shared). ``key`` fixes the key (a substitute is one component for every instance)."""

    def __init__(self, key: str | None, load: Callable[[dict[str, Any]], Component]) -> None:
        self._key = key
        self._load = load
        self._loaded: dict[str, Component] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def get(self, head: dict[str, Any]) -> Component:
        key = self._key if self._key is not None else str(head["component"])
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            component = self._loaded.get(key)
            if component is None:
                component = self._loaded[key] = self._load(head)
            return component


def _check_heads(groups: dict[int, list[dict[str, Any]]]) -> None:
    for instance_id, records in groups.items():
        head = records[0]
        if head.get("k") != "instance":
            raise TraceInvalid(
                f"instance {instance_id} has no start record in the trace (its first record,"
                f" at byte {head['@']}, is {head['k']!r})",
                offset=head["@"],
            )


def _run_side_by_side(
    groups: dict[int, list[dict[str, Any]]],
    one: Callable[[int], None],
    sequencer: _Sequencer,
) -> None:
    """Replay every instance on its own thread, in step through ``sequencer``; raise the
    first failure (a divergence before the aborts it caused in the other instances)."""
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def run(instance_id: int) -> None:
        failed = False
        try:
            one(instance_id)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failed = True
            with lock:
                failures.append((instance_id, exc))
        finally:
            sequencer.finished(instance_id, failed)

    threads = [
        threading.Thread(target=run, args=(i,), name=f"mighty-replay-{i}", daemon=True)
        for i in groups
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        real = [exc for _, exc in failures if not isinstance(exc, ReplayAborted)]
        raise (real or [failures[0][1]])[0]


def _unanswerable(ctx: GuestContext, *args: Any) -> Any:
    raise HostError("an import outside the trace reached its stand-in host function")


class _StandIns:
    """Stand-in functions for imports no provider implements (``mighty:sandbox/tools``, ...):
    the replayer answers every import from the trace, so they only have to exist to link."""

    name = "replay.stand-ins"

    def __init__(self, component: Component, missing: Sequence[str]) -> None:
        from wasmtime import component as wc

        from mighty.engine import get_engine
        from mighty.gate import unversioned

        engine = get_engine()
        imports = component.wasm.type.imports(engine)
        self._bindings: list[Binding] = []
        # Interfaces that only define types (mighty:agent/types) link as empty instances.
        self.type_interfaces = tuple(unversioned(name) for name in missing)
        for name in missing:
            item = imports[name].ty if hasattr(imports[name], "ty") else imports[name]
            if not isinstance(item, wc.ComponentInstanceType):
                continue
            for func, extern in item.exports(engine).items():
                ty = extern.ty if hasattr(extern, "ty") else extern
                if isinstance(ty, wc.FuncType):
                    self._bindings.append(Binding(unversioned(name), func, _unanswerable))

    def resources(self) -> list[ResourceKind]:
        return []

    def bindings(self) -> list[Binding]:
        return self._bindings

    def setup(self, ctx: GuestContext) -> None:
        pass


def _replay_gate(component: Component) -> Gate | None:
    """The default gate, plus stand-ins for whatever else the component imports."""
    base = default_gate()
    missing = base.missing(component.imports)
    if not missing:
        return None
    return Gate([*base.providers, _StandIns(component, missing)])


def _replay_calls(
    live: Any,
    replayer: _Replayer,
    steps: deque[dict[str, Any]],
    report: InstanceReport,
    limits: ReplayLimits,
) -> None:
    instance_id = replayer.instance
    if replayer.expected:
        raise _mismatch(instance_id, 0, "imports while instantiating", len(replayer.expected), 0)
    try:
        while steps:
            record = steps.popleft()
            if record["k"] == "close":
                _check_close(replayer, record)
                continue
            if record["k"] != "call":
                step = int(record.get("s", -1))
                raise _mismatch(instance_id, step, "record order", "call", record["k"])
            while steps and steps[0]["k"] == "import":
                replayer.expected.append(steps.popleft())
            if not steps or steps[0]["k"] != "export":
                return  # the trace ends inside this call (a crash or a cut file)
            _replay_export(live, replayer, record, steps.popleft(), report, limits)
    finally:
        report.imports = replayer.imports


def _check_close(replayer: _Replayer, record: dict[str, Any]) -> None:
    for stream in ("stdout", "stderr"):
        replayed = bytes(replayer.output[stream])
        if replayed != bytes(record[stream]):
            raise _mismatch(
                replayer.instance, -1, f"{stream} bytes", bytes(record[stream]), replayed
            )
    replayer.digest.update(_canonical(_plain(record)))


def _replay_export(
    live: Any,
    replayer: _Replayer,
    record: dict[str, Any],
    end: dict[str, Any],
    report: InstanceReport,
    limits: ReplayLimits,
) -> None:
    instance_id = replayer.instance
    interrupted = not end["ok"] and (end.get("error") or {}).get("kind") in _INTERRUPTIONS
    replayer.stop_when_empty = interrupted
    report.exports += 1
    replayer.notify("call", record["s"], "", record["fn"], record["args"], offset=record["@"])
    outcome: dict[str, Any]
    budget, capped = limits.cap(record["budget"], record["@"])
    try:
        value = live.call(record["fn"], *_materialize(live.context, record["args"]), budget=budget)
        outcome = {"ok": True, "res": value, "error": None}
    except NondeterminismError:
        raise
    except MightyError as exc:
        if isinstance(exc.__cause__, ReplayAborted | NondeterminismError):
            # Raised inside an import: the gate stopped the guest; pass it on as it was.
            raise exc.__cause__ from None
        stopped = isinstance(exc.__cause__, _StopReplay)
        if interrupted and (stopped or exc.kind in (*_INTERRUPTIONS, "out_of_fuel")):
            # Stopped where the recorded run was interrupted; everything before matched.
            report.interrupted.append(record["fn"])
            replayer.stop_when_empty = False
            return
        recorded_kind = (end.get("error") or {}).get("kind")
        if capped and exc.kind in _BUDGET_FAILURES and exc.kind != recorded_kind:
            raise ReplayLimitExceeded(
                f"instance {instance_id} step {record['s']}: {record['fn']} stopped with "
                f"{exc.kind} under the replay limits (fuel {budget.fuel}, memory "
                f"{budget.memory}, timeout {budget.timeout}s); the trace recorded "
                f"{record['budget']}: raise --max-fuel/--max-memory/--timeout to replay it"
            ) from exc
        outcome = {"ok": False, "res": None, "error": {"kind": exc.kind, "message": exc.message}}
    if replayer.expected:
        nxt = replayer.expected[0]
        raise _mismatch(
            instance_id,
            int(nxt["s"]),
            "the export returned before this import",
            f"{nxt['if']}#{nxt['fn']}",
            "return",
        )
    recorded = {"ok": end["ok"], "res": end["res"], "error": end["error"]}
    step = int(end["s"])
    if outcome["ok"] != recorded["ok"] or _canonical(outcome["res"]) != _canonical(recorded["res"]):
        raise _mismatch(instance_id, step, f"result of {record['fn']}", recorded, outcome)
    if not recorded["ok"] and (outcome["error"] or {}).get("kind") != recorded["error"]["kind"]:
        raise _mismatch(
            instance_id, step, f"failure of {record['fn']}", recorded["error"], outcome["error"]
        )
    usage = live.last_usage
    if end.get("fuel") is not None and usage is not None and usage.fuel != end["fuel"]:
        raise _mismatch(instance_id, step, f"fuel used by {record['fn']}", end["fuel"], usage.fuel)
    replayer.digest.update(_canonical({"export": record["fn"], **recorded}))
    replayer.notify(
        "export",
        step,
        "",
        record["fn"],
        record["args"],
        recorded["res"] if recorded["ok"] else recorded["error"],
        end.get("fuel"),
        end["@"],
    )


def _read_component(
    path: Path, size: int | None, limits: ReplayLimits, progress: Progress | None = None
) -> Component:
    """The component in ``path``, checked before it is read whole: a regular file (opened
    without blocking, so a FIFO cannot hang the replay), at most ``limits.component_bytes``
    (and ``size`` when the trace recorded one), starting with the wasm magic."""
    data = read_regular_file(
        path,
        limits.component_bytes,
        limit_text=f"replay limit of {limits.component_bytes} bytes",
        size=size,
        head=_check_magic,
        head_size=len(_WASM_MAGIC),
    )
    if progress is None:
        return Component.load(data)
    started = time.monotonic()
    said: list[str] = []

    def report(message: str) -> None:
        said.append(message)
        progress(message.replace("<bytes>", str(path)))

    component = Component.load(data, progress=report)
    if said:
        progress(f"done in {time.monotonic() - started:.1f} s")
    return component


def _check_magic(head: bytes) -> None:
    if head != _WASM_MAGIC:
        raise FileRefused("not a wasm file (bad magic)")


def _agent_groups(
    groups: dict[int, list[dict[str, Any]]], agent: str | Sequence[str]
) -> dict[int, list[dict[str, Any]]]:
    """The instances that were agent ``agent`` (by address, else by registered name, else an
    instance number), or any of several agents, in trace order; every one must be there."""
    wanted = [agent] if isinstance(agent, str) else list(agent)
    chosen: set[int] = set()
    for name in wanted:
        by_address = {i for i, r in groups.items() if r[0].get("a") == name}
        found = by_address or {i for i, r in groups.items() if r[0].get("name") == name}
        if not found and name.isdigit() and int(name) in groups:
            found = {int(name)}
        if not found:
            known = sorted({str(r[0]["a"]) for r in groups.values() if r[0].get("a") is not None})
            raise HostError(
                f"the trace has no agent {name!r} (agents: {', '.join(known) or 'none recorded'})"
            )
        chosen |= found
    return {i: r for i, r in groups.items() if i in chosen}


def _load(
    head: dict[str, Any],
    components: dict[str, Path] | None,
    limits: ReplayLimits,
    component_dirs: Sequence[Path] = (),
    store: ComponentStore | None = None,
    progress: Progress | None = None,
) -> Component:
    sha = str(head["component"])
    recorded = head.get("size")
    size = recorded if type(recorded) is int else None
    looked: list[str] = []
    try:
        kept = (store or ComponentStore()).path_for(sha)
    except ValueError:
        kept = None
    candidates: list[Path] = []
    if kept is not None:
        candidates.append(kept)
    if head.get("path") and not str(head["path"]).startswith("<"):
        candidates.append(Path(head["path"]))
    if components and sha in components:
        candidates.append(Path(components[sha]))
    for candidate in candidates:
        if not candidate.exists():
            looked.append(f"{candidate} (absent)")
            continue
        try:
            # Checked before it is read: a regular file, within the limit, of the recorded size.
            loaded = _read_component(candidate, size, limits, progress)
        except HostError as exc:
            looked.append(f"{candidate} ({exc.message})")
            continue
        if loaded.sha256 == sha:
            return loaded
        looked.append(f"{candidate} (not the recorded component: sha256 {loaded.sha256[:12]})")
    for directory in component_dirs:
        looked.append(f"{directory}/*.wasm")
        for candidate in sorted(Path(directory).glob("*.wasm")):
            if candidate.is_file() and (size is None or candidate.stat().st_size == size):
                loaded = _read_component(candidate, size, limits, progress)
                if loaded.sha256 == sha:
                    return loaded
    raise HostError(
        f"cannot find the recorded component {sha[:12]} (looked at: {', '.join(looked)});"
        " pass --component-dir DIR holding it, or --component FILE to replay another build"
    )
