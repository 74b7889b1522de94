"""Supervisor.relocate: a running child that moved (a live migration) gets a new handle and
start; the strategy treats it as before."""

from __future__ import annotations

import pytest

from mighty._errors import BadInput
from mighty.agents import ChildSpec, Supervisor


class Handle:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")


def test_a_relocated_child_is_restarted_by_its_new_start() -> None:
    log: list[str] = []
    starts = {"a": 0, "b": 0}

    def starter(name: str) -> Handle:
        starts[name] += 1
        log.append(f"start {name}{starts[name]}")
        return Handle(f"{name}{starts[name]}", log)

    sup = Supervisor(
        "s",
        [ChildSpec("a", lambda: starter("a")), ChildSpec("b", lambda: starter("b"))],
        "one_for_all",
    ).start()
    old = {c.name: c.handle for c in sup.which_children()}["a"]
    moved = Handle("a-moved", log)
    remote: list[str] = []

    def remote_start() -> Handle:
        remote.append("restart")
        return Handle(f"a-remote{len(remote)}", log)

    previous = sup.relocate("a", moved, remote_start)
    assert previous is not remote_start  # the start it had, handed back (for a way home)
    assert {c.name: c.handle for c in sup.which_children()}["a"] is moved
    # A report about the old incarnation is ignored; one about the moved one restarts it.
    assert sup.child_exited("a", crashed=True, handle=old) is None
    assert remote == []
    sup.child_exited("a", crashed=True, reason="boom", handle=moved)
    assert remote == ["restart"]
    assert "stop b1" in log and "start b2" in log  # one_for_all took the sibling along
    assert {c.name: c.handle.name for c in sup.which_children()} == {  # type: ignore[union-attr]
        "a": "a-remote1",
        "b": "b2",
    }
    sup.stop()
    with pytest.raises(BadInput, match="not running"):
        sup.relocate("a", moved, remote_start)
    with pytest.raises(BadInput, match="no child"):
        sup.relocate("zz", moved, remote_start)
