"""File timestamps follow the guest's one clock: fixed and virtual clocks never show host time."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from mighty import Component, Instance
from mighty.abi import Ok, Variant
from mighty.wasi import DirGrant, MemoryDir, Policy, _clocks
from mighty.wasi._clocks import VIRTUAL_STEP_NS
from tests.wasi import make_ctx
from tests.wasi.test_filesystem import CREATE, NONE, RW, Guest

START = 1_234_567_890 * 10**9
OLD = 1_000_000_000 * 10**9 + 7
NOW = Variant("now")
KEEP = Variant("no-change")


def _ns(stamp: dict[str, int] | None) -> int:
    assert stamp is not None
    return stamp["seconds"] * 10**9 + stamp["nanoseconds"]


def _times(record: dict[str, Any]) -> tuple[int, int, int]:
    return (
        _ns(record["data-access-timestamp"]),
        _ns(record["data-modification-timestamp"]),
        _ns(record["status-change-timestamp"]),
    )


def _guest(tmp_path: Path, clock: str, *, memory: bool = False) -> Guest:
    (tmp_path / "old.txt").write_bytes(b"made by the host")
    os.utime(tmp_path / "old.txt", ns=(OLD, OLD))
    grant: DirGrant | MemoryDir = (
        MemoryDir("/d", {"old.txt": b"seeded"})
        if memory
        else DirGrant(tmp_path, "/d", readonly=False)
    )
    policy = Policy(dirs=(grant,)).with_clock(clock, START)  # type: ignore[arg-type]
    ctx = make_ctx(policy)  # the clocks first, as the provider sets them up
    return Guest(policy, ctx)


@pytest.mark.parametrize("memory", [False, True])
def test_fixed_clock_stat_shows_only_clock_start(tmp_path: Path, memory: bool) -> None:
    """Under a fixed clock every time of an old or a freshly written file is clock_start."""
    g = _guest(tmp_path, "fixed", memory=memory)
    d = g.dirs["/d"]
    assert _times(g.ok("stat-at", d, NONE, "old.txt")) == (START,) * 3
    f = g.ok("open-at", d, NONE, "new.txt", CREATE, RW)
    g.ok("write", f, b"hello", 0)
    assert _times(g.ok("stat", f)) == (START,) * 3
    assert _times(g.ok("stat", d)) == (START,) * 3
    g.close()


@pytest.mark.parametrize("memory", [False, True])
def test_set_times_now_is_the_guest_clock(tmp_path: Path, memory: bool) -> None:
    """set-times with now stores the guest clock's time, a given timestamp exactly."""
    g = _guest(tmp_path, "fixed", memory=memory)
    d = g.dirs["/d"]
    stamp = Variant("timestamp", {"seconds": 42, "nanoseconds": 9})
    g.ok("set-times-at", d, NONE, "old.txt", stamp, NOW)
    assert _times(g.ok("stat-at", d, NONE, "old.txt")) == (42 * 10**9 + 9, START, START)
    f = g.open(d, "old.txt", NONE, RW)
    g.ok("set-times", f, NOW, KEEP)
    assert _times(g.ok("stat", f))[:2] == (START, START)
    if not memory:
        assert (tmp_path / "old.txt").stat().st_mtime_ns == START
    g.close()


@pytest.mark.parametrize("memory", [False, True])
def test_virtual_clock_times_follow_the_virtual_clock(tmp_path: Path, memory: bool) -> None:
    """Under a virtual clock a write is stamped with the guest's current virtual time."""
    g = _guest(tmp_path, "virtual", memory=memory)
    d = g.dirs["/d"]
    assert _times(g.ok("stat-at", d, NONE, "old.txt"))[1] == START
    wall = {b.name: b.fn for b in _clocks.bindings() if b.interface == "wasi:clocks/wall-clock"}
    seen = _ns(wall["now"](g.ctx))
    assert seen == START + VIRTUAL_STEP_NS
    f = g.ok("open-at", d, NONE, "new.txt", CREATE, RW)
    g.ok("write", f, b"x", 0)
    _, mtime, ctime = _times(g.ok("stat", f))
    assert mtime == ctime == seen
    g.ok("set-times", f, NOW, NOW)
    assert _times(g.ok("stat", f))[:2] == (seen, seen)
    assert _ns(wall["now"](g.ctx)) == seen + VIRTUAL_STEP_NS
    g.close()


def test_real_clock_shows_host_times(tmp_path: Path) -> None:
    """Under the real clock a host file's stat is the host's own."""
    g = _guest(tmp_path, "real")
    assert _times(g.ok("stat-at", g.dirs["/d"], NONE, "old.txt"))[:2] == (OLD, OLD)
    g.close()


def test_metadata_hash_does_not_change_with_host_time(tmp_path: Path) -> None:
    """Under a fixed clock, a host-only change of a file's times leaves its hash alone."""
    g = _guest(tmp_path, "fixed")
    d = g.dirs["/d"]
    before = g.ok("metadata-hash-at", d, NONE, "old.txt")
    os.utime(tmp_path / "old.txt", ns=(OLD + 5, OLD + 5))
    assert g.ok("metadata-hash-at", d, NONE, "old.txt") == before
    g.close()


_STAT = """
import os, json
with open('/d/new.txt', 'w') as f:
    f.write('hi')
os.utime('/d/old.txt')
s_old, s_new = os.stat('/d/old.txt'), os.stat('/d/new.txt')
result = json.dumps([[s.st_atime_ns, s.st_mtime_ns, s.st_ctime_ns] for s in (s_old, s_new)]
                    + [os.stat('/d').st_ctime_ns, time.time_ns()])
"""


def _probe_stat(probe_wasm: Path, tmp_path: Path, clock: str) -> list[Any]:
    (tmp_path / "old.txt").write_bytes(b"old")
    os.utime(tmp_path / "old.txt", ns=(OLD, OLD))
    policy = Policy().with_dir(tmp_path, "/d", readonly=False).with_clock(clock, START)  # type: ignore[arg-type]
    with Instance(Component.load(probe_wasm), policy=policy) as instance:
        result = instance.call("run", _STAT)
    assert isinstance(result, Ok), result
    value: list[Any] = json.loads(result.value)
    return value


def test_probe_stat_under_a_fixed_clock(probe_wasm: Path, tmp_path: Path) -> None:
    """A real guest under a fixed clock sees clock_start in every stat, never the host's time."""
    old, new, dir_ctime, now = _probe_stat(probe_wasm, tmp_path, "fixed")
    assert old == [START] * 3
    assert new == [START] * 3
    assert dir_ctime == now == START


def test_probe_stat_under_a_virtual_clock_replays(probe_wasm: Path, tmp_path: Path) -> None:
    """A real guest under a virtual clock sees the same stat results run after run."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _probe_stat(probe_wasm, tmp_path / "a", "virtual")
    second = _probe_stat(probe_wasm, tmp_path / "b", "virtual")
    assert first == second
    old, new, _, now = first
    assert START <= old[1] <= now
    assert START <= new[1] <= now
    assert old[0] == old[1]
