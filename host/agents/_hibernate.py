"""Hibernation: idle agents leave memory for the snapshot store and wake on their next message.

An agent is *hibernated* when it is alive and has no instance: its state is a row of the
:class:`~mighty.agents._store.SnapshotStore`, while its :class:`AgentProcess` (address, name,
supervisor link, mailbox, counters) stays in the runtime as a small record.

Going to sleep (:meth:`Hibernator.hibernate`, from the idle timer or ``Runtime.hibernate``)
takes the agent's run lock without waiting, so it never runs beside a turn or a hot swap; it
gives up unless the agent is idle (alive, awake, mailbox empty and not paused, no turn
scheduled or running: an agent asks only from inside a turn, so no ask is outstanding either).
It then calls the guest's ``snapshot`` (the export hot swap uses), writes the row, and releases
the instance. A message that arrives meanwhile schedules a turn as usual; the turn waits for the
run lock, finds the agent asleep and wakes it before taking the message. Waking happens inside
the turn, under the run lock, before any message is taken out of the mailbox: a message is
never lost or handled twice, and the mailbox order is the handling order, however the idle
timer and the messages interleave (the mailbox is never touched by hibernation).

Waking (:meth:`Hibernator.wake`): read and check the row, instantiate the agent type's current
component, check the stored schema against the component's (the hot swap rules), ``restore``.
Any failure raises a :class:`StoreError` (``SnapshotCorrupt``, ``SnapshotRefused``,
``StoreUnavailable``); the turn treats it as a crash of the agent, so its supervisor decides,
and the row is left as it was: nothing is written on a failed wake. An agent whose state is in
the store is restarted by restoring that state again, not by ``init``.

Durable agent types (``durable = true``) also write their snapshot after every handled message,
before the reply is released (write-ahead: a reply means its state is on disk, fsynced), and
after ``init``. Their rows survive the runtime; a new runtime on the same ``state_dir`` brings
them back, asleep, under their old address (and name) on first use. Rows of agents that were
not durable are discarded when a store is opened: their agent may have changed since.

The idle timer is one thread per runtime with a heap of deadlines, at most one entry per agent
(an agent active again before its deadline is put back with its new deadline when the entry
comes up); a custom ``clock`` turns the thread off and the owner calls :meth:`Hibernator.tick`.

Rejected: a timer per agent (100,000 timer threads or handles); scanning every agent on each
tick (linear in the number of agents, most of them asleep already); hibernating from a worker
(a worker would have to poll for idleness, and a hibernation would hold it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mighty._errors import MightyError
from mighty.abi import Err
from mighty.agents._store import (
    SnapshotCorrupt,
    SnapshotRefused,
    SnapshotStore,
    StoredSnapshot,
    StoreError,
)
from mighty.engine import check_lowering
from mighty.reload import SchemaError, check_compatible, parse_schema

if TYPE_CHECKING:
    from mighty.agents._process import AgentProcess
    from mighty.agents._runtime import Runtime
    from mighty.agents._types import AgentType
    from mighty.instance import Instance

__all__ = ["HibernationStats", "Hibernator"]

_log = logging.getLogger(__name__)
_LATENCIES_KEPT = 10_000
_TIMER_SLICE = 1.0


@dataclass
class HibernationStats:
    """The runtime's hibernation counters (``Runtime.hibernation_stats`` gives them as JSON)."""

    hibernations: int = 0
    wakes: int = 0
    hibernate_failures: int = 0
    wake_failures: int = 0
    durable_writes: int = 0
    recovered: int = 0
    wake_seconds: float = 0.0


