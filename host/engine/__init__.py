"""The engine layer: the process's wasmtime Engine, component loading, the compiled cache."""

from mighty.engine._cache import CompiledCache
from mighty.engine._component import (
    MAX_COMPONENT_BYTES,
    SHARE_MODULES_ENV,
    Component,
    check_component_bytes,
)
from mighty.engine._engine import EPOCH_TICK, SETTINGS, EngineSettings, get_engine, wasmtime_version
from mighty.engine._lowering import LOWERED_BYTES_PER_BYTE, check_lowering
from mighty.engine._memory import (
    MemoryAccount,
    capture_memory,
    instantiating_into,
    learn_hot_pages,
    live_memories,
    populate_memory,
    restore_memory,
    rewind_memory,
)
from mighty.engine._native import immortal, quick_call
from mighty.engine._signals import SignalShield, shielded
from mighty.engine._state import MAX_GAP, MemoryState, state_from_pages
from mighty.engine._store import ComponentStore

__all__ = [
    "EPOCH_TICK",
    "LOWERED_BYTES_PER_BYTE",
    "MAX_COMPONENT_BYTES",
    "MAX_GAP",
    "SETTINGS",
    "SHARE_MODULES_ENV",
    "CompiledCache",
    "Component",
    "ComponentStore",
    "EngineSettings",
    "MemoryAccount",
    "MemoryState",
    "SignalShield",
    "capture_memory",
    "check_component_bytes",
    "check_lowering",
    "get_engine",
    "immortal",
    "instantiating_into",
    "learn_hot_pages",
    "live_memories",
    "populate_memory",
    "quick_call",
    "restore_memory",
    "rewind_memory",
    "shielded",
    "state_from_pages",
    "wasmtime_version",
]
