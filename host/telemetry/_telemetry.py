"""OpenTelemetry for the agent runtime: spans, span events, log records and metrics.

The runtime holds ``telemetry = None`` when telemetry is off, and every hook on the message
path is behind ``if telemetry is not None``: off, no span object, no attribute dict and no
context is made. On, the runtime calls the hooks below; they never raise into a turn (a
failure in a hook is counted and logged once, as an export failure is).

Spans:
- ``agent.spawn`` (``agent.type``), around instantiation and ``init``;
- ``agent.send``: ends at once (one-way); the receiving ``agent.handle`` starts a new trace
  with a *link* to it, since a send does not wait;
- ``agent.ask``: a child of the caller's current span (its ``agent.handle``, or none from the
  host), ended when the reply arrives or the ask fails; the receiving ``agent.handle`` is its
  child, so an ask chain A -> B -> C is one trace;
- ``agent.handle`` around each dispatch, made current on the worker thread while the guest
  runs, so the asks and sends the guest makes are its children.
Trace context travels inside the message (``Envelope.trace``, a SpanContext in process;
``traceparent`` converts it for a wire).

Events: ``supervise.restart`` on the supervisor's span (one span per supervisor, from its
first event to shutdown), ``budget.exhausted`` (with the reason) and the agents' own
``emit``/``log`` as span events on the current ``agent.handle`` and as log records carrying
its trace context.

Metrics: ``mighty.messages`` {agent.type, outcome}, ``mighty.fuel`` {agent.type},
``mighty.restarts`` {agent.type}, ``mighty.mailbox.depth`` {agent.address} (observed),
``worker.steals_total`` {src, dst} (observed).

Export failures (an endpoint that refuses connections, a timeout) never block or crash the
runtime: the SDK's batch processors export on their own threads from bounded queues (a full
queue drops, it does not wait), every failure is counted (:attr:`Telemetry.failures`) and the
first one is logged, once. The exporters' own repeated log lines are silenced while telemetry
is open.

Rejected: the global tracer provider (a library must not take the process's one), an exporter
of our own (the SDK's OTLP exporters are the standard), and opentelemetry's context API across
threads for asks (the worker thread that asks is the one running the handle span, so the
thread-local current context is exactly the caller's span).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry._logs import SeverityNumber
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk._logs import LoggerProvider, LogRecordLimits
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from mighty.telemetry._config import TelemetryConfig

__all__ = ["LINK", "Telemetry", "traceparent"]

_log = logging.getLogger(__name__)

LINK = "link"
"""``Envelope.trace`` of a send is ``(LINK, context)``: the handler links to it."""

_SEVERITY = {
    "trace": SeverityNumber.TRACE,
    "debug": SeverityNumber.DEBUG,
    "info": SeverityNumber.INFO,
    "warn": SeverityNumber.WARN,
    "warning": SeverityNumber.WARN,
    "error": SeverityNumber.ERROR,
    "critical": SeverityNumber.FATAL,
}
_MAX_ATTRIBUTES = 32
_SCOPE = "mighty"


def _unsampled_current() -> Span | None:
    """The current span when it belongs to a trace the sampler dropped (else None)."""
    span = trace.get_current_span()
    context = span.get_span_context()
    if context.is_valid and not context.trace_flags.sampled:
        return span
    return None


def traceparent(span_context: SpanContext) -> str:
    """The W3C ``traceparent`` header of ``span_context`` (for a message crossing a wire)."""
    flags = int(span_context.trace_flags)
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{flags:02x}"


class _Failures:
    """Counts export failures; logs the first, once; quiets the exporters' own repeats."""

    def __init__(self) -> None:
        self.count = 0
        self._logged = False
        self._lock = threading.Lock()

    def failed(self, what: str, detail: str) -> None:
        with self._lock:
            self.count += 1
            first = not self._logged
            self._logged = True
        if first:
            _log.warning(
                "telemetry: exporting %s failed (%s); further failures are counted, not logged",
                what,
                detail,
            )


