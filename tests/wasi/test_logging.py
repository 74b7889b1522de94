"""wasi:logging/logging: served through the gate, recorded and replayed, routed to the agent's
log by the runtime, and a structured stderr line elsewhere."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from mighty import Component, Instance
from mighty.agents import AgentType, Runtime
from mighty.trace import Recorder, replay_trace, summarize
from mighty.wasi import LOG_SINK

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def logger(wat: Callable[[str], bytes]) -> Component:
    """A component whose `run` logs (warn, "ctx", "hello") and (trace, "", "hello")."""
    return Component.load(wat((FIXTURES / "wasi_logging.wat").read_text()))


def test_default_sink_is_a_structured_log_line(
    logger: Component, caplog: pytest.LogCaptureFixture
) -> None:
    """Without a sink each call is one `[level] context: message` line of the `mighty.guest`
    logger, at the matching level; the guest's own stderr stays its own."""
    with caplog.at_level(logging.DEBUG, "mighty.guest"), Instance(logger) as instance:
        instance.call("run")
        assert instance.stderr.getvalue() == b""
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "mighty.guest"]
    assert lines == [(logging.WARNING, "[warn] ctx: hello"), (logging.DEBUG, "[trace] hello")]


def test_calls_are_recorded_and_replay(logger: Component, tmp_path: Path) -> None:
    """Each log call is an import in the trace, and the trace replays byte for byte."""
    path = tmp_path / "log.trace"
    recorder = Recorder(path)
    with Instance(logger, record=recorder) as instance:
        instance.call("run")
    recorder.close()
    summary = summarize(path)
    imports = summary["instances"][0]["imports"]
    assert imports["wasi:logging/logging#log"] == 2
    report = replay_trace(path)  # raises NondeterminismError on any difference
    assert [(r.imports, r.exports) for r in report.instances] == [(2, 1)]


def test_agent_routes_it_to_its_log(logger: Component) -> None:
    """A sink in the LOG_SINK slot (the agent runtime's) gets (level, context, message)."""
    seen: list[tuple[str, str, str]] = []

    def sink(level: str, context: str, message: str) -> None:
        seen.append((level, context, message))

    with Instance(logger, slots=[LOG_SINK.of(sink)]) as instance:
        instance.call("run")
        assert instance.stderr.getvalue() == b""
    assert seen == [("warn", "ctx", "hello"), ("trace", "", "hello")]


def test_runtime_sink_makes_log_events_and_output(logger: Component) -> None:
    """The agent runtime's sink: a `log` event and a line in the agent's output tail."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("x", logger))
        # Not an agent (no init/handle): drive the runtime's sink directly as the gate would.
        from mighty.agents import AgentProcess
        from mighty.agents.hosting import Mailbox

        process = AgentProcess(rt, "x:1", rt.agent_type("x"), b"", Mailbox(4))
        process._wasi_log("warn", "ctx", "hello")
        process._wasi_log("trace", "", "quiet")
    events = [e.data for e in rt.events_of("log")]
    assert events == [
        {"level": "warn", "text": "hello", "context": "ctx"},
        {"level": "debug", "text": "quiet"},
    ]
    assert [(o.level, o.text) for o in process.output.items()] == [
        ("warn", "ctx: hello"),
        ("debug", "quiet"),
    ]
