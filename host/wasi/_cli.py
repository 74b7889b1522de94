"""``wasi:cli`` 0.2: environment, exit, stdio and the terminal interfaces.

The guest sees exactly what the policy lists: its environment and arguments, its stdin bytes
then end of file, and stdout/stderr captured into bounded buffers (:func:`outputs`). It is never
on a terminal, so every ``get-terminal-*`` answers ``none``.

``get-stdin``/``get-stdout``/``get-stderr`` hand out the same host stream each time: a guest that
drops its handle and asks again continues where it left off, and the host reads the captures
after the call whatever the guest dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mighty.abi import Ok
from mighty.gate import Binding, GuestContext, ResourceKind, Slot, request_exit
from mighty.wasi._output import CaptureOutput
from mighty.wasi._policy import Policy
from mighty.wasi._streams import INPUT_STREAM, OUTPUT_STREAM, InputStream, StreamClosed

__all__ = [
    "STDERR_SINK",
    "STDOUT_SINK",
    "TERMINAL_INPUT",
    "TERMINAL_OUTPUT",
    "BytesInput",
    "OutputSink",
    "bindings",
    "outputs",
    "resources",
    "setup",
]

TERMINAL_INPUT = ResourceKind("wasi:cli/terminal-input", "terminal-input")
TERMINAL_OUTPUT = ResourceKind("wasi:cli/terminal-output", "terminal-output")
_STATE: Slot[_CliState] = Slot("wasi.cli")

OutputSink = Callable[[bytes], None]
"""Who hears an output stream as it is written: ``sink(chunk)`` for every write."""
STDOUT_SINK: Slot[OutputSink] = Slot("wasi.cli.stdout")
"""Seeded by an embedder (``Instance(slots=[STDOUT_SINK.of(fn)])``): every write to stdout
also goes to it. A slot, not a field of the policy: a policy is data (compared, recorded in a
trace), a sink is a live object of the embedder's."""
STDERR_SINK: Slot[OutputSink] = Slot("wasi.cli.stderr")
"""As :data:`STDOUT_SINK`, for stderr."""


class BytesInput(InputStream):
    """Fixed bytes, then end of file."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(bytes(data))
        self._pos = 0

    def read(self, limit: int) -> bytes:
        if self._pos >= len(self._data):
            raise StreamClosed("end of stdin")
        end = min(len(self._data), self._pos + max(0, limit))
        piece = bytes(self._data[self._pos : end])
        self._pos = end
        return piece

    def close(self) -> None:
        """Kept open: a later ``get-stdin`` returns this same stream."""


@dataclass(frozen=True, slots=True)
class _CliState:
    policy: Policy
    stdin: BytesInput
    stdout: CaptureOutput
    stderr: CaptureOutput


def _state(ctx: GuestContext) -> _CliState:
    return ctx.slot(_STATE)


def resources() -> list[ResourceKind]:
    """The terminal resource kinds (the stream kinds belong to ``_io``)."""
    return [TERMINAL_INPUT, TERMINAL_OUTPUT]


def setup(ctx: GuestContext, policy: Policy) -> None:
    """Fresh stdin and stdout/stderr captures for one instance."""
    ctx.put(
        _STATE,
        _CliState(
            policy=policy,
            stdin=BytesInput(policy.stdin),
            stdout=CaptureOutput(policy.stdout.cap, ctx.find(STDOUT_SINK)),
            stderr=CaptureOutput(policy.stderr.cap, ctx.find(STDERR_SINK)),
        ),
    )


def outputs(ctx: GuestContext) -> tuple[CaptureOutput, CaptureOutput]:
    """The instance's (stdout, stderr) captures; two empty ones if it is served without WASI."""
    state = ctx.find(_STATE)
    if state is None:
        return CaptureOutput(0), CaptureOutput(0)
    return state.stdout, state.stderr


def _get_environment(ctx: GuestContext) -> list[tuple[str, str]]:
    return [(key, value) for key, value in _state(ctx).policy.env]


def _get_arguments(ctx: GuestContext) -> list[str]:
    return list(_state(ctx).policy.args)


def _initial_cwd(_ctx: GuestContext) -> None:
    return None


def _exit(_ctx: GuestContext, status: object) -> None:
    request_exit(0 if isinstance(status, Ok) else 1)


def _exit_with_code(_ctx: GuestContext, code: int) -> None:
    request_exit(code)


def _get_stdin(ctx: GuestContext) -> Any:
    return ctx.new(INPUT_STREAM, _state(ctx).stdin)


def _get_stdout(ctx: GuestContext) -> Any:
    return ctx.new(OUTPUT_STREAM, _state(ctx).stdout)


def _get_stderr(ctx: GuestContext) -> Any:
    return ctx.new(OUTPUT_STREAM, _state(ctx).stderr)


def _no_terminal(_ctx: GuestContext) -> None:
    return None


def bindings() -> list[Binding]:
    """Every function of the wasi:cli 0.2 import interfaces (``exit-with-code`` included)."""
    return [
        Binding("wasi:cli/environment", "get-environment", _get_environment),
        Binding("wasi:cli/environment", "get-arguments", _get_arguments),
        Binding("wasi:cli/environment", "initial-cwd", _initial_cwd),
        Binding("wasi:cli/exit", "exit", _exit),
        Binding("wasi:cli/exit", "exit-with-code", _exit_with_code),
        Binding("wasi:cli/stdin", "get-stdin", _get_stdin),
        Binding("wasi:cli/stdout", "get-stdout", _get_stdout),
        Binding("wasi:cli/stderr", "get-stderr", _get_stderr),
        Binding("wasi:cli/terminal-stdin", "get-terminal-stdin", _no_terminal),
        Binding("wasi:cli/terminal-stdout", "get-terminal-stdout", _no_terminal),
        Binding("wasi:cli/terminal-stderr", "get-terminal-stderr", _no_terminal),
    ]
