"""Recorded agent runs for the debugger's tests: the kvstore example (a crash and a restart)
and three relays asking each other (a -> b -> c), each recorded once per session with `mty run
--record` from a copy of its manifest (the builds go to the copy's .mighty, the shared build
cache keeps them)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _record(
    directory: Path, manifest: Path, sources: list[Path], env: dict[str, str] | None = None
) -> Path:
    for source in [manifest, *sources]:
        shutil.copy(source, directory / source.name)
    trace = directory / "run.trace"
    ran = CliRunner().invoke(
        main,
        ["run", str(directory / manifest.name), "--record", str(trace), "-q", "--json"],
        env=env,
    )
    assert ran.exit_code == 0, ran.output
    return trace


@pytest.fixture(scope="session")
def kv_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/agents/kvstore.toml recorded: put, crash (a restart), put, size."""
    agents = ROOT / "examples" / "agents"
    return _record(tmp_path_factory.mktemp("kv"), agents / "kvstore.toml", [agents / "kvstore.py"])


@pytest.fixture(scope="session")
def relay_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/trace/agents/relay.toml recorded: a asks b asks c, twice."""
    here = Path(__file__).parent / "agents"
    return _record(tmp_path_factory.mktemp("relay"), here / "relay.toml", [here / "relay.py"])


@pytest.fixture(scope="session")
def relay_positions_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The relays recorded with source positions (MTY_TRACE_POSITIONS=1; the same build)."""
    here = Path(__file__).parent / "agents"
    return _record(
        tmp_path_factory.mktemp("relay-positions"),
        here / "relay.toml",
        [here / "relay.py"],
        env={"MTY_TRACE_POSITIONS": "1"},
    )
