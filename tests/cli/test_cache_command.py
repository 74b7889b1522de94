"""`mty cache`: sections and sizes (hard links once), pruning what is unusable, LRU, and a
build stored once (the build cache and the component store share one file)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty.cli import main
from mighty.cli._cache import cache_entries, prune_cache
from mighty.engine import CompiledCache

SHA = [f"{i:x}" * 64 for i in range(1, 6)]
DAY = 86400.0
NOW = time.time()


def _file(path: Path, size: int, used: float) -> Path:
    """A cache file of ``size`` bytes last used at ``used`` (atime and mtime)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    os.utime(path, (used, used))
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with two builds (one also in the store, hard-linked), compiled code of this and
    of another wasmtime, a stale temp file, an unheld lock and a sandbox build."""
    root = tmp_path / "cache"
    monkeypatch.setenv("MTY_CACHE_DIR", str(root))
    now = NOW
    old = _file(root / "builds" / f"{SHA[0]}.wasm", 40_000, now - 10 * DAY)
    _file(root / "builds" / f"{SHA[1]}.wasm", 30_000, now - 1 * DAY)
    (root / "components").mkdir()
    os.link(old, root / "components" / f"{SHA[2]}.wasm")
    os.utime(root / "components" / f"{SHA[2]}.wasm", (now - 10 * DAY, now - 10 * DAY))
    current = CompiledCache(root).directory
    _file(current / f"{SHA[3]}.cwasm", 20_000, now - 5 * DAY)
    _file(current / f"{SHA[3]}-images.cwasm", 5_000, now - 5 * DAY)
    _file(root / "compiled" / "0.0.1" / "abc" / f"{SHA[3]}.cwasm", 7_000, now)
    _file(root / "builds" / f".{SHA[4]}.x.wasm.tmp", 3_000, now - 2 * DAY)
    _file(root / "builds" / f".{SHA[0]}.lock", 0, now - 2 * DAY)
    _file(root / "sandbox" / f"interpreter-{SHA[4]}.wasm", 10_000, now - 3 * DAY)
    return root


def _by_name(root: Path) -> dict[str, tuple[str, bool]]:
    """Entries as name -> (section, usable)."""
    return {e.name.rsplit("/", 1)[-1]: (e.section, e.usable) for e in cache_entries(root)}


def test_entries_and_hard_links_counted_once(cache: Path) -> None:
    """Sections are listed; a file linked from builds and components is counted once."""
    entries = cache_entries(cache)
    linked = [e for e in entries if SHA[0] in e.name or SHA[2] in e.name]
    assert sorted(e.section for e in linked if e.usable) == ["builds", "components"]
    assert sorted(e.size > 0 for e in linked if e.usable) == [False, True]
    names = _by_name(cache)
    assert names[SHA[3]] == ("compiled", True)  # .cwasm and -images.cwasm: one entry
    assert names[f".{SHA[4]}.x.wasm.tmp"] == ("builds", False)
    assert names[f".{SHA[0]}.lock"] == ("builds", False)
    assert [e for e in entries if e.section == "compiled" and not e.usable]


def test_prune_removes_only_the_unusable_by_default(cache: Path) -> None:
    """Without limits: other wasmtime versions, old temp files, unheld locks go; entries stay."""
    removed = prune_cache(cache, now=NOW)
    assert {e.usable for e in removed} == {False}
    assert not (cache / "compiled" / "0.0.1" / "abc" / f"{SHA[3]}.cwasm").exists()
    assert not (cache / "builds" / f".{SHA[0]}.lock").exists()
    assert (cache / "builds" / f"{SHA[0]}.wasm").exists()
    assert all(e.usable for e in cache_entries(cache))


def test_max_size_removes_the_least_recently_used_but_not_components(cache: Path) -> None:
    """--max-size: oldest first until it fits; stored components stay unless asked."""
    # The oldest build is hard-linked from the kept component store: removing it frees nothing,
    # so older compiled code and the sandbox build go too.
    removed = prune_cache(cache, max_size=80_000, now=NOW)
    gone = {e.name.rsplit("/", 1)[-1] for e in removed if e.usable}
    assert SHA[0] in gone  # used 10 days ago: first
    assert (cache / "components" / f"{SHA[2]}.wasm").exists()
    assert sum(e.size for e in cache_entries(cache)) <= 80_000
    assert (cache / "builds" / f"{SHA[1]}.wasm").exists()
    prune_cache(cache, max_size=0, components=True, now=NOW)
    assert cache_entries(cache) == []


def test_older_than_and_dry_run(cache: Path) -> None:
    """--older-than removes entries unused that long; --dry-run removes nothing."""
    before = sorted(str(e.files) for e in cache_entries(cache))
    said = prune_cache(cache, older_than=4 * DAY, dry_run=True, now=NOW)
    assert sorted(str(e.files) for e in cache_entries(cache)) == before
    assert {e.name.rsplit("/", 1)[-1] for e in said if e.usable} == {SHA[0], SHA[3]}


def test_a_held_lock_is_kept(cache: Path) -> None:
    """A build lock someone holds is not removed (its builder is still running)."""
    lock = cache / "builds" / f".{SHA[0]}.lock"
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        prune_cache(cache, now=NOW)
        assert lock.exists()
    finally:
        os.close(fd)


def test_cli_list_and_prune(cache: Path) -> None:
    """`mty cache --json` and `mty cache prune --max-size 50K --json` report bytes."""
    runner = CliRunner()
    listed = json.loads(runner.invoke(main, ["cache", "list", "--json"]).stdout)
    assert listed["root"] == str(cache)
    assert listed["sections"]["builds"]["entries"] == 2
    assert listed["sections"]["unusable"]["entries"] == 3
    text = runner.invoke(main, ["cache"]).stdout
    assert text.splitlines()[0] == str(cache)
    assert "builds" in text
    assert "total" in text
    pruned = runner.invoke(main, ["cache", "prune", "--max-size", "50K", "--json"])
    assert pruned.exit_code == 0, pruned.output
    report = json.loads(pruned.stdout)
    assert report["bytes_before"] - report["bytes_freed"] <= 50_000
    bad = runner.invoke(main, ["cache", "prune", "--max-size", "lots"])
    assert bad.exit_code == 2


WORLD = "package demo:one;\n\nworld one {\n  export answer: func() -> u32;\n}\n"
HANDLER = (
    "import wit_world\n\n\nclass WitWorld(wit_world.WitWorld):\n"
    "    def answer(self) -> int:\n        return 42\n"
)


@pytest.mark.slow
def test_a_build_is_stored_once(tmp_path: Path, cache: Path) -> None:
    """A new build and the component store's copy of it are one file (a hard link), also
    after the component is loaded."""
    from mighty import Component
    from mighty.build import build_component

    (tmp_path / "one" / "wit").mkdir(parents=True)
    (tmp_path / "one" / "wit" / "one.wit").write_text(WORLD)
    (tmp_path / "one" / "handler.py").write_text(HANDLER)
    built = build_component(tmp_path / "one" / "handler.py", output=tmp_path / "one.wasm")
    entry = cache / "builds" / f"{built.digest}.wasm"
    stored = cache / "components" / f"{built.component_sha256}.wasm"
    assert os.path.samefile(entry, stored)
    Component.load(tmp_path / "one.wasm")
    assert os.path.samefile(entry, stored)


def test_the_sandbox_interpreter_links_the_stored_copy(cache: Path, tmp_path: Path) -> None:
    """The published interpreter-<sha>.wasm is the component store's file (a hard link), or
    the build's cache entry when the store has no copy."""
    from mighty.build import BuildResult
    from mighty.sandbox._interpreter import publish

    stored = _file(cache / "components" / f"{SHA[3]}.wasm", 5_000, NOW)
    entry = _file(tmp_path / "entry.wasm", 5_000, NOW)

    def built(sha: str) -> BuildResult:
        return BuildResult(path=entry, digest="d", component_sha256=sha, cached=True, seconds=0)

    final = publish(built(SHA[3]))
    assert final == cache / "sandbox" / f"interpreter-{SHA[3]}.wasm"
    assert os.path.samefile(final, stored)
    other = publish(built(SHA[1]))
    assert os.path.samefile(other, entry)
