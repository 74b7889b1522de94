"""A recorded run as agents and messages: what the debugger and the timeline exports show.

A trace holds records, one instance at a time; people debugging twenty agents think in agents,
the messages they handled, who asked whom and who restarted what. :class:`RunModel` reads a
trace once and answers those questions for any point of the run, a point being a record's
byte offset: the writer appends records in the order they happened across every instance (one
writer, one lock, one file), so the offset is the run's global sequence number.

Design notes
------------
- No sequence number is added to the records: the frame offset already orders them totally
  and every trace ever written has it. Rejected: a ``"seq"`` field in every record with a format
  version bump (two more bytes per import record in the compiled taps of ``_speedups.c`` and in
  the templates of ``_template.py``, and a second order that could disagree with the file's).
- The mailbox is shown as the trace can show it: the messages the agent handles next, in the
  order it handled them. A queued message is not a record (only its handling is), and an ask's
  import record is written when its reply comes back, so "sent at" is not known for asks.
  Rejected: inferring send times from send records (a fire-and-forget send is recorded when
  sent, an ask is not, and the start messages of a manifest come from the host, unrecorded).
- Bodies are decoded with the bounded decoder agents' bodies get everywhere else
  (``mighty._cbor.loads_untrusted``); anything else shows as its size and first bytes.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._cbor import loads_untrusted
from mighty._errors import HostError
from mighty.abi import Err, Ok, Some
from mighty.trace._format import TraceReader

__all__ = [
    "InstanceInfo",
    "Message",
    "RunModel",
    "body_text",
    "decoded",
    "message_text",
    "result_text",
]

_BODY_BYTES = 1 << 16
"""Bodies larger than this are shown by size, not decoded."""


def decoded(body: Any) -> Any:
    """A message body as data: CBOR decoded (bounded) when it is bytes that decode."""
    if not isinstance(body, bytes | bytearray):
        return body
    if not body:
        return None
    if len(body) > _BODY_BYTES:
        return {"bytes": len(body)}
    try:
        return loads_untrusted(bytes(body))
    except Exception:  # noqa: BLE001 - any undecodable body is shown as bytes
        return {"bytes": len(body), "head": bytes(body[:16]).hex()}


def body_text(body: Any, limit: int = 120) -> str:
    """``decoded(body)`` as one line of JSON (other values by repr), at most ``limit`` chars."""
    value = decoded(body)
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=False, default=repr)
    except ValueError:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def message_text(message: Any, limit: int = 120) -> str:
    """``name {body}`` for a recorded WIT message record, else the value's repr."""
    if isinstance(message, dict) and "name" in message:
        body = message.get("body")
        shown = "" if not body else " " + body_text(body, limit)
        return f"{message['name']}{shown}"
    text = repr(message)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def result_text(value: Any, limit: int = 120) -> str:
    """A handle's or an ask's result, with a message's body decoded."""
    if isinstance(value, Ok):
        return "ok " + result_text(value.value, limit)
    if isinstance(value, Err):
        return "err " + result_text(value.value, limit)
    if isinstance(value, Some):
        return result_text(value.value, limit)
    if value is None:
        return "(none)"
    return message_text(value, limit)


@dataclass
class Message:
    """One message an agent handled: its ``handle`` call and, once it returned, its end."""

    instance: int
    agent: str | None
    sender: str
    name: str
    body: Any
    offset: int
    end_offset: int | None = None
    ok: bool | None = None
    reply: Any = None
    error: Any = None

    @property
    def head(self) -> str:
        """``name {body}``, the body decoded (no body: the name alone)."""
        return f"{self.name} {body_text(self.body)}" if self.body else self.name

    def line(self, at: int | None = None) -> str:
        """The message, its sender and how it ended (as known at offset ``at``)."""
        head = self.head
        if self.end_offset is None:
            return f"{head} from {self.sender} (the trace ends before it does)"
        if at is not None and self.end_offset > at:
            return f"{head} from {self.sender} (in flight)"
        if self.ok:
            return f"{head} from {self.sender} -> {result_text(self.reply)}"
        kind = self.error.get("kind") if isinstance(self.error, dict) else self.error
        return f"{head} from {self.sender} -> failed: {kind}"


