"""Stub of the compiled module host/abi/_speedups.c (the value codec's common types in C)."""

from typing import Any

def init(
    functions: dict[str, int],
    sizes: tuple[int, int, int, int],
    some: type,
    ok: type,
    err: type,
    variant: type,
    mismatch: type[Exception],
) -> None: ...

class Codec:
    """One WIT type's compiled codec, made from the spec ``_codec._spec`` builds."""

    def __init__(self, spec: tuple[Any, ...]) -> None: ...
    def lower(self, value: Any, address: int) -> bool: ...
    def lift(self, address: int) -> Any: ...

class Params:
    """An export call's lowered arguments."""

    size: int
    def free(self) -> None: ...

class Func:
    """One function signature's compiled codecs and its call."""

    def __init__(self, params: tuple[Codec, ...], result: Codec | None) -> None: ...
    def lower(self, args: tuple[Any, ...]) -> Params | None: ...
    def call(
        self, func: Any, context: Any, params: Params, fuel: int | None = None
    ) -> tuple[int, Any, int | None]: ...
