"""A node: one Runtime joined to a cluster through NATS, routing messages for other nodes.

``Node(runtime, config).start()`` connects (nats-py, on an asyncio loop in a thread of its
own), claims its node name, subscribes to its subject and installs itself as the runtime's
``router``: from then on ``send``/``ask`` to ``node:type:pid`` or to a cluster-wide name held
by another node go over NATS, from the host API and from guests alike.

- ``send`` is a NATS request whose reply acknowledges that the remote mailbox accepted the
  message (or says why not: ``noproc``, ``mailbox-full``, ``circuit-open``), so a remote send
  returns or fails as a local one does. Sends go through a pipe per sender and address
  (``_pipes``): ``send_future`` queues without waiting, and what queued while a frame was in
  flight goes in one ``sends`` frame, in order. Delivery is at most once: a message in a
  mailbox of a node that dies is lost, as a local one is when its process dies.
- ``ask`` is a NATS request/reply carrying the asker's deadline (``ttl``); the asker's future
  always settles by its own deadline (``AskTimeout``), whatever NATS does.
- Backpressure: an incoming message for a full ``block`` mailbox waits on a worker thread (at
  most ``max_inflight`` of them wait at once; beyond that the answer is ``mailbox-full``); the
  NATS subscription itself is bounded, never an unbounded buffer.
- Names: a name registered with ``spawn(..., name=)`` is claimed in the JetStream KV bucket
  ``<cluster>_names``; a name another live node holds is refused with BadSpawn naming it.
- Liveness: every node publishes a heartbeat each ``heartbeat`` seconds; one silent for
  ``dead_after`` is dead: messages to it fail with ``noproc`` at once, and membership listeners
  (the cluster supervisor) hear of it. A node that leaves on purpose (``close``: `mty node`
  after SIGINT/SIGTERM) says so in a last heartbeat with ``leaving`` set, on its own heartbeat
  subject (so NATS's publish permissions vouch for it as for every frame): its peers log
  "node b left the cluster" at once instead of "dead (silent for ...)" ``dead_after`` later,
  and ``has_left(b)`` tells listeners it was not a crash (its supervised children are reported
  stopped, not crashed). Rejected: a frame kind of its own (a heartbeat already has the
  subject, the size bound and the ordering after the node's earlier heartbeats), and reading
  the deletion of the node's key in ``<cluster>_nodes`` (the key also expires by TTL, and a
  watcher is one more subscription per node for one bit).

Frames that are not ours (garbage, a newer version, a node outside ``[cluster.peers]``) are
dropped, counted in ``stats.dropped`` by reason, and logged (the first few, then every 1000th).
The sender and the size are checked before a byte is decoded: the sender is the last token of
the subject (``<prefix>.node.<node>.<sender>``, ``<prefix>.hb.<sender>``; see ``_frames``), and
the frame's own ``node`` must agree with it. Frames over a few KiB are decoded on the node's
decoder thread, not on the NATS loop, which also runs the heartbeats: a flood of large frames
(up to ``max_frame`` each, hundreds of thousands of items) cannot hold up liveness; the
subscription waits for each, so frames still arrive in order. Rejected: decoding every frame
off the loop (a thread hop per message, for frames that decode in microseconds).

Threads: nothing on the NATS loop blocks (a blocking delivery, a spawn, a name lookup run on
the node's small thread pool); calls from other threads wait on the loop with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from mighty._errors import BadInput, HostError
from mighty.agents import (
    AgentChild,
    AgentCrashed,
    AgentError,
    AskTimeout,
    BadSpawn,
    HandlerFailed,
    MailboxFullError,
    NoProc,
    Refused,
    Runtime,
    Supervisor,
    SupervisorSpec,
    SupervisorStartFailed,
    decode_body,
    start_tree,
)
from mighty.cluster._aio import eager as _eager
from mighty.cluster._aio import settle as _set
from mighty.cluster._config import ClusterConfig, check_node_name
from mighty.cluster._durable import Durable
from mighty.cluster._fence import Fence
from mighty.cluster._frames import (
    Frame,
    FrameError,
    decode,
    encode,
    heartbeat_subject,
    node_subject,
    sender_of,
)
from mighty.cluster._migrate import MigrationReport, accept_migration, forward_frame, migrate
from mighty.cluster._moved import on_membership, reclaim
from mighty.cluster._pipes import SendPipes
from mighty.cluster._replies import acknowledgement, error_of
from mighty.cluster._replies import error_frame as _err

__all__ = ["ClusterError", "Node", "NodeStats"]

_log = logging.getLogger(__name__)
T = TypeVar("T")

_KEY = re.compile(r"^[-_=A-Za-z0-9]{1,256}$")
_POOL = 8
_SUB_PENDING = 65_536
_SUB_PENDING_BYTES = 64 << 20
_LOGGED_DROPS = 10
_INLINE_DECODE = 4096
"""Frames up to this many bytes are decoded on the NATS loop (microseconds); larger ones on the
decoder thread."""
_HEARTBEAT_MAX = 4096


class ClusterError(HostError):
    """The node could not join or talk to the cluster (NATS down, a name clash, a bad peer)."""

    kind = "cluster_error"


@dataclass
class NodeStats:
    """Counters of one node."""

    sent: int = 0
    asked: int = 0
    received: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    """Frames dropped, by reason: garbage, version, size, field, peer."""


class Node:
    """This runtime's membership of a cluster (see the module docstring)."""

    _cut_off_at = -1e9
    """When this node last saw its own lease stale (``_check_liveness``)."""
    orphans: dict[str, tuple[Any, Supervisor]]
    """Remote children adopted here when their home went, by name: (the ``Reporter`` they had,
    the adoptive supervisor); handed back to a home that starts their tree again, or to an old
    home heard again that still supervises them (see _moved)."""
    _held: list[Any]
    """Children handed back here, held until the tree that takes them started."""
    _moving: dict[str, threading.Event]
    _cluster: set[Supervisor]
    """The one-child supervisors of cluster children here (``spawn_on(..., supervise=)``, or
    adopted): a node death is their cluster supervisor's to restart, not theirs."""
    """Agents migrating away: sends to their old address wait for the event (``moving``)."""

    def __init__(self, runtime: Runtime, config: ClusterConfig, *, name: str | None = None) -> None:
        node = name or config.node
        if node is None:
            raise BadInput("the node needs a name: [cluster] node = ... or --name")
        self.name = check_node_name(node)
        if self.name not in config.peers:
            allowed = ", ".join(sorted(config.peers))
            raise BadInput(f"node {self.name!r} is not in [cluster.peers] ({allowed})")
        self.runtime = runtime
        self.config = config
        self.prefix = config.name
        self.subject = f"{self.prefix}.node.{self.name}"
        self.stats = NodeStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"cluster-{self.name}", daemon=True
        )
        self._pool = ThreadPoolExecutor(_POOL, thread_name_prefix=f"cluster-{self.name}")
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix=f"cluster-{self.name}-decode")
        self._nc: Client | None = None
        self._watcher: Any = None
        self._names_kv: KeyValue | None = None
        self._nodes_kv: KeyValue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._seen: dict[str, float] = {}
        self._load: dict[str, int] = {}
        self._dead: set[str] = set()
        self._left: set[str] = set()  # peers that said they were leaving (within _dead)
        self._names: dict[str, str] = {}
        self._claims: dict[str, int] = {}
        self._supervisors: dict[str, Supervisor] = {}
        self._moved: dict[str, str] = {}
        """Addresses whose agent migrated: old (local or node:type:pid) -> node:type:pid."""
        self._takeover: dict[str, str] = {}
        # Names a migration's commit is handing to another node: name -> node.
        self._handoffs: dict[str, str] = {}
        self._trees: list[Supervisor] = []
        self._owners: dict[str, str] = {}
        """Every name's latest owner seen, kept after its entry is deleted (see last_owner)."""
        # Each name's revision in the names bucket as the watcher last saw it; and per node,
        # those of its names when it was last declared dead or left: the fencing tokens
        # forget_names_of deletes by (a node that came back and claimed them again keeps them).
        self._revisions: dict[str, int] = {}
        self._dead_revisions: dict[str, dict[str, int]] = {}
        self.relocated: dict[tuple[str, str], Any] = {}
        """Supervised agents that migrated away, by (supervisor, child): see _moved."""
        self.orphans, self._held, self._moving, self._cluster = {}, [], {}, set()
        self._listeners: list[Callable[[str, bool], None]] = []
        self._inflight, self._ids = 0, itertools.count(1)
        self._lock = threading.Lock()
        self._closed, self.started_at = False, time.time()
        self.durable = Durable(self)
        self.fence = Fence(self)
        self.pipes = SendPipes(self)
        """Sends to other nodes, queued per sender and address (see ``_pipes``)."""
        # Kinds handled on the pool (they may block: instantiate a component, drain an agent).
        self._handlers: dict[str, Callable[[Frame], Frame]] = {
            "spawn": self._in_spawn,
            "stop": self._in_stop,
            "migrate": lambda frame: accept_migration(self, frame),
        }
        self.on_membership(lambda node, alive: on_membership(self, node, alive))

    # -- life -------------------------------------------------------------------------------

    def start(self) -> Node:
        """Connect, claim the node name, subscribe; then route the runtime's remote messages."""
        if self._closed:
            raise ClusterError(f"node {self.name} has left the cluster; make a new Node")
        self._thread.start()
        try:
            self._call(self._start(), self.config.connect_timeout + 10)
        except BaseException:
            self.close()
            raise
        self.runtime.router = self
        return self

    def _ssl(self) -> ssl.SSLContext | None:
        tls = self.config.tls
        if tls is None:
            return None
        try:
            context = ssl.create_default_context(cafile=tls.ca)
            if tls.cert is not None:
                context.load_cert_chain(tls.cert, tls.key)
        except (OSError, ssl.SSLError) as exc:
            raise BadInput(f"[cluster] tls: {exc}") from None
        return context

    async def _start(self) -> None:
        config = self.config
        options: dict[str, Any] = {
            "servers": config.servers,
            "name": f"mighty-{self.name}",
            "connect_timeout": max(1, int(config.connect_timeout)),
            "reconnect_time_wait": 0.5,
            "max_reconnect_attempts": -1,
            "allow_reconnect": True,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        context = self._ssl()
        if context is not None:
            options["tls"] = context
        if config.creds is not None:
            options["user_credentials"] = config.creds
        try:
            nc = await asyncio.wait_for(nats.connect(**options), config.connect_timeout)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            servers = ", ".join(config.servers)
            raise ClusterError(
                f"no NATS server answered at {servers}: {str(exc) or type(exc).__name__}"
            ) from None
        self._nc = nc
        js = nc.jetstream()
        try:
            self._names_kv = await self._bucket(js, f"{self.prefix}_names", None)
            self._nodes_kv = await self._bucket(js, f"{self.prefix}_nodes", config.dead_after)
        except nats.errors.Error as exc:
            raise ClusterError(
                f"JetStream is not available on {config.servers[0]}: {exc}"
            ) from None
        claimed = time.monotonic()
        try:
            await self._nodes_kv.create(self.name, encode(self._heartbeat()))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise ClusterError(
                f"node name {self.name!r} is in use: a live node refreshed it within the last "
                f"{config.dead_after:g} s (if it died, start again after that)"
            ) from None
        self.fence.renew(claimed)  # the first lease
        self.runtime.hold_while(self.fence.holding)  # see _fence: held while the lease is stale
        # Bounded: past these, NATS drops for this slow consumer (counted by the server).
        await nc.subscribe(
            f"{self.subject}.*",  # the last token names the sender
            cb=self._on_request,
            pending_msgs_limit=_SUB_PENDING,
            pending_bytes_limit=_SUB_PENDING_BYTES,
        )
        await nc.subscribe(
            heartbeat_subject(self.prefix, "*"),
            cb=self._on_heartbeat,
            pending_msgs_limit=1024,
            pending_bytes_limit=1 << 20,
        )
        if self.durable.types:
            try:
                await self.durable.setup(nc)
            except nats.errors.Error as exc:
                raise ClusterError(f"cannot set up the durable stream: {exc}") from None
        watcher = await self._names_kv.watchall()
        self._watcher = watcher
        self._tasks.append(asyncio.ensure_future(self._watch_names(watcher)))
        self._tasks.append(asyncio.ensure_future(self._beat()))
        self._tasks.append(asyncio.ensure_future(self.fence.watch()))
        await nc.flush()

    async def _bucket(self, js: Any, bucket: str, ttl: float | None) -> KeyValue:
        try:
            kv: KeyValue = await js.key_value(bucket)
            return kv
        except nats.js.errors.BucketNotFoundError:
            pass
        try:
            created: KeyValue = await js.create_key_value(bucket=bucket, history=1, ttl=ttl)
        except nats.js.errors.BadRequestError:  # created by another node just now
            created = await js.key_value(bucket)
        return created

    def close(self, timeout: float = 5.0) -> None:
        """Leave the cluster: names released, the node's key removed, the connection drained."""
        if self._closed:
            return
        self._closed = True
        if self.runtime.router is self:
            self.runtime.router = None
        self.runtime.hold_while(None)  # the runtime goes on alone: no lease to keep
        self.durable.close()
        if self._thread.is_alive():
            try:
                self._call(self._close(), timeout)
            except (ClusterError, HostError) as exc:
                _log.warning("node %s: leaving the cluster: %s", self.name, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._decoder.shutdown(wait=False, cancel_futures=True)

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        nc = self._nc
        if nc is None:
            return
        if self._watcher is not None:
            with suppress(TimeoutError, nats.errors.Error):
                await asyncio.wait_for(self._watcher.stop(), 1.0)
        if nc.is_connected:
            for name, revision in list(self._claims.items()):
                await self._delete_name(name, revision)
            # After the names are free: a peer that restarts our agents can claim them.
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                leaving = encode(self._heartbeat(leaving=True))
                await nc.publish(heartbeat_subject(self.prefix, self.name), leaving)
                await asyncio.wait_for(nc.flush(), 1.0)
            if self._nodes_kv is not None:
                with contextlib.suppress(TimeoutError, nats.errors.Error):
                    await asyncio.wait_for(self._nodes_kv.delete(self.name), 1.0)
        # The server may be gone: nats-py's close then flushes into a lost connection
        # (ConnectionResetError); leaving must not fail on that.
        with contextlib.suppress(TimeoutError, OSError, nats.errors.Error):
            await asyncio.wait_for(nc.close(), 2.0)
        # Every task still on the loop (nats-py's subscription readers among them) ends here:
        # one left pending is collected after the loop closed, and its clean-up raises then
        # ("Event loop is closed"), an unraisable error in whatever runs at that moment.
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=1.0)

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The node's asyncio loop (NATS runs on it, in the node's own thread)."""
        return self._loop

    def next_id(self) -> int:
        """A number no other frame of this node carries (frame ids, message ids)."""
        return next(self._ids)

    def note_bad_reply(self, to: str, what: str) -> None:
        """A reply from ``to``'s node that decoded but does not fit what was asked: dropped."""
        self._drop("field", f"{what} (from {to})")

    # -- calls onto the loop ----------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        if threading.get_ident() == self._thread.ident:
            coro.close()
            raise HostError("a blocking cluster call on the NATS loop (a bug)")
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        except RuntimeError:
            coro.close()
            raise ClusterError(f"node {self.name} has left the cluster") from None
        try:
            return future.result(timeout)
        except FutureCancelled:
            # The node is leaving: its close ends every task still on the loop.
            raise ClusterError(f"node {self.name} has left the cluster") from None
        except FutureTimeout:
            # Cancelling hands the cancel to the loop; once the node has closed it, the
            # coroutine runs no more and the hand-off would fail (logged from a callback).
            if not self._loop.is_closed():
                future.cancel()
            raise ClusterError(
                f"node {self.name}: no answer from NATS within {timeout:g} s"
            ) from None

    async def _on_error(self, exc: Exception) -> None:
        _log.warning("node %s: NATS: %s", self.name, exc)

    async def _on_disconnected(self) -> None:
        if self._closed:
            return
        _log.warning("node %s: disconnected from NATS; reconnecting", self.name)

    async def _on_reconnected(self) -> None:
        _log.warning("node %s: reconnected to NATS", self.name)

    # -- addresses --------------------------------------------------------------------------

    def qualify(self, address: str) -> str:
        """``type:pid`` (or ``host``) of this node as ``node:type:pid``; others unchanged."""
        if address.count(":") == 2:
            return address
        if address.count(":") == 1 or address == "host":
            return f"{self.name}:{address}"
        return address

    def localize(self, address: str) -> str:
        """``node:type:pid`` of this node as ``type:pid``; others unchanged."""
        node, _, rest = address.partition(":")
        return rest if node == self.name and rest.count(":") == 1 else address

    def route(self, address: str) -> str | None:
        """RemoteRouter.route: the local form, or None when another node holds ``address``."""
        if self._moved_to(address) is not None:
            return None
        parts = address.split(":")
        if len(parts) == 3:
            if parts[0] == self.name:
                return f"{parts[1]}:{parts[2]}"
            if parts[0] not in self.config.peers:
                raise NoProc(f"no node {parts[0]!r} in this cluster (address {address!r})")
            return None
        if len(parts) != 1:
            return address
        owner = self.whereis(address)
        if owner is None:
            return address
        node, _, local = owner.partition(":")
        return local if node == self.name else None

    def whereis(self, name: str) -> str | None:
        """The cluster-wide address (``node:type:pid``) registered under ``name``, if any."""
        with self._lock:
            found = self._names.get(name)
        if found is not None or not _KEY.match(name):
            return found
        if threading.get_ident() == self._thread.ident:
            return None
        try:
            return self._call(self._get_name(name), 5.0)
        except ClusterError:
            return None

    async def _get_name(self, name: str) -> str | None:
        assert self._names_kv is not None
        try:
            entry = await self._names_kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.errors.Error:
            return None
        value = _address_value(entry.value)
        if value is not None:
            with self._lock:
                self._names[name] = value
        return value

    def _target(self, to: str) -> tuple[str, str]:
        """(the node, the address in the frame) for a remote ``to``."""
        self._wait_moved(to)
        to = self._moved_to(to) or to
        parts = to.split(":")
        if len(parts) == 3:
            node, target = parts[0], f"{parts[1]}:{parts[2]}"
        else:
            owner = self.whereis(to)
            if owner is None:
                raise NoProc(f"no agent at {to!r}")
            node, target = owner.partition(":")[0], to
        if node in self._dead:
            raise NoProc(f"{to}: node {node} is down")
        return node, target

    def _moved_to(self, address: str) -> str | None:
        """Where the agent once at ``address`` lives now (after migrations), if it moved."""
        found = None
        with self._lock:
            for _ in range(8):
                key = self.localize(address)
                nxt = self._moved.get(key) or self._moved.get(address)
                if nxt is None:
                    break
                found = address = nxt
        return found

    def moving(self, local: str, new_address: str) -> threading.Event:
        """Record that ``local`` moved to ``new_address``; sends to it wait for the event."""
        ready = threading.Event()
        with self._lock:
            self._moving[local] = ready
            self._moved[local] = new_address
        return ready

    def _wait_moved(self, address: str) -> None:
        with self._lock:
            ready = self._moving.get(self.localize(address))
        if ready is not None and not ready.wait(30):
            raise AskTimeout(f"{address} is still moving")

    def migrate(self, address: str, node: str, *, drain_timeout: float = 5.0) -> MigrationReport:
        """Move the agent at ``address`` (on this node), live, to ``node``; see _migrate."""
        return migrate(self, address, node, drain_timeout=drain_timeout)

    def last_owner(self, name: str) -> str | None:
        """Where ``name`` was last seen registered (even if its entry is gone since): a
        migrated child's cluster supervisor knows where it lived when its node went away."""
        with self._lock:
            return self._names.get(name) or self._owners.get(name)

    def adopt(self, supervisor: Supervisor) -> Supervisor:
        """Let this node's migrations find ``supervisor``'s children (they move with their
        child spec: see _moved); `mty node` adopts its ``[supervisor]`` tree."""
        with self._lock:
            self._trees.append(supervisor)
        return supervisor

    def start_tree(self, spec: SupervisorSpec) -> Supervisor:
        """Start the supervision tree ``spec`` here and ``adopt`` it. Its children that another
        node adopted while this node was gone (an earlier process under this node's name) are
        handed back first: moved here live (state and mailbox), held (no message taken) until
        the tree's start has taken them as its own, then let run. `mty node` starts its
        ``[supervisor]`` tree so."""
        reclaim(self, _agent_names(spec))
        try:
            return self.adopt(start_tree(self.runtime, spec))
        finally:
            with self._lock:
                held, self._held = self._held, []
            for process in held:
                process.mailbox.resume()
                process.wake()

    def hold(self, process: Any) -> None:
        """A child handed back (``start_tree``): its mailbox stays paused until the tree
        started."""
        with self._lock:
            self._held.append(process)

    def drop_supervisor(self, supervisor: Supervisor) -> None:
        """``supervisor`` no longer supervises an agent here (its child was handed back, or
        its cluster supervisor restarts it elsewhere)."""
        with self._lock:
            for address, held in list(self._supervisors.items()):
                if held is supervisor:
                    del self._supervisors[address]
            self._cluster.discard(supervisor)

    def hold_supervisor(self, local: str, supervisor: Supervisor, *, cluster: bool) -> None:
        """``supervisor`` is this node's one-child supervisor of the agent at ``local`` now
        (an adopted remote child, or one back home): stopping that agent stops it for good.
        ``cluster``: the child is a cluster supervisor's (see ``is_cluster_child``)."""
        with self._lock:
            for address, held in list(self._supervisors.items()):
                if held is supervisor:
                    del self._supervisors[address]
            self._supervisors[local] = supervisor
            if cluster:
                self._cluster.add(supervisor)

    def is_cluster_child(self, supervisor: Supervisor) -> bool:
        """``supervisor`` is this node's one-child supervisor of a cluster supervisor's child:
        the death of the node the child runs on is the cluster supervisor's to restart."""
        with self._lock:
            return supervisor in self._cluster

    def supervision_trees(self) -> list[Supervisor]:
        """The supervisors adopted, and the one-child ones of this node's cluster children."""
        with self._lock:
            return [*self._trees, *self._supervisors.values()]

    def max_payload(self) -> int:
        """The largest message the NATS server takes (its INFO ``max_payload``)."""
        nc = self._nc
        return int(nc.max_payload) if nc is not None and nc.max_payload else 1 << 20

    def expect_takeover(self, name: str, previous: str) -> None:
        """A migration moves ``name`` from ``previous`` to an agent here: let the claim take it."""
        with self._lock:
            self._takeover[name] = previous

    def handing_off(self, name: str, node: str | None) -> None:
        """A migration is about to hand ``name`` to ``node`` (None: it no longer is): that
        node's claim is expected, not a takeover to yield to (see ``_watch_names``)."""
        with self._lock:
            if node is None:
                self._handoffs.pop(name, None)
            else:
                self._handoffs[name] = node

    def takeover_done(self, name: str, new_address: str) -> None:
        """``name`` moved to ``new_address`` on another node (our claim is theirs now)."""
        with self._lock:
            self._claims.pop(name, None)
            self._handoffs.pop(name, None)
            self._names[name] = new_address

    # -- outgoing ---------------------------------------------------------------------------

    def send(self, to: str, name: str, body: bytes, *, sender: str, timeout: float | None) -> None:
        """RemoteRouter.send: returns when the remote mailbox accepted the message.

        A send by name to an agent of a durable type returns when JetStream stored it. The
        message joins the sender's pipe to ``to`` (see ``_pipes``), behind any sent with
        ``send_future`` before it.
        """
        wait = timeout if timeout is not None else self.config.ask_timeout
        future = self.send_future(to, name, body, sender=sender, timeout=timeout)
        try:
            future.result(wait + 1.0)
        except FutureTimeout:
            raise AskTimeout(f"no acknowledgement from {to} within {wait:g} s") from None

    def send_future(
        self, to: str, name: str, body: bytes, *, sender: str, timeout: float | None
    ) -> Future[None]:
        """RemoteRouter.send_future: the message queued in its pipe (see ``_pipes``); the
        future settles when the remote mailbox took it, or with the AgentError why not.

        A send by name to an agent of a durable type is stored by JetStream before this
        returns (one round trip each; the future is settled)."""
        wait = timeout if timeout is not None else self.config.ask_timeout
        qualified = self.qualify(sender)
        if self.durable.types and to.count(":") == 0:
            owner = (self.whereis(to) or "").split(":")
            if len(owner) == 3 and owner[1] in self.durable.types:
                self.stats.sent += 1
                future: Future[None] = Future()
                try:
                    self.durable.publish(to, name, body, sender=qualified, timeout=wait)
                except AgentError as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(None)
                return future
        node, target = self._target(to)
        self.stats.sent += 1
        return self.pipes.submit(to, node, target, qualified, name, body, wait)

    def ask(
        self,
        to: str,
        name: str,
        body: bytes,
        *,
        sender: str,
        timeout: float,
        chain: tuple[str, ...],
    ) -> Future[bytes | None]:
        """RemoteRouter.ask: the reply's future; it settles by the deadline at the latest."""
        node, target = self._target(to)
        frame = Frame(
            "ask",
            node=self.name,
            to=target,
            sender=self.qualify(sender),
            name=name,
            body=body,
            ttl=max(1, int(timeout * 1000)),
            chain=tuple(self.qualify(c) for c in chain),
        )
        self.stats.asked += 1
        future: Future[bytes | None] = Future()
        self._submit(node, to, frame, timeout, future)
        return future

    def _submit(
        self, node: str, to: str, frame: Frame, timeout: float, future: Future[bytes | None]
    ) -> None:
        data = encode(frame)
        if len(data) > self.config.max_frame:
            raise Refused(
                f"{to}: a message of {len(data)} bytes exceeds the cluster's frame limit "
                f"({self.config.max_frame})"
            )
        coro = self._request(node_subject(self.prefix, node, self.name), to, data, timeout, future)
        try:
            self._loop.call_soon_threadsafe(_eager, self._loop, coro)
        except RuntimeError:
            coro.close()
            raise NoProc(f"{to}: this node has left the cluster") from None

    async def _request(
        self, subject: str, to: str, data: bytes, timeout: float, future: Future[bytes | None]
    ) -> None:
        try:
            reply = await self.exchange(subject, to, data, timeout)
        except AgentError as exc:
            _set(future, error=exc)
            return
        except BaseException:
            # The node leaves (its loop's tasks are cancelled): the asker hears at once, not at
            # its deadline. The message may have been taken: no reply, not NoProc.
            _set(future, error=AskTimeout(f"{to}: this node left before the reply"))
            raise
        _set(future, reply.body or None)

    async def exchange(self, subject: str, to: str, data: bytes, timeout: float) -> Frame:
        """The ``ok`` reply to a request frame for ``to`` sent on ``subject``; an AgentError
        for an ``err`` reply (the remote side's), no reply (AskTimeout) or no node (NoProc)."""
        nc = self._nc
        if nc is None or nc.is_closed:
            raise NoProc(f"{to}: this node has left the cluster")
        try:
            msg = await nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise NoProc(f"{to}: its node is not running") from None
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            what = "no reply" if isinstance(exc, TimeoutError) else f"no reply ({exc})"
            raise AskTimeout(f"{what} from {to} within {timeout:g} s") from None
        try:
            reply = await self.decoded(msg.data, self.config.max_frame)
        except FrameError as exc:
            self._drop(exc.reason, f"a reply from {to}: {exc.message}")
            raise AskTimeout(f"{to} answered with a frame this node cannot read") from None
        moved = reply.extra.get("moved")
        if (
            isinstance(moved, str)
            and moved.count(":") == 2
            and moved.partition(":")[0] in self.config.peers
        ):
            with self._lock:
                self._moved[to] = moved  # the old node forwarded: go direct from now on
        if reply.k == "ok":
            return reply
        if reply.k == "err":
            if reply.code == "noproc" and to.count(":") == 0:
                with self._lock:
                    self._names.pop(to, None)
            raise error_of(reply)
        self._drop("field", f"a reply of kind {reply.k!r} from {to}")
        raise AskTimeout(f"{to} answered with a {reply.k!r} frame")

    def request(self, node: str, frame: Frame, timeout: float) -> Frame:
        """A request frame to ``node``, waiting for its ``ok`` reply (an AgentError otherwise)."""
        if node in self._dead:
            raise NoProc(f"node {node} is down")
        future: Future[bytes | None] = Future()
        holder: list[Frame] = []

        async def go() -> None:
            nc = self._nc
            assert nc is not None
            try:
                msg = await nc.request(
                    node_subject(self.prefix, node, self.name), encode(frame), timeout=timeout
                )
                reply = await self.decoded(msg.data, self.config.max_frame)
            except nats.errors.NoRespondersError:
                _set(future, error=NoProc(f"node {node} is not running"))
                return
            except (TimeoutError, nats.errors.Error, OSError, FrameError) as exc:
                _set(
                    future,
                    error=AskTimeout(f"no reply from node {node} within {timeout:g} s ({exc})"),
                )
                return
            if reply.k == "err":
                _set(future, error=error_of(reply))
                return
            holder.append(reply)
            _set(future, None)

        self._call(go(), timeout + 2.0)
        future.result(0)
        return holder[0]

    # -- incoming ---------------------------------------------------------------------------

    def _drop(self, reason: str, what: str) -> None:
        self.stats.dropped[reason] += 1
        count = self.stats.dropped[reason]
        if count <= _LOGGED_DROPS or count % 1000 == 0:
            _log.warning("node %s: dropped %s (%s; %d so far)", self.name, what, reason, count)

    async def _respond(self, msg: Msg, frame: Frame) -> None:
        nc = self._nc
        if not msg.reply or nc is None:
            return
        try:
            await nc.publish(msg.reply, encode(frame))
        except nats.errors.Error as exc:
            _log.warning("node %s: replying failed: %s", self.name, exc)

    def _answer(self, msg: Msg, frame: Frame) -> None:
        """Reply from any thread."""
        if self._closed:
            return
        with suppress(RuntimeError):  # the loop is closed: the asker times out
            self._loop.call_soon_threadsafe(self._reply_soon, msg, frame)

    def _reply_soon(self, msg: Msg, frame: Frame) -> None:
        _eager(self._loop, self._respond(msg, frame))

    async def decoded(self, data: bytes, max_frame: int) -> Frame:
        """``decode(data)``; on the decoder thread when it is large (see the module docstring)."""
        if len(data) <= _INLINE_DECODE:
            return decode(data, max_frame=max_frame)
        if len(data) > max_frame:
            raise FrameError(f"frame of {len(data)} bytes (limit {max_frame})", reason="size")
        try:
            future = self._decoder.submit(decode, data, max_frame=max_frame)
        except RuntimeError:  # shut down: the node is leaving
            raise FrameError("a frame while the node leaves", reason="closing") from None
        return await asyncio.wrap_future(future)

    async def _on_request(self, msg: Msg) -> None:
        # Before a byte is decoded: who sent it (the subject's last token), and how much.
        sender = sender_of(msg.subject)
        if sender not in self.config.peers:
            self._drop("peer", f"a frame from {sender[:64]!r}, not in [cluster.peers]")
            return
        try:
            frame = await self.decoded(msg.data, self.config.max_frame)
        except FrameError as exc:
            self._drop(exc.reason, f"a frame from {sender}: {exc.message}")
            if exc.reason == "version":
                await self._respond(
                    msg, Frame("err", node=self.name, code="failed", msg=exc.message)
                )
            return
        if frame.node != sender:
            self._drop("sender", f"a frame from {sender} that says it is from {frame.node!r}")
            return
        self.stats.received += 1
        if frame.k in ("send", "sends", "ask"):
            moved = self._moved_to(frame.to)
            if moved is not None:
                with self._lock:
                    ready = self._moving.get(self.localize(frame.to))
                self._loop.create_task(forward_frame(self, msg, frame, moved, ready))
                return
        try:
            if frame.k == "send":
                self._in_send(msg, frame)
            elif frame.k == "sends":
                self._in_sends(msg, frame)
            elif frame.k == "ask":
                self._in_ask(msg, frame)
            elif frame.k in self._handlers:
                self._in_pool(msg, frame)
            else:
                self._drop("field", f"a {frame.k!r} frame on {msg.subject}")
        except AgentError as exc:
            await self._respond(msg, _err(self.name, exc))

    def _local(self, to: str) -> str:
        """The local address a frame's ``to`` names (a name resolved here), or NoProc."""
        target = self.localize(to)
        if target.count(":") == 1:
            return target
        if target.count(":") == 0:
            found = self.runtime.whereis(target)
            if found is not None:
                return found
        raise NoProc(f"no agent at {to!r} on node {self.name}")

    def _blocks(self, address: str) -> bool:
        """The target's mailbox is full and its policy is to block."""
        mailbox = self.runtime.process(address).mailbox
        return mailbox.on_full == "block" and len(mailbox) >= mailbox.capacity

    def _slow(self, msg: Msg, work: Callable[[], None]) -> None:
        """Run a delivery that may block on the pool (bounded), answering mailbox-full beyond."""
        if self._inflight >= self.config.max_inflight:
            raise MailboxFullError(f"node {self.name}: too many deliveries waiting for space")
        self._inflight += 1

        def run() -> None:
            try:
                work()
            finally:
                self._loop.call_soon_threadsafe(self._done_inflight)

        self._pool.submit(run)

    @property
    def waiting(self) -> int:
        """Incoming messages waiting on this node for space in a full ``block`` mailbox (at
        most ``max_inflight``)."""
        return self._inflight

    def _done_inflight(self) -> None:
        self._inflight -= 1

    def _in_send(self, msg: Msg, frame: Frame) -> None:
        local = self._local(frame.to)
        wait = frame.ttl / 1000 if frame.ttl else None

        def deliver(timeout: float | None) -> None:
            self.runtime.send_raw(
                local, frame.name, frame.body, sender=frame.sender, timeout=timeout
            )

        if not self._blocks(local):
            try:
                deliver(0.0)
            except MailboxFullError:
                if self.runtime.process(local).mailbox.on_full != "block":
                    raise
            else:
                _eager(self._loop, self._respond(msg, Frame("ok", node=self.name)))
                return

        def slow() -> None:
            try:
                deliver(wait)
            except AgentError as exc:
                self._answer(msg, _err(self.name, exc))
                return
            self._answer(msg, Frame("ok", node=self.name))

        self._slow(msg, slow)

    def _in_sends(self, msg: Msg, frame: Frame) -> None:
        """Put a ``sends`` frame's messages in the mailbox in order; one reply for all.

        Each is put as a ``send`` is: at once, or, when the mailbox is full under ``block``,
        on the pool waiting for space, and then so are the messages after it (in order). A
        message that fails (its own error in the reply) does not stop those after it.
        """
        local = self._local(frame.to)
        wait = frame.ttl / 1000 if frame.ttl else None
        batch = frame.batch
        errors: list[tuple[int, AgentError]] = []

        def put(index: int, timeout: float | None) -> bool:
            """False when the message must wait for space (under ``block``)."""
            name, body = batch[index]
            try:
                self.runtime.send_raw(local, name, body, sender=frame.sender, timeout=timeout)
            except MailboxFullError as exc:
                if timeout == 0.0 and self._blocks_or_gone(local):
                    return False
                errors.append((index, exc))
            except AgentError as exc:
                errors.append((index, exc))
            return True

        for index in range(len(batch)):
            if not put(index, 0.0):
                break
        else:
            _eager(self._loop, self._respond(msg, acknowledgement(self.name, len(batch), errors)))
            return
        first = index

        def slow() -> None:
            for rest in range(first, len(batch)):
                put(rest, wait)
            self._answer(msg, acknowledgement(self.name, len(batch), errors))

        try:
            self._slow(msg, slow)
        except MailboxFullError as exc:
            errors.extend((rest, exc) for rest in range(first, len(batch)))
            _eager(self._loop, self._respond(msg, acknowledgement(self.name, len(batch), errors)))

    def _blocks_or_gone(self, address: str) -> bool:
        """The agent's mailbox policy is ``block`` (False when the agent is gone)."""
        try:
            return self.runtime.process(address).mailbox.on_full == "block"
        except AgentError:
            return False

    def _in_ask(self, msg: Msg, frame: Frame) -> None:
        local = self._local(frame.to)
        chain = tuple(self.localize(c) for c in frame.chain)
        wait = frame.ttl / 1000
        # The remote asker stops waiting then: a cancellable handler ends by it too.
        deadline = time.monotonic() + wait

        def deliver(timeout: float) -> None:
            future, breaker = self.runtime.deliver_ask(
                local,
                frame.name,
                frame.body,
                sender=frame.sender,
                chain=chain,
                timeout=timeout,
                deadline=deadline,
            )
            future.add_done_callback(lambda f: self._replied(msg, f, breaker))

        if not self._blocks(local):
            try:
                deliver(0.0)
            except MailboxFullError:
                if self.runtime.process(local).mailbox.on_full != "block":
                    raise
            else:
                return

        def slow() -> None:
            try:
                deliver(wait)
            except AgentError as exc:
                self._answer(msg, _err(self.name, exc))

        self._slow(msg, slow)

    def _replied(self, msg: Msg, future: Future[bytes | None], breaker: Any) -> None:
        """The local agent answered a remote ask (on the thread that settled it)."""
        error = future.exception()
        if error is None:
            if breaker is not None:
                breaker.record_success()
            self._answer(msg, Frame("ok", node=self.name, body=future.result() or b""))
            return
        if breaker is not None and isinstance(error, HandlerFailed | AgentCrashed):
            breaker.record_failure()
        if isinstance(error, AgentError):
            self._answer(msg, _err(self.name, error))
        else:
            self._answer(msg, Frame("err", node=self.name, code="failed", msg=str(error)[:400]))

    def handle(self, kind: str, handler: Callable[[Frame], Frame]) -> None:
        """Serve request frames of ``kind`` with ``handler`` (on the pool: it may block)."""
        self._handlers[kind] = handler

    def _in_pool(self, msg: Msg, frame: Frame) -> None:
        handler = self._handlers[frame.k]

        def run() -> None:
            try:
                reply = handler(frame)
            except AgentError as exc:
                reply = _err(self.name, exc)
            except Exception as exc:  # noqa: BLE001 -- a bad request must not kill the pool
                _log.exception("node %s: %s request failed", self.name, frame.k)
                reply = Frame(
                    "err", node=self.name, code="failed", msg=f"{type(exc).__name__}: {exc}"[:400]
                )
            self._answer(msg, reply)

        self._pool.submit(run)

    def _in_spawn(self, frame: Frame) -> Frame:
        name = frame.name or None
        supervise = frame.extra.get("supervise")
        if name is None or not isinstance(supervise, dict):
            process = self.runtime.spawn_process(frame.type, frame.body, name=name)
            return Frame("ok", node=self.name, to=self.qualify(process.address))
        intensity, period = supervise.get("intensity", 3), supervise.get("period", 5.0)
        if not isinstance(intensity, int) or not isinstance(period, int | float) or period <= 0:
            raise BadSpawn("spawn: supervise takes {intensity: int, period: seconds}")
        # Supervised here: a crash on this node restarts it here (same address and mailbox).
        child = AgentChild(name, frame.type, decode_body(frame.body))
        spec = SupervisorSpec(f"{self.name}/{name}", [child], "one_for_one", intensity, period)
        try:
            supervisor = start_tree(self.runtime, spec)
        except SupervisorStartFailed as exc:
            raise BadSpawn(str(exc)) from None
        address = self.runtime.whereis(name)
        if address is None:
            supervisor.stop()
            raise BadSpawn(f"{name!r} stopped as it started")
        with self._lock:
            self._supervisors[address] = supervisor
            self._cluster.add(supervisor)
        return Frame("ok", node=self.name, to=self.qualify(address))

    def _in_stop(self, frame: Frame) -> Frame:
        local = self._local(frame.to)
        with self._lock:
            supervisor = self._supervisors.pop(local, None)
        if supervisor is not None:
            supervisor.stop()
            supervisor.retire()  # for good: a child that migrated is stopped where it is
        with suppress(NoProc):
            self.runtime.stop(local)
        return Frame("ok", node=self.name)

    # -- remote life ------------------------------------------------------------------------

    def spawn_on(
        self,
        node: str,
        type_name: str,
        init: bytes = b"",
        *,
        name: str | None = None,
        supervise: tuple[int, float] | None = None,
        timeout: float = 60.0,
    ) -> str:
        """Start an agent on ``node`` (this one or another); its address ``node:type:pid``.

        ``supervise=(intensity, period)`` (with a ``name``) puts it under a one_for_one
        supervisor on that node, so that a crash there restarts it there.
        """
        if node not in self.config.peers:
            raise BadSpawn(f"no node {node!r} in this cluster")
        extra = (
            {}
            if supervise is None
            else {"supervise": {"intensity": supervise[0], "period": supervise[1]}}
        )
        frame = Frame(
            "spawn", node=self.name, type=type_name, body=init, name=name or "", extra=extra
        )
        if node == self.name:
            if threading.get_ident() == self._thread.ident:
                raise HostError("spawn_on from the NATS loop (a bug)")
            return self._in_spawn(frame).to
        reply = self.request(node, frame, timeout)
        return reply.to

    def stop_on(self, address: str, timeout: float = 10.0) -> None:
        """Stop the agent at ``node:type:pid`` for good, wherever it runs."""
        node, _, local = address.partition(":")
        frame = Frame("stop", node=self.name, to=local)
        if node == self.name:
            self._in_stop(frame)
            return
        self.request(node, frame, timeout)

    # -- names ------------------------------------------------------------------------------

    def claim(self, name: str, address: str) -> None:
        """RemoteRouter.claim: register ``name`` cluster-wide, or BadSpawn on a clash."""
        if not _KEY.match(name):
            raise BadSpawn(
                f"{name!r} cannot be a cluster-wide name (letters, digits, '-', '_', '=')"
            )
        value = self.qualify(address)
        try:
            revision = self._call(self._claim(name, value), 10.0)
        except ClusterError as exc:
            raise BadSpawn(f"cannot register the name {name!r}: {exc.message}") from None
        with self._lock:
            self._claims[name] = revision
            self._names[name] = value
        if address.partition(":")[0] in self.durable.types:
            self.durable.attach(name, address)

    async def _claim(self, name: str, value: str) -> int:
        kv = self._names_kv
        assert kv is not None
        try:
            return int(await kv.create(name, value.encode()))
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        entry = await kv.get(name)
        owner = _address_value(entry.value) or ""
        owner_node = owner.partition(":")[0]
        with self._lock:
            expected = self._takeover.pop(name, None)
        stale = (
            owner == expected
            or owner_node in self._dead
            or (owner_node == self.name and self.runtime.whereis(name) != self.localize(owner))
        )
        if owner == value or stale:
            return int(await kv.update(name, value.encode(), last=entry.revision))
        raise BadSpawn(f"the name {name!r} is already registered in the cluster, by {owner}")

    def release(self, name: str, address: str) -> None:
        """RemoteRouter.release: drop our claim (asynchronously; a later claim is kept)."""
        self.durable.detach(name)
        with self._lock:
            revision = self._claims.pop(name, None)
        if revision is None or self._closed:
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._delete_name(name, revision), self._loop)

    async def _delete_name(self, name: str, revision: int) -> None:
        kv = self._names_kv
        if kv is None:
            return
        # Taken over meanwhile, or NATS away: the claim goes stale with this node.
        with suppress(TimeoutError, nats.errors.Error):
            await asyncio.wait_for(kv.delete(name, last=revision), 2.0)

    def forget_names_of(self, node: str) -> list[str]:
        """Delete the names a dead ``node`` held (its supervisor restarts the agents); the
        names it keeps: those it claimed again after it was declared dead (it came back and
        found them still its own, see _fence), which are not deleted."""
        return self._call(self._forget_names(node), 10.0)

    async def _forget_names(self, node: str) -> list[str]:
        kv = self._names_kv
        assert kv is not None
        with self._lock:
            held = [n for n, a in self._names.items() if a.partition(":")[0] == node]
            tokens = dict(self._dead_revisions.get(node, {}))
        kept = []
        for name in held:
            try:
                entry = await kv.get(name)
                owner = _address_value(entry.value) or ""
                if owner.partition(":")[0] == node:
                    # The revision seen when the node was declared dead, not the latest: a
                    # node that came back (heard again) has claimed the name again since, and
                    # keeps it. One still silent loses it whatever the revision (a names
                    # watcher that fell behind must not keep a dead node's children dead).
                    token = tokens.get(name, entry.revision)
                    if entry.revision != token and node not in self._dead:
                        kept.append(name)
                        continue
                    await kv.delete(name, last=entry.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                kept.append(name)
                continue
            except nats.errors.Error:
                continue
            with self._lock:
                self._names.pop(name, None)
        if kept:
            _log.warning(
                "node %s: node %s came back and claimed %s again: left to it",
                self.name,
                node,
                ", ".join(map(repr, kept)),
            )
        return kept

    async def _watch_names(self, watcher: Any) -> None:
        while True:
            try:
                entry = await watcher.updates(timeout=3600)
            except nats.errors.TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 -- the watcher broke (NATS away): lookups still work
                _log.warning("node %s: the names watcher stopped", self.name)
                return
            if entry is None:
                continue
            if not isinstance(entry, KeyValue.Entry):  # the sentinel of watcher.stop()
                return
            with self._lock:
                value = None
                if entry.operation in ("DEL", "PURGE"):
                    self._names.pop(entry.key, None)
                    self._revisions.pop(entry.key, None)
                else:
                    value = _address_value(entry.value)
                    if value is not None:
                        self._names[entry.key] = value
                        self._owners[entry.key] = value
                        if entry.revision is not None:
                            self._revisions[entry.key] = entry.revision
                taken = self._taken(entry.key, entry.revision, value)
            if taken:
                self.fence.taken(entry.key, value)

    def _taken(self, name: str, revision: int | None, owner: str | None) -> bool:
        """A names-bucket change (under the lock) took ``name`` from this node: we claim it,
        the change is newer than our claim (the revision is the fencing token), and it deletes
        the name or gives it to another node that no migration of ours is handing it to."""
        claimed = self._claims.get(name)
        if claimed is None or revision is None or revision <= claimed:
            return False
        node = None if owner is None else owner.partition(":")[0]
        if node == self.name:
            return False
        return node is None or self._handoffs.get(name) != node

    # -- liveness ---------------------------------------------------------------------------

    def on_membership(self, listener: Callable[[str, bool], None]) -> None:
        """``listener(node, alive)`` hears a node die, leave or come back (on a pool thread;
        the listeners of one event one after another, in the order they were added, so a
        listener added later hears it once the earlier ones are done with it). ``has_left``
        tells a node that left on purpose from one that went silent."""
        self._listeners.append(listener)

    def live_nodes(self) -> list[str]:
        """This node and every peer heard from within ``dead_after``, in peer order."""
        now = time.monotonic()
        window = self.config.dead_after
        return [
            n
            for n in self.config.peers
            if n == self.name or (n not in self._dead and now - self._seen.get(n, -1e9) <= window)
        ]

    def load(self, node: str) -> int:
        """Agents on ``node`` at its last heartbeat (this node: now)."""
        if node == self.name:
            return len(self.runtime.agents())
        return self._load.get(node, 0)

    def wait_for(self, nodes: list[str], timeout: float) -> bool:
        """Wait until every node in ``nodes`` is live; False on timeout."""
        deadline = time.monotonic() + timeout
        while not set(nodes) <= set(self.live_nodes()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def is_down(self, node: str) -> bool:
        """``node`` was declared dead, or left, and has not been heard from since."""
        return node in self._dead

    @property
    def closed(self) -> bool:
        """This node has left the cluster (``close``)."""
        return self._closed

    def has_left(self, node: str) -> bool:
        """``node`` left the cluster on purpose (it said so as it closed) and has not come back;
        False for a node that went silent (dead) or is live."""
        return node in self._left

    def _heartbeat(self, *, leaving: bool = False) -> Frame:
        extra: dict[str, Any] = {"load": len(self.runtime.agents())}
        if leaving:
            extra["leaving"] = True
        return Frame("hb", node=self.name, extra=extra)

    async def _beat(self) -> None:
        nc = self._nc
        assert nc is not None
        assert self._nodes_kv is not None
        while True:
            frame = encode(self._heartbeat())
            sent = time.monotonic()
            try:
                await nc.publish(heartbeat_subject(self.prefix, self.name), frame)
                if nc.is_connected:
                    await asyncio.wait_for(
                        self._nodes_kv.put(self.name, frame), self.config.heartbeat
                    )
                    # The lease: acknowledged after the heartbeat before it (see _fence).
                    self.fence.renew(sent)
            except (TimeoutError, nats.errors.Error):
                pass
            self._check_liveness()
            await asyncio.sleep(self.config.heartbeat)

    def _check_liveness(self) -> None:
        """Declare dead the peers silent for ``dead_after``, counted from when this node last
        had its own lease stale: a node cut off from NATS hears nobody, and its silence tells
        nothing of theirs. (Declared dead from there, its supervisor deleted live peers' names
        by writes that reached NATS when the link healed, and restarted nothing: a name lost.)"""
        now = time.monotonic()
        if now - self.fence.renewed > self.fence.after:
            self._cut_off_at = now
            return
        for node, seen in list(self._seen.items()):
            if (
                node not in self._dead
                and now - max(seen, self._cut_off_at) > self.config.dead_after
            ):
                self._dead.add(node)
                self._note_tokens(node)
                _log.warning(
                    "node %s: node %s is dead (silent for %.1f s)", self.name, node, now - seen
                )
                self._notify(node, alive=False)

    def _note_tokens(self, node: str) -> None:
        """``node`` is gone: the revisions of its names now are what may be deleted later."""
        with self._lock:
            self._dead_revisions[node] = {
                name: self._revisions[name]
                for name, owner in self._names.items()
                if owner.partition(":")[0] == node and name in self._revisions
            }

    def _notify(self, node: str, *, alive: bool) -> None:
        listeners = list(self._listeners)

        def run() -> None:
            for listener in listeners:
                try:
                    listener(node, alive)
                except Exception:  # noqa: BLE001 -- a listener must not break liveness
                    _log.exception("node %s: membership listener failed", self.name)

        self._pool.submit(run)

    async def _on_heartbeat(self, msg: Msg) -> None:
        sender = sender_of(msg.subject)
        if sender not in self.config.peers:  # before decoding, as for requests
            self._drop("peer", f"a heartbeat from {sender[:64]!r}, not in [cluster.peers]")
            return
        if sender == self.name:
            return
        try:
            frame = decode(msg.data, max_frame=_HEARTBEAT_MAX)
        except FrameError as exc:
            self._drop(exc.reason, f"a heartbeat from {sender}: {exc.message}")
            return
        if frame.k != "hb":
            self._drop("field", f"a {frame.k!r} frame on the heartbeat subject")
            return
        if frame.node != sender:
            self._drop("sender", f"a heartbeat from {sender} that says it is from {frame.node!r}")
            return
        if frame.extra.get("leaving") is True:
            self._leaving(frame.node)
            return
        load = frame.extra.get("load", 0)
        self._load[frame.node] = load if isinstance(load, int) and load >= 0 else 0
        self._seen[frame.node] = time.monotonic()
        if frame.node in self._dead:
            self._dead.discard(frame.node)
            self._left.discard(frame.node)
            self._notify(frame.node, alive=True)

    def _leaving(self, node: str) -> None:
        """``node`` said it is leaving: gone now, not after ``dead_after`` of silence."""
        if node in self._left:
            return
        self._left.add(node)
        self._load.pop(node, None)
        _log.warning("node %s: node %s left the cluster", self.name, node)
        if node not in self._dead:  # declared dead already (silent first): listeners heard
            self._dead.add(node)
            self._note_tokens(node)
            self._notify(node, alive=False)


def _agent_names(spec: SupervisorSpec) -> list[str]:
    """The names of the agents of the tree ``spec``, at any depth."""
    names = []
    for child in spec.children:
        if isinstance(child, SupervisorSpec):
            names.extend(_agent_names(child))
        else:
            names.append(child.name)
    return names


def _address_value(value: bytes | None) -> str | None:
    """A names-bucket value (``node:type:pid``), or None for anything else."""
    if value is None or len(value) > 600:
        return None
    try:
        text = value.decode()
    except UnicodeDecodeError:
        return None
    return text if text.count(":") == 2 else None