@dataclass
class InstanceInfo:
    """One instance of the run: the agent it was (if any) and its records' positions."""

    instance: int
    agent: str | None
    name: str | None
    component: str
    path: str | None
    offsets: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    @property
    def label(self) -> str:
        if self.agent is None:
            return f"instance {self.instance}"
        named = f" ({self.name})" if self.name and self.name != self.agent else ""
        return f"{self.agent}{named} instance {self.instance}"

    def at(self, offset: int) -> int:
        """How many of this instance's records are at or before ``offset``."""
        return bisect_right(self.offsets, offset)

    def open_call(self, offset: int) -> dict[str, Any] | None:
        """The export call in progress at ``offset`` (its call record), if any."""
        for record in reversed(self.records[: self.at(offset)]):
            if record["k"] == "export":
                return None if record["@"] < offset else _call_before(self, record)
            if record["k"] == "call":
                return dict(record)
        return None

    def next_record(self, offset: int) -> dict[str, Any] | None:
        """This instance's first record after ``offset``."""
        at = self.at(offset)
        return self.records[at] if at < len(self.records) else None

    def failed_call(self, offset: int) -> dict[str, Any] | None:
        """The export record of a call that failed (a trap, fuel, memory) at or before
        ``offset``: after it the instance is gone."""
        for record in self.records[: self.at(offset)]:
            if record["k"] == "export" and not record["ok"]:
                return dict(record)
        return None


def _call_before(info: InstanceInfo, end: dict[str, Any]) -> dict[str, Any] | None:
    index = next(n for n, record in enumerate(info.records) if record is end)
    for record in reversed(info.records[:index]):
        if record["k"] == "call":
            return dict(record)
    return None


