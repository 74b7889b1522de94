"""Answering a *different* build's imports from a trace: while they match, then strict or live.

``replay_trace`` checks that a guest repeats a recording exactly, step for step, fuel included.
Evaluation (``mighty.eval``) asks something weaker: a member is another build (or another
program), so its internal import pattern may differ, and what counts is what it produces. The
:class:`TraceAnswers` hook answers each import the member makes from the recorded imports of one
instance, **by key, not by position**:

- the key of an import is its interface, function and canonical arguments (resources recorded
  by the trace and handed to the member as stand-ins are translated back to the recorded
  references first, so a member that opened them in another order still matches); a caller
  may give its own key function (code mode keys tool calls by name and canonical JSON);
- the n-th identical call is answered with the n-th recorded answer for that key, in recorded
  order; a call past the recorded count does not match (so a loop that asks a tool once more
  than the baseline did is seen);
- imports whose arguments hold a live handle of the member's own (its stdout stream, say), and
  the calls ``passthrough`` names, always go to the real host function: their effect is the
  member's own output, which a comparator judges, not an input of the recorded world.

At the first import that does not match, the policy decides: ``strict`` raises the
:class:`NondeterminismError` ``mty replay`` would (the instance, the step, what the trace has
and what came), and ``live`` calls the real host function for it and every later import,
noting where (:attr:`TraceAnswers.live_from`). ``resume`` is for the same build going on from
where a log stops (a durable agent's message recovered after a crash): live, but only once
every recorded import the guest could have been answered by was used; an import the trace
cannot answer while one is left means the guest did not retrace its steps, and is the
``strict`` divergence; the log's last HTTP request, when its answer was cut short (no
response, or a body read part way), is not answered from it: it goes live, as the import in
flight at a crash does. Which records it counts: not those of imports that always run for real
(``_ALWAYS_LIVE``, ``passthrough``, ``local``, wasi:http with ``http=True``), nor calls on a
resource such an import made (a write to the guest's own stdout), which are never matched.

Rejected: positional matching with skips (a refactor that reads the clock once more would
shift every later answer), and matching by function alone (two different questions to one
tool would get each other's answers). This module is apart from ``_replay.py`` so the replay
path stays what it was: nothing here runs unless a caller builds this hook.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mighty._errors import BadInput
from mighty.abi import Err, Ok, Some, Variant
from mighty.engine import Component
from mighty.gate import Binding, Gate, GuestContext, GuestViolation, Handle, request_exit
from mighty.instance import default_gate
from mighty.trace._format import TraceReader
from mighty.trace._http import HTTP_INTERFACES, RecordedHttp, Unmatched, recorded_exchanges
from mighty.trace._recorder import to_refs
from mighty.trace._replay import (
    NondeterminismError,
    _brief,
    _canonical,
    _group,
    _kind_named,
    _RecordedHostError,
    _StandIns,
    _Stub,
)
from mighty.trace._values import HandleRef

__all__ = [
    "AnswerPolicy",
    "AnsweredImport",
    "LiveFrom",
    "TraceAnswers",
    "answer_gate",
    "read_instances",
]

AnswerPolicy = Literal["strict", "live", "resume"]
"""What happens at the first import the trace cannot answer."""
KeyFunction = Callable[[str, str, list[Any]], Any]
"""``(interface, function, args) -> key``: imports with equal keys are the same question;
``None`` means the default key (interface, function and canonical arguments)."""

_ALWAYS_LIVE = frozenset(
    {
        ("wasi:cli/stdout", "get-stdout"),
        ("wasi:cli/stderr", "get-stderr"),
    }
)


@dataclass(frozen=True, slots=True)
class AnsweredImport:
    """One import the member made: what it asked, what it got, and who answered.

    ``source`` is ``trace`` (a recorded answer), ``live`` (the real host function after the
    run went live) or ``own`` (the member's own effects: its output streams and handles, and
    the imports answered ``local``-ly).
    """

    index: int
    interface: str
    function: str
    args: Any
    result: Any
    source: str


@dataclass(frozen=True, slots=True)
class LiveFrom:
    """Where a ``live`` run left the trace: the member's import ``index`` (1-based) and why."""

    index: int
    interface: str
    function: str
    reason: str


