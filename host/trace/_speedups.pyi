"""Stub of the compiled module host/trace/_speedups.c (the recorder's taps in C)."""

from collections.abc import Callable
from typing import Any

class Queue:
    """A trace writer's queue of framed import records (``TraceWriter._queue``)."""

    oldest: float
    closed: bool
    nbytes: int
    def __init__(
        self,
        drain: Callable[[], object],
        limit: int,
        interval: float,
        blob_min: int,
        max_payload: int,
    ) -> None: ...
    def push(self, payload: bytes) -> None: ...
    def take(self) -> tuple[bytes, int]: ...
    def close(self) -> None: ...
    def __len__(self) -> int: ...

class Core:
    """One instance's step, fuel limit and fuel reading, shared by its taps."""

    step: int
    fuel_limit: int
    def __init__(self, get_fuel: int, error_delete: int) -> None: ...

class Tap:
    """One import's tap: ``tap(context_ptr, result, *args)``."""

    def __init__(
        self,
        core: Core,
        queue: Queue,
        ok_type: type,
        head: bytes,
        mid: bytes,
        res: bytes,
        ok: bytes,
        tail: bytes,
        nparams: int,
        method: bool,
        general: Callable[..., None],
    ) -> None: ...
    def __call__(self, context_ptr: int, result: Any, /, *args: Any) -> None: ...

def crc32(data: bytes, value: int = 0, /) -> int: ...
def frame(payload: bytes, /) -> bytes: ...
def encode(value: Any, blob_min: int, result: bool, ok_type: type, /) -> bytes | None: ...
def split(payload: bytes, ok_type: type) -> tuple[int, int, int, int, Any, str, int] | None: ...
