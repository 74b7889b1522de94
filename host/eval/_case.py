"""Cases (a recorded input and its baseline) and members (the things under test).

A case is a trace file: an export call recorded with ``mty call --record`` (or
``Instance(record=...)``), an agent exchange recorded with ``mty run --record`` (``agent``
picks the agent type, name or address whose instances are the case), or a code-mode run
recorded with ``Sandbox.run(record=...)``. Its kind (``component`` or ``code``) is read from the
trace: a code-mode trace is the interpreter's ``run`` export.

A member is a component build (``Member.wasm``, or an agent handler source built with
``mty build``'s cache, ``Member.source``) for component cases, or a program text and/or a tool
set for code cases (``Member.program``). Members meet the cases of their kind.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mighty._errors import BadInput, MightyError
from mighty.engine import Component
from mighty.eval._compare import Comparator
from mighty.eval._outcome import TOOLS, Outcome, jsonable, tool_calls_of, tool_specs
from mighty.trace import AnswerPolicy, read_instances

__all__ = ["Case", "CaseData", "Member", "load_case"]

Kind = Literal["component", "code"]


@dataclass(frozen=True)
class Case:
    """A named recorded input with its baseline: the trace at ``trace``.

    ``agent`` (an agent type, registered name or address) selects the instances of one agent
    in a multi-agent trace; ``instance`` one instance by number. ``compare`` and ``policy``
    override the suite's for this case.
    """

    name: str
    trace: Path
    agent: str | None = None
    instance: int | None = None
    compare: tuple[Comparator, ...] | None = None
    policy: AnswerPolicy | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "trace", Path(self.trace))
        if self.policy not in (None, "strict", "live"):
            raise BadInput(f"case {self.name}: policy must be strict or live, got {self.policy!r}")


@dataclass(frozen=True)
class Member:
    """A thing under test. Exactly one of ``wasm`` (a component file), ``source`` (an agent
    handler to build) or ``code`` / ``tools`` (code mode: a program text, a path to one, and a
    tool set: callables or a name -> callable map) says what it is."""

    name: str
    wasm: Path | Component | None = None
    source: Path | None = None
    code: str | None = None
    tools: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]] | None = None
    kind: Kind = field(init=False)

    def __post_init__(self) -> None:
        component = self.wasm is not None or self.source is not None
        code = self.code is not None or self.tools is not None
        if component == code or (self.wasm is not None and self.source is not None):
            raise BadInput(f"member {self.name}: give exactly one of wasm, source, or code/tools")
        object.__setattr__(self, "kind", "component" if component else "code")

    @classmethod
    def component(cls, name: str, wasm: str | Path | Component) -> Member:
        """A component build under test (a file, or a component already loaded)."""
        return cls(name, wasm=wasm if isinstance(wasm, Component) else Path(wasm))

    @classmethod
    def program(
        cls,
        name: str,
        code: str | None = None,
        tools: Sequence[Callable[..., Any]] | Mapping[str, Callable[..., Any]] | None = None,
    ) -> Member:
        """Code mode: another program text and/or another tool set (``None``: the recorded)."""
        return cls(name, code=code, tools=tools)


@dataclass
class CaseData:
    """A case read and checked: its instances' records, its kind, its baseline."""

    case: Case
    kind: Kind
    instances: dict[int, list[dict[str, Any]]]
    baseline: Outcome
    specs: dict[str, list[dict[str, Any]]]
    truncated: bool


def _select(case: Case, groups: dict[int, list[dict[str, Any]]]) -> dict[int, list[dict[str, Any]]]:
    if case.instance is not None:
        if case.instance not in groups:
            raise BadInput(f"the trace has no instance {case.instance} (it has {sorted(groups)})")
        return {case.instance: groups[case.instance]}
    if case.agent is None:
        return groups
    wanted = case.agent

    def matches(head: dict[str, Any]) -> bool:
        address = head.get("a")
        return (
            address == wanted
            or head.get("name") == wanted
            or (isinstance(address, str) and address.split(":", 1)[0] == wanted)
        )

    chosen = {i: r for i, r in groups.items() if r and matches(r[0])}
    if not chosen:
        known = sorted({str(r[0].get("a")) for r in groups.values() if r and r[0].get("a")})
        raise BadInput(
            f"the trace has no agent {wanted!r} (agents: {', '.join(known) or 'none recorded'})"
        )
    return chosen