def read_instances(path: str | Path) -> tuple[dict[int, list[dict[str, Any]]], bool]:
    """Every instance's records of the trace at ``path``, schema-checked, and ``truncated``.

    Each record carries ``"@"``, its frame's byte offset. Raises ``TraceCorrupt`` /
    ``TraceInvalid`` for a damaged or malformed trace.
    """
    with TraceReader(path) as reader:
        groups = _group(reader)
        return groups, reader.truncated


def answer_gate(component: Component, base: Gate | None = None) -> Gate:
    """``base`` (default: the default WASI gate) plus stand-ins for every other import of
    ``component``: a stand-in only links; it fails if a call ever reaches it (a ``live`` run
    that leaves the trace on an import nothing here implements, such as ``mighty:agent``)."""
    gate = base or default_gate()
    missing = gate.missing(component.imports)
    if not missing:
        return gate
    return Gate([*gate.providers, _StandIns(component, missing)])


_TOOL_CALLS = {("mighty:agent/tools", "call"), ("mighty:sandbox/tools", "call")}
_MAX_KEYED_JSON = 1 << 20


def _default_key(interface: str, function: str, args: list[Any]) -> Any:
    if (interface.partition("@")[0], function) in _TOOL_CALLS:
        args = _tool_call_args(args)
    return _canonical({"if": interface, "fn": function, "args": args})


def _tool_call_args(args: list[Any]) -> list[Any]:
    """A tool call's ``[name, json]`` with the JSON in canonical form (keys sorted): the same
    call with its keyword arguments in another order is the same call. JSON that does not
    parse, or is over 1 MiB, is keyed by its bytes."""
    if len(args) != 2 or not isinstance(args[1], bytes | bytearray | memoryview):
        return args
    data = bytes(args[1])
    if len(data) > _MAX_KEYED_JSON:
        return args
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return args
    return [args[0], json.dumps(value, sort_keys=True, separators=(",", ":")).encode()]


def _refs_in(value: Any) -> Iterator[tuple[str, str, int]]:
    """The resources a recorded value names (``HandleRef``s), as (interface, name, rep)."""
    if isinstance(value, HandleRef):
        yield (value.interface, value.name, value.rep)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _refs_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _refs_in(item)
    elif isinstance(value, Ok | Err | Some | Variant):
        yield from _refs_in(value.value)


