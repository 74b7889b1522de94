"""Forking a recorded run at a point: the same instance, the trace's answers before that point
and the live world after it, recorded as a new trace (``mty debug``'s ``fork``).

A fresh instance of the recorded component runs the instance's recorded export calls again, with
their recorded arguments, under a :class:`TraceAnswers` hook in ``live`` mode that holds only the
imports recorded *before* the fork point: those are answered from the trace (by key, as
evaluation's live mode answers), and the first import past them, with every one after it, goes
to the real host functions (the default WASI gate: nothing granted, as ``mty call`` without
flags). A recorder wraps it all, so the new trace holds the replayed prefix as it was and the
live branch as it went, and replays like any trace.

An agent's ``log`` and ``emit`` are its own output and are answered here (they need no host).
Its messages (``send``, ``ask``, ``spawn``, ``self-address``) have no runtime to go to outside
``mty run``, so they are answered from the whole recorded instance by key, before and after the
fork point alike: the n-th identical ask gets the n-th recorded reply. One the recorded run never
made fails where the guest makes it, naming it; the report says so.

Rejected: forking the stepped instance in place (wasmtime cannot copy a store, and the stepped
instance belongs to the replay, which must go on as recorded); answering the branch by
position (the first import of a different shape would end the answers; by key is what eval's
live mode does and what its tests hold).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import HostError, MightyError
from mighty.instance import Instance
from mighty.trace._answer import LiveFrom, TraceAnswers, answer_gate, read_instances
from mighty.trace._recorder import Recorder
from mighty.trace._replay import (
    DEFAULT_REPLAY_LIMITS,
    ReplayLimits,
    _canonical,
    _load,
    _stderr_progress,
)

__all__ = ["ForkReport", "fork_trace"]

_AGENT_HOST = "mighty:agent/host"


def _nothing(_args: list[Any]) -> None:
    return None


_AGENT_OUTPUT: dict[tuple[str, str], Callable[[list[Any]], Any]] = {
    (_AGENT_HOST, "log"): _nothing,
    (_AGENT_HOST, "emit"): _nothing,
}


_MESSAGING = ("send", "ask", "spawn", "self-address")


class _RecordedMessages:
    """Answers an agent's messaging imports from all of its instance's recorded ones, by key."""

    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self._answers: dict[tuple[str, bytes], deque[Any]] = {}
        for record in records:
            if (
                record["k"] == "import"
                and record["if"] == _AGENT_HOST
                and record["fn"] in _MESSAGING
            ):
                key = (str(record["fn"]), _canonical(record["args"]))
                self._answers.setdefault(key, deque()).append(record["res"])

    def answer(self, function: str) -> Callable[[list[Any]], Any]:
        def answered(args: list[Any]) -> Any:
            recorded = self._answers.get((function, _canonical(args)))
            if not recorded:
                raise HostError(
                    f"fork: {function}{tuple(args)!r} was never made in the recorded run, and a"
                    " fork has no runtime to send it to"
                )
            return recorded.popleft()

        return answered


@dataclass
class ForkReport:
    """What a fork did: the new trace, each export call's outcome, where it went live."""

    path: Path
    instance: int
    calls: list[tuple[str, str]] = field(default_factory=list)
    """``(export, "ok" | the failure's kind)``, in order."""
    live_from: LiveFrom | None = None
    stopped: str = ""
    """Why the calls stopped before the last recorded one (a failed call poisons the instance)."""

    def lines(self) -> list[str]:
        """What the debugger prints."""
        where = (
            f"live from its import {self.live_from.index} ({self.live_from.interface}#"
            f"{self.live_from.function})"
            if self.live_from is not None
            else "every import of the branch was answered from the trace or was the agent's own"
        )
        done = ", ".join(f"{name} {outcome}" for name, outcome in self.calls) or "none"
        lines = [f"forked instance {self.instance} to {self.path}: {where}", f"  calls: {done}"]
        if self.stopped:
            lines.append(f"  stopped: {self.stopped}")
        return lines


def fork_trace(
    path: str | Path,
    instance: int,
    at: int,
    out: str | Path,
    *,
    limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
    component_dirs: Sequence[Path] = (),
    progress: Callable[[str], None] | None = None,
) -> ForkReport:
    """Run ``instance`` of the trace at ``path`` again with its imports recorded before byte
    offset ``at`` answered from the trace and the rest live, recording to ``out`` (which must
    not exist). See the module docstring."""
    target = Path(out)
    if target.exists():
        raise HostError(f"{target} exists; fork writes a new trace")
    groups, _ = read_instances(path)
    records = groups.get(instance)
    if not records or records[0].get("k") != "instance":
        raise HostError(f"the trace has no instance {instance}")
    head = records[0]
    component = _load(head, None, limits, component_dirs, None, progress or _stderr_progress)
    messages = _RecordedMessages(records)
    local = dict(_AGENT_OUTPUT)
    local.update({(_AGENT_HOST, fn): messages.answer(fn) for fn in _MESSAGING})
    answers = TraceAnswers(
        [r for r in records if int(r["@"]) < at], instance=instance, policy="live", local=local
    )
    report = ForkReport(target, instance)
    agent = head.get("a") if isinstance(head.get("a"), str) else None
    name = head.get("name") if isinstance(head.get("name"), str) else None
    # No source positions: the answering hook does not keep them (mighty.gate's _source.py).
    forked_from = {"trace": str(path), "instance": instance, "at": at}
    with Recorder(target, positions=False, forked_from=forked_from) as rec:
        budget, _ = limits.cap(head["budget"], head["@"])
        live = Instance(
            component,
            budget=budget,
            gate=answer_gate(component),
            hooks=[answers],
            record=rec,
            agent=agent,
            agent_name=name,
        )
        try:
            for record in records:
                if record["k"] != "call":
                    continue
                call_budget = limits.cap(record["budget"], record["@"])[0]
                try:
                    live.call(str(record["fn"]), *record["args"], budget=call_budget)
                except MightyError as exc:
                    report.calls.append((str(record["fn"]), exc.kind))
                    if live.poisoned is not None:
                        report.stopped = f"{record['fn']} failed: {exc.message}"
                        break
                    continue
                report.calls.append((str(record["fn"]), "ok"))
        finally:
            live.close()
    report.live_from = answers.live_from
    return report
