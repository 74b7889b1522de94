"""replay_across refuses histories that do not join up, and hostile link records, by name.

The end-to-end replay across two real nodes' traces is tests/cluster/test_migrate_nodes.py."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty._errors import HostError
from mighty.trace import TraceInvalid, TraceWriter, migration_link, replay_across

GOOD = migration_link(
    local="counter:1", node="a", source="a:counter:1", target="b:counter:2", state=b"s"
)


def _trace(path: Path, node: str | None, *records: dict[str, Any]) -> Path:
    with TraceWriter(path, {} if node is None else {"node": node}, overwrite=True) as writer:
        for record in records:
            writer.append(record)
    return path


def test_the_link_record() -> None:
    assert GOOD["k"] == "migrated"
    assert GOOD["snapshot"] == hashlib.sha256(b"s").hexdigest()
    assert (GOOD["from"], GOOD["to"], GOOD["a"], GOOD["node"]) == (
        "a:counter:1",
        "b:counter:2",
        "counter:1",
        "a",
    )


def test_histories_that_do_not_join_up(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a.bin", "a", GOOD)
    with pytest.raises(HostError, match="not an agent address"):
        replay_across([a], "counter:1")
    with pytest.raises(HostError, match="no trace of node c"):
        replay_across([a], "c:counter:1")
    twice = _trace(tmp_path / "a2.bin", "a")
    with pytest.raises(HostError, match="two traces of node a"):
        replay_across([a, twice], "a:counter:1")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("not a trace")
    with pytest.raises(HostError, match="no trace file"):
        replay_across([empty], "a:counter:1")


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    field=st.sampled_from(["from", "to", "snapshot", "a", "node"]),
    value=st.one_of(
        st.none(), st.integers(), st.text(max_size=80), st.binary(max_size=8), st.lists(st.none())
    ),
)
def test_a_malformed_link_record_is_refused(tmp_path: Path, field: str, value: Any) -> None:
    record = {**GOOD, field: value}
    path = _trace(tmp_path / "bad.bin", "a", record)
    fits = isinstance(value, str) and (
        field in ("a", "node")
        or (field == "snapshot" and len(value) == 64 and set(value) <= set("0123456789abcdef"))
        or (field in ("from", "to") and value.count(":") == 2)
    )
    with pytest.raises(HostError) as caught:
        replay_across([path], "a:counter:1")
    if not fits:
        assert isinstance(caught.value, TraceInvalid)
        assert f'"{field}"' in caught.value.message