class TraceAnswers:
    """A gate hook answering one instance's imports from its recorded imports, by key.

    ``records`` are the instance's recorded ``import`` records (others are ignored).
    ``policy`` is ``strict``, ``live`` or ``resume`` (see the module note). ``key`` maps an
    import to its matching key (default: interface, function and canonical arguments).
    ``passthrough`` names further imports that always go to the real host function. ``local``
    answers some imports itself, never from the trace, whatever the policy: ``(interface,
    function) -> fn(args)`` (an agent's ``log`` and ``emit`` are its own output, with no host
    to go to outside a runtime).
    """

    def __init__(
        self,
        records: Sequence[dict[str, Any]],
        *,
        instance: int,
        policy: AnswerPolicy = "strict",
        key: KeyFunction | None = None,
        passthrough: Callable[[str, str], bool] | None = None,
        local: Mapping[tuple[str, str], Callable[[list[Any]], Any]] | None = None,
        http: bool = False,
    ) -> None:
        if policy not in ("strict", "live", "resume"):
            raise BadInput(f"policy must be 'strict', 'live' or 'resume', got {policy!r}")
        self.instance = instance
        self.policy: AnswerPolicy = policy
        self._custom_key = key
        self._passthrough = passthrough
        self._local = dict(local or {})
        imports = [r for r in records if r.get("k") == "import"]
        self.http: RecordedHttp | None = None
        """With ``http=True``: the instance's ``HTTP_RESPONDER``, answering its requests from
        the recorded exchanges by request key (see ``_http``); its wasi:http imports then run
        for real, and only the network is answered."""
        if http:
            exchanges = recorded_exchanges(imports)
            if policy == "resume" and exchanges and not exchanges[-1].complete:
                # The request in flight where the log ends (a crash): it was sent, perhaps,
                # but its answer was not all logged, so it is made again, live, like any
                # import in flight; answering it with the part logged would fail it.
                exchanges.pop()
            self.http = RecordedHttp(exchanges, self._http_unmatched)
            imports = [r for r in imports if str(r.get("if")) not in HTTP_INTERFACES]
        self._pending: list[dict[str, Any]] = imports
        self._used = [False] * len(self._pending)
        self._by_key: dict[Any, deque[int]] = {}
        self._counted = [False] * len(self._pending)
        """For ``resume``: records a retracing guest must use before anything goes live."""
        stand_ins: set[tuple[str, str, int]] = set()
        for position, record in enumerate(self._pending):
            args = record["args"] if isinstance(record["args"], list) else [record["args"]]
            interface, function = str(record["if"]), str(record["fn"])
            k = self._key(interface, function, args)
            self._by_key.setdefault(k, deque()).append(position)
            if self._answerable(interface, function, args, stand_ins):
                self._counted[position] = True
                stand_ins.update(_refs_in(record.get("res")))
        self._left = sum(self._counted)
        self._stubs: dict[tuple[int, int], HandleRef] = {}
        self._refs: dict[tuple[str, str, int], HandleRef] = {}
        self.calls: list[AnsweredImport] = []
        """Every import the member made, in order."""
        self.live_from: LiveFrom | None = None
        """Set when a ``live`` run left the trace."""
        self.divergence: NondeterminismError | None = None
        """Set when a ``strict`` run met an import the trace cannot answer."""

    def _key(self, interface: str, function: str, args: list[Any]) -> Any:
        if self._custom_key is not None:
            k = self._custom_key(interface, function, args)
            if k is not None:
                return k
        return _default_key(interface, function, args)

    # -- the gate hook ------------------------------------------------------------------------

    def __call__(
        self,
        ctx: GuestContext,
        binding: Binding,
        args: Sequence[Any],
        call: Callable[[], Any],
    ) -> Any:
        index = len(self.calls) + 1
        interface, function = binding.interface, binding.name
        answer = self._local.get((interface, function)) if self._local else None
        if answer is not None:
            refs = to_refs(list(args))
            result = answer(refs)
            self.calls.append(AnsweredImport(index, interface, function, refs, result, "own"))
            return result
        if self.live_from is not None or self._own(interface, function, args):
            result = call()
            source = "live" if self.live_from is not None else "own"
            self.calls.append(
                AnsweredImport(index, interface, function, to_refs(list(args)), result, source)
            )
            return result
        got = [self._recorded_ref(a) for a in to_refs(list(args))]
        queue = self._by_key.get(self._key(interface, function, got))
        if not queue:
            return self._unmatched(ctx, index, interface, function, got, call)
        position = queue.popleft()
        self._used[position] = True
        if self._counted[position]:
            self._left -= 1
        record = self._pending[position]
        outcome = record["out"]
        self.calls.append(AnsweredImport(index, interface, function, got, record["res"], "trace"))
        if outcome == "exit":
            request_exit(int(record["res"]))
        if outcome == "violation":
            raise GuestViolation(str(record["res"]))
        if outcome == "host_error":
            raise _RecordedHostError(str(record["res"]))
        return self._materialize(ctx, record["res"])

    # -- helpers --------------------------------------------------------------------------------

    def _http_unmatched(self, request: Unmatched) -> bool:
        """A request the recording cannot answer: strict notes the divergence and refuses it;
        live sends it to the network (and notes where the run left the trace)."""
        what = request.describe()
        message = f"instance {self.instance}: the trace has no answer for {what}"
        if self.policy == "strict" or (self.policy == "resume" and self._left > 0):
            if self.divergence is None:
                self.divergence = NondeterminismError(
                    message,
                    instance=self.instance,
                    step=-1,
                    expected=None,
                    got={"http": what},
                )
            return False
        if self.live_from is None:
            self.live_from = LiveFrom(
                len(self.calls), "wasi:http/outgoing-handler", "handle", message
            )
        return True

    def _own(self, interface: str, function: str, args: Sequence[Any]) -> bool:
        if (interface, function) in _ALWAYS_LIVE:
            return True
        if self.http is not None and interface in HTTP_INTERFACES:
            return True
        if self._passthrough is not None and self._passthrough(interface, function):
            return True
        return any(self._live_handle(a) for a in args)

    def _live_handle(self, value: Any) -> bool:
        if isinstance(value, Handle):
            return (value.kind.type_id, value.rep) not in self._stubs
        if isinstance(value, list | tuple):
            return any(self._live_handle(v) for v in value)
        return False

    def _recorded_ref(self, value: Any) -> Any:
        if isinstance(value, HandleRef):
            return self._refs.get((value.interface, value.name, value.rep), value)
        if isinstance(value, list):
            return [self._recorded_ref(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._recorded_ref(v) for v in value)
        return value

    def _materialize(self, ctx: GuestContext, value: Any) -> Any:
        """A recorded result with every HandleRef turned into a fresh stand-in resource."""
        if isinstance(value, HandleRef):
            handle = ctx.new(_kind_named(value.interface, value.name), _Stub(value))
            self._stubs[(handle.kind.type_id, handle.rep)] = value
            self._refs[(value.interface, value.name, handle.rep)] = value
            return handle
        if isinstance(value, list):
            return [self._materialize(ctx, v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._materialize(ctx, v) for v in value)
        if isinstance(value, Ok):
            return Ok(self._materialize(ctx, value.value))
        if isinstance(value, Err):
            return Err(self._materialize(ctx, value.value))
        if isinstance(value, Some):
            return Some(self._materialize(ctx, value.value))
        if isinstance(value, Variant):
            return Variant(value.case, self._materialize(ctx, value.value))
        if isinstance(value, dict):
            return {k: self._materialize(ctx, v) for k, v in value.items()}
        return value

    def next_unused(
        self, interface: str, function: str, *, counted: bool = False
    ) -> dict[str, Any] | None:
        """The earliest recorded import not yet answered, of that function if there is one
        (``counted``: only among those ``resume`` counts)."""
        fallback = None
        for position, record in enumerate(self._pending):
            if self._used[position] or (counted and not self._counted[position]):
                continue
            if (record["if"], record["fn"]) == (interface, function):
                return record
            fallback = fallback or record
        return fallback

    def _answerable(
        self, interface: str, function: str, args: list[Any], stand_ins: set[tuple[str, str, int]]
    ) -> bool:
        """Whether a recorded import is one a retracing guest is answered by: not one that
        always runs for real, nor a call on a resource only such an import made."""
        if (interface, function) in _ALWAYS_LIVE or (interface, function) in self._local:
            return False
        if self._passthrough is not None and self._passthrough(interface, function):
            return False
        return all(ref in stand_ins for ref in _refs_in(args))

    def _unmatched(
        self,
        ctx: GuestContext,
        index: int,
        interface: str,
        function: str,
        got: list[Any],
        call: Callable[[], Any],
    ) -> Any:
        resume = self.policy == "resume"
        expected = self.next_unused(interface, function, counted=resume)
        if expected is None:
            message = (
                f"instance {self.instance}: the guest called {interface}#{function}"
                f"{_brief(got)} after the last recorded import"
            )
            step = -1
            want: Any = None
        else:
            step = int(expected["s"])
            message = (
                f"instance {self.instance} step {step}: the trace has "
                f"{expected['if']}#{expected['fn']}{_brief(expected['args'])}, the guest called "
                f"{interface}#{function}{_brief(got)}"
            )
            want = {"if": expected["if"], "fn": expected["fn"], "args": expected["args"]}
        if self.policy == "strict" or (resume and self._left > 0):
            self.divergence = NondeterminismError(
                message,
                instance=self.instance,
                step=step,
                expected=want,
                got={"if": interface, "fn": function, "args": got},
            )
            raise self.divergence
        self.live_from = LiveFrom(index, interface, function, message)
        result = call()
        self.calls.append(AnsweredImport(index, interface, function, got, result, "live"))
        return result
