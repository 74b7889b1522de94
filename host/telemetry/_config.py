"""Telemetry settings: off by default; on with ``MTY_OTLP_ENDPOINT`` or a ``[telemetry]`` block.

    [telemetry]
    endpoint = "http://localhost:4318"   # OTLP receiver; required to turn telemetry on
    protocol = "http/protobuf"           # or "grpc" (endpoint then like "localhost:4317")
    service_name = "mighty"
    sampling = 1.0                       # fraction of traces kept (parent-based)
    timeout = 5.0                        # seconds per export attempt
    attribute_limit = 256                # characters per span attribute value

Environment variables win over the block: ``MTY_OTLP_ENDPOINT``, ``MTY_OTLP_PROTOCOL``,
``MTY_OTLP_SERVICE_NAME``. An unknown key, a bad value, or an unknown protocol is a BadInput
naming it (``mty run`` exits 2 before anything starts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from mighty._errors import BadInput

__all__ = ["ENV_ENDPOINT", "ENV_PROTOCOL", "ENV_SERVICE", "TelemetryConfig", "load_config"]

ENV_ENDPOINT = "MTY_OTLP_ENDPOINT"
ENV_PROTOCOL = "MTY_OTLP_PROTOCOL"
ENV_SERVICE = "MTY_OTLP_SERVICE_NAME"
Protocol = Literal["http/protobuf", "grpc"]
_PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Where and how spans, metrics and agent events are exported (OTLP)."""

    endpoint: str
    protocol: Protocol = "http/protobuf"
    service_name: str = "mighty"
    sampling: float = 1.0
    timeout: float = 5.0
    attribute_limit: int = 256
    metric_interval: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.endpoint, str) or not self.endpoint or len(self.endpoint) > 2048:
            raise BadInput("telemetry endpoint must be a non-empty string (a URL or host:port)")
        if self.protocol not in _PROTOCOLS:
            raise BadInput(
                f"telemetry protocol must be one of {', '.join(_PROTOCOLS)}, not {self.protocol!r}"
            )
        if not isinstance(self.service_name, str) or not 0 < len(self.service_name) <= 256:
            raise BadInput("telemetry service_name must be a string of 1..256 characters")
        _number("sampling", self.sampling, 0.0, 1.0)
        _number("timeout", self.timeout, 0.01, 120.0)
        _number("metric_interval", self.metric_interval, 0.05, 3600.0)
        if (
            isinstance(self.attribute_limit, bool)
            or not isinstance(self.attribute_limit, int)
            or not 16 <= self.attribute_limit <= 65536
        ):
            raise BadInput("telemetry attribute_limit must be an integer in 16..65536")

    @property
    def traces_url(self) -> str:
        """The endpoint for spans (``/v1/traces`` added to a bare http endpoint)."""
        return _signal_url(self.endpoint, "traces")

    def url(self, signal: str) -> str:
        return _signal_url(self.endpoint, signal)


def _signal_url(endpoint: str, signal: str) -> str:
    base = endpoint.rstrip("/")
    return base if base.endswith(f"/v1/{signal}") else f"{base}/v1/{signal}"


def _number(name: str, value: Any, low: float, high: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise BadInput(f"telemetry {name} must be a number in {low:g}..{high:g}, not {value!r}")


_KEYS = {f.name for f in fields(TelemetryConfig)}


def load_config(
    block: Mapping[str, Any] | None, environ: Mapping[str, str]
) -> TelemetryConfig | None:
    """The settings from a manifest's ``[telemetry]`` block and the environment; None: off."""
    values: dict[str, Any] = {}
    if block is not None:
        if not isinstance(block, Mapping):
            raise BadInput("[telemetry] must be a table")
        unknown = sorted(set(block) - _KEYS)
        if unknown:
            raise BadInput(
                f"[telemetry] has unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(_KEYS))}"
            )
        values.update(block)
    for key, var in (("endpoint", ENV_ENDPOINT), ("protocol", ENV_PROTOCOL)):
        if environ.get(var):
            values[key] = environ[var]
    if environ.get(ENV_SERVICE):
        values["service_name"] = environ[ENV_SERVICE]
    if not values.get("endpoint"):
        if values:
            raise BadInput(f"[telemetry] needs an endpoint (or set {ENV_ENDPOINT})")
        return None
    try:
        return TelemetryConfig(**values)
    except TypeError as exc:
        raise BadInput(f"[telemetry]: {exc}") from None
