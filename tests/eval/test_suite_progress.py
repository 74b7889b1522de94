"""Suite.run tells its progress callback about member builds and compiles (not silent)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from mighty.eval import Case, Member, Suite
from tests.trace.test_replay import random_sum, record


def test_member_compile_is_reported_before_the_cells(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member the cache has not compiled is compiled first, and progress hears it."""
    trace = tmp_path / "t.bin"
    guest = random_sum(wat, tmp_path, "v1")
    record(trace, guest, [("run", (2,))])
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cold-cache"))
    messages: list[str] = []
    cells: list[str] = []
    suite = Suite([Case("c", trace)], [Member.component("m", guest)])
    report = suite.run(lambda cell: cells.append(str(messages)), progress=messages.append)
    assert [c.verdict for c in report.cells] == ["pass"]
    assert any(m.startswith(f"compiling {guest} (") for m in messages), messages
    # Compiled before the first cell started, so no cell's time includes it.
    assert cells == [str(messages)]
