"""OpenTelemetry spans, metrics and agent events; off by default; the only importer of
``opentelemetry`` (install the ``otel`` extra)."""

from mighty.telemetry._config import (
    ENV_ENDPOINT,
    ENV_PROTOCOL,
    ENV_SERVICE,
    TelemetryConfig,
    load_config,
)
from mighty.telemetry._telemetry import LINK, Telemetry, traceparent

__all__ = [
    "ENV_ENDPOINT",
    "ENV_PROTOCOL",
    "ENV_SERVICE",
    "LINK",
    "Telemetry",
    "TelemetryConfig",
    "load_config",
    "traceparent",
]
