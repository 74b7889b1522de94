"""Hot reload: state schemas, their compatibility rules, and what a swap reports.

The swap itself is ``Runtime.reload`` in ``mighty.agents``, the layer above this one.
"""

from mighty.reload._schema import (
    Compatibility,
    FieldInfo,
    SchemaError,
    StateSchema,
    check_compatible,
    parse_schema,
)
from mighty.reload._swap import (
    ReloadFailed,
    ReloadRefused,
    ReloadReport,
    SwapVerifier,
)

__all__ = [
    "Compatibility",
    "FieldInfo",
    "ReloadFailed",
    "ReloadRefused",
    "ReloadReport",
    "SchemaError",
    "StateSchema",
    "SwapVerifier",
    "check_compatible",
    "parse_schema",
]