class Hibernator:
    """Puts idle agents of one runtime to sleep in a store and wakes them (see the module)."""

    def __init__(
        self,
        runtime: Runtime,
        store: SnapshotStore,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.runtime = runtime
        self.store = store
        self.clock = clock or time.monotonic
        self.stats = HibernationStats()
        self._latencies: deque[float] = deque(maxlen=_LATENCIES_KEPT)
        self._timer = clock is None
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, AgentProcess]] = []
        # The idle timer's bookkeeping, per agent (under ``_cond``): when it last became idle,
        # and whether it has an entry in the heap.
        self._idle_since: dict[AgentProcess, float] = {}
        self._armed: set[AgentProcess] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # component sha256 -> (schema hash, schema JSON), asked of the component once.
        self._schemas: dict[str, tuple[str, str]] = {}
        self._schemas_lock = threading.Lock()

    # -- the idle timer --------------------------------------------------------------------

    def touch(self, process: AgentProcess) -> None:
        """``process`` is idle from now on (a turn ended, it started): arm its idle deadline."""
        after = process.type.hibernate_after
        if after is None:
            return
        now = self.clock()
        with self._cond:
            self._idle_since[process] = now
            if process in self._armed or self._stopping:
                return
            self._armed.add(process)
            heapq.heappush(self._heap, (now + after, next(self._seq), process))
            if self._timer:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="mighty-hibernator", daemon=True
                    )
                    self._thread.start()
                elif self._heap[0][2] is process:
                    self._cond.notify()

    def tick(self, now: float | None = None) -> int:
        """Hibernate every agent idle past its deadline; how many went to sleep."""
        now = self.clock() if now is None else now
        due: list[AgentProcess] = []
        with self._cond:
            while self._heap and self._heap[0][0] <= now:
                _, _, process = heapq.heappop(self._heap)
                self._armed.discard(process)
                after = process.type.hibernate_after
                idle_since = self._idle_since.pop(process, now)
                if after is None or not process.alive or process.instance is None:
                    continue
                deadline = idle_since + after
                if deadline > now:  # active again since the entry was pushed
                    self._idle_since[process] = idle_since
                    self._armed.add(process)
                    heapq.heappush(self._heap, (deadline, next(self._seq), process))
                    continue
                due.append(process)
        slept = 0
        for process in due:
            if self.hibernate(process):
                slept += 1
            elif process.alive and process.instance is not None and not process.busy:
                # Declined for a passing reason (its run lock was held, its mailbox paused by
                # a hot swap): try again after another idle period.
                self.touch(process)
        return slept

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                wait = _TIMER_SLICE
                if self._heap:
                    wait = min(wait, max(0.0, self._heap[0][0] - self.clock()))
                if wait > 0:
                    self._cond.wait(wait)
                if self._stopping:
                    return
            try:
                self.tick()
            except Exception:  # noqa: BLE001 -- the timer outlives any one agent's failure
                _log.exception("the idle timer failed; it goes on")

    def pending(self) -> int:
        """Idle deadlines armed (at most one per awake agent with ``hibernate_after``)."""
        with self._cond:
            return len(self._heap)

    # -- sleep -----------------------------------------------------------------------------

    def hibernate(self, process: AgentProcess, *, wait: float = 0.0) -> bool:
        """Snapshot ``process`` into the store and release its instance, if it is idle.

        False (nothing changed) when it is busy, asleep already, stopped, or the snapshot or
        the write failed (the agent stays awake; a ``hibernate.failed`` event says why).
        ``wait``: seconds to wait for a turn in progress to end (an ask's reply is out before
        its turn is over) while nothing else is queued.
        """
        deadline = time.monotonic() + wait
        while True:
            slept = self._hibernate_now(process)
            if slept is not None:
                return slept
            if time.monotonic() >= deadline or len(process.mailbox) or not process.alive:
                return False
            time.sleep(0.0005)

    def _hibernate_now(self, process: AgentProcess) -> bool | None:
        """True: asleep now; False: will not (asleep, stopped, failed); None: busy, retry."""
        if process.hibernated or not process.alive:
            return False
        turn = process.turn_lock
        if not turn.acquire(blocking=False):
            return None
        try:
            if not process.may_sleep():
                return None
            instance = process.instance
            assert instance is not None
            if not (process.type.durable and process.in_store):
                try:
                    self._write(process, instance, durable=process.type.durable)
                except MightyError as exc:
                    self.stats.hibernate_failures += 1
                    self.runtime.emit(
                        "hibernate.failed", process.address, {"reason": f"{exc.kind}: {exc}"}
                    )
                    return False
            if process.fall_asleep() is None:
                # A message came while the snapshot was taken: stay awake (the row just
                # written is a valid snapshot, overwritten at the next hibernation).
                return None
            self.stats.hibernations += 1
            # Rewound for the next agent of its type to wake or spawn, or closed.
            self.runtime.seats.release(process, instance)
        finally:
            turn.release()
        self.runtime.emit("agent.hibernated", process.address, {})
        return True

    # -- wake ------------------------------------------------------------------------------

    def wake(self, process: AgentProcess, *, report: bool = True) -> Instance:
        """A fresh instance of ``process``'s type with its stored state restored.

        Raises a StoreError (the row is left as it was), counted and told as a
        ``wake.failed`` event unless ``report`` is false (a wake tried again elsewhere, which
        reports it). The caller installs the instance.
        """
        started = time.perf_counter()
        try:
            instance = self._restore(process)
        except StoreError as exc:
            if report:
                self.stats.wake_failures += 1
                self.runtime.emit("wake.failed", process.address, {"reason": f"{exc.kind}: {exc}"})
            raise
        took = time.perf_counter() - started
        self.stats.wakes += 1
        self.stats.wake_seconds += took
        self._latencies.append(took)
        process.stats.wakes += 1
        return instance

    def woke(self, process: AgentProcess) -> None:
        """``process`` has its instance again (called once the caller installed it)."""
        if not process.type.durable:
            process.in_store = False
        self.runtime.emit("agent.woke", process.address, {})

    def _restore(self, process: AgentProcess) -> Instance:
        row = self.store.get(process.address)
        if row is None:
            raise SnapshotCorrupt(f"{process.address}: no stored snapshot to wake from")
        if row.type != process.type.name:
            raise SnapshotCorrupt(
                f"{process.address}: the stored snapshot is of type {row.type!r}, "
                f"not {process.type.name!r}"
            )
        try:
            instance = process.instantiate()
        except MightyError as exc:
            raise SnapshotRefused(f"{process.address}: cannot instantiate: {exc}") from exc
        try:
            self._check_schema(process, row, instance)
            try:
                memory = instance.budget.memory  # the state's lowering is charged to it
                check_lowering(len(row.state), memory, f"{process.address}: restore")
                outcome = instance.call("restore", row.state)
            except MightyError as exc:
                raise SnapshotRefused(
                    f"{process.address}: restore failed: {exc.kind}: {exc}"
                ) from exc
            if isinstance(outcome, Err):
                raise SnapshotRefused(f"{process.address}: restore refused: {outcome.value}")
        except BaseException:
            instance.close()
            raise
        finally:
            process.flush_output()
        return instance

    def _check_schema(self, process: AgentProcess, row: StoredSnapshot, instance: Any) -> None:
        """The stored snapshot's schema must fit the current component (hot swap's rules)."""
        current_hash, current_json = self._schema(process.type, instance)
        if row.schema == current_hash:
            return
        stored = self.store.schemas_of(process.type.name).get(row.schema)
        if stored is None:
            raise SnapshotRefused(
                f"{process.address}: the stored snapshot's schema {row.schema[:12]} is unknown "
                "to the store"
            )
        try:
            verdict = check_compatible(parse_schema(stored), parse_schema(current_json))
        except SchemaError as exc:
            raise SnapshotCorrupt(f"{process.address}: stored schema: {exc}") from exc
        if not verdict.ok:
            raise SnapshotRefused(
                f"{process.address}: the current component refuses the stored state: "
                + "; ".join(verdict.problems)
            )

    # -- durable ---------------------------------------------------------------------------

    def persist(self, process: AgentProcess, instance: Instance, done: int | None = None) -> None:
        """Write-ahead: ``process``'s snapshot, fsynced, before its reply is released.
        ``done``: the journaled message it includes, deleted from the inbox with the write."""
        self._write(process, instance, durable=True, done=done)
        process.in_store = True
        self.stats.durable_writes += 1

    def _write(
        self, process: AgentProcess, instance: Instance, *, durable: bool, done: int | None = None
    ) -> None:
        schema_hash, _ = self._schema(process.type, instance)
        state = bytes(instance.call("snapshot"))
        snapshot = StoredSnapshot(
            process.address,
            process.type.name,
            process.name,
            process.type.component.sha256,
            schema_hash,
            durable,
            state,
        )
        if done is None:
            self.store.put(snapshot, sync=durable)
        else:
            self.store.put(snapshot, sync=durable, done=done)

    def _schema(self, agent_type: AgentType, instance: Any) -> tuple[str, str]:
        """The component's (schema hash, schema JSON), asked once per component."""
        sha = agent_type.component.sha256
        with self._schemas_lock:
            known = self._schemas.get(sha)
        if known is not None:
            return known
        try:
            text = str(instance.call("state-schema"))
            schema_hash = parse_schema(text).hash
        except (MightyError, SchemaError) as exc:
            raise SnapshotRefused(
                f"{agent_type.name}: the component has no usable state schema: {exc}"
            ) from exc
        self.store.put_schema(schema_hash, text)
        with self._schemas_lock:
            self._schemas[sha] = (schema_hash, text)
        return schema_hash, text

    # -- recovery --------------------------------------------------------------------------

    def stored_address(self, agent_type: AgentType, name: str) -> str | None:
        """The address of ``name``'s durable row of ``agent_type`` (a restart adopts it)."""
        address = self.store.address_of(name)
        if address is None or address.partition(":")[0] != agent_type.name:
            return None
        return address

    def recoverable(self, address: str) -> StoredSnapshot | None:
        """The durable row stored for ``address``, if any (errors read as none)."""
        try:
            row = self.store.get(address)
        except StoreError:
            return None
        return row if row is not None and row.durable else None

    def adopted(self, process: AgentProcess) -> None:
        """``process`` was brought back asleep from a row an earlier runtime wrote."""
        self.stats.recovered += 1
        self.runtime.emit("agent.recovered", process.address, {})

    # -- the end ---------------------------------------------------------------------------

    def latencies(self) -> list[float]:
        """The last wake latencies (seconds), oldest first."""
        return list(self._latencies)

    def to_json(self) -> dict[str, Any]:
        """The counters, the number asleep, and wake latency percentiles (milliseconds)."""
        ordered = sorted(self._latencies)

        def pct(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3, 3)

        s = self.stats
        return {
            "hibernated": sum(1 for p in self.runtime.agents() if p.hibernated),
            "hibernations": s.hibernations,
            "wakes": s.wakes,
            "hibernate_failures": s.hibernate_failures,
            "wake_failures": s.wake_failures,
            "durable_writes": s.durable_writes,
            "recovered": s.recovered,
            "wake_ms_p50": pct(0.5),
            "wake_ms_p99": pct(0.99),
            "wake_ms_mean": round(s.wake_seconds / s.wakes * 1e3, 3) if s.wakes else None,
            "store_bytes": self.store.size_bytes(),
            "state_dir": str(self.store.directory),
        }

    def close(self) -> None:
        """Stop the idle timer and close the store."""
        with self._cond:
            self._stopping = True
            self._heap.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self.store.close()
