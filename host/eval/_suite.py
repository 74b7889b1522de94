"""Suites: every case x member cell, run in parallel workers, each with a verdict and evidence.

A cell runs the member against the case's recorded world: the member is instantiated (a
component member) or a fresh interpreter is given its program (a code member), the recorded
export calls are made again with the recorded arguments, and every import is answered by
:class:`mighty.trace.TraceAnswers` from the case's trace while it matches. At the first import
that does not, the cell's policy decides (``strict``: ``diverged``, naming the divergence as
``mty replay`` does; ``live``: that import and every later one go to the real host function or
tool, and the cell says from which import it was live). Then each comparator judges what the
member produced against the baseline.

Verdicts: ``pass`` (every comparator agrees), ``fail`` (one does not: its evidence says what was
expected and what came), ``diverged`` (strict policy, the member asked the world something the
trace cannot answer), ``error`` (the case or member is unusable, or the member trapped, ran out
of fuel, memory or time where the baseline did not: the reason is given). Fuel and wall time are
reported as figures and never change a verdict: a member is another build, and a refactor that
uses more fuel is not wrong.

Every member runs under budgets: each recorded budget, capped by ``ReplayLimits`` (as replay
caps them). Cells are independent (own instance, own store, own answers), so workers run them
on threads; wasm releases the GIL.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal
from xml.sax.saxutils import quoteattr

from mighty._errors import BadInput, MightyError
from mighty.budget import Budget
from mighty.engine import Component
from mighty.eval._case import (
    Case,
    CaseData,
    Member,
    describe_error,
    load_case,
)
from mighty.eval._compare import Comparator, Comparison, Equal
from mighty.eval._outcome import (
    AGENT_HOST,
    TOOLS,
    Outcome,
    canonical_tool_args,
    jsonable,
    tool_calls_of,
)
from mighty.gate import Gate
from mighty.trace import (
    DEFAULT_REPLAY_LIMITS,
    AnswerPolicy,
    NondeterminismError,
    ReplayLimits,
    TraceAnswers,
    answer_gate,
)
from mighty.wasi import HTTP_RESPONDER, HttpPolicy, Policy

__all__ = ["CellResult", "Suite", "SuiteReport", "Verdict"]

Verdict = Literal["pass", "fail", "diverged", "error"]
VERDICTS: tuple[Verdict, ...] = ("pass", "fail", "diverged", "error")
_BUDGET_KINDS = frozenset({"out_of_fuel", "out_of_memory", "deadline_exceeded", "cancelled"})
MAX_WORKERS = 64


class _CellError(Exception):
    """Ends a cell in ``error`` with this reason."""


class _Diverged(Exception):
    def __init__(self, error: NondeterminismError) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass
class CellResult:
    """One cell's verdict and its evidence."""

    case: str
    member: str
    verdict: Verdict
    reason: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    live_from: str | None = None
    fuel: int | None = None
    baseline_fuel: int | None = None
    wall_time: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.case} x {self.member}"

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "member": self.member,
            "verdict": self.verdict,
            "reason": self.reason,
            "comparisons": [c.to_json() for c in self.comparisons],
            "live_from": self.live_from,
            "fuel": self.fuel,
            "baseline_fuel": self.baseline_fuel,
            "wall_time": round(self.wall_time, 6),
        }


@dataclass
class SuiteReport:
    """Every cell's result, in case x member order."""

    cells: list[CellResult]
    wall_time: float
    workers: int

    @property
    def ok(self) -> bool:
        """True only when every cell passed (and there was at least one)."""
        return bool(self.cells) and all(c.verdict == "pass" for c in self.cells)

    def counts(self) -> dict[str, int]:
        return {v: sum(1 for c in self.cells if c.verdict == v) for v in VERDICTS}

    def failing(self) -> list[CellResult]:
        return [c for c in self.cells if c.verdict != "pass"]

    def summary(self) -> str:
        counts = self.counts()
        parts = ", ".join(f"{n} {v}" for v, n in counts.items())
        return f"{len(self.cells)} cells: {parts} ({self.wall_time:.2f} s, {self.workers} workers)"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "wall_time": round(self.wall_time, 6),
            "workers": self.workers,
            "cells": [c.to_json() for c in self.cells],
        }

    def to_junit(self, name: str = "mty eval") -> str:
        """JUnit XML: one testcase per cell (classname the case, name the member)."""
        counts = self.counts()
        lines = [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<testsuites name={quoteattr(name)} tests="{len(self.cells)}" '
            f'failures="{counts["fail"] + counts["diverged"]}" errors="{counts["error"]}" '
            f'time="{self.wall_time:.3f}">',
            f'  <testsuite name={quoteattr(name)} tests="{len(self.cells)}" '
            f'failures="{counts["fail"] + counts["diverged"]}" errors="{counts["error"]}" '
            f'time="{self.wall_time:.3f}">',
        ]
        for cell in self.cells:
            head = (
                f"    <testcase classname={quoteattr(_xml_text(cell.case))} "
                f'name={quoteattr(_xml_text(cell.member))} time="{cell.wall_time:.3f}"'
            )
            body = _junit_body(cell)
            lines.append(head + (">" if body else "/>"))
            if body:
                lines.extend(body)
                lines.append("    </testcase>")
        lines += ["  </testsuite>", "</testsuites>", ""]
        return "\n".join(lines)


