"""Supervision trees of agents: specs, and how a Supervisor drives agent processes.

A supervised agent keeps its address and mailbox across restarts: its supervisor revives it
(a fresh instance, ``init`` again) and the messages that arrived meanwhile are still there, so
a crash loses only the message being handled (whose sender is told). When a supervisor gives up
(too many restarts in its period), its children are stopped for good (queued asks fail with
``NoProc``, queued sends count as unhandled) and the failure goes up to its parent, which
restarts the whole subtree or gives up in turn; at the root, the runtime emits
``supervisor.failed``. A child its supervisor will not restart (a temporary one, or one whose
supervisor gave up) is retired the same way (``RetiringHandle``), so no ask waits on it forever.

Supervision never runs under an agent's run lock: a crash is reported after the worker has
released the crashed agent's lock (see ``AgentProcess.run_batch``), so a supervisor may stop,
revive or retire any agent, the crashed one included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mighty.agents._process import AgentProcess, encode_body
from mighty.agents._runtime import Runtime
from mighty.agents._supervisor import (
    ChildHandle,
    ChildSpec,
    CircuitBreaker,
    RestartType,
    Strategy,
    Supervisor,
    SupervisorEvent,
)

__all__ = ["AgentChild", "BreakerSettings", "SupervisorSpec", "start_tree"]


@dataclass(frozen=True)
class AgentChild:
    """A supervised agent: registered under ``name``, of type ``type``, started with ``init``."""

    name: str
    type: str
    init: Any = None
    restart: RestartType = "permanent"


@dataclass(frozen=True)
class BreakerSettings:
    """Makes a supervisor a circuit breaker for its children (see CircuitBreaker)."""

    failure_threshold: int = 5
    window: float = 10.0
    cooldown: float = 5.0


@dataclass(frozen=True)
class SupervisorSpec:
    """A supervisor and its children (agents or supervisors), started in order."""

    name: str
    children: Sequence[AgentChild | SupervisorSpec] = ()
    strategy: Strategy = "one_for_one"
    intensity: int = 3
    period: float = 5.0
    restart: RestartType = "permanent"
    circuit_breaker: BreakerSettings | None = None


def start_tree(
    runtime: Runtime,
    spec: SupervisorSpec,
    *,
    on_failed: Callable[[str], None] | None = None,
) -> Supervisor:
    """Build and start the supervision tree of ``spec``; returns its root supervisor."""
    supervisor = _build(runtime, spec, on_failed)
    supervisor.start()
    return supervisor


def _build(
    runtime: Runtime, spec: SupervisorSpec, on_failed: Callable[[str], None] | None
) -> Supervisor:
    breaker = (
        CircuitBreaker(
            spec.name,
            spec.circuit_breaker.failure_threshold,
            spec.circuit_breaker.window,
            spec.circuit_breaker.cooldown,
        )
        if spec.circuit_breaker is not None
        else None
    )
    holder: list[Supervisor] = []
    children: list[ChildSpec] = []
    runtime.supervisors.setdefault(spec.name, None)
    for child in spec.children:
        if isinstance(child, AgentChild):
            children.append(
                ChildSpec(
                    child.name, _agent_starter(runtime, child, holder, breaker), child.restart
                )
            )
        else:
            children.append(
                ChildSpec(child.name, _subtree_starter(runtime, child, holder), child.restart)
            )

    def emit(event: SupervisorEvent) -> None:
        runtime.emit(
            f"supervisor.{event.kind}",
            event.supervisor,
            {"child": event.child, "reason": event.reason},
        )

    def failed(reason: str) -> None:
        # The children were stopped and retired (their queues settled) as the supervisor gave
        # up, before this call, so a parent restarting this subtree starts fresh agents.
        runtime.emit("supervisor.failed", spec.name, {"reason": reason})
        if on_failed is not None:
            on_failed(reason)

    supervisor = Supervisor(
        spec.name,
        children,
        spec.strategy,
        spec.intensity,
        spec.period,
        on_event=emit,
        on_failed=failed,
    )
    holder.append(supervisor)
    return supervisor


def _agent_starter(
    runtime: Runtime,
    child: AgentChild,
    holder: list[Supervisor],
    breaker: CircuitBreaker | None,
) -> Callable[[], ChildHandle]:
    def exited(process: AgentProcess, crashed: bool, reason: str) -> None:
        # The breaker counted the crash already (AgentProcess._crashed, once per crash).
        holder[0].child_exited(child.name, crashed=crashed, reason=reason, handle=process)

    def start() -> ChildHandle:
        address = runtime.whereis(child.name)
        if address is not None:
            process = runtime._agents[address]
            # Its crashes are reported here: a restart's own agent, or one that came to this
            # node under the child's name to be supervised (a cluster's hand-back).
            process.on_exit = exited
            if not process.alive:
                process.revive()
            return process
        process = runtime.spawn_process(
            child.type,
            encode_body(child.init),
            name=child.name,
            on_exit=exited,
            parent=holder[0].name,
        )
        if breaker is not None:
            runtime.set_breaker(process.address, breaker)
        return process

    return start


def _subtree_starter(
    runtime: Runtime, spec: SupervisorSpec, holder: list[Supervisor]
) -> Callable[[], ChildHandle]:
    built: list[Supervisor] = []

    def failed(reason: str) -> None:
        holder[0].child_exited(spec.name, crashed=True, reason=reason)

    def start() -> ChildHandle:
        if not built:
            built.append(_build(runtime, spec, failed))
            runtime.supervisors[spec.name] = holder[0].name
        return built[0].start()

    return start
