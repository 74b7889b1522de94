"""Fencing: a node cut off from NATS but alive stops its agents before the cluster may give
their names to others, and on its return yields the names that were given away.

The lease is the node's own key in ``<cluster>_nodes``, rewritten each heartbeat right after the
heartbeat is published on the same connection. When a rewrite is acknowledged, the server had
the heartbeat published before it, and every peer hears that heartbeat (or a later one) no earlier
than its send time: a peer declares the node dead ``dead_after`` after the last heartbeat it
heard, hence no earlier than ``renewed + dead_after``, where ``renewed`` is the send time of
the last acknowledged rewrite. The node fences itself at ``renewed +
fence_after`` (``fence_after`` < ``dead_after``, by default half of it): no local agent's
mailbox hands out a message from that instant (it keeps accepting; nothing is handled, an ask
run in place waits too), so between the fence and the return no agent of this node starts
handling a message. That instant does not wait for a thread to notice: the runtime's hold
(``Runtime.hold_while(fence.holding)``) is read each time a mailbox could hand a message out,
and is on from ``renewed + fence_after`` whether or not the watcher below has run. (It once
waited: the watcher, a task on the NATS loop, fenced 0.5 s late on a loaded CI machine, after
the peer had declared the node dead and restarted its agent: two copies answered.) The watcher
then pauses the mailboxes and logs; an agent started while fenced (a local supervisor's
restart, a local spawn) is held from its start. A message being handled at the fence runs to
its end. Same clock, same
process: only the rate of the two monotonic clocks matters, not their values.

When a rewrite is acknowledged again, the node looks at each cluster-wide name it claimed:
still its own address in ``<cluster>_names``: its agents resume; gone or another node's: the
cluster gave it away while this node was cut off, so the local agent is stopped (with its
one-child supervisor, if it has one, so that nothing restarts it) and the name is forgotten
here; its queued messages are dropped with it (at-most-once sends, as when a node dies). Only
then are the other paused agents resumed. A name this node could not check (NATS away again)
keeps the node fenced until the next renewal.

That check looks once, and the cluster may give a name away after it: a peer that declared this
node dead while the link was down may delete its name (``forget_names_of``) and restart the
agent elsewhere only once the link is back (its membership listener ran late, a restart took
its time). Two things close that. A name found still ours is claimed again by compare-and-set
(a new revision), and a peer deletes a dead node's names only by the revisions it saw when it
declared the node dead (the fencing token, ``Node._note_tokens``): a late takeover finds the
name moved on by a node it hears again and leaves it (the cluster supervisor then restarts
nothing); a node still silent loses its names whatever their revision. And the node
watches: the names watcher compares every change of a name this node claims with the revision
of its claim; a change with a later revision that deletes the name or gives it to another node
takes the name away wherever this node is, fenced or not: the local agent is paused on the spot
and stopped, as above (``taken``). A migration of ours is told apart: its commit marks the name
as handed to the target (``Node.handing_off``), whose claim is then expected. Left open: a late
change no token guards (another node's claim over a name of a node it thinks dead compares
with the latest revision) leaves two copies until the watcher hears of it. Rejected: keeping
the agents fenced for a while after the return (a guess at how late a peer may act, and a pause
for every blink); an owner's lease per name renewed through the KV (see below).

Rejected: refusing incoming frames while fenced (a cut-off node receives none anyway, and a
frame that arrives while the link heals waits in the paused mailbox and is handled or dropped
with the agent by the check above); stopping every agent at the fence (a link that blinks for
longer than ``fence_after`` but less than ``dead_after`` would lose state that nobody took
over); a lease of its own per name with JetStream KV TTLs per key (the nats-server in use
sets TTLs per bucket, and a per-name renewal multiplies the KV writes by the names held: the
node's key already says the node is alive, and the names' owners are checked on return).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import suppress
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors

from mighty.agents import AgentError, NoProc

if TYPE_CHECKING:
    from mighty.cluster._node import Node

__all__ = ["Fence"]

_log = logging.getLogger("mighty.cluster")
_FENCED_TICK = 0.02
"""While fenced: how often the watcher looks whether the lease was renewed."""


class Fence:
    """The fencing state of one node (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        config = node.config
        self.after = config.fence_after or config.dead_after / 2
        self.renewed = time.monotonic()
        """Send time of the last acknowledged lease rewrite."""
        self.fenced = False
        self.fenced_at = 0.0
        """When it last fenced itself (monotonic): the instant its lease went stale and its
        agents were held, which the watcher's log line ("fenced", with ``held_since`` on the
        wall clock in its record) may follow late."""
        self.fences = 0
        """How many times this node fenced itself."""
        self.yielded: list[str] = []
        """Names this node found given away on its return (their agents stopped here)."""
        self._paused: list[str] = []
        self._yielding: Counter[str] = Counter()
        """Names whose agents are being stopped, with how many ``_yield`` calls are under way
        for each (the watcher may see a name deleted, then given away: two calls, the first
        blocked while the agent's message ends): never resumed until the last one returns."""
        self._wake: asyncio.Event | None = None

    def holding(self) -> bool:
        """The node's agents are held back now: fenced, or the lease older than ``after`` (the
        runtime's hold, read each time an agent's mailbox could hand out a message: the fence
        takes effect at that instant, however late this node's threads run)."""
        return self.fenced or time.monotonic() - self.renewed >= self.after

    def renew(self, sent: float) -> None:
        """A lease rewrite sent at ``sent`` was acknowledged (on the NATS loop)."""
        stale = time.monotonic() - self.renewed >= self.after
        self.renewed = max(self.renewed, sent)
        if stale and not self.holding():
            # Stale and fresh again before the watcher fenced: the agents the hold kept back
            # are scheduled again (off the loop: waking takes the agents' locks).
            with suppress(RuntimeError):  # the pool is shut down: the node is leaving anyway
                self.node._pool.submit(self.node.runtime.hold_lifted)
        if self._wake is not None:
            self._wake.set()

    async def watch(self) -> None:
        """Fence when the lease is older than ``after``; check the names when it is renewed."""
        self._wake = asyncio.Event()
        while True:
            left = self.renewed + self.after - time.monotonic()
            if not self.fenced and left <= 0:
                self._fence(-left)
            fresh = time.monotonic() - self.renewed < self.after
            if self.fenced and fresh and await self._check_names():
                await asyncio.get_running_loop().run_in_executor(self.node._pool, self._unfence)
            self._wake.clear()
            wait = left if left > 0 and not self.fenced else _FENCED_TICK
            with suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    def _fence(self, late: float) -> None:
        paused = []
        for process in self.node.runtime.agents():
            mailbox = process.mailbox
            if not mailbox.paused:  # a migration's pause stays the migration's
                mailbox.pause()
                paused.append(process.address)
        self._paused = paused
        # The fence began when the lease went stale (the hold), not now: the watcher may be late.
        self.fenced_at = self.renewed + self.after
        self.fenced = True
        self.fences += 1
        held_since = time.time() - (time.monotonic() - self.fenced_at)
        _log.warning(
            "node %s: fenced: no lease renewed for %.2f s (%d agents paused)",
            self.node.name,
            self.after + late,
            len(paused),
            extra={"held_since": held_since},
        )

    async def _check_names(self) -> bool:
        """Stop the agents whose names were given away; False if NATS did not answer."""
        node = self.node
        kv = node._names_kv
        assert kv is not None
        with node._lock:
            claims = list(node._claims)
        # Our own agents' addresses (node._names follows the watcher: it may name the new owner).
        mine = {}
        for name in claims:
            local = node.runtime.whereis(name)
            mine[name] = None if local is None else node.qualify(local)
        lost: list[str] = []
        for name in claims:
            try:
                entry = await asyncio.wait_for(kv.get(name), node.config.heartbeat * 2)
                owner = None if entry.value is None else entry.value.decode()
            except nats.js.errors.KeyNotFoundError:
                owner = None
            except (TimeoutError, nats.errors.Error):
                return False
            if owner is None or owner != mine[name]:
                lost.append(name)
                continue
            # Still ours: claim it again (a new revision), so that a peer that declared this
            # node dead and deletes its names by the revisions it saw then, leaves it alone.
            try:
                revision = await asyncio.wait_for(
                    kv.update(name, entry.value or b"", last=entry.revision),
                    node.config.heartbeat * 2,
                )
            except nats.js.errors.KeyWrongLastSequenceError:
                lost.append(name)  # changed since we read it: taken (the watcher says by whom)
                continue
            except (TimeoutError, nats.errors.Error):
                return False
            with node._lock:
                if name in node._claims:
                    node._claims[name] = int(revision)
        if lost:
            with node._lock:
                self._yielding.update(lost)
            await asyncio.get_running_loop().run_in_executor(node._pool, self._yield, lost)
        return True

    def taken(self, name: str, owner: str | None) -> None:
        """The names watcher saw ``name``, which this node claims, deleted or given to
        ``owner`` on another node after our claim (on the NATS loop): yield it, fenced or not."""
        _log.warning(
            "node %s: %r was %s after this node claimed it: yielding it",
            self.node.name,
            name,
            "deleted" if owner is None else f"given to {owner}",
        )
        runtime = self.node.runtime
        local = runtime.whereis(name)
        if local is not None:
            with suppress(AgentError):  # paused at once; stopped on the pool (it may block)
                runtime.process(local).mailbox.pause()
        with self.node._lock:
            self._yielding[name] += 1
        with suppress(RuntimeError):  # the pool is shut down: the node is leaving anyway
            self.node._pool.submit(self._yield, [name])

    def _yield(self, names: list[str]) -> None:
        """Stop the local agents of ``names``: the cluster gave the names to others. The
        caller counted each name in ``_yielding``; this uncounts it when done."""
        try:
            self._stop_names(names)
        finally:
            with self.node._lock:
                self._yielding.subtract(names)
                for name in names:
                    if self._yielding[name] <= 0:
                        del self._yielding[name]

    def _stop_names(self, names: list[str]) -> None:
        node = self.node
        for name in names:
            with node._lock:
                if node._claims.pop(name, None) is None:
                    continue  # yielded already (the watcher and the check on return both saw it)
                value = node._names.get(name)
                if value is not None and value.partition(":")[0] == node.name:
                    node._names.pop(name, None)
            local = node.runtime.whereis(name)
            if local is None:
                continue
            with node._lock:
                supervisor = node._supervisors.pop(local, None)
            if supervisor is not None:
                supervisor.stop()
                supervisor.retire()
            with suppress(NoProc):
                node.runtime.stop(local)
            self.yielded.append(name)
            _log.warning(
                "node %s: %r belongs to another node now (this one was declared dead): %s stopped",
                node.name,
                name,
                local,
            )

    def _unfence(self) -> None:
        # A name being yielded (a _yield still on the pool or stopping its agent) stays paused:
        # resumed here, its agent answered beside the new owner's until stopped (the partition
        # ledger test sampled it; once with two _yield calls for one name, the second of which
        # found the claim gone and uncounted the name while the first waited for the agent's
        # message to end: hence a count, not a set).
        runtime = self.node.runtime
        with self.node._lock:
            names = list(self._yielding)
        yielding = {runtime.whereis(name) for name in names}
        for address in self._paused:
            if address in yielding:
                continue
            with suppress(NoProc):
                process = self.node.runtime.process(address)
                process.mailbox.resume()
                process.wake()
        self._paused = []
        self.fenced = False
        runtime.hold_lifted()  # agents started while fenced were held, not paused
        _log.warning("node %s: lease renewed: unfenced", self.node.name)
