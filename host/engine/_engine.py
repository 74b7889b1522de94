"""The process's one wasmtime Engine, configured for determinism and control.

Every setting here changes either what a guest can observe or what the host can stop, and all of
them are part of the compiled-cache key (:attr:`EngineSettings.fingerprint`): a component compiled
under one configuration never loads into another.
"""

from __future__ import annotations

import atexit
import hashlib
import platform
import threading
from dataclasses import dataclass
from importlib.metadata import version

import wasmtime

from mighty._wasmtime import ffi
from mighty.engine._memory import install_memory_creator

__all__ = ["EPOCH_TICK", "EngineSettings", "get_engine", "wasmtime_version"]

# How often the epoch advances. Deadlines and cancellation are checked at this granularity:
# a cancelled call stops within about one tick.
EPOCH_TICK = 0.005


def wasmtime_version() -> str:
    """The installed wasmtime-py version (its compiled artifacts are version specific)."""
    return version("wasmtime")


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine configuration mighty runs every guest under.

    Not user-tunable on purpose: one configuration per process keeps compiled artifacts,
    traces and fuel figures comparable.
    """

    consume_fuel: bool = True
    epoch_interruption: bool = True
    nan_canonicalization: bool = True
    relaxed_simd_deterministic: bool = True
    wasm_threads: bool = False
    host_memory: bool = True
    component_model_map: bool = True

    @property
    def fingerprint(self) -> str:
        """A short stable hash of the settings, the wasmtime version and the target."""
        text = "|".join(
            [
                f"consume_fuel={self.consume_fuel}",
                f"epoch_interruption={self.epoch_interruption}",
                f"nan_canonicalization={self.nan_canonicalization}",
                f"relaxed_simd_deterministic={self.relaxed_simd_deterministic}",
                f"wasm_threads={self.wasm_threads}",
                f"host_memory={self.host_memory}",
                f"component_model_map={self.component_model_map}",
                f"wasmtime={wasmtime_version()}",
                f"machine={platform.machine()}",
                f"system={platform.system()}",
            ]
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        """The settings as plain data, for traces and `mty` diagnostics."""
        return {
            "consume_fuel": self.consume_fuel,
            "epoch_interruption": self.epoch_interruption,
            "nan_canonicalization": self.nan_canonicalization,
            "relaxed_simd_deterministic": self.relaxed_simd_deterministic,
            "wasm_threads": self.wasm_threads,
            "host_memory": self.host_memory,
            "component_model_map": self.component_model_map,
            "wasmtime": wasmtime_version(),
            "fingerprint": self.fingerprint,
        }

    def to_config(self) -> wasmtime.Config:
        config = wasmtime.Config()
        config.consume_fuel = self.consume_fuel
        config.epoch_interruption = self.epoch_interruption
        config.cranelift_nan_canonicalization = self.nan_canonicalization
        config.wasm_relaxed_simd = True
        config.wasm_relaxed_simd_deterministic = self.relaxed_simd_deterministic
        config.wasm_threads = self.wasm_threads
        # `map<K, V>` is still a proposal; mighty.abi supports it, so components may use it.
        ffi.wasmtime_config_wasm_component_model_map_set(config.ptr(), self.component_model_map)
        if self.host_memory:
            install_memory_creator(config.ptr())
        return config


SETTINGS = EngineSettings()

_engine: wasmtime.Engine | None = None
_engine_lock = threading.Lock()


_stopping = threading.Event()
# Stop ticking before the interpreter starts tearing the engine down.
atexit.register(_stopping.set)


def _tick(engine: wasmtime.Engine) -> None:
    while not _stopping.wait(EPOCH_TICK):
        engine.increment_epoch()


def get_engine() -> wasmtime.Engine:
    """The process-wide engine, created on first use together with its epoch ticker."""
    global _engine  # noqa: PLW0603 - one engine per process is the design
    engine = _engine
    if engine is not None:
        return engine
    with _engine_lock:
        if _engine is None:
            created = wasmtime.Engine(SETTINGS.to_config())
            threading.Thread(
                target=_tick, args=(created,), name="mighty-epoch", daemon=True
            ).start()
            _engine = created
        return _engine
