"""Counter versions for hot-swap tests, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build(source: Path, tmp: Path) -> Path:
    from mighty.build import build_component

    out = tmp / f"{source.stem}.wasm"
    build_component(
        source, output=out, wit=ROOT / "wit" / "agent", python_path=[ROOT / "guests" / "sdk"]
    )
    return out


@pytest.fixture(scope="session")
def counters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """v1 (the example), v2 (adds a field), v3 (changes a type), v4 (traps in restore)."""
    tmp = tmp_path_factory.mktemp("counters")
    versions = {"v1": ROOT / "examples" / "agents" / "counter.py"}
    for name in ("v2", "v3", "v4"):
        versions[name] = ROOT / "guests" / "testing" / "counter" / f"{name}.py"
    return {name: _build(path, tmp) for name, path in versions.items()}