def _xml_text(text: str) -> str:
    # XML 1.0 cannot carry most control characters even escaped: show them as \xNN.
    return "".join(
        c
        if c in "\t\n\r" or (ord(c) >= 0x20 and ord(c) not in (0xFFFE, 0xFFFF))
        else f"\\x{ord(c):02x}"
        for c in text
        if not 0xD800 <= ord(c) <= 0xDFFF
    )


def _cdata(text: str) -> str:
    return "<![CDATA[" + _xml_text(text).replace("]]>", "]]]]><![CDATA[>") + "]]>"


def _junit_body(cell: CellResult) -> list[str]:
    figures = f"fuel {cell.fuel} (baseline {cell.baseline_fuel})"
    if cell.live_from:
        figures += f"; {cell.live_from}"
    out = [f"      <system-out>{_cdata(figures)}</system-out>"]
    if cell.verdict == "pass":
        return out
    detail = evidence_text(cell)
    if cell.verdict == "error":
        tag = f'      <error message={quoteattr(_xml_text(cell.reason))} type="error">'
        return [tag + _cdata(detail) + "</error>", *out]
    message = cell.reason or cell.verdict
    tag = f"      <failure message={quoteattr(_xml_text(message))} type={quoteattr(cell.verdict)}>"
    return [tag + _cdata(detail) + "</failure>", *out]


def evidence_text(cell: CellResult) -> str:
    """What was expected and what came, for every comparator that disagreed (bounded)."""
    lines: list[str] = []
    if cell.reason and not any(not c.ok for c in cell.comparisons):
        lines.append(cell.reason)
    for comparison in cell.comparisons:
        if comparison.ok:
            continue
        lines.append(f"{comparison.comparator}: {comparison.summary}")
        if comparison.diff:
            lines.extend("  " + line for line in comparison.diff.splitlines())
        else:
            if comparison.expected:
                lines.append(f"  expected: {comparison.expected}")
            if comparison.got:
                lines.append(f"  got:      {comparison.got}")
    return "\n".join(lines)


