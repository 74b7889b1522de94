"""Pipelined sends to other nodes: many in flight per sender, delivered and acknowledged in order.

A send to an agent on another node is acknowledged when the remote mailbox took it: one at a
time, that is a NATS round trip per message (about 2,000 a second from one thread).
``Runtime.send_future`` returns at once with a future the acknowledgement settles; the messages
of one sender to one address queue here in a *pipe*, which has one frame on the wire at a time.
When the node's loop takes a pipe up, what it holds goes in one frame: a ``send`` frame for a
single message (a synchronous send goes the same way, then waits), else a ``sends`` frame (up
to ``MAX_BATCH`` messages and the frame limit), which the receiving node puts in the mailbox in
order and acknowledges with one reply naming each message that failed; what queued meanwhile
goes next. So the order
holds from one sender to one address, as between two processes of one node (Erlang's
guarantee), and the rate is bound by the frames' size rather than by round trips.

Bounds: a pipe holds at most ``PIPE_MESSAGES`` messages and ``PIPE_BYTES`` bytes of them; a
sender beyond that waits for room until its message's deadline (then ``AskTimeout``; nothing
is queued). A message's deadline (its ``timeout``, or the cluster's ``ask_timeout``) counts
from the moment it was queued: one still queued at its deadline fails with ``AskTimeout``
without being sent. A frame's ``ttl`` (how long the far node may wait for mailbox space, and
how long this one waits for the reply) is the furthest deadline of the messages it carries, so
one message with a short deadline cannot fail the others; it may then be taken after its own
deadline (a synchronous ``send`` has stopped waiting by then, with ``AskTimeout``, as when an
acknowledgement comes late).
A node that leaves fails every queued message with ``NoProc``.

Rejected: one request per message with many in flight (each message then pays a request's CPU
on both sides, and when the far mailbox is full under ``block`` a later message could pass one
waiting for space: the order breaks); several frames in flight per pipe (the same reordering
when one frame waits for space, and one frame per round trip already carries thousands of
messages a second); a pipe per target node shared by its senders (a full mailbox of one agent
would hold up the others' messages).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mighty.agents import AgentError, AskTimeout, NoProc, Refused
from mighty.cluster._aio import eager, settle
from mighty.cluster._frames import MAX_BATCH, Frame, encode, node_subject
from mighty.cluster._replies import acknowledged_failures

if TYPE_CHECKING:
    from mighty.cluster._node import Node

__all__ = ["PIPE_BYTES", "PIPE_MESSAGES", "SendPipes"]

PIPE_MESSAGES = 4096
"""The most messages queued in one pipe (one sender to one address) before a sender waits."""
PIPE_BYTES = 16 << 20
"""The most bytes of message bodies queued in one pipe before a sender waits."""
_OVERHEAD = 160
"""Bytes a message adds to a frame beyond its body, name and addresses (a generous bound)."""


@dataclass(slots=True)
class _Item:
    node: str
    target: str
    sender: str
    name: str
    body: bytes
    size: int
    deadline: float
    future: Future[None]


class _Pipe:
    __slots__ = ("busy", "bytes", "items")

    def __init__(self) -> None:
        self.items: deque[_Item] = deque()
        self.bytes = 0
        self.busy = False


class SendPipes:
    """The pipes of one node's outgoing sends, by (sender, address as the sender wrote it)."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._cond = threading.Condition()
        self._pipes: dict[tuple[str, str], _Pipe] = {}

    def __len__(self) -> int:
        """Messages queued (not yet on the wire), over every pipe."""
        with self._cond:
            return sum(len(pipe.items) for pipe in self._pipes.values())

    def submit(
        self, to: str, node: str, target: str, sender: str, name: str, body: bytes, wait: float
    ) -> Future[None]:
        """Queue a message for ``target`` on ``node``; its future settles when it is taken."""
        size = len(body) + len(name) + len(sender) + len(target) + _OVERHEAD
        limit = self._node.config.max_frame
        if size > limit:
            raise Refused(
                f"{to}: a message of {len(body)} bytes exceeds the cluster's frame limit ({limit})"
            )
        deadline = time.monotonic() + wait
        future: Future[None] = Future()
        item = _Item(node, target, sender, name, body, size, deadline, future)
        key = (sender, to)
        with self._cond:
            while True:
                pipe = self._pipes.get(key)
                if pipe is None:
                    pipe = self._pipes[key] = _Pipe()
                if not pipe.items or (
                    len(pipe.items) < PIPE_MESSAGES and pipe.bytes + size <= PIPE_BYTES
                ):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AskTimeout(
                        f"{to}: {len(pipe.items)} messages still wait for their "
                        f"acknowledgement after {wait:g} s"
                    )
                self._cond.wait(left)
            pipe.items.append(item)
            pipe.bytes += size
            if pipe.busy:
                return future
            pipe.busy = True
        loop = self._node.loop
        try:
            loop.call_soon_threadsafe(eager, loop, self._drain(key, pipe))
        except RuntimeError:
            self._fail_all(key, pipe, NoProc(f"{to}: this node has left the cluster"))
        return future

    def _fail_all(self, key: tuple[str, str], pipe: _Pipe, error: AgentError) -> None:
        with self._cond:
            items = list(pipe.items)
            pipe.items.clear()
            pipe.bytes = 0
            pipe.busy = False
            if self._pipes.get(key) is pipe:
                del self._pipes[key]
            self._cond.notify_all()
        for item in items:
            settle(item.future, error=error)

    def _take(self, key: tuple[str, str], pipe: _Pipe) -> list[_Item]:
        """The next frame's messages: the head and those after it for the same target."""
        limit = self._node.config.max_frame
        with self._cond:
            items = pipe.items
            if not items:
                pipe.busy = False
                if self._pipes.get(key) is pipe:
                    del self._pipes[key]
                return []
            head = items.popleft()
            batch, size = [head], head.size
            while items and len(batch) < MAX_BATCH:
                item = items[0]
                if item.node != head.node or item.target != head.target:
                    break
                if size + item.size > limit:
                    break
                batch.append(items.popleft())
                size += item.size
            pipe.bytes -= size
            self._cond.notify_all()
        return batch

    async def _drain(self, key: tuple[str, str], pipe: _Pipe) -> None:
        """Send the pipe's messages, a frame at a time, until it is empty (on the loop)."""
        batch: list[_Item] = []
        try:
            while True:
                batch = self._take(key, pipe)
                if not batch:
                    return
                await self._send(key[1], batch)
        except BaseException:
            # Cancelled (the node leaves) or a bug: nothing queued may wait forever. The frame
            # on the wire may have been taken: that is not known, so not a NoProc.
            for item in batch:
                settle(
                    item.future,
                    error=AskTimeout(f"{key[1]}: this node left before the acknowledgement"),
                )
            self._fail_all(key, pipe, NoProc(f"{key[1]}: this node has left the cluster"))
            raise

    async def _send(self, to: str, batch: list[_Item]) -> None:
        node = self._node
        now = time.monotonic()
        live = []
        for item in batch:
            if item.deadline > now:
                live.append(item)
            else:
                settle(
                    item.future,
                    error=AskTimeout(f"{to}: no acknowledgement before its deadline (queued)"),
                )
        if not live:
            return
        head = live[0]
        ttl = max(item.deadline for item in live) - now
        ttl_ms = max(1, int(ttl * 1000))
        frame_id = f"{node.name}-{node.next_id()}"
        if len(live) == 1:
            frame = Frame(
                "send",
                node=node.name,
                to=head.target,
                sender=head.sender,
                name=head.name,
                body=head.body,
                ttl=ttl_ms,
                id=frame_id,
            )
        else:
            frame = Frame(
                "sends",
                node=node.name,
                to=head.target,
                sender=head.sender,
                ttl=ttl_ms,
                id=frame_id,
                batch=tuple((item.name, item.body) for item in live),
            )
        subject = node_subject(node.prefix, head.node, node.name)
        try:
            reply = await node.exchange(subject, to, encode(frame), ttl)
        except AgentError as exc:
            for item in live:
                settle(item.future, error=exc)
            return
        if len(live) == 1:
            settle(head.future, None)
            return
        failed = acknowledged_failures(reply, len(live))
        if failed is None:
            node.note_bad_reply(to, "a sends acknowledgement that does not fit its frame")
            error = AskTimeout(f"{to} acknowledged its messages with a reply this node cannot read")
            for item in live:
                settle(item.future, error=error)
            return
        for index, item in enumerate(live):
            settle(item.future, error=failed.get(index))
