"""wasi:cli: environment, exit, stdio capture, terminals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.abi import Err, Ok, Variant
from mighty.gate import GuestExitRequest
from mighty.wasi import STDOUT_SINK, _cli
from mighty.wasi._output import CaptureOutput
from mighty.wasi._policy import OutputPolicy, Policy
from mighty.wasi._streams import INPUT_STREAM, OUTPUT_STREAM
from tests.wasi import call, make_ctx, obj

S = "wasi:io/streams"


def test_environment_and_arguments_come_from_the_policy() -> None:
    """get-environment and get-arguments return exactly the policy's; initial-cwd is none."""
    ctx = make_ctx(Policy().with_env(A="1", B="two").with_args("prog", "x"))
    assert call(ctx, "wasi:cli/environment", "get-environment") == [("A", "1"), ("B", "two")]
    assert call(ctx, "wasi:cli/environment", "get-arguments") == ["prog", "x"]
    assert call(ctx, "wasi:cli/environment", "initial-cwd") is None


def test_default_policy_shows_nothing() -> None:
    """The default policy gives no environment and no arguments."""
    ctx = make_ctx()
    assert call(ctx, "wasi:cli/environment", "get-environment") == []
    assert call(ctx, "wasi:cli/environment", "get-arguments") == []


@pytest.mark.parametrize(("status", "code"), [(Ok(None), 0), (Err(None), 1)])
def test_exit_requests_exit(status: object, code: int) -> None:
    """exit(ok) exits 0 and exit(err) exits 1, through the gate's exit request."""
    with pytest.raises(GuestExitRequest) as info:
        call(make_ctx(), "wasi:cli/exit", "exit", status)
    assert info.value.code == code


def test_exit_with_code() -> None:
    """exit-with-code exits with the given status."""
    with pytest.raises(GuestExitRequest) as info:
        call(make_ctx(), "wasi:cli/exit", "exit-with-code", 42)
    assert info.value.code == 42


def test_stdin_gives_policy_bytes_then_eof() -> None:
    """stdin yields the policy's bytes and then stream-error.closed, across get-stdin calls."""
    ctx = make_ctx(Policy(stdin=b"hello"))
    first = call(ctx, "wasi:cli/stdin", "get-stdin")
    assert first.kind is INPUT_STREAM
    assert call(ctx, S, "[method]input-stream.read", obj(ctx, first), 3) == Ok(b"hel")
    again = obj(ctx, call(ctx, "wasi:cli/stdin", "get-stdin"))
    assert call(ctx, S, "[method]input-stream.read", again, 99) == Ok(b"lo")
    assert call(ctx, S, "[method]input-stream.read", again, 99) == Err(Variant("closed"))


def test_stdout_and_stderr_are_captured() -> None:
    """Writes to stdout and stderr land in the captures that outputs() returns."""
    chunks: list[bytes] = []
    ctx = make_ctx(Policy(stdout=OutputPolicy(cap=4)), seed=[STDOUT_SINK.of(chunks.append)])
    out = call(ctx, "wasi:cli/stdout", "get-stdout")
    err = call(ctx, "wasi:cli/stderr", "get-stderr")
    assert out.kind is OUTPUT_STREAM and err.kind is OUTPUT_STREAM
    write = "[method]output-stream.blocking-write-and-flush"
    assert call(ctx, S, write, obj(ctx, out), b"hello ") == Ok(None)
    assert call(ctx, S, write, obj(ctx, out), b"world") == Ok(None)
    assert call(ctx, S, write, obj(ctx, err), b"oops") == Ok(None)
    stdout, stderr = _cli.outputs(ctx)
    assert stdout.getvalue() == b"hell"
    assert stdout.total == 11
    assert stdout.truncated
    assert chunks == [b"hello ", b"world"]
    assert stderr.getvalue() == b"oops"
    assert not stderr.truncated


def test_dropping_stdout_keeps_the_capture() -> None:
    """The guest dropping its stdout handle does not lose or close the capture."""
    ctx = make_ctx()
    stream = obj(ctx, call(ctx, "wasi:cli/stdout", "get-stdout"))
    stream.write(b"a")
    stream.close()
    assert call(ctx, S, "[method]output-stream.write", stream, b"b") == Ok(None)
    assert _cli.outputs(ctx)[0].getvalue() == b"ab"


def test_no_terminals() -> None:
    """Every get-terminal-* answers none."""
    ctx = make_ctx()
    for which in ("stdin", "stdout", "stderr"):
        assert call(ctx, f"wasi:cli/terminal-{which}", f"get-terminal-{which}") is None


def test_terminal_resources_are_declared() -> None:
    """terminal-input and terminal-output exist so guests importing them link."""
    assert {(k.interface, k.name) for k in _cli.resources()} == {
        ("wasi:cli/terminal-input", "terminal-input"),
        ("wasi:cli/terminal-output", "terminal-output"),
    }


@given(chunks=st.lists(st.binary(max_size=50), max_size=20), cap=st.integers(0, 200))
def test_capture_keeps_a_prefix_and_counts_everything(chunks: list[bytes], cap: int) -> None:
    """A capture keeps exactly the first cap bytes, counts all, and is truncated iff it lost any."""
    seen: list[bytes] = []
    capture = CaptureOutput(cap, seen.append)
    for chunk in chunks:
        capture.write(chunk)
    everything = b"".join(chunks)
    assert capture.getvalue() == everything[:cap]
    assert capture.total == len(everything)
    assert capture.truncated == (len(everything) > cap)
    assert b"".join(seen) == everything


def test_capture_rejects_negative_cap() -> None:
    """A negative cap is a ValueError."""
    with pytest.raises(ValueError, match="cap"):
        CaptureOutput(-1)