class _Once:
    """A value computed once by whichever worker asks first (errors are kept too)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def get(self) -> Any:
        with self._lock:
            if not self._done:
                try:
                    self._value = self._make()
                except Exception as exc:  # noqa: BLE001 - kept, and raised to every cell
                    self._error = exc
                self._done = True
        if self._error is not None:
            raise self._error
        return self._value


def _load_member(
    member: Member, base: Path | None, progress: Callable[[str], None] | None = None
) -> Component:
    if isinstance(member.wasm, Component):
        return member.wasm
    if member.wasm is not None:
        path = Path(member.wasm)
        if not path.is_file():
            raise BadInput(f"member {member.name}: {path}: no such file")
        return Component.load(path, progress=progress)
    assert member.source is not None
    from mighty._resources import agent_sdk, agent_wit
    from mighty.build import build_component

    source = Path(member.source).resolve()
    out = (base or source.parent) / ".mighty" / f"{member.name}.wasm"
    out.parent.mkdir(parents=True, exist_ok=True)
    built = build_component(
        source, output=out, wit=agent_wit(), python_path=[agent_sdk()], progress=progress
    )
    return Component.load(built.path, progress=progress)


class Suite:
    """Cases x members, judged by comparators.

    ``compare``: comparators every cell uses unless its case names its own (default:
    ``Equal()`` on the result). ``policy``: ``strict`` or ``live`` (a case may override it).
    ``workers``: cells run at once (threads). ``limits``: the most any member run may use,
    whatever the trace recorded. Members meet the cases of their kind (components meet
    component cases, programs meet code cases).
    """

    def __init__(
        self,
        cases: Sequence[Case],
        members: Sequence[Member],
        compare: Sequence[Comparator] = (),
        *,
        policy: AnswerPolicy = "strict",
        workers: int = 2,
        limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
        base: Path | None = None,
    ) -> None:
        if policy not in ("strict", "live"):
            raise BadInput(f"policy must be strict or live, got {policy!r}")
        if (
            isinstance(workers, bool)
            or not isinstance(workers, int)
            or not (1 <= workers <= MAX_WORKERS)
        ):
            raise BadInput(f"workers must be an int in 1..{MAX_WORKERS}, got {workers!r}")
        names = [c.name for c in cases]
        if len(set(names)) != len(names):
            raise BadInput("case names must be unique")
        if len({m.name for m in members}) != len(members):
            raise BadInput("member names must be unique")
        self.cases = tuple(cases)
        self.members = tuple(members)
        self.compare = tuple(compare) or (Equal(),)
        self.policy: AnswerPolicy = policy
        self.workers = workers
        self.limits = limits
        self.base = base
        self._lock = threading.Lock()
        self._cases: dict[Case, _Once] = {}

    def _loaded(self, case: Case) -> _Once:
        with self._lock:
            once = self._cases.get(case)
            if once is None:
                once = self._cases[case] = _Once(lambda: load_case(case))
            return once

    def _kind(self, case: Case) -> str | None:
        try:
            data: CaseData = self._loaded(case).get()
        except Exception:  # noqa: BLE001 - an unreadable case is an error cell, decided later
            return None
        return data.kind

    def with_members(self, members: Sequence[Member]) -> Suite:
        """The same cases and comparators with other members."""
        return Suite(
            self.cases,
            members,
            self.compare,
            policy=self.policy,
            workers=self.workers,
            limits=self.limits,
            base=self.base,
        )

    def cells(self) -> list[tuple[Case, Member]]:
        """Every (case, member) pair this suite runs, in order (kinds must agree; a case whose
        trace cannot be read meets every member, and each such cell is an ``error``)."""
        kinds = {case.name: self._kind(case) for case in self.cases}
        return [
            (case, member)
            for case in self.cases
            for member in self.members
            if kinds[case.name] in (None, member.kind)
        ]

    def run(
        self,
        on_cell: Callable[[CellResult], None] | None = None,
        *,
        progress: Callable[[str], None] | None = None,
    ) -> SuiteReport:
        """Run every cell; ``on_cell`` hears each result as it is decided (any thread).

        Component members are built (a ``source``) and compiled first, one at a time, and the
        code-mode interpreter too when a code cell will run, telling ``progress`` about waits
        (the first build of a handler takes tens of seconds): no cell's time includes a build."""
        started = time.monotonic()
        cases = {c.name: self._loaded(c) for c in self.cases}
        members = {
            m.name: _Once(functools.partial(_load_member, m, self.base, progress))
            for m in self.members
        }
        gates: dict[str, _Once] = {}
        gates_lock = threading.Lock()

        def gate_for(component: Component) -> Gate:
            with gates_lock:
                once = gates.setdefault(component.sha256, _Once(lambda: answer_gate(component)))
            gate: Gate = once.get()
            return gate

        def one(cell: tuple[Case, Member]) -> CellResult:
            case, member = cell
            result = self._cell(case, member, cases[case.name], members[member.name], gate_for)
            if on_cell is not None:
                on_cell(result)
            return result

        cells = self.cells()
        for name in dict.fromkeys(m.name for _, m in cells if m.kind == "component"):
            with suppress(Exception):  # a member that cannot load is an error in its cells
                members[name].get()
        if any(m.kind == "code" for _, m in cells):
            from mighty.sandbox import interpreter_component

            with suppress(Exception):  # a cell that needs it reports the failure itself
                interpreter_component(progress)
        if self.workers == 1 or len(cells) <= 1:
            results = [one(c) for c in cells]
        else:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="mty-eval") as pool:
                results = list(pool.map(one, cells))
        return SuiteReport(results, time.monotonic() - started, self.workers)

    def verify_swap(self, agent_type: str, component: Component) -> list[str]:
        """Run the component cases with ``component`` as the only member, each case restricted
        to ``agent_type``'s instances unless it names its agent; return the failing cells
        (``"case: verdict: reason"``), empty when every cell passed. ``runtime.reload(...,
        verify=suite)`` calls this before anything is paused."""
        cases = [
            c if c.agent is not None or c.instance is not None else replace(c, agent=agent_type)
            for c in self.cases
            if self._kind(c) != "code"
        ]
        if not cases:
            return ["the verify suite has no component case"]
        suite = Suite(
            cases,
            [Member.component(f"{agent_type}@{component.sha256[:12]}", component)],
            self.compare,
            policy=self.policy,
            workers=self.workers,
            limits=self.limits,
            base=self.base,
        )
        report = suite.run()
        return [
            f"{c.case}: {c.verdict}: {c.reason or evidence_text(c).splitlines()[0]}"
            for c in report.failing()
        ]

    # -- one cell -------------------------------------------------------------------------------

    def _cell(
        self,
        case: Case,
        member: Member,
        case_once: _Once,
        member_once: _Once,
        gate_for: Callable[[Component], Gate],
    ) -> CellResult:
        started = time.monotonic()
        result = CellResult(case.name, member.name, "error")
        policy = case.policy or self.policy
        try:
            data: CaseData = case_once.get()
            result.baseline_fuel = data.baseline.fuel
            if data.kind != member.kind:
                raise _CellError(f"a {member.kind} member cannot run a {data.kind} case")
            if data.kind == "code":
                got, answers = _run_code(data, member, policy, self.limits)
            else:
                component: Component = member_once.get()
                got, answers = _run_component(
                    data, component, gate_for(component), policy, self.limits
                )
            result.fuel = got.fuel
            went_live = [a for a in answers if a.live_from is not None]
            if went_live:
                result.live_from = _live_text(went_live[0])
            comparators = case.compare or self.compare
            result.comparisons = [c.compare(data.baseline, got) for c in comparators]
            result.verdict = "pass" if all(c.ok for c in result.comparisons) else "fail"
            failed = [c for c in result.comparisons if not c.ok]
            if failed:
                result.reason = "; ".join(f"{c.comparator}: {c.summary}" for c in failed)
        except _Diverged as exc:
            result.verdict = "diverged"
            result.reason = exc.error.message
        except _CellError as exc:
            result.reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - a cell's failure is its verdict; the suite goes on
            result.reason = describe_error(exc)
        result.wall_time = time.monotonic() - started
        return result


