"""Reproducible builds: two fresh caches, the same source, compared byte for byte (slow)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mighty.build import BuildResult, build_component
from mighty.engine._image import _sections

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello"


def _build_in(cache: Path, project: Path, monkeypatch: pytest.MonkeyPatch) -> BuildResult:
    monkeypatch.setenv("MTY_CACHE_DIR", str(cache))
    return build_component(project / "handler.py", output=cache / "out" / "hello.wasm")


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildResult, BuildResult, Path]:
    """examples/hello copied to a fresh folder, built in two fresh caches of different names."""
    base = tmp_path_factory.mktemp("repro")
    project = base / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.MonkeyPatch.context() as mp:
        first = _build_in(base / "c1", project, mp)
        second = _build_in(base / "a-much-longer-cache-directory-name" / "nested", project, mp)
    return first, second, project


@pytest.mark.slow
def test_two_caches_compute_the_same_digest(
    two_builds: tuple[BuildResult, BuildResult, Path],
) -> None:
    """The build digest does not depend on where the cache is."""
    first, second, _ = two_builds
    assert not first.cached and not second.cached
    assert first.digest == second.digest


@pytest.mark.slow
def test_the_build_leaves_the_source_folder_alone(
    two_builds: tuple[BuildResult, BuildResult, Path],
) -> None:
    """componentize-py runs on a staged copy: no __pycache__ appears beside the handler."""
    _, _, project = two_builds
    assert sorted(p.name for p in project.iterdir()) == ["handler.py", "wit"]


# Sections of a core module that hold its initial state, not its code: globals, data, datacount.
_STATE_SECTIONS = {6, 11, 12}


def _shape(component: bytes) -> list[bytes]:
    """The component with every core module's initial state left out: code, types, imports,
    exports and every component-level section, in order."""
    out = []
    view = memoryview(component)
    for section, start, body, end in _sections(view, 8):
        if section != 1:
            out.append(bytes(view[start:end]))
            continue
        module = view[body:end]
        out.extend(
            bytes(module[s:e])
            for sid, s, _b, e in _sections(module, 8)
            if sid not in _STATE_SECTIONS
        )
    return out


@pytest.mark.slow
def test_two_fresh_caches_differ_only_in_initial_state(
    two_builds: tuple[BuildResult, BuildResult, Path],
) -> None:
    """Code, types, imports and exports are byte-identical; only the pre-initialised state is not.

    componentize-py 0.25.1 pre-initialises the guest with real entropy and clocks
    (bytecodealliance/componentize-py#247; docs/determinism.md), so the heap snapshot (data
    segments) and the globals that point into it differ from build to build; nothing else may.
    """
    first, second, _ = two_builds
    one, two = first.path.read_bytes(), second.path.read_bytes()
    assert _shape(one) == _shape(two)
