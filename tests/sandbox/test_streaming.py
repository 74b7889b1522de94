"""Code mode: stdout/stderr streamed to ``on_output`` while the code runs, and artifacts."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty.sandbox import Artifact, Limits, RunResult, Sandbox

Heard = list[tuple[str, str]]


def _joined(heard: Heard, stream: str) -> str:
    return "".join(text for name, text in heard if name == stream)


def test_chunks_arrive_while_the_code_runs(interpreter: object) -> None:
    """A tool called between two prints sees the first print already delivered, not the second."""
    heard: Heard = []

    def peek() -> str:
        """What on_output has heard so far."""
        return _joined(heard, "stdout")

    with Sandbox(tools=[peek], pool=0) as box:
        result = box.run(
            "print('first')\nseen = peek()\nprint('second')\nseen",
            on_output=lambda stream, text: heard.append((stream, text)),
        )
    assert result.ok, result.error
    assert result.value == "first\n"
    assert _joined(heard, "stdout") == "first\nsecond\n" == result.stdout
    # stdout is line-buffered in the sandbox: a print() is one write, its line whole.
    assert heard == [("stdout", "first\n"), ("stdout", "second\n")]


def test_streams_are_told_apart_and_run_on_the_runs_thread(interpreter: object) -> None:
    """stdout and stderr chunks keep their stream and order; sync runs call back on the caller."""
    heard: Heard = []
    threads: set[int] = set()

    def listen(stream: str, text: str) -> None:
        threads.add(threading.get_ident())
        heard.append((stream, text))

    with Sandbox(pool=0) as box:
        result = box.run(
            "import sys\nprint('a')\nsys.stderr.write('b')\nprint('c')", on_output=listen
        )
    assert result.ok, result.error
    merged: Heard = []
    for stream, text in heard:
        if merged and merged[-1][0] == stream:
            merged[-1] = (stream, merged[-1][1] + text)
        else:
            merged.append((stream, text))
    assert merged == [("stdout", "a\n"), ("stderr", "b"), ("stdout", "c\n")]
    assert threads == {threading.get_ident()}


def test_a_character_split_across_writes_is_delivered_whole(interpreter: object) -> None:
    """UTF-8 bytes of one character written apart reach the listener as that one character;
    a dangling lead byte at the end is U+FFFD."""
    heard: Heard = []
    with Sandbox(pool=0) as box:
        result = box.run(
            "import sys\nout = sys.stdout.buffer\n"
            "out.write(b'\\xc3'); out.write(b'\\xa9!'); out.write(b'\\xe2\\x82')",
            on_output=lambda stream, text: heard.append((stream, text)),
        )
    assert result.ok, result.error
    assert [text for _, text in heard] == ["é!", "\ufffd"]


def test_a_failing_listener_is_dropped_and_the_run_goes_on(
    interpreter: object, caplog: pytest.LogCaptureFixture
) -> None:
    """A listener that raises (even SystemExit) is called once, logged, and the run is unharmed."""
    for error in (RuntimeError("boom"), SystemExit(3), KeyboardInterrupt()):
        calls: list[str] = []

        def listen(
            stream: str, text: str, error: BaseException = error, calls: list[str] = calls
        ) -> None:
            calls.append(text)
            raise error

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mighty.sandbox"), Sandbox(pool=0) as box:
            result = box.run("print(1)\nprint(2)\nresult = 3", on_output=listen)
        assert result.ok, result.error
        assert result.value == 3
        assert result.stdout == "1\n2\n"
        assert calls == ["1\n"]
        assert any("on_output raised" in record.getMessage() for record in caplog.records)


def test_output_past_the_view_is_an_artifact(interpreter: object) -> None:
    """Past Limits.output the view is cut and the stream is kept whole; to_json has a reference."""
    with Sandbox(limits=Limits(output=10, artifact=1000), pool=0) as box:
        result = box.run("print('x' * 20)\nresult = 1")
        assert result.ok, result.error
        assert result.stdout == "x" * 10
        artifact = result.artifact("stdout")
        assert artifact == Artifact("stdout", b"x" * 20 + b"\n")
        assert artifact.text() == "x" * 20 + "\n"
        document = result.to_json()
        assert document["artifacts"] == [{"name": "stdout", "bytes": 21, "sha256": artifact.sha256}]
        assert "data" not in str(document["artifacts"])
        # Under the view: no artifact at all.
        assert box.run("print('short')").artifacts == ()


def test_artifact_at_or_below_output_means_no_artifacts(interpreter: object) -> None:
    """With artifact <= output the run ends at output, as before artifacts existed."""
    with Sandbox(limits=Limits(output=100, artifact=0), pool=0) as box:
        result = box.run("print('y' * 200)")
    assert result.error is not None
    assert result.error.kind == "output_limit"
    assert result.stdout == "y" * 100
    assert result.artifacts == ()


def test_limits_artifact_is_checked() -> None:
    """Limits.artifact must be a non-negative int."""
    with pytest.raises(ValueError, match="artifact"):
        Limits(artifact=-1)
    with pytest.raises(TypeError, match="artifact"):
        Limits(artifact=1.5)  # type: ignore[arg-type]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    writes=st.lists(
        st.tuples(st.sampled_from(["stdout", "stderr"]), st.integers(min_value=0, max_value=40)),
        max_size=8,
    ),
    view=st.integers(min_value=4, max_value=60),  # the result's JSON, null, counts too
    keep=st.integers(min_value=0, max_value=120),
)
def test_view_artifacts_and_listener_follow_the_model(
    interpreter: object, writes: list[tuple[str, int]], view: int, keep: int
) -> None:
    """For any writes and limits: the view is the first `output` bytes in the order they reach
    the host, each cut stream is whole up to max(output, artifact), the listener hears exactly
    what is kept, and passing the larger limit is output_limit."""
    lines = ["import sys"]
    for index, (stream, size) in enumerate(writes):
        letter = "abcdefgh"[index]
        lines.append(f"sys.{stream}.write({letter!r} * {size})")
    lines.append("result = None")
    heard: Heard = []
    limits = Limits(output=view, artifact=keep)
    with Sandbox(limits=limits, pool=0) as box:
        result = box.run("\n".join(lines), on_output=lambda s, t: heard.append((s, t)))
    _check_model(result, heard, _delivered(writes), view, max(view, keep))


def _delivered(writes: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """The writes as they reach the host: stderr's as the code makes them; stdout is
    line-buffered, so its writes (no newline in them, each under 8 KiB) go out together when
    the run ends, after every stderr write."""
    pieces = [(stream, "abcdefgh"[index] * size) for index, (stream, size) in enumerate(writes)]
    out = "".join(text for stream, text in pieces if stream == "stdout")
    return [piece for piece in pieces if piece[0] == "stderr"] + [("stdout", out)]


def _check_model(
    result: RunResult, heard: Heard, pieces: list[tuple[str, str]], view: int, keep: int
) -> None:
    kept = {"stdout": "", "stderr": ""}
    shown = {"stdout": "", "stderr": ""}
    total = shown_total = 0
    over = False
    for stream, text in pieces:
        size = len(text)
        piece = text[: max(0, keep - total)]
        kept[stream] += piece
        cut = piece[: max(0, view - shown_total)]
        shown[stream] += cut
        shown_total += len(cut)
        total += size
        if total > keep:
            over = True
            break
    assert result.stdout == shown["stdout"]
    assert result.stderr == shown["stderr"]
    assert result.ok is not over
    if over:
        assert result.error is not None
        assert result.error.kind == "output_limit"
    for stream in ("stdout", "stderr"):
        assert _joined(heard, stream) == kept[stream]
        artifact = result.artifact(stream)
        if len(kept[stream]) > len(shown[stream]):
            assert artifact is not None
            assert artifact.data == kept[stream].encode()
        else:
            assert artifact is None


def test_record_and_replay_with_listener_and_artifact(interpreter: object, tmp_path: Path) -> None:
    """A recorded run that streamed to a listener and made an artifact replays exactly."""
    from mighty.trace import replay_trace

    heard: Heard = []
    trace = tmp_path / "run.bin"
    with Sandbox(limits=Limits(output=16, artifact=4096)) as box:
        result = box.run(
            "for i in range(20): print('line', i)\nresult = 7",
            record=trace,
            on_output=lambda s, t: heard.append((s, t)),
        )
    assert result.ok, result.error
    artifact = result.artifact("stdout")
    assert artifact is not None
    assert artifact.text() == _joined(heard, "stdout")
    assert artifact.text().count("\n") == 20
    report = replay_trace(trace)
    assert report.instances[0].exports == 1
