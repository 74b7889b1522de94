"""Traces find their components: by hash in the store, the recorded path, --component-dir."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty import Component, Instance, MightyError
from mighty.cli import main
from mighty.engine import ComponentStore
from mighty.trace import Recorder, read_trace, replay_trace

FIXTURE = (Path(__file__).parent.parent / "fixtures" / "random_sum.wat").read_text()


def guest(wat: Callable[[str], bytes], directory: Path, xor: int = 0) -> Path:
    """The random-sum guest (``xor`` makes other bytes) written to ``directory/guest.wasm``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "guest.wasm"
    path.write_bytes(wat(FIXTURE.replace("CALLS_EXTRA", "0").replace("XOR", str(xor))))
    return path


def record_relative(trace: Path, component: Path, agents: tuple[str | None, ...] = (None,)) -> None:
    """Record one call per instance, loading the component by a path relative to its folder."""
    here = Path.cwd()
    os.chdir(component.parent)
    try:
        with Recorder(trace) as recorder:
            for agent in agents:
                name = None if agent is None else "named"
                loaded = Component.load(component.name)
                with Instance(loaded, record=recorder, agent=agent, agent_name=name) as instance:
                    instance.call("run", 2)
    finally:
        os.chdir(here)


def test_loaded_components_are_kept_by_hash(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """Component.load keeps the bytes in the cache's store under their sha256, once."""
    path = guest(wat, tmp_path)
    loaded = Component.load(path)
    kept = ComponentStore().find(loaded.sha256)
    assert kept is not None and kept.read_bytes() == path.read_bytes()
    assert ComponentStore().keep(loaded.sha256, path.read_bytes()) == kept


def test_trace_records_hash_and_absolute_path(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """The instance record names the component by sha256 and by its absolute path."""
    component = guest(wat, tmp_path / "proj")
    record_relative(tmp_path / "t.bin", component)
    [head] = [r for r in read_trace(tmp_path / "t.bin").records() if r["k"] == "instance"]
    assert head["path"] == str(component.absolute())
    assert len(head["component"]) == 64


def test_replays_from_another_directory(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace recorded with a relative component path replays from anywhere."""
    component = guest(wat, tmp_path / "proj")
    trace = tmp_path / "t.bin"
    record_relative(trace, component)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(main, ["replay", str(trace), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ok"] is True


def test_replays_after_a_rebuild_overwrote_the_file(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """When the recorded path now holds another build, the store still has the recorded one."""
    component = guest(wat, tmp_path / "proj")
    trace = tmp_path / "t.bin"
    record_relative(trace, component)
    guest(wat, tmp_path / "proj", xor=5)  # the rebuild, over the same file
    report = replay_trace(trace)
    assert report.instances[0].exports == 1


def test_component_dir_is_searched_and_misses_say_where(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the store and the recorded file, --component-dir finds it; a miss lists the places."""
    component = guest(wat, tmp_path / "proj")
    trace = tmp_path / "t.bin"
    record_relative(trace, component)
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "kept-under-any-name.wasm").write_bytes(component.read_bytes())
    component.unlink()
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "fresh-cache"))
    missing = CliRunner().invoke(main, ["replay", str(trace)])
    assert missing.exit_code != 0
    assert "fresh-cache/components/" in missing.output
    assert f"{component.absolute()} (absent)" in missing.output
    found = CliRunner().invoke(main, ["replay", str(trace), "--component-dir", str(saved)])
    assert found.exit_code == 0, found.output


def test_agent_trace_replays_one_agent_by_address_or_name(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """Every record carries the agent's address; --agent picks that agent's instances alone."""
    component = guest(wat, tmp_path / "proj")
    trace = tmp_path / "t.bin"
    record_relative(trace, component, agents=("kv:1", "kv:3", "kv:3"))
    records = [r for r in read_trace(trace).records() if r["k"] != "blob"]
    assert all("a" in r for r in records)
    report = replay_trace(trace, agent="kv:3")
    assert [r.instance for r in report.instances] == [2, 3]
    assert [r.instance for r in replay_trace(trace, agent="named").instances] == [1, 2, 3]
    result = CliRunner().invoke(main, ["replay", str(trace), "--agent", "kv:1", "--json"])
    assert result.exit_code == 0, result.output
    assert [i["instance"] for i in json.loads(result.output)["instances"]] == [1]
    with pytest.raises(MightyError, match="no agent 'kv:9'"):
        replay_trace(trace, agent="kv:9")


def test_debug_takes_an_agent_address(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """`mty debug --agent kv:3` steps through that agent's instances only; a wrong one exits 2."""
    component = guest(wat, tmp_path / "proj")
    trace = tmp_path / "t.bin"
    record_relative(trace, component, agents=("kv:1", "kv:3"))
    result = CliRunner().invoke(main, ["debug", str(trace), "--agent", "kv:3"], input="continue\n")
    assert result.exit_code == 0, result.output
    assert "instance 2" in result.output
    assert "instance 1 " not in result.output
    missing = CliRunner().invoke(main, ["debug", str(trace), "--agent", "kv:9"], input="quit\n")
    assert missing.exit_code == 2, missing.output
