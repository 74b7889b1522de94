"""Hot swap: replace the component of a running agent type, behind a compatible state schema.

For every live agent of the type, in one transaction:

1. the new component is loaded and compiled first, and its state schema checked against the
   running one (an incompatible change is refused before anything stops);
2. each agent's mailbox is paused (it keeps accepting messages, nothing is taken out) and its
   in-flight message, if any, is let finish within the drain deadline;
3. each agent is snapshotted, a new instance is created and restored from the snapshot;
4. only when every agent has a restored new instance is the swap confirmed: the new instances
   take over, the old ones are closed, the mailboxes resume. Messages are neither lost nor
   reordered: the mailboxes never stopped accepting and were never drained.

Any failure (incompatible schema, a restore error, a trap, a drain past its deadline) closes the
new instances and resumes every agent on its old instance with its state and mailbox untouched
(the old instance was only read by ``snapshot``); the report says why. An agent is never left
stuck: it always ends running, old or new.

Hibernated agents of the type (no instance, their state a row of the snapshot store) are part
of the same transaction: the new schema is checked against the schema of every stored snapshot
of the type as well as the running one (one refusal refuses the swap for all), they are paused
and locked like the others, and on confirm they simply take the new type: the next message
wakes them with the new component, which restores the stored snapshot.

Rejected: swapping agent by agent with independent commits (a half-swapped type would run two
versions at once with no way back for the first ones); stopping the mailbox (senders would see
errors or lose messages during a deploy).

The transaction lives in ``agents`` (it is ``Runtime.reload``): it holds the agents' turn locks and
pauses their mailboxes. ``mighty.reload``, below, owns what it checks and reports: the state
schemas, the compatibility rules, ``ReloadReport`` and the two errors.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mighty._errors import MightyError
from mighty.abi import Err
from mighty.budget import Budget
from mighty.engine import Component, check_lowering
from mighty.instance import Instance
from mighty.reload import (
    Compatibility,
    ReloadFailed,
    ReloadRefused,
    ReloadReport,
    StateSchema,
    SwapVerifier,
    check_compatible,
    parse_schema,
)

if TYPE_CHECKING:
    from mighty.agents._process import AgentProcess
    from mighty.agents._runtime import Runtime

__all__ = ["reload_agent_type"]


def _schema_of(instance: Instance) -> StateSchema:
    return parse_schema(str(instance.call("state-schema")))


def reload_agent_type(
    runtime: Runtime,
    type_name: str,
    source: str | os.PathLike[str] | bytes,
    *,
    drain_timeout: float = 5.0,
    verify: SwapVerifier | None = None,
) -> ReloadReport:
    """Swap ``type_name`` to the component in ``source`` for every live agent, or roll back.

    With ``verify`` (an eval suite), the new component is checked against it first, before
    anything is paused: any failing cell refuses the swap (``ReloadRefused`` naming them)."""
    old_type = runtime.agent_type(type_name)
    component = Component.load(source)
    if verify is not None:
        failing = tuple(verify.verify_swap(type_name, component))
        if failing:
            raise ReloadRefused(
                f"{type_name}: the verify suite failed {len(failing)} cell(s): "
                + "; ".join(failing),
                problems=failing,
            )
    new_type = replace(old_type, component=component)
    agents = [p for p in runtime.agents() if p.type.name == type_name and p.alive]

    verdict = _check(runtime, type_name, old_type, component)
    report = ReloadReport(
        type_name, old_type.component.sha256, component.sha256, [], verdict.migration
    )
    paused_at: dict[str, float] = {}
    locked: list[AgentProcess] = []
    staged: list[tuple[AgentProcess, Instance, Instance]] = []
    try:
        for process in agents:
            process.hold_for_swap()
            paused_at[process.address] = time.monotonic()
        deadline = time.monotonic() + drain_timeout
        for process in agents:
            if not process.turn_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise ReloadFailed(
                    f"{process.address} was still handling a message after the "
                    f"{drain_timeout:g} s drain deadline"
                )
            locked.append(process)
        for process in agents:
            if not process.hibernated:
                staged.append(_stage(runtime, process, old_type, component))
    except BaseException:
        for _, _, fresh in staged:
            fresh.close()
        _resume(runtime, agents, locked, paused_at, report)
        runtime.emit("reload.rolled_back", type_name, {"component": component.sha256})
        raise
    # Confirm: every agent has a restored new instance.
    for process, old, fresh in staged:
        process.adopt(fresh, new_type)
        old.close()
        report.agents.append(process.address)
    for process in locked:
        if process.hibernated:  # wakes with the new component
            process.type = new_type
            report.agents.append(process.address)
    runtime.register(new_type)
    _resume(runtime, agents, locked, paused_at, report)
    runtime.emit("reload.confirmed", type_name, report.to_json())
    if runtime.recorder is not None:
        runtime.recorder.append({"k": "swap", "type": type_name, **report.to_json()})
    return report


def _check(runtime: Runtime, type_name: str, old_type: Any, component: Component) -> Compatibility:
    """The schemas of the running and the new version, compared before anything is paused."""
    probe = Instance(component, gate=runtime.gate, budget=Budget())
    try:
        new_schema = _schema_of(probe)
    except MightyError as exc:
        raise ReloadRefused(
            f"{type_name}: the new component has no usable state schema: {exc}"
        ) from exc
    finally:
        probe.close()
    verdict = check_compatible(_running_schema(runtime, old_type), new_schema)
    if not verdict.ok:
        raise ReloadRefused(
            f"{type_name}: the new version cannot take over the running state: "
            + "; ".join(verdict.problems),
            problems=verdict.problems,
        )
    migration = verdict.migration
    # Hibernated agents: the schemas their stored snapshots were taken with.
    for schema_hash, text in runtime.stored_schemas(type_name).items():
        if schema_hash == new_schema.hash:
            continue
        if text is None:
            raise ReloadRefused(
                f"{type_name}: a stored snapshot has schema {schema_hash[:12]}, unknown to the "
                "store",
                problems=(f"unknown stored schema {schema_hash[:12]}",),
            )
        try:
            stored = check_compatible(parse_schema(text), new_schema)
        except MightyError as exc:
            raise ReloadRefused(f"{type_name}: a stored schema is unreadable: {exc}") from exc
        if not stored.ok:
            raise ReloadRefused(
                f"{type_name}: the new version cannot take over the state of hibernated "
                f"agents (stored schema {schema_hash[:12]}): " + "; ".join(stored.problems),
                problems=stored.problems,
            )
        migration = migration or stored.migration
    return replace(verdict, migration=migration)


def _stage(
    runtime: Runtime, process: AgentProcess, old_type: Any, component: Component
) -> tuple[AgentProcess, Instance, Instance]:
    """Snapshot one paused agent into a restored instance of the new component."""
    old = process.instance
    if old is None or not process.alive:
        raise ReloadFailed(f"{process.address} stopped during the swap")
    snapshot = old.call("snapshot")
    # Made as the agent makes its own: its address in the trace (``mty replay --agent``), its
    # log sink, granted tools and journal.
    fresh = process.instantiate(component)
    try:
        check_lowering(len(snapshot), fresh.budget.memory, f"{process.address}: restore")
        outcome = fresh.call("restore", snapshot)
    except MightyError as exc:
        fresh.close()
        raise ReloadFailed(f"{process.address}: restore failed: {exc.message}") from exc
    if isinstance(outcome, Err):
        fresh.close()
        raise ReloadFailed(f"{process.address}: restore refused: {outcome.value}")
    return process, old, fresh


def _running_schema(runtime: Runtime, old_type: Any) -> StateSchema:
    # Ask the old component itself (a throwaway instance): a live agent may be busy.
    probe = Instance(old_type.component, gate=runtime.gate, budget=Budget())
    try:
        return _schema_of(probe)
    finally:
        probe.close()


def _resume(
    runtime: Runtime,
    agents: list[AgentProcess],
    locked: list[AgentProcess],
    paused_at: dict[str, float],
    report: ReloadReport,
) -> None:
    for process in locked:
        process.turn_lock.release()
    for process in agents:
        process.release_from_swap()
        started = paused_at.get(process.address)
        if started is not None:
            report.pauses.append(time.monotonic() - started)
        process.wake()
