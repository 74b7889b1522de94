"""Host-side stream objects behind ``wasi:io/streams`` resources.

Every source or sink a guest can read or write (stdin bytes, captured stdout, a file) is one of
these. The ``wasi:io`` bindings translate between them and the WIT interface; filesystem and
cli only construct them. All sizes are bounded by the caller (the policy's ``max_read``).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any

from mighty.gate import GuestContext, ResourceKind

__all__ = [
    "INPUT_STREAM",
    "IO_ERROR",
    "OUTPUT_STREAM",
    "POLLABLE",
    "CodedMessage",
    "InputStream",
    "OutputStream",
    "Pollable",
    "StreamClosed",
    "StreamFailed",
]


class StreamClosed(Exception):
    """The stream reached its end (input) or was closed (output): WIT ``stream-error.closed``."""


class StreamFailed(Exception):
    """The last operation failed: WIT ``stream-error.last-operation-failed(error)``.

    ``str(exc)`` becomes the ``wasi:io/error`` resource's debug string; ``code``, when given, is
    what an interface's error accessor answers for it (``wasi:http``'s ``http-error-code``).
    """

    def __init__(self, message: str, code: Any = None) -> None:
        super().__init__(message)
        self.code = code


class CodedMessage(str):
    """A ``wasi:io/error`` object: its debug string, carrying the ``code`` of the failure."""

    code: Any

    def __new__(cls, text: str, code: Any) -> CodedMessage:
        obj = super().__new__(cls, text)
        obj.code = code
        return obj


class InputStream(ABC):
    """A byte source."""

    @abstractmethod
    def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes; ``b""`` if none are ready yet; StreamClosed at the end."""

    def ready(self) -> bool:
        """Whether a read would return data or the end without waiting (for pollables)."""
        return True

    def waker(self) -> threading.Event | None:
        """An event set when :meth:`ready` may have changed by itself (a host thread feeds the
        stream), or None when only the guest's own calls change it."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the stream holds (called when the guest drops it)."""


class OutputStream(ABC):
    """A byte sink."""

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Accept all of ``data`` (callers never exceed :meth:`check_write`)."""

    def check_write(self) -> int:
        """How many bytes a write may take now; StreamClosed if closed."""
        return 1 << 20

    def flush(self) -> None:  # noqa: B027 - optional hook, unbuffered by default
        """Push out anything buffered."""

    def ready(self) -> bool:
        return True

    def waker(self) -> threading.Event | None:
        """As :meth:`InputStream.waker`."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release what the stream holds (called when the guest drops it)."""


class Pollable(ABC):
    """What a ``wasi:io/poll`` pollable waits for."""

    @abstractmethod
    def ready(self) -> bool:
        """Whether the event has happened."""

    def wait_seconds(self) -> float | None:
        """How long until it is ready if nothing else happens (None: unknown or never)."""
        return None

    def waker(self) -> threading.Event | None:
        """An event a host thread sets when this pollable may have become ready (a response
        arrived), or None. A wait on pollables with a waker sleeps on it instead of refusing."""
        return None


def _close(_ctx: GuestContext, obj: object) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


# The resource kinds shared by every WASI module: streams and pollables are created by cli,
# filesystem and clocks and served by wasi:io.
INPUT_STREAM = ResourceKind("wasi:io/streams", "input-stream", on_drop=_close)
OUTPUT_STREAM = ResourceKind("wasi:io/streams", "output-stream", on_drop=_close)
POLLABLE = ResourceKind("wasi:io/poll", "pollable")
IO_ERROR = ResourceKind("wasi:io/error", "error")
"""Objects are the error's debug string."""
