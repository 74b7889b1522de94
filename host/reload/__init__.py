"""Hot reload: swap a running agent type's component behind a compatible state schema."""

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
    reload_agent_type,
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
    "reload_agent_type",
]