_QUIET = ("opentelemetry.exporter", "opentelemetry.sdk")
_quiet_lock = threading.Lock()
_quiet_users = [0]  # open Telemetry objects
_quiet_saved: dict[str, int] = {}


def _quiet(on: bool) -> None:
    """While any Telemetry is open, the SDK's and exporters' own per-attempt error lines are
    silenced (their loggers' level raised); _Failures reports the first failure instead."""
    with _quiet_lock:
        if on:
            _quiet_users[0] += 1
            if _quiet_users[0] == 1:
                for name in _QUIET:
                    logger = logging.getLogger(name)
                    _quiet_saved[name] = logger.level
                    logger.setLevel(logging.CRITICAL + 1)
        elif _quiet_users[0] > 0:
            _quiet_users[0] -= 1
            if _quiet_users[0] == 0:
                for name, level in _quiet_saved.items():
                    logging.getLogger(name).setLevel(level)


_R = TypeVar("_R")


def _counted(failures: _Failures, what: str, export: Callable[[], _R], ok: _R, failed: _R) -> _R:
    """Run one export: a raise or a refusal is counted (and reported once), never propagated."""
    try:
        result = export()
    except Exception as exc:  # noqa: BLE001 -- an exporter must never take the runtime down
        failures.failed(what, f"{type(exc).__name__}: {exc}")
        return failed
    if result is not ok:
        failures.failed(what, "the receiver did not accept them")
    return result


class _CountedSpans(SpanExporter):
    def __init__(self, inner: SpanExporter, failures: _Failures) -> None:
        self._inner, self._failures = inner, failures

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return _counted(
            self._failures,
            "spans",
            lambda: self._inner.export(spans),
            SpanExportResult.SUCCESS,
            SpanExportResult.FAILURE,
        )

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountedLogs(LogRecordExporter):
    def __init__(self, inner: LogRecordExporter, failures: _Failures) -> None:
        self._inner, self._failures = inner, failures

    def export(self, batch: Sequence[Any]) -> LogRecordExportResult:
        return _counted(
            self._failures,
            "log records",
            lambda: self._inner.export(batch),
            LogRecordExportResult.SUCCESS,
            LogRecordExportResult.FAILURE,
        )

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call] # untyped in the SDK

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


class _CountedMetrics(MetricExporter):
    def __init__(self, inner: MetricExporter, failures: _Failures) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self._inner, self._failures = inner, failures

    def export(
        self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        return _counted(
            self._failures,
            "metrics",
            lambda: self._inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs),
            MetricExportResult.SUCCESS,
            MetricExportResult.FAILURE,
        )

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def _otlp_exporters(config: TelemetryConfig) -> tuple[Any, Any, Any]:
    """The SDK's OTLP exporters for spans, logs and metrics, by protocol."""
    if config.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = config.endpoint
        insecure = not endpoint.startswith("https://")
        return (
            OTLPSpanExporter(endpoint=endpoint, insecure=insecure, timeout=config.timeout),
            OTLPLogExporter(endpoint=endpoint, insecure=insecure, timeout=config.timeout),
            OTLPMetricExporter(endpoint=endpoint, insecure=insecure, timeout=config.timeout),
        )
    from opentelemetry.exporter.otlp.proto.http._log_exporter import (
        OTLPLogExporter as HttpLogs,
    )
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetrics,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpSpans,
    )

    return (
        HttpSpans(endpoint=config.url("traces"), timeout=config.timeout),
        HttpLogs(endpoint=config.url("logs"), timeout=config.timeout),
        HttpMetrics(endpoint=config.url("metrics"), timeout=config.timeout),
    )


