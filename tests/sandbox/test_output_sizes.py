"""Code mode: one large write to stdout or stderr is shown, kept as an artifact, or ends the run."""

from __future__ import annotations

import pytest

from mighty.sandbox import Limits, Sandbox

KIB = 1 << 10
MIB = 1 << 20
SIZES = [64 * KIB - 1, 64 * KIB, 64 * KIB + 1, MIB]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", SIZES)
def test_one_write_up_to_the_limit_is_complete(sandbox: Sandbox, stream: str, size: int) -> None:
    """A single write of up to the 1 MiB limit arrives byte for byte and the run is ok."""
    result = sandbox.run(f"import sys; sys.{stream}.write('y' * {size})")
    assert result.ok, result.error
    assert getattr(result, stream) == "y" * size
    other = "stderr" if stream == "stdout" else "stdout"
    assert getattr(result, other) == ""


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", SIZES[:-1])
def test_print_below_the_limit_is_complete(sandbox: Sandbox, stream: str, size: int) -> None:
    """print() of sizes around the old 64 KiB permit keeps every character and the newline."""
    target = "" if stream == "stdout" else ", file=sys.stderr"
    result = sandbox.run(f"import sys; print('y' * {size}{target})")
    assert result.ok, result.error
    assert getattr(result, stream) == "y" * size + "\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", [MIB, MIB + 1])
def test_past_the_view_is_an_artifact(sandbox: Sandbox, stream: str, size: int) -> None:
    """print() past the 1 MiB view but within the 2 MiB artifact limit: ok, the first 1 MiB
    shown, every byte (and the newline) in the stream's artifact."""
    target = "" if stream == "stdout" else ", file=sys.stderr"
    result = sandbox.run(f"import sys; print('y' * {size}{target})")
    assert result.ok, result.error
    assert getattr(result, stream) == "y" * MIB
    artifact = result.artifact(stream)
    assert artifact is not None
    assert artifact.data == b"y" * size + b"\n"
    assert [a.name for a in result.artifacts] == [stream]


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("size", [2 * MIB, 50 * MIB])
def test_passing_the_artifact_limit_is_output_limit(
    sandbox: Sandbox, stream: str, size: int
) -> None:
    """print() of 2 MiB (plus its newline) or more is output_limit, showing the first 1 MiB and
    keeping the first 2 MiB."""
    target = "" if stream == "stdout" else ", file=sys.stderr"
    result = sandbox.run(f"import sys; print('y' * {size}{target})")
    assert not result.ok
    assert result.error is not None
    assert result.error.kind == "output_limit"
    assert getattr(result, stream) == "y" * MIB
    artifact = result.artifact(stream)
    assert artifact is not None
    assert artifact.data == b"y" * (2 * MIB)


def test_the_limit_is_shared_by_stdout_and_stderr(sandbox: Sandbox) -> None:
    """The view and the artifact limit count both streams together, in write order."""
    code = f"import sys; sys.stdout.write('o' * {MIB // 2}); sys.stderr.write('e' * {MIB})"
    result = sandbox.run(code)
    assert result.ok, result.error
    assert result.stdout == "o" * (MIB // 2)
    assert result.stderr == "e" * (MIB // 2)
    assert [a.name for a in result.artifacts] == ["stderr"]
    assert result.artifacts[0].data == b"e" * MIB
    code = f"import sys; sys.stdout.write('o' * {MIB}); sys.stderr.write('e' * {MIB + 1})"
    result = sandbox.run(code)
    assert result.error is not None
    assert result.error.kind == "output_limit"
    assert result.stdout == "o" * MIB
    assert result.stderr == ""
    artifact = result.artifact("stderr")
    assert artifact is not None
    assert artifact.data == b"e" * MIB


def test_many_writes_past_the_limit_are_output_limit(sandbox: Sandbox) -> None:
    """Many small writes that together pass the artifact limit end the run with output_limit."""
    result = sandbox.run(f"for _ in range({2 * MIB // 1000 + 1}): print('z' * 999)")
    assert result.error is not None
    assert result.error.kind == "output_limit"
    assert len(result.stdout) == MIB
    artifact = result.artifact("stdout")
    assert artifact is not None
    assert artifact.size == 2 * MIB


def test_a_larger_limit_takes_a_larger_write_whole() -> None:
    """Under a 2 MiB limit, one 1.5 MiB write is complete (no 64 KiB or 1 MiB cut)."""
    with Sandbox(limits=Limits(output=2 * MIB)) as box:
        result = box.run(f"import sys; sys.stdout.write('q' * {MIB + MIB // 2})")
    assert result.ok, result.error
    assert result.stdout == "q" * (MIB + MIB // 2)
