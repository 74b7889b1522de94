"""Which node runs the cluster supervisor: a lease in JetStream KV, taken over when its node dies.

The lease is the key ``sup-<supervisor>`` of the bucket ``<cluster>_leases``: a CBOR map naming
the holder (``node``), its ``state`` (``held`` or ``stopped``) and the supervisor's ``spec``
(the ``[cluster.supervisor]`` block the first holder ran, so every later holder runs the same
tree). The holder rewrites it every heartbeat with a compare-and-set on its last revision.

Every `mty node` runs a ``SupervisorLease``. The preferred node (``[cluster.supervisor] node``)
takes a lease that does not exist or was ``stopped`` (a deliberate stop). Any node takes over a
``held`` lease whose revision has not moved for ``dead_after`` seconds while its holder is not
live (no heartbeat): compare-and-set on that revision, so exactly one node wins. The winner
adopts the children still running on live nodes (found by their cluster-wide names, left as
they are, state and mailbox intact) and starts the others (those that were on a dead node)
by the placement; the restart history (intensity) starts afresh. A holder whose
compare-and-set fails (it was cut off long enough for another node to take over) detaches:
it stops supervising and leaves the children running.

No clocks are compared: staleness is measured on the observer's own monotonic clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2
import nats.errors
import nats.js.errors
from pydantic import ValidationError

from mighty._cbor import loads_untrusted
from mighty._errors import MightyError
from mighty.cluster._config import ClusterSupervisorModel
from mighty.cluster._node import ClusterError, Node
from mighty.cluster._supervisor import ClusterSupervisor

__all__ = ["SupervisorLease"]

_log = logging.getLogger(__name__)
_MAX_LEASE = 1 << 20


class _Away(Exception):
    """No answer from NATS about the lease."""


class SupervisorLease:
    """Runs ``plan``'s cluster supervisor on this node while it holds the lease (see above)."""

    def __init__(
        self,
        node: Node,
        plan: ClusterSupervisorModel,
        *,
        name: str = "cluster",
        on_start: Callable[[ClusterSupervisor, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.plan = plan
        self.key = f"sup-{name}"
        self.preferred = (plan.node or next(iter(node.config.peers))) == node.name
        self.on_start = on_start
        """``on_start(supervisor, took_over)`` once this node runs the supervisor."""
        self.clock = clock
        """Measures how long another holder's lease has not moved (a test may pass its own)."""
        self.supervisor: ClusterSupervisor | None = None
        self.takeovers = 0
        self._kv: Any = None
        self._revision = 0
        self._seen: tuple[int, float] | None = None
        """(revision, when it was first seen) of another holder's lease."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"lease-{node.name}", daemon=True)

    @property
    def held(self) -> bool:
        return self.supervisor is not None

    def start(self) -> SupervisorLease:
        """Open the bucket, try once now (so the preferred node starts supervising before this
        returns), then keep refreshing or watching on a thread (a step each heartbeat)."""
        self.open()
        self.step()
        self._thread.start()
        return self

    def open(self) -> SupervisorLease:
        """Open the lease bucket (``start`` does; without it, ``step`` is called by hand)."""
        node = self.node
        js = node._call(self._jetstream(), 10)
        try:
            self._kv = node._call(node._bucket(js, f"{node.prefix}_leases", None), 10)
        except nats.errors.Error as exc:
            raise ClusterError(f"cannot open the supervisor's lease bucket: {exc}") from None
        return self

    def step(self) -> None:
        """One look at the lease: refresh it (holding), or take it when it is ours to take."""
        self._step()

    async def _jetstream(self) -> Any:
        assert self.node._nc is not None
        return self.node._nc.jetstream()

    def stop(self) -> None:
        """Stop supervising: the children are stopped, and the lease is marked ``stopped``."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(5)
        supervisor, self.supervisor = self.supervisor, None
        if supervisor is None:
            return
        supervisor.stop()
        try:
            self.node._call(
                self._kv.update(self.key, self._value("stopped"), last=self._revision), 5
            )
        except (nats.errors.Error, MightyError) as exc:
            _log.warning("lease %s: not marked stopped: %s", self.key, exc)

    def _value(self, state: str) -> bytes:
        return bytes(
            cbor2.dumps(
                {"node": self.node.name, "state": state, "spec": self.plan.model_dump(mode="json")}
            )
        )

    def _loop(self) -> None:
        interval = self.node.config.heartbeat
        while not self._stopped.wait(interval):
            try:
                self.step()
            except Exception:  # noqa: BLE001 -- the lease thread must go on
                _log.exception("lease %s: step failed", self.key)

    def _step(self) -> None:
        if self.supervisor is not None:
            self._refresh()
            return
        try:
            entry = self._get()
        except _Away:
            return  # NATS away: try again later
        if entry is None:
            if self.preferred:
                self._take(None, took_over=False)
            return
        revision, holder, state, spec = entry
        if state == "stopped":
            self._seen = None
            if self.preferred:
                self._take(revision, took_over=False, spec=spec)
            return
        now = self.clock()
        if self._seen is None or self._seen[0] != revision:
            self._seen = (revision, now)
            return
        stale = now - self._seen[1] > self.node.config.dead_after
        if stale and (holder == self.node.name or holder not in self.node.live_nodes()):
            self._take(revision, took_over=True, spec=spec, holder=holder)

    def _get(self) -> tuple[int, str, str, Any] | None:
        """(revision, holder, state, spec) of the lease; None if there is none; _Away."""
        try:
            entry = self.node._call(self._kv.get(self.key), 5)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except (nats.errors.Error, MightyError) as exc:
            _log.info("lease %s: %s", self.key, exc)
            raise _Away from None
        value = entry.value or b""
        try:
            data = loads_untrusted(value) if len(value) <= _MAX_LEASE else None
        except Exception:  # noqa: BLE001 -- cbor2 raises many kinds on garbage
            data = None
        if not isinstance(data, dict):
            data = {}
        holder, state = data.get("node"), data.get("state")
        return (
            int(entry.revision),
            holder if isinstance(holder, str) else "",
            state if state in ("held", "stopped") else "held",
            data.get("spec"),
        )

    def _spec(self, spec: Any) -> ClusterSupervisorModel:
        """The stored spec (validated, its nodes in this cluster), else this node's own plan."""
        if spec is None:
            return self.plan
        try:
            model = ClusterSupervisorModel.model_validate(spec)
        except ValidationError as exc:
            _log.warning("lease %s: stored spec unreadable (%s); using ours", self.key, exc)
            return self.plan
        peers = self.node.config.peers
        if any(c.node is not None and c.node not in peers for c in model.children):
            _log.warning("lease %s: stored spec names unknown nodes; using ours", self.key)
            return self.plan
        return model

    def _take(
        self, revision: int | None, *, took_over: bool, spec: Any = None, holder: str = ""
    ) -> None:
        plan = self._spec(spec)
        self.plan = plan
        value = self._value("held")
        try:
            if revision is None:
                self._revision = int(self.node._call(self._kv.create(self.key, value), 5))
            else:
                self._revision = int(
                    self.node._call(self._kv.update(self.key, value, last=revision), 5)
                )
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # another node was first
        except (nats.errors.Error, MightyError) as exc:
            _log.info("lease %s: not taken: %s", self.key, exc)
            return
        self._seen = None
        if took_over:
            self.takeovers += 1
            _log.warning(
                "node %s: took over the cluster supervisor from %s", self.node.name, holder
            )
        supervisor = ClusterSupervisor.from_model(self.node, plan)
        supervisor.adopt()
        self.supervisor = supervisor
        if self.on_start is not None:
            self.on_start(supervisor, took_over)

    def _refresh(self) -> None:
        try:
            self._revision = int(
                self.node._call(
                    self._kv.update(self.key, self._value("held"), last=self._revision), 5
                )
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            supervisor, self.supervisor = self.supervisor, None
            _log.warning(
                "node %s: lost the cluster supervisor's lease; children left running",
                self.node.name,
            )
            if supervisor is not None:
                supervisor.detach()
        except (nats.errors.Error, MightyError) as exc:
            _log.info("lease %s: refresh failed: %s", self.key, exc)
