"""WASI 0.2 implemented in Python behind the gate, driven by a frozen Policy."""

from mighty.wasi._cli import STDERR_SINK, STDOUT_SINK, OutputSink, outputs
from mighty.wasi._http import (
    HTTP_RESPONDER,
    RequestBody,
    ServedRequest,
    ServedResponse,
    incoming_handler_args,
)
from mighty.wasi._http_client import Exchange, PreparedRequest, Responder, error_code
from mighty.wasi._http_policy import HttpGrant, HttpLimits, HttpPolicy, Origin, Secret
from mighty.wasi._idempotency import IDEMPOTENCY_KEYS, IdempotencyKeys
from mighty.wasi._logging import LOG_SINK, LogSink
from mighty.wasi._output import CaptureOutput
from mighty.wasi._policy import DEFAULT_OUTPUT_CAP, DirGrant, MemoryDir, OutputPolicy, Policy
from mighty.wasi._provider import WASI_POLICY, WasiProvider

__all__ = [
    "DEFAULT_OUTPUT_CAP",
    "HTTP_RESPONDER",
    "IDEMPOTENCY_KEYS",
    "LOG_SINK",
    "STDERR_SINK",
    "STDOUT_SINK",
    "WASI_POLICY",
    "CaptureOutput",
    "DirGrant",
    "Exchange",
    "HttpGrant",
    "HttpLimits",
    "HttpPolicy",
    "IdempotencyKeys",
    "LogSink",
    "MemoryDir",
    "Origin",
    "OutputPolicy",
    "OutputSink",
    "Policy",
    "PreparedRequest",
    "RequestBody",
    "Responder",
    "Secret",
    "ServedRequest",
    "ServedResponse",
    "WasiProvider",
    "error_code",
    "incoming_handler_args",
    "outputs",
]
