"""The local control socket of a running ``mty run``: JSON lines over a Unix socket.

Opt in by setting ``RUNTIME_CONTROL_SOCK`` to a path; the runtime serves its ops there
(:class:`ControlServer`) and tools call them with :func:`request`.
"""

from mighty.control._client import request
from mighty.control._ops import (
    MAX_ADDRESS,
    MAX_ASK_TIMEOUT,
    UnknownAgent,
    application_ops,
    runtime_ops,
)
from mighty.control._protocol import ENV_VAR, PROTOCOL_VERSION, ControlError
from mighty.control._server import (
    IDLE_TIMEOUT,
    MAX_FILE_BYTES,
    ControlServer,
    ControlSocketError,
    FileRefused,
    read_regular_file,
)
from mighty.control._top import SORT_KEYS, sort_rows, top_rows

__all__ = [
    "ENV_VAR",
    "IDLE_TIMEOUT",
    "MAX_ADDRESS",
    "MAX_ASK_TIMEOUT",
    "MAX_FILE_BYTES",
    "PROTOCOL_VERSION",
    "SORT_KEYS",
    "ControlError",
    "ControlServer",
    "ControlSocketError",
    "FileRefused",
    "UnknownAgent",
    "application_ops",
    "read_regular_file",
    "request",
    "runtime_ops",
    "sort_rows",
    "top_rows",
]