def _live_text(answers: TraceAnswers) -> str:
    live = answers.live_from
    assert live is not None
    return (
        f"live from import {live.index} of instance {answers.instance} "
        f"({live.interface}#{live.function})"
    )


def _imports(answers: list[TraceAnswers]) -> list[tuple[str, str, Any]]:
    return [(a.interface, a.function, a.args) for ans in answers for a in ans.calls]


def _failure_kind(exc: MightyError, answers: TraceAnswers) -> str:
    """The kind of a member's failure, or ``_Diverged`` when the answers diverged."""
    if answers.divergence is not None:
        raise _Diverged(answers.divergence)
    cause = exc.__cause__
    if isinstance(cause, NondeterminismError):
        raise _Diverged(cause)
    return exc.kind


def _recorded_http(head: dict[str, Any], instance_id: int) -> HttpPolicy:
    """The HTTP part of the policy the instance was recorded with."""
    described = head.get("policy")
    try:
        return HttpPolicy.from_description(
            described.get("http") if isinstance(described, dict) else None
        )
    except BadInput as exc:
        raise _CellError(f"instance {instance_id}: the recorded HTTP policy: {exc}") from None


def _nothing(_args: list[Any]) -> None:
    return None


# An agent's log lines and events are its own output, not questions to the recorded world: a
# refactor that logs one more line has not diverged. (Outside a runtime they go nowhere.)
_AGENT_OUTPUT = {(AGENT_HOST, "log"): _nothing, (AGENT_HOST, "emit"): _nothing}