def _is_code(records: list[dict[str, Any]]) -> bool:
    calls = [r for r in records if r.get("k") == "call"]
    exports = [r for r in records if r.get("k") == "export"]
    if not calls or any(r.get("fn") != "run" for r in calls):
        return False
    # The interpreter's run export returns an outcome record carrying "error-kind".
    return any(isinstance(r.get("res"), dict) and "error-kind" in r["res"] for r in exports)


def code_result(res: Any) -> dict[str, Any]:
    """A code-mode ``outcome`` record (the interpreter's export result) as a result entry."""
    if not isinstance(res, dict):
        return {"fn": "run", "ok": False, "error": "no result recorded"}
    if res.get("ok"):
        try:
            value = json.loads(bytes(res.get("value") or b"null"))
        except (ValueError, TypeError):
            value = jsonable(res.get("value"))
        return {"fn": "run", "ok": True, "value": value}
    return {"fn": "run", "ok": False, "error": str(res.get("error-kind"))}


def load_case(case: Case) -> CaseData:
    """Read ``case``'s trace and its baseline; ``BadInput`` or a ``TraceError`` (missing,
    corrupt, malformed) when it cannot be used."""
    try:
        groups, truncated = read_instances(case.trace)
    except FileNotFoundError:
        raise BadInput(f"{case.trace}: no such trace file") from None
    except OSError as exc:
        raise BadInput(f"{case.trace}: {exc.strerror or exc}") from None
    if not groups:
        raise BadInput(f"{case.trace} holds no instance")
    chosen = _select(case, groups)
    for instance_id, records in chosen.items():
        if not records or records[0].get("k") != "instance":
            raise BadInput(f"instance {instance_id} has no start record in {case.trace}")
    every = [r for records in chosen.values() for r in records]
    if not any(r.get("k") == "call" for r in every):
        raise BadInput(f"{case.trace} holds no export call to evaluate")
    kind: Kind = "code" if _is_code(every) else "component"
    imports = [r for r in every if r.get("k") == "import"]
    specs: dict[str, list[dict[str, Any]]] = {}
    for r in imports:
        if r.get("if") == TOOLS and r.get("fn") == "list-tools":
            specs = tool_specs(r.get("res"))
            break
    calls, messages = tool_calls_of(
        ((str(r["if"]), str(r["fn"]), r["args"]) for r in imports if r.get("out") == "ok"),
        specs,
    )
    results: list[dict[str, Any]] = []
    fuel = 0
    for r in every:
        if r.get("k") != "export":
            continue
        if isinstance(r.get("fuel"), int):
            fuel += r["fuel"]
        if kind == "code":
            results.append(code_result(r.get("res")) if r.get("ok") else _failed(r))
        elif r.get("ok"):
            results.append({"fn": r["fn"], "ok": True, "value": jsonable(r.get("res"))})
        else:
            results.append(_failed(r))
    closes = [r for r in every if r.get("k") == "close"]
    stdout = b"".join(bytes(r.get("stdout") or b"") for r in closes)
    stderr = b"".join(bytes(r.get("stderr") or b"") for r in closes)
    baseline = Outcome(
        results=results,
        stdout=stdout.decode("utf-8", "replace"),
        stderr=stderr.decode("utf-8", "replace"),
        messages=messages,
        tool_calls=calls,
        fuel=fuel,
    )
    return CaseData(case, kind, chosen, baseline, specs, truncated)


def _failed(record: dict[str, Any]) -> dict[str, Any]:
    error = record.get("error") or {}
    return {"fn": record.get("fn"), "ok": False, "error": str(error.get("kind", "failed"))}


def describe_error(exc: BaseException) -> str:
    """One line for an exception that ends a cell in ``error``."""
    text = exc.message if isinstance(exc, MightyError) else f"{type(exc).__name__}: {exc}"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:500]
