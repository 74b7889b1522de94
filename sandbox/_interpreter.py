"""The interpreter component: built from ``guests/interpreter`` on first use, then cached.

The build goes through :func:`mighty.build.build_component` (content-hash cache: an unchanged
interpreter is never rebuilt) and the compiled form through the engine's compiled cache. The
component is published as ``<cache>/sandbox/interpreter-<sha256>.wasm`` so a trace names a file
that keeps those exact bytes, whatever later builds do.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mighty._cachedir import atomic_copy, cache_root
from mighty._resources import interpreter_source, sandbox_wit
from mighty.build import BuildResult, build_component
from mighty.engine import Component

__all__ = ["INTERPRETER_SOURCE", "INTERPRETER_WIT", "interpreter_component", "publish"]

# Package data of the installed wheel, or the checkout's own files (see mighty._resources).
INTERPRETER_SOURCE = interpreter_source()
INTERPRETER_WIT = sandbox_wit()

_lock = threading.Lock()
_loaded: Component | None = None

Progress = Callable[[str], None]


_TICK = re.compile(r": \d+ s$")
_last_tick = [0.0]


def _default_progress(message: str) -> None:
    # Terminal or not (a script's first Sandbox() builds for minutes; a log should say so): each
    # step's first line and "done", the build's per-second ticks at most every 10 s.
    if _TICK.search(message):
        if time.monotonic() - _last_tick[0] < 10.0:
            return
        _last_tick[0] = time.monotonic()
    with contextlib.suppress(OSError, ValueError):
        print(f"mighty.sandbox: {message}", file=sys.stderr, flush=True)


def publish(built: BuildResult) -> Path:
    """``<cache>/sandbox/interpreter-<sha256>.wasm`` for an interpreter build: a hard link to
    the component store's copy of the same bytes (named by their sha256; the build links it
    there), else to the build cache's entry, else a copy of it."""
    from mighty.engine import ComponentStore

    directory = cache_root() / "sandbox"
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"interpreter-{built.component_sha256}.wasm"
    if final.exists():
        return final
    for source in (ComponentStore().path_for(built.component_sha256), built.path):
        try:
            os.link(source, final)
        except FileExistsError:
            return final  # another process published it
        except OSError:
            continue
        return final
    atomic_copy(built.path, final)
    return final


def interpreter_component(progress: Progress | None = None) -> Component:
    """The compiled interpreter, building and compiling it the first time (tens of seconds,
    reported through ``progress``; default: to stderr, terminal or not)."""
    global _loaded  # noqa: PLW0603 - one compiled interpreter per process
    with _lock:
        if _loaded is not None:
            return _loaded
        started = time.monotonic()
        reported: list[str] = []

        def report(message: str) -> None:
            reported.append(message)
            (progress or _default_progress)(message)

        # Left in the build cache (no copy): a copy of the 21 MB interpreter, written and synced
        # by every process that loads it, made `mty exec` wait on the disk, and a signal with it.
        built = build_component(
            INTERPRETER_SOURCE,
            output=None,
            wit=INTERPRETER_WIT,
            world="interpreter",
            progress=report,
        )
        _loaded = Component.load(publish(built), progress=report)
        if reported:  # built or compiled: say when the wait is over
            report(f"done in {time.monotonic() - started:.1f} s: the interpreter is ready")
        return _loaded