def _run_component(
    data: CaseData,
    component: Component,
    gate: Gate,
    policy: AnswerPolicy,
    limits: ReplayLimits,
) -> tuple[Outcome, list[TraceAnswers]]:
    from mighty.instance import Instance

    got = Outcome(fuel=0)
    seen: list[TraceAnswers] = []
    stdout, stderr = bytearray(), bytearray()
    for instance_id, records in data.instances.items():
        head = records[0]
        answers = TraceAnswers(
            records, instance=instance_id, policy=policy, local=_AGENT_OUTPUT, http=True
        )
        seen.append(answers)
        budget, _ = limits.cap(head["budget"], head["@"])
        try:
            live = Instance(
                component,
                budget=budget,
                gate=gate,
                hooks=[answers],
                # The recorded HTTP grants (and secret sources, for live requests); the
                # recorded exchanges answer the member's requests in place of the network.
                policy=Policy(http=_recorded_http(head, instance_id)),
                slots=[] if answers.http is None else [HTTP_RESPONDER.of(answers.http)],
            )
        except MightyError as exc:
            kind = _failure_kind(exc, answers)
            raise _CellError(f"instantiating the member failed: {kind}: {exc.message}") from None
        try:
            ends = {int(r["s"]) - 1: r for r in records if r.get("k") == "export"}
            for record in records:
                if record.get("k") != "call":
                    continue
                end = ends.get(int(record["s"]))
                call_budget: Budget = limits.cap(record["budget"], record["@"])[0]
                try:
                    value = live.call(str(record["fn"]), *record["args"], budget=call_budget)
                except MightyError as exc:
                    kind = _failure_kind(exc, answers)
                    recorded = ((end or {}).get("error") or {}).get("kind")
                    if end is not None and not end.get("ok") and recorded == kind:
                        got.results.append({"fn": record["fn"], "ok": False, "error": kind})
                        break  # failed as the baseline did; the instance is spent
                    where = f"{record['fn']} (instance {instance_id} step {record['s']})"
                    if answers.live_from is not None:
                        # Live past the trace on an import with no real host here (an agent's
                        # ask or send outside a running runtime), or the live import failed.
                        where += f", {_live_text(answers)}"
                    raise _CellError(f"{where}: {kind}: {exc.message}") from None
                if answers.divergence is not None:
                    raise _Diverged(answers.divergence)
                got.results.append({"fn": record["fn"], "ok": True, "value": jsonable(value)})
                if live.last_usage is not None and got.fuel is not None:
                    got.fuel += live.last_usage.fuel
            stdout += live.stdout.getvalue()
            stderr += live.stderr.getvalue()
        finally:
            live.close()
    got.stdout = stdout.decode("utf-8", "replace")
    got.stderr = stderr.decode("utf-8", "replace")
    got.tool_calls, got.messages = tool_calls_of(_imports(seen), data.specs)
    return got, seen


def _code_key(specs: dict[str, list[dict[str, Any]]]) -> Callable[[str, str, list[Any]], Any]:
    def key(interface: str, function: str, args: list[Any]) -> Any:
        if interface == TOOLS and function == "call" and len(args) == 2:
            name = str(args[0])
            return ("tool", name, canonical_tool_args(args[1], specs.get(name)))
        return None  # the default key: interface, function, canonical arguments

    return key


def _own_tool_list(interface: str, function: str) -> bool:
    # A member with its own tool set describes it itself; the recorded list is the baseline's.
    return interface == TOOLS and function == "list-tools"


def _run_code(
    data: CaseData, member: Member, policy: AnswerPolicy, limits: ReplayLimits
) -> tuple[Outcome, list[TraceAnswers]]:
    from mighty.sandbox import Limits, Sandbox

    if len(data.instances) != 1:
        raise _CellError(f"a code case holds one run; this trace has {len(data.instances)}")
    ((instance_id, records),) = data.instances.items()
    call = next(r for r in records if r.get("k") == "call")
    args = call["args"]
    if not (isinstance(args, list) and len(args) == 2 and isinstance(args[0], str)):
        raise _CellError("the recorded run call is not run(code, inputs)")
    try:
        inputs = json.loads(bytes(args[1])).get("globals") or {}
    except (ValueError, TypeError, AttributeError):
        raise _CellError("the recorded run's inputs are not readable JSON") from None
    code = member.code if member.code is not None else args[0]
    budget, _ = limits.cap(call["budget"], call["@"])
    own_tools = member.tools is not None
    answers = TraceAnswers(
        records,
        instance=instance_id,
        policy=policy,
        key=_code_key(data.specs),
        passthrough=_own_tool_list if own_tools else None,
    )
    run_limits = Limits(
        fuel=budget.fuel, memory=max(budget.memory, 32 << 20), timeout=budget.timeout
    )
    try:
        with Sandbox(tools=member.tools, limits=run_limits, pool=0) as box:
            result = box.run(code, inputs, hooks=[answers])
    except MightyError as exc:
        _failure_kind(exc, answers)
        raise
    if answers.divergence is not None:
        raise _Diverged(answers.divergence)
    if result.error is not None and result.error.kind in _BUDGET_KINDS:
        raise _CellError(f"run: {result.error.kind}: {result.error.message}")
    entry = (
        {"fn": "run", "ok": True, "value": jsonable(result.value)}
        if result.ok
        else {"fn": "run", "ok": False, "error": result.error.kind if result.error else "failed"}
    )
    calls, messages = tool_calls_of(_imports([answers]), data.specs)
    got = Outcome(
        results=[entry],
        stdout=result.stdout,
        stderr=result.stderr,
        messages=messages,
        tool_calls=calls,
        fuel=result.usage.fuel,
        wall_time=result.usage.wall_time,
    )
    return got, [answers]
