"""Errors of the trace layer, under ``HostError``: a trace that cannot be written or read."""

from __future__ import annotations

from mighty._errors import HostError

__all__ = ["TraceCorrupt", "TraceError", "TraceInvalid", "TraceTruncated", "TraceVersionError"]


class TraceError(HostError):
    """A trace could not be written or read (a value it cannot hold, a closed writer, bad bytes)."""

    kind = "trace_error"


class TraceCorrupt(TraceError):
    """The file is not a readable trace; ``offset`` is the byte where the problem was found."""

    kind = "trace_corrupt"

    def __init__(self, message: str, *, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


class TraceInvalid(TraceCorrupt):
    """The frames are whole but a record breaks the schema (a field missing or of the wrong
    type, an instance id that is not an int, a trace that holds nothing to replay).

    A ``TraceCorrupt`` too, so callers that refuse damaged files refuse these; ``offset`` is
    the byte where the offending record's frame starts (-1 when no one record is at fault).
    """

    kind = "trace_invalid"


class TraceVersionError(TraceCorrupt):
    """The file is a trace in a format version this mighty cannot read.

    It derives from ``TraceCorrupt`` because a caller can do nothing more with it than with a
    corrupt file; catch it first to tell the user to use a matching mighty.
    """

    kind = "trace_version"

    def __init__(self, message: str, *, offset: int, version: int) -> None:
        super().__init__(message, offset=offset)
        self.version = version


class TraceTruncated(TraceError):
    """The file ends inside a frame, as a crash mid-write leaves it.

    ``readable_records`` records were whole before the cut, and the first ``readable_bytes``
    bytes of the file hold whole frames only.
    """

    kind = "trace_truncated"

    def __init__(self, message: str, *, readable_records: int, readable_bytes: int) -> None:
        super().__init__(message)
        self.readable_records = readable_records
        self.readable_bytes = readable_bytes
