"""What a sandbox run is given and gives back: :class:`Limits`; :class:`RunResult`, with its
error, usage and artifacts (:class:`RunError`, :class:`RunUsage`, :class:`Artifact`); the checks
every guest report passes before it counts (``check_result``); the run's inputs as the
interpreter reads them.

Pure data and checks, with no instance in sight: the pool (``_pool.py``), sessions
(``_sessions.py``) and the ``Sandbox`` (``_api.py``) build on it. ``_api.py``'s notes say how
each way a run can end is reported and what is bounded.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mighty._errors import BadInput, WrongType
from mighty.budget import Budget
from mighty.sandbox._data import cut_text, json_problem
from mighty.sandbox._tools import (
    MAX_CONCURRENT_CALLS,
    MAX_CONCURRENT_CALLS_LIMIT,
    MAX_NESTED_RUNS,
    nesting_depth,
)

__all__ = [
    "ERROR_KINDS",
    "MAX_ERROR_TEXT",
    "Artifact",
    "Limits",
    "OutputListener",
    "RunError",
    "RunResult",
    "RunUsage",
    "check_result",
]

ERROR_KINDS = frozenset(
    {
        "exception",
        "out_of_fuel",
        "out_of_memory",
        "deadline_exceeded",
        "cancelled",
        "output_limit",
        "tool_error",
        "tool_limit",
        "not_allowed",
    }
)
_GUEST_REPORTED = frozenset({"exception", "tool_error", "out_of_memory", "output_limit"})
_MIN_MEMORY = 32 << 20
MAX_ERROR_TEXT = 64 << 10
"""Most UTF-8 bytes of a run error's message, and of its traceback (plus a short note)."""
_MIN_ERROR_TEXT = 512