class RunModel:
    """A trace read once, as instances, agents and messages (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = []
        self.instances: dict[int, InstanceInfo] = {}
        self.spawns: dict[str, tuple[str | None, int]] = {}
        """Address -> (the agent whose spawn import returned it, the record's offset)."""
        with TraceReader(self.path) as reader:
            for record in reader.records(schema=True):
                instance = record.get("i")
                if type(instance) is not int:
                    continue
                record["@"] = reader.record_offset
                self._add(instance, record)
        self.offsets = [int(r["@"]) for r in self.records]

    def _add(self, instance: int, record: dict[str, Any]) -> None:
        self.records.append(record)
        info = self.instances.get(instance)
        if info is None:
            agent, name = record.get("a"), record.get("name")
            info = self.instances[instance] = InstanceInfo(
                instance,
                agent if isinstance(agent, str) else None,
                name if isinstance(name, str) else None,
                str(record.get("component", "?")),
                record.get("path") if isinstance(record.get("path"), str) else None,
            )
        info.offsets.append(int(record["@"]))
        info.records.append(record)
        kind = record["k"]
        if kind == "call" and record.get("fn") == "handle" and _is_handle(record["args"]):
            sender, message = record["args"]
            info.messages.append(
                Message(
                    instance,
                    info.agent,
                    str(sender),
                    str(message["name"]),
                    message.get("body"),
                    int(record["@"]),
                )
            )
        elif kind == "export" and record.get("fn") == "handle" and info.messages:
            last = info.messages[-1]
            if last.end_offset is None:
                last.end_offset = int(record["@"])
                last.ok = bool(record["ok"])
                last.reply = record["res"]
                last.error = record["error"]
        elif kind == "import" and record.get("fn") == "spawn":
            result = record.get("res")
            if isinstance(result, Ok) and isinstance(result.value, str):
                self.spawns[result.value] = (info.agent, int(record["@"]))

    # -- questions ---------------------------------------------------------------------------

    def agents(self) -> list[str]:
        """Every agent address in the trace, in the order each first appears."""
        seen: dict[str, None] = {}
        for info in self.instances.values():
            if info.agent is not None:
                seen.setdefault(info.agent, None)
        return list(seen)

    def find(self, target: str) -> list[InstanceInfo]:
        """The instances ``target`` names: an address, a registered name or an instance number
        (a HostError naming what the trace holds when none)."""
        found = [i for i in self.instances.values() if i.agent == target]
        found = found or [i for i in self.instances.values() if i.name == target]
        if not found and target.isdigit() and int(target) in self.instances:
            found = [self.instances[int(target)]]
        if not found:
            known = ", ".join(self.agents()) or "none recorded"
            numbers = ", ".join(str(i) for i in self.instances)
            raise HostError(
                f"no agent or instance {target!r} (agents: {known}; instances: {numbers})"
            )
        return found

    def instance_at(self, target: str | int, offset: int) -> InstanceInfo:
        """The instance ``target`` was at ``offset``: the latest one started by then (the
        first one when none had started yet)."""
        if isinstance(target, int):
            return self.instances[target]
        found = self.find(target)
        started = [i for i in found if i.offsets[0] <= offset]
        return started[-1] if started else found[0]

    def agent_instance(self, address: str, offset: int) -> InstanceInfo | None:
        """The instance agent ``address`` (or registered name) was at ``offset``, or None."""
        try:
            return self.instance_at(address, offset)
        except HostError:
            return None

    def rank(self, offset: int) -> int:
        """The 1-based position of the record at ``offset`` in the run's recorded order."""
        return bisect_right(self.offsets, offset)

    def backtrace(self, instance: int, offset: int) -> list[str]:
        """The ask chain into ``instance`` at ``offset``, then its supervision path."""
        lines: list[str] = []
        info: InstanceInfo | None = self.instances[instance]
        seen: set[int] = set()
        depth = 0
        while info is not None and info.instance not in seen:
            seen.add(info.instance)
            pad = "  " * depth
            call = info.open_call(offset)
            if call is None:
                lines.append(f"{pad}{info.label}: idle")
                break
            if call.get("fn") == "handle" and _is_handle(call["args"]):
                sender, message = call["args"]
                lines.append(
                    f"{pad}{info.label}: handling {message_text(message)} from {sender}"
                    f" (step {call['s']})"
                )
            else:
                lines.append(f"{pad}{info.label}: in {call['fn']} (step {call['s']})")
                break
            asker = self.agent_instance(str(sender), offset) if sender != "host" else None
            if asker is None:
                if sender == "host":
                    lines.append(f"{pad}  sent by the host (a start message, send or ask)")
                break
            waiting = asker.next_record(offset)
            depth += 1
            if (
                waiting is not None
                and waiting["k"] == "import"
                and waiting.get("fn") == "ask"
                and len(waiting["args"]) >= 2
                and waiting["args"][1] == message
            ):
                lines.append(
                    f"{'  ' * depth}asked by {asker.agent}, waiting in"
                    f" ask({waiting['args'][0]}, {message_text(waiting['args'][1])})"
                )
            else:
                lines.append(f"{'  ' * depth}sent by {asker.agent} (not waiting for a reply)")
            info = asker
        lines.extend(self.supervision(instance))
        return lines

    def supervision(self, instance: int) -> list[str]:
        """Who started ``instance``'s agent and the instances it was before (restarts)."""
        info = self.instances[instance]
        if info.agent is None:
            return []
        spawned = self.spawns.get(info.agent)
        if spawned is not None:
            parent, at = spawned
            start = f"spawned by {parent or 'an unnamed instance'} (record {self.rank(at)})"
        else:
            start = f"started by the supervisor as child {info.name or info.agent!r}"
        lines = [f"supervision: {info.agent} {start}"]
        before = [i for i in self.find(info.agent) if i.instance < instance]
        for previous in before:
            failed = previous.failed_call(previous.offsets[-1])
            why = "ended"
            if failed is not None:
                kind = (failed.get("error") or {}).get("kind", "failed")
                why = f"crashed in {failed['fn']} ({kind})"
            lines.append(f"  instance {previous.instance} {why}; restarted as the next")
        if before:
            lines.append(f"  now instance {instance} (restart {len(before)})")
        return lines


def _is_handle(args: Any) -> bool:
    return (
        isinstance(args, list)
        and len(args) == 2
        and isinstance(args[1], dict)
        and "name" in args[1]
    )
