"""Spans, events and metrics with the SDK's in-memory exporters: one trace per ask chain,
links for sends, agent events as log records, export failures counted and logged once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mighty import Budget, Component
from mighty._errors import BadInput
from mighty.agents import AgentChild, AgentType, Runtime, SupervisorSpec, start_tree
from mighty.agents.hosting import Envelope
from mighty.telemetry import Telemetry, TelemetryConfig, load_config, traceparent


class Sink:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.logs = InMemoryLogRecordExporter()
        self.metrics = InMemoryMetricReader()
        self.telemetry = Telemetry(
            span_exporter=self.spans,
            log_exporter=self.logs,
            metric_reader=self.metrics,
            batch=False,
        )

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == name]


@pytest.fixture
def sink() -> Iterator[Sink]:
    made = Sink()
    yield made
    made.telemetry.shutdown()


def _by_address(spans: list[ReadableSpan], address: str) -> ReadableSpan:
    (span,) = [s for s in spans if (s.attributes or {}).get("agent.address") == address]
    return span


def test_an_ask_chain_is_one_trace_with_the_right_parents(relay: Component, sink: Sink) -> None:
    """host asks A, A asks B, B asks C: six spans, one trace, each the child of the one before."""
    with Runtime(workers=2, telemetry=sink.telemetry) as rt:
        rt.register(AgentType("relay", relay))
        a, b, c = (rt.spawn("relay") for _ in range(3))
        assert rt.ask(a, "relay", {"path": [b, c]}, timeout=30) == {"depth": 2}
        assert rt.drain(10)
    spawns = sink.named("agent.spawn")
    assert [s.attributes["agent.type"] for s in spawns] == ["relay"] * 3
    asks = sink.named("agent.ask")
    handles = sink.named("agent.handle")
    assert len(asks) == 3
    assert len(handles) == 3
    root = next(s for s in asks if s.parent is None)
    assert root.attributes["agent.sender"] == "host"
    assert root.attributes["protocol.msg"] == "relay"
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in asks + handles} == {trace_id}
    handle_a, handle_b, handle_c = (_by_address(handles, x) for x in (a, b, c))
    ask_ab = next(s for s in asks if s.attributes["agent.target"] == b)
    ask_bc = next(s for s in asks if s.attributes["agent.target"] == c)
    assert handle_a.parent.span_id == root.context.span_id
    assert ask_ab.parent.span_id == handle_a.context.span_id
    assert handle_b.parent.span_id == ask_ab.context.span_id
    assert ask_bc.parent.span_id == handle_b.context.span_id
    assert handle_c.parent.span_id == ask_bc.context.span_id
    # The reply closes each ask after the handle it waited on.
    assert ask_ab.end_time >= handle_b.end_time
    assert root.end_time >= handle_a.end_time
    assert all(s.attributes["agent.outcome"] == "ok" for s in handles)
    assert all(s.attributes["agent.fuel"] > 0 for s in handles)
    assert "protocol.body" not in handle_a.attributes


def test_a_send_is_linked_not_parented(relay: Component, sink: Sink) -> None:
    """A send's span ends at once; the receiver's handle starts its own trace, linked to it."""
    with Runtime(workers=1, telemetry=sink.telemetry) as rt:
        rt.register(AgentType("relay", relay))
        a, b = rt.spawn("relay"), rt.spawn("relay")
        rt.send(a, "tell", {"path": [b]})
        assert rt.drain(10)
    sends = sink.named("agent.send")
    handles = sink.named("agent.handle")
    host_send = next(s for s in sends if s.attributes["agent.sender"] == "host")
    a_send = next(s for s in sends if s.attributes["agent.sender"] == a)
    handle_a, handle_b = _by_address(handles, a), _by_address(handles, b)
    assert handle_a.parent is None
    assert [link.context.span_id for link in handle_a.links] == [host_send.context.span_id]
    assert handle_a.context.trace_id != host_send.context.trace_id
    assert a_send.parent.span_id == handle_a.context.span_id
    assert [link.context.span_id for link in handle_b.links] == [a_send.context.span_id]
    assert a_send.attributes["protocol.msg"] == "tell"


def test_emit_and_log_become_log_records_and_span_events(relay: Component, sink: Sink) -> None:
    """emit() and log() inside a handler: log records in its trace, and events on its span."""
    with Runtime(workers=1, telemetry=sink.telemetry) as rt:
        rt.register(AgentType("relay", relay))
        a = rt.spawn("relay")
        rt.ask(a, "relay", {"path": []}, timeout=30)
    (handle,) = sink.named("agent.handle")
    events = {e.name: e for e in handle.events}
    assert events["agent.hop"].attributes["agent.address"] == a
    assert events["agent.hop"].attributes["body.type"] == "dict"
    assert events["agent.hop"].attributes["field.left"] == 0
    assert events["agent.hop"].attributes["field.hops"] == 1
    assert events["log"].attributes["message"] == "relaying, 0 left"
    assert events["log"].attributes["log.level"] == "info"
    records = [r.log_record for r in sink.logs.get_finished_logs()]
    log = next(r for r in records if r.event_name == "agent.log")
    assert log.body == "relaying, 0 left"
    assert log.severity_text == "INFO"
    assert log.trace_id == handle.context.trace_id
    assert log.span_id == handle.context.span_id
    hop = next(r for r in records if r.event_name == "agent.hop")
    assert hop.attributes["agent.address"] == a


def test_budget_exhausted_and_supervise_restart(crasher_like: Component, sink: Sink) -> None:
    """A supervised agent out of fuel: budget.exhausted on its handle span, supervise.restart
    on the supervisor's span, a restart counted, the handle span in error."""
    with Runtime(workers=1, telemetry=sink.telemetry) as rt:
        rt.register(AgentType("r", crasher_like, budget=Budget(fuel=50_000)))
        start_tree(rt, SupervisorSpec("root", [AgentChild("worker", "r")]))
        address = rt.whereis("worker")
        assert address is not None
        with pytest.raises(Exception, match="crashed"):
            rt.ask(address, "relay", {"path": []}, timeout=30)
        assert rt.drain(30)
        metrics = sink.metrics.get_metrics_data()
    sink.telemetry.shutdown()
    (handle,) = [s for s in sink.named("agent.handle") if s.attributes["agent.address"] == address]
    assert handle.attributes["agent.outcome"] == "crashed"
    assert not handle.status.is_ok
    exhausted = next(e for e in handle.events if e.name == "budget.exhausted")
    assert exhausted.attributes["reason"] == "out_of_fuel"
    (supervisor,) = sink.named("supervisor")
    restart = next(e for e in supervisor.events if e.name == "supervise.restart")
    assert restart.attributes["child"] == "worker"
    names = {
        m.name: m for rm in metrics.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert sum(p.value for p in names["mighty.restarts"].data.data_points) == 1
    outcomes = {p.attributes["outcome"]: p.value for p in names["mighty.messages"].data.data_points}
    assert outcomes["crashed"] == 1
    depths = names["mighty.mailbox.depth"].data.data_points
    assert [(p.attributes["agent.address"], p.value) for p in depths] == [(address, 0)]


@pytest.fixture
def crasher_like(relay: Component) -> Component:
    return relay


def test_export_failures_are_counted_and_logged_once(
    echo_agent: Component, caplog: pytest.LogCaptureFixture
) -> None:
    """An endpoint refusing connections: the runtime runs on; failures counted, one log line."""
    telemetry = Telemetry(TelemetryConfig(endpoint="http://127.0.0.1:9", timeout=0.5))
    with caplog.at_level(logging.WARNING), Runtime(workers=1, telemetry=telemetry) as rt:
        rt.register(AgentType("echo", echo_agent))
        address = rt.spawn("echo")
        for i in range(50):
            assert rt.ask(address, "x", i) == i
        telemetry.tracer_provider.force_flush(2000)
    telemetry.shutdown(timeout=5)
    assert telemetry.failures >= 1
    lines = [r for r in caplog.records if "telemetry: exporting" in r.getMessage()]
    assert len(lines) == 1


def test_off_means_no_trace_context(echo_agent: Component) -> None:
    """Without telemetry the message carries no trace context at all."""
    seen: list[Envelope] = []  # each envelope once, whichever way it went (held: ids are reused)
    with Runtime(workers=1) as rt:
        rt.register(AgentType("echo", echo_agent))
        process = rt.process(rt.spawn("echo"))
        deliver, run_here = process.deliver, process.run_here

        def spy(envelope, timeout=None):  # type: ignore[no-untyped-def]
            if not any(e is envelope for e in seen):
                seen.append(envelope)
            deliver(envelope, timeout)

        def spy_here(envelope, deadline, outer=None):  # type: ignore[no-untyped-def]
            if not any(e is envelope for e in seen):
                seen.append(envelope)
            return run_here(envelope, deadline, outer)

        process.deliver = spy  # type: ignore[method-assign]
        process.run_here = spy_here  # type: ignore[method-assign]
        assert rt.ask(process.address, "x", 1) == 1
        rt.send(process.address, "x", 2)
    assert [e.trace for e in seen] == [None, None]
    assert rt.telemetry is None


def test_config_from_block_and_environment() -> None:
    """The block is validated (unknown keys named); the environment wins; nothing set: off."""
    assert load_config(None, {}) is None
    config = load_config({"endpoint": "http://h:4318", "sampling": 0.5}, {})
    assert config is not None
    assert config.url("traces") == "http://h:4318/v1/traces"
    assert config.sampling == 0.5
    env = load_config(
        {"endpoint": "http://h:4318"},
        {"MTY_OTLP_ENDPOINT": "http://o:1", "MTY_OTLP_PROTOCOL": "grpc"},
    )
    assert env is not None
    assert (env.endpoint, env.protocol) == ("http://o:1", "grpc")
    with pytest.raises(BadInput, match="'colour'"):
        load_config({"endpoint": "http://h", "colour": "red"}, {})
    with pytest.raises(BadInput, match="needs an endpoint"):
        load_config({"sampling": 1.0}, {})
    with pytest.raises(BadInput, match="protocol"):
        load_config({"endpoint": "http://h", "protocol": "carrier-pigeon"}, {})


@given(
    st.dictionaries(
        st.sampled_from(["endpoint", "protocol", "sampling", "timeout", "attribute_limit", "x"]),
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    )
)
def test_config_never_raises_anything_but_bad_input(block: dict[str, object]) -> None:
    """Any block gives a config or a BadInput, never another exception."""
    config = None
    message = ""
    try:
        config = load_config(block, {})
    except BadInput as exc:
        message = str(exc)
    assert "\n" not in message
    assert config is None or isinstance(config.endpoint, str)
    assert config is None or 0.0 <= config.sampling <= 1.0


def test_traceparent_is_w3c(sink: Sink) -> None:
    """traceparent() renders a span context as the W3C header (for messages on a wire)."""
    span = sink.telemetry.tracer.start_span("x")
    context = span.get_span_context()
    header = traceparent(context)
    version, trace_id, span_id, flags = header.split("-")
    assert (version, int(trace_id, 16), int(span_id, 16), int(flags, 16)) == (
        "00",
        context.trace_id,
        context.span_id,
        int(context.trace_flags),
    )
    assert int(flags, 16) & 1  # sampled
    span.end()


def test_a_dropped_trace_stays_dropped_down_the_chain(relay: Component) -> None:
    """sampling = 0: no span is exported anywhere along an ask chain, messages still counted."""
    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry = Telemetry(
        TelemetryConfig(endpoint="in-process", sampling=0.0),
        span_exporter=spans,
        metric_reader=metrics,
        batch=False,
    )
    with Runtime(workers=2, telemetry=telemetry) as rt:
        rt.register(AgentType("relay", relay))
        a, b, c = (rt.spawn("relay") for _ in range(3))
        assert rt.ask(a, "relay", {"path": [b, c]}, timeout=30) == {"depth": 2}
        rt.send(a, "tell", {"path": [b]})
        assert rt.drain(10)
        data = metrics.get_metrics_data()
    telemetry.shutdown()
    assert spans.get_finished_spans() == ()
    (messages,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "mighty.messages"
    ]
    assert sum(p.value for p in messages.data.data_points) == 5