class Telemetry:
    """The runtime's OpenTelemetry providers and the hooks the runtime calls (when on).

    ``Telemetry(config)`` exports OTLP with batch processors. Tests and embedders may pass
    their own exporters (``span_exporter``, ``log_exporter``, ``metric_reader``), exported
    synchronously when ``batch=False`` (the SDK's in-memory exporters, for example).
    """

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        span_exporter: SpanExporter | None = None,
        log_exporter: LogRecordExporter | None = None,
        metric_reader: MetricReader | None = None,
        batch: bool = True,
    ) -> None:
        self.config = config or TelemetryConfig(endpoint="in-process")
        self._failures = _Failures()
        _quiet(True)
        if config is not None and span_exporter is None:
            span_exporter, log_exporter, metric_exporter = _otlp_exporters(config)
            metric_reader = PeriodicExportingMetricReader(
                _CountedMetrics(metric_exporter, self._failures),
                export_interval_millis=config.metric_interval * 1000,
                export_timeout_millis=config.timeout * 1000,
            )
        limit = self.config.attribute_limit
        resource = Resource.create({"service.name": self.config.service_name})
        self.tracer_provider = TracerProvider(
            resource=resource,
            sampler=ParentBased(TraceIdRatioBased(self.config.sampling)),
            span_limits=SpanLimits(
                max_attribute_length=limit,
                max_span_attribute_length=limit,
                max_span_attributes=_MAX_ATTRIBUTES,
                max_event_attributes=_MAX_ATTRIBUTES,
                max_events=128,
            ),
        )
        if span_exporter is not None:
            counted = _CountedSpans(span_exporter, self._failures)
            self.tracer_provider.add_span_processor(
                BatchSpanProcessor(counted, export_timeout_millis=self.config.timeout * 1000)
                if batch
                else SimpleSpanProcessor(counted)
            )
        self.logger_provider = LoggerProvider(resource=resource)
        if log_exporter is not None:
            counted_logs = _CountedLogs(log_exporter, self._failures)
            self.logger_provider.add_log_record_processor(
                BatchLogRecordProcessor(counted_logs)
                if batch
                else SimpleLogRecordProcessor(counted_logs)
            )
        self._log_limits = LogRecordLimits(
            max_attributes=_MAX_ATTRIBUTES, max_attribute_length=limit
        )
        self.meter_provider = MeterProvider(
            resource=resource, metric_readers=[metric_reader] if metric_reader else []
        )
        self.tracer = self.tracer_provider.get_tracer(_SCOPE)
        self.logger = self.logger_provider.get_logger(_SCOPE)
        meter = self.meter_provider.get_meter(_SCOPE)
        # Per message only plain counters move (under one lock); the SDK reads them when it
        # collects, so the message path makes no metric attribute dict and takes no SDK lock.
        self._counts: dict[tuple[str, str], int] = {}
        self._fuel_used: dict[str, int] = {}
        self._counts_lock = threading.Lock()
        meter.create_observable_counter(
            "mighty.messages", [self._observe_messages], description="Messages handled"
        )
        meter.create_observable_counter(
            "mighty.fuel", [self._observe_fuel], unit="{fuel}", description="Fuel used"
        )
        self._restarts = meter.create_counter("mighty.restarts", description="Agent restarts")
        self._meter = meter
        self._supervisors: dict[str, Span] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.bodies = False
        self._attr_limit = limit

    # -- state -------------------------------------------------------------------------------

    @property
    def failures(self) -> int:
        """Exports (and hooks) that failed so far; the first was logged."""
        return self._failures.count

    def observe(
        self,
        agents: Callable[[], Iterable[Any]],
        steals: Callable[[], Mapping[tuple[str, str], int]],
        *,
        bodies: bool,
    ) -> None:
        """Observe a runtime: mailbox depth per agent and steals per (src, dst) worker."""
        self.bodies = bodies

        def depth(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(len(p.mailbox), {"agent.address": p.address, "agent.type": p.type.name})
                for p in agents()
            ]

        def stolen(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {"src": s, "dst": d}) for (s, d), n in steals().items()]

        self._meter.create_observable_gauge("mighty.mailbox.depth", [depth])
        self._meter.create_observable_counter("worker.steals_total", [stolen])

    def _observe_messages(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._counts_lock:
            counts = list(self._counts.items())
        return [Observation(n, {"agent.type": t, "outcome": o}) for (t, o), n in counts]

    def _observe_fuel(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._counts_lock:
            fuel = list(self._fuel_used.items())
        return [Observation(n, {"agent.type": t}) for t, n in fuel]

    def _guard(self, what: str, exc: BaseException) -> None:
        self._failures.failed(what, f"{type(exc).__name__}: {exc}")

    def _text(self, value: Any) -> str:
        text = value if isinstance(value, str) else repr(value)
        return text[: self._attr_limit]

    # -- spans -------------------------------------------------------------------------------

    # Every hook below may run inside a guest's import or a caller's send: none may raise.
    # A failure is counted like an export failure and the message goes on untraced.

    def spawn_begin(self, agent_type: str) -> Span:
        try:
            return self.tracer.start_span("agent.spawn", attributes={"agent.type": agent_type})
        except Exception as exc:  # noqa: BLE001 -- never into a spawn
            self._guard("a spawn span", exc)
            return trace.INVALID_SPAN

    def spawn_end(self, span: Span, address: str | None, error: BaseException | None) -> None:
        try:
            self._spawn_end(span, address, error)
        except Exception as exc:  # noqa: BLE001 -- never into a spawn
            self._guard("a spawn span", exc)

    def _spawn_end(self, span: Span, address: str | None, error: BaseException | None) -> None:
        if address is not None:
            span.set_attribute("agent.address", address)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, self._text(str(error))))
        span.end()

    def send(self, to: str, name: str, sender: str) -> tuple[str, SpanContext] | None:
        """A one-way send: its span ends now; the receiver links to it."""
        try:
            return self._send(to, name, sender)
        except Exception as exc:  # noqa: BLE001 -- never into a send
            self._guard("a send span", exc)
            return None

    def _send(self, to: str, name: str, sender: str) -> tuple[str, SpanContext]:
        dropped = _unsampled_current()
        if dropped is not None:
            return (LINK, dropped.get_span_context())
        span = self.tracer.start_span(
            "agent.send",
            kind=SpanKind.PRODUCER,
            attributes={"protocol.msg": name, "agent.sender": sender, "agent.target": to},
        )
        span.end()
        return (LINK, span.get_span_context())

    def ask_begin(self, to: str, name: str, sender: str) -> Span:
        """An ask: a child of the current span; its context goes in the message."""
        try:
            return self._ask_begin(to, name, sender)
        except Exception as exc:  # noqa: BLE001 -- never into an ask
            self._guard("an ask span", exc)
            return trace.INVALID_SPAN

    def _ask_begin(self, to: str, name: str, sender: str) -> Span:
        dropped = _unsampled_current()
        if dropped is not None:
            return dropped  # the sampler would drop a child of a dropped span: skip asking it
        return self.tracer.start_span(
            "agent.ask",
            kind=SpanKind.CLIENT,
            attributes={"protocol.msg": name, "agent.sender": sender, "agent.target": to},
        )

    def ask_end(self, span: Span, error: BaseException | None) -> None:
        try:
            self._ask_end(span, error)
        except Exception as exc:  # noqa: BLE001 -- never into an ask
            self._guard("an ask span", exc)

    def _ask_end(self, span: Span, error: BaseException | None) -> None:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, self._text(f"{type(error).__name__}")))
            span.set_attribute("error.message", self._text(str(error)))
        span.end()

    def handle_begin(
        self, address: str, agent_type: str, name: str, sender: str, carried: Any, body: bytes
    ) -> tuple[Span, object] | None:
        """The span of one dispatch, made current on this thread until :meth:`handle_end`."""
        try:
            return self._handle_begin(address, agent_type, name, sender, carried, body)
        except Exception as exc:  # noqa: BLE001 -- never into a turn
            self._guard("a handle span", exc)
            return None

    def _handle_begin(
        self, address: str, agent_type: str, name: str, sender: str, carried: Any, body: bytes
    ) -> tuple[Span, object]:
        parent = None
        links: list[Link] = []
        if isinstance(carried, SpanContext) and not carried.trace_flags.sampled:
            # The trace was dropped at its root: carry it on without a span or a sampler call.
            dropped = trace.NonRecordingSpan(carried)
            return dropped, otel_context.attach(trace.set_span_in_context(dropped))
        if isinstance(carried, SpanContext):
            parent = trace.set_span_in_context(trace.NonRecordingSpan(carried))
        elif isinstance(carried, tuple) and len(carried) == 2 and carried[0] == LINK:
            links.append(Link(carried[1]))
        attributes: dict[str, Any] = {
            "agent.address": address,
            "agent.type": agent_type,
            "protocol.msg": name,
            "agent.sender": sender,
        }
        if self.bodies:
            attributes["protocol.body"] = self._text(body.hex())
        span = self.tracer.start_span(
            "agent.handle",
            context=parent or otel_context.Context(),
            kind=SpanKind.CONSUMER if links else SpanKind.SERVER,
            links=links,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        return span, token

    def handle_end(
        self, begun: tuple[Span, object], agent_type: str, outcome: str, fuel: int
    ) -> None:
        try:
            self._handle_end(begun, agent_type, outcome, fuel)
        except Exception as exc:  # noqa: BLE001 -- never into a turn
            self._guard("a handle span", exc)

    def _handle_end(
        self, begun: tuple[Span, object], agent_type: str, outcome: str, fuel: int
    ) -> None:
        span, token = begun
        otel_context.detach(token)  # type: ignore[arg-type] # the token attach gave us
        if not span.is_recording():
            key = (agent_type, outcome)
            with self._counts_lock:
                self._counts[key] = self._counts.get(key, 0) + 1
                if fuel:
                    self._fuel_used[agent_type] = self._fuel_used.get(agent_type, 0) + fuel
            return
        span.set_attributes({"agent.outcome": outcome, "agent.fuel": fuel})
        if outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()
        key = (agent_type, outcome)
        with self._counts_lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            if fuel:
                self._fuel_used[agent_type] = self._fuel_used.get(agent_type, 0) + fuel

    @staticmethod
    def carry(span: Span) -> SpanContext:
        """What an ask puts in its message."""
        return span.get_span_context()

    # -- HTTP (mighty.serve's agent front) ---------------------------------------------------

    def http_begin(
        self,
        method: str,
        route: str,
        attributes: Mapping[str, Any],
        traceparent: str | None = None,
    ) -> Span:
        """An ``http.server`` span for one routed request (OpenTelemetry's HTTP semantic
        conventions: named ``METHOD ROUTE``), the child of the request's W3C ``traceparent``
        when it has a valid one, else a root; end it with :meth:`http_end`."""
        try:
            parent = otel_context.Context()
            if traceparent is not None:
                parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
            return self.tracer.start_span(
                f"{method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "http.route": route, **attributes},
            )
        except Exception as exc:  # noqa: BLE001 -- never into a request
            self._guard("an http span", exc)
            return trace.INVALID_SPAN

    @contextmanager
    def http_current(self, span: Span) -> Iterator[None]:
        """``span`` current on this thread inside the block: the asks made there are its
        children (and the handlers theirs)."""
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            yield
        finally:
            otel_context.detach(token)

    def http_end(self, span: Span, status: int | None, error: str | None) -> None:
        """End an :meth:`http_begin` span: its status code (None: the client went away before
        one), and ``error.type`` when it failed (server errors set the span's status)."""
        try:
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if error is not None:
                span.set_attribute("error.type", error)
            if status is None or status >= 500:
                span.set_status(Status(StatusCode.ERROR, error or str(status)))
            span.end()
        except Exception as exc:  # noqa: BLE001 -- never into a request
            self._guard("an http span", exc)

    # -- events ------------------------------------------------------------------------------

    def event(self, kind: str, address: str, data: Mapping[str, Any]) -> None:
        """A runtime event: a span event on the current span and/or a log record."""
        try:
            self._event(kind, address, data)
        except Exception as exc:  # noqa: BLE001 -- an event must never break a turn
            self._guard("an event", exc)

    def _attributes(self, address: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Typed attributes of an event. An emit's fields (``body``) become ``field.NAME``:
        numbers and booleans always (counters), other values only with the introspect
        capability (else ``field.NAME.type``): the privacy boundary of docs/observability.md."""
        out: dict[str, Any] = {"agent.address": address}
        for key, value in list(data.items())[:_MAX_ATTRIBUTES]:
            if key == "body":
                out["body.type"] = type(value).__name__
                if isinstance(value, dict):
                    for name, item in list(value.items())[:_MAX_ATTRIBUTES]:
                        self._field(out, f"field.{str(name)[:64]}", item)
                elif self.bodies and value is not None:
                    out["body"] = self._text(value)
                continue
            if isinstance(value, bool | int | float):
                out[str(key)[:64]] = value
            elif value is not None:
                out[str(key)[:64]] = self._text(value)
        return out

    def _field(self, out: dict[str, Any], key: str, value: Any) -> None:
        if isinstance(value, bool | int | float) and not (
            isinstance(value, int) and not -(2**63) <= value < 2**63
        ):
            out[key] = value
        elif self.bodies:
            out[key] = self._text(value)
        else:
            out[f"{key}.type"] = type(value).__name__

    def _event(self, kind: str, address: str, data: Mapping[str, Any]) -> None:
        if kind == "supervisor.child_restarted":
            span = self._supervisor_span(address)
            span.add_event(
                "supervise.restart",
                {"supervisor": address, "child": self._text(data.get("child") or "")},
            )
            return
        if kind == "agent.restarted":
            agent_type = address.rpartition(":")[0]
            self._restarts.add(1, {"agent.type": agent_type})
            return
        current = trace.get_current_span()
        if kind == "log":
            level = str(data.get("level", "info"))
            text = self._text(data.get("text", ""))
            attributes = {"agent.address": address, "log.level": level}
            if "context" in data:
                attributes["log.context"] = self._text(data["context"])
            current.add_event("log", {**attributes, "message": text})
            self.logger.emit(
                body=text,
                severity_number=_SEVERITY.get(level, SeverityNumber.INFO),
                severity_text=level.upper(),
                attributes=attributes,
                event_name="agent.log",
            )
            return
        attributes = self._attributes(address, data)
        name = "budget.exhausted" if kind == "budget.exhausted" else kind
        current.add_event(name, attributes)
        severity = SeverityNumber.WARN if kind in ("budget.exhausted", "agent.crashed") else None
        self.logger.emit(
            body=name,
            severity_number=severity or SeverityNumber.INFO,
            attributes=attributes,
            event_name=name,
        )

    def _supervisor_span(self, name: str) -> Span:
        with self._lock:
            span = self._supervisors.get(name)
            if span is None:
                span = self.tracer.start_span(
                    "supervisor", context=otel_context.Context(), attributes={"supervisor": name}
                )
                self._supervisors[name] = span
            return span

    # -- the end -----------------------------------------------------------------------------

    def shutdown(self, timeout: float | None = None) -> None:
        """End the supervisors' spans, flush and stop the exporters, within ``timeout`` s.

        Runs on a daemon thread joined up to the timeout: an endpoint that does not answer
        cannot hold the runtime's exit.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            spans = list(self._supervisors.values())
        for span in spans:
            span.end()
        budget = self.config.timeout * 2 if timeout is None else timeout

        def close() -> None:
            for provider in (self.tracer_provider, self.logger_provider, self.meter_provider):
                try:
                    provider.shutdown()
                except Exception as exc:  # noqa: BLE001 -- the end must come anyway
                    self._guard("the shutdown", exc)

        closer = threading.Thread(target=close, name="mighty-telemetry-close", daemon=True)
        closer.start()
        closer.join(budget)
        _quiet(False)