OutputListener = Callable[[str, str], None]
"""``on_output(stream, text)``: ``stream`` is ``"stdout"`` or ``"stderr"``, ``text`` what the code
just wrote to it (decoded as UTF-8, a character split across writes is delivered whole with the
next one, invalid bytes as U+FFFD); or ``"progress"``, a line a tool reported with
``ctx.progress(...)`` (``message`` or ``message (done/total)``, and a newline)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What one run may use. Frozen; ``replace`` returns a changed copy.

    - ``fuel``: wasm fuel (10**10 is about 1 s of pure-Python work in the interpreter);
    - ``memory``: bytes of linear memory, the interpreter included (it needs about 16 MiB);
    - ``timeout``: wall-clock seconds for the run, not counting time spent inside tools;
    - ``output``: bytes of stdout and stderr together shown in ``RunResult.stdout`` and
      ``stderr`` (the view a model reads), and of the result's JSON;
    - ``artifact``: bytes of stdout and stderr together kept whole: output past ``output`` is
      cut from the view but kept, up to this, in ``RunResult.artifacts``; passing it (or
      ``output``, whichever is larger) ends the run with ``output_limit``. The default stays
      below what wasmtime copies in one host call (``LIFT_LIMIT``, ~2.7 MB), so any one write
      under it is whole; ``artifact <= output`` means no artifacts;
    - ``tool_calls``: tool calls per run;
    - ``tool_timeout``: seconds one tool call may take (a ``Tool`` may override it);
    - ``tool_concurrency``: tool calls of the run's async code in flight at once (more wait).
    """

    fuel: int = 10_000_000_000
    memory: int = 128 << 20
    timeout: float = 5.0
    output: int = 1 << 20
    tool_calls: int = 100
    tool_timeout: float = 30.0
    tool_concurrency: int = MAX_CONCURRENT_CALLS
    artifact: int = 2 << 20

    def __post_init__(self) -> None:
        for name in ("fuel", "memory", "output", "tool_calls", "tool_concurrency", "artifact"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise WrongType(f"Limits.{name} must be an int, got {type(value).__name__}")
        for name in ("timeout", "tool_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise WrongType(f"Limits.{name} must be a number, got {type(value).__name__}")
            if not (value > 0 and math.isfinite(value)):
                raise BadInput(f"Limits.{name} must be a positive number of seconds")
        if self.fuel <= 0:
            raise BadInput(f"Limits.fuel must be positive, got {self.fuel}")
        if self.memory < _MIN_MEMORY:
            raise BadInput(
                f"Limits.memory must be at least {_MIN_MEMORY} bytes (the interpreter alone "
                f"needs about 16 MiB), got {self.memory}"
            )
        if self.output < 0 or self.tool_calls < 0 or self.artifact < 0:
            raise BadInput("Limits.output, Limits.artifact and Limits.tool_calls must be >= 0")
        if not 1 <= self.tool_concurrency <= MAX_CONCURRENT_CALLS_LIMIT:
            raise BadInput(
                f"Limits.tool_concurrency must be in 1..{MAX_CONCURRENT_CALLS_LIMIT}, "
                f"got {self.tool_concurrency}"
            )

    def replace(self, **changes: Any) -> Limits:
        """A copy with the given fields changed (validated like the original)."""
        return replace(self, **changes)

    def budget(self) -> Budget:
        return Budget(fuel=self.fuel, memory=self.memory, timeout=self.timeout)


@dataclass(frozen=True, slots=True)
class RunError:
    """Why a run failed: ``kind`` (one of :data:`ERROR_KINDS`), a message, and for exceptions
    the traceback of the user's own frames."""

    kind: str
    message: str
    traceback: str = ""

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message, "traceback": self.traceback}


@dataclass(frozen=True, slots=True)
class RunUsage:
    """What a run used. ``wall_time`` includes ``tool_time`` (which the deadline does not)."""

    fuel: int = 0
    memory_peak: int = 0
    wall_time: float = 0.0
    tool_calls: int = 0
    tool_time: float = 0.0

    def to_json(self) -> dict[str, float | int]:
        return {
            "fuel": self.fuel,
            "memory_peak": self.memory_peak,
            "wall_ms": round(self.wall_time * 1000, 3),
            "tool_calls": self.tool_calls,
            "tool_ms": round(self.tool_time * 1000, 3),
        }


@dataclass(frozen=True, slots=True)
class Artifact:
    """One output stream kept whole because it went past ``Limits.output``.

    ``name`` is ``"stdout"`` or ``"stderr"``; ``data`` every byte the code wrote to it (up to
    ``Limits.artifact`` for both streams together). ``RunResult.to_json`` refers to it by name,
    size and SHA-256 only: the bytes stay with the host.
    """

    name: str
    data: bytes = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def text(self) -> str:
        """The bytes as UTF-8 (invalid sequences as U+FFFD)."""
        return self.data.decode("utf-8", "replace")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended. ``value`` is JSON-compatible data (``None`` on failure).

    ``stdout`` and ``stderr`` show at most ``Limits.output`` bytes together; a stream cut there
    is in ``artifacts`` whole (see :class:`Artifact`).
    """

    ok: bool
    value: Any = None
    stdout: str = ""
    stderr: str = ""
    error: RunError | None = None
    usage: RunUsage = field(default_factory=RunUsage)
    artifacts: tuple[Artifact, ...] = ()

    def artifact(self, name: str) -> Artifact | None:
        """The artifact of stream ``name``, if that stream was cut."""
        return next((a for a in self.artifacts if a.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``mty exec --json`` prints (artifacts by reference)."""
        return {
            "ok": self.ok,
            "value": self.value,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": None if self.error is None else self.error.to_json(),
            "usage": self.usage.to_json(),
            "artifacts": [artifact.to_json() for artifact in self.artifacts],
        }


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


def _error_text_limit(output: int) -> int:
    """Bytes for each of a run error's message and traceback: half the output limit, at most
    MAX_ERROR_TEXT, and never so few that the error cannot say what happened."""
    return max(_MIN_ERROR_TEXT, min(MAX_ERROR_TEXT, output // 2))


def check_result(data: bytes) -> tuple[Any] | RunError:
    """The value of a result's JSON bytes, or the ``exception`` error saying why they are not
    JSON data: strict UTF-8, JSON syntax, finite numbers, no lone surrogates."""
    try:
        text = data.decode("utf-8")  # strict: refuses encoded surrogates (json.loads does not)
    except UnicodeDecodeError as exc:
        return RunError(
            "exception", f"TypeError: the result is not UTF-8 (byte {exc.start} is invalid)"
        )
    try:
        value = json.loads(text, parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        message = cut_text(str(exc), 1024)
        return RunError("exception", f"TypeError: the result is not JSON data: {message}")
    problem = json_problem(value, "the result")
    if problem is not None:
        return RunError("exception", f"TypeError: {problem}")
    return (value,)


def _encode_inputs(
    inputs: Mapping[str, Any] | None, *, keep: bool, max_value: int, seed: bool = False
) -> bytes:
    """The run's options for the guest: its inputs as globals, whether it keeps a session's
    globals, the result's limit, and with ``seed`` 256 bits from the host's secure random that
    the guest seeds an imported ``random`` with before the code runs (so a rewound instance,
    whose memory holds the same ``random`` state every time, never repeats a sequence)."""
    names = dict(inputs or {})
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            shown = repr(name[:100]) if isinstance(name, str) else type(name).__name__
            raise BadInput(f"input names must be Python identifiers, got {shown}")
    try:
        options: dict[str, Any] = {"globals": names, "keep": keep, "max-value": max_value}
        if seed:
            options["seed"] = os.urandom(32).hex()
        return json.dumps(
            options,
            allow_nan=False,
            separators=(",", ":"),
        ).encode()
    except (TypeError, ValueError) as exc:
        raise BadInput(f"inputs must be JSON-compatible data: {exc}") from None


_RUN_LIMIT_FIELDS = (
    "fuel",
    "memory",
    "timeout",
    "output",
    "tool_calls",
    "tool_timeout",
    "tool_concurrency",
)


def _check_run_limits(limits: Limits, ceiling: Limits) -> None:
    """A run's own limits may lower the sandbox's, never raise them (its pooled instances and
    their output captures were made for the sandbox's)."""
    if not isinstance(limits, Limits):
        raise BadInput(f"limits must be a Limits, got {type(limits).__name__}")
    over = [
        f"{name}={getattr(limits, name)!r} (the sandbox's is {getattr(ceiling, name)!r})"
        for name in _RUN_LIMIT_FIELDS
        if getattr(limits, name) > getattr(ceiling, name)
    ]
    if max(limits.output, limits.artifact) > max(ceiling.output, ceiling.artifact):
        over.append(
            f"artifact={limits.artifact} (the sandbox keeps at most "
            f"{max(ceiling.output, ceiling.artifact)} bytes of output)"
        )
    if over:
        raise BadInput("a run's limits may only be lower than its sandbox's: " + ", ".join(over))


def _check_nesting() -> None:
    depth = nesting_depth()
    if depth > MAX_NESTED_RUNS:
        raise BadInput(
            f"a sandbox run was started from inside a tool {depth} levels deep; runs nest "
            f"through tools at most {MAX_NESTED_RUNS} level(s)"
        )
