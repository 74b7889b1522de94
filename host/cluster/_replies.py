"""The reply frames a node answers requests with, and the AgentErrors they stand for.

An ``err`` reply carries the ``agent-error`` code, the error's class name and its message; the
asking node raises the same AgentError class (by name among the known ones, else by code, else
HandlerFailed). A ``sends`` frame is acknowledged by one ``ok`` reply whose ``x`` holds ``n``
(how many messages the frame carried) and ``e`` (a list of [index, code, type, message], one per
message that failed); everything in it is checked, as it comes from the network.
"""

from __future__ import annotations

from mighty.agents import (
    AgentCrashed,
    AgentError,
    AskCycle,
    AskTimeout,
    BadSpawn,
    CircuitOpenError,
    HandlerFailed,
    MailboxFullError,
    MessageDropped,
    NoProc,
    Refused,
)
from mighty.cluster._frames import Frame

__all__ = ["acknowledged_failures", "acknowledgement", "error_frame", "error_of"]

_MAX_ERROR_TEXT = 512

_ERRORS: dict[str, type[AgentError]] = {
    cls.__name__: cls
    for cls in (
        NoProc,
        AskTimeout,
        Refused,
        MailboxFullError,
        MessageDropped,
        CircuitOpenError,
        HandlerFailed,
        AgentCrashed,
        AskCycle,
        BadSpawn,
    )
}
_BY_CODE: dict[str, type[AgentError]] = {
    "noproc": NoProc,
    "timeout": AskTimeout,
    "refused": Refused,
    "mailbox-full": MailboxFullError,
    "circuit-open": CircuitOpenError,
    "cycle": AskCycle,
    "bad-spawn": BadSpawn,
}


def error_of(frame: Frame) -> AgentError:
    """The AgentError an ``err`` reply frame stands for."""
    cls = _ERRORS.get(frame.type) or _BY_CODE.get(frame.code, HandlerFailed)
    return cls(frame.msg or frame.code or "remote error")


def error_frame(node: str, exc: AgentError) -> Frame:
    """The ``err`` reply frame for ``exc``."""
    return Frame("err", node=node, code=exc.code, type=type(exc).__name__, msg=exc.message)


def acknowledged_failures(reply: Frame, count: int) -> dict[int, AgentError] | None:
    """The messages a ``sends`` acknowledgement says failed, by index; None if it is malformed.

    ``x``: ``n`` (how many the frame carried) and ``e``, a list of [index, code, type, message].
    """
    n = reply.extra.get("n")
    errors = reply.extra.get("e", [])
    if type(n) is not int or n != count or type(errors) is not list or len(errors) > count:
        return None
    failed: dict[int, AgentError] = {}
    for entry in errors:
        if type(entry) is not list or len(entry) != 4:
            return None
        index, code, kind, message = entry
        if type(index) is not int or not 0 <= index < count:
            return None
        if not all(type(text) is str and len(text) <= _MAX_ERROR_TEXT for text in entry[1:]):
            return None
        failed[index] = error_of(Frame("err", code=code, type=kind, msg=message))
    return failed


def acknowledgement(node: str, count: int, errors: list[tuple[int, AgentError]]) -> Frame:
    """The reply to a ``sends`` frame of ``count`` messages, ``errors`` those that failed."""
    return Frame(
        "ok",
        node=node,
        extra={
            "n": count,
            "e": [[i, exc.code, type(exc).__name__, exc.message[:400]] for i, exc in errors],
        },
    )
