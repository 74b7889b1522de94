"""`fork` in `mty debug` (issue 35 #2): the instance of an event runs again with the imports
recorded before it answered from the trace and the rest live, recorded to a new trace that
replays."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mighty._cbor import loads_untrusted
from mighty._errors import HostError
from mighty.trace import Debugger, read_trace, replay_trace
from mighty.trace._fork import fork_trace
from mighty.trace._model import RunModel
from tests.trace.test_replay import random_sum, record


def _quiet(_message: str) -> None:
    return None


def _imports(trace: Path) -> list[dict[str, Any]]:
    return [r for r in read_trace(trace).all_records if r["k"] == "import"]


def test_fork_live_at_the_second_call(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """Forked at the second export call: the first call's randoms come from the trace, the
    second's from the live host; the branch is a trace that replays."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,)), ("run", (3,))])
    branch = tmp_path / "branch.bin"
    debugger = Debugger(trace, progress=_quiet)
    try:
        debugger.start()
        (at,) = debugger.command("next")[0]
        assert at.startswith("#5 instance 1 step 5: call run(3,)")
        lines, _ = debugger.command(f"fork -o {branch}")
    finally:
        debugger.close()
    assert lines[0] == (
        f"forked instance 1 to {branch}: live from its import 3 (wasi:random/random#get-random-u64)"
    )
    assert lines[1] == "  calls: run ok, run ok"
    replay_trace(branch, progress=_quiet)  # the branch replays
    before, after = _imports(trace), _imports(branch)
    assert len(after) == len(before) == 5
    assert [r["res"] for r in after[:2]] == [r["res"] for r in before[:2]]  # from the trace
    assert [r["res"] for r in after[2:]] != [r["res"] for r in before[2:]]  # live (2**-192)
    assert read_trace(branch).header["forked_from"]["instance"] == 1


def test_fork_an_agent_in_an_ask_chain(relay_trace: Path, tmp_path: Path) -> None:
    """b forked at its first relay: its asks to c are answered as recorded (no runtime in a
    fork), its replies are the recorded ones, and the branch replays."""
    model = RunModel(relay_trace)
    b = model.instances[2]
    first = b.messages[0]
    branch = tmp_path / "b.bin"
    report = fork_trace(relay_trace, 2, first.offset, branch, progress=_quiet)
    assert report.calls == [("init", "ok"), ("handle", "ok"), ("handle", "ok")]
    assert not report.stopped
    replay_trace(branch, progress=_quiet)
    forked = RunModel(branch).instances[1]
    assert forked.agent == "relay:2" and forked.name == "b"
    assert [loads_untrusted(m.reply.value["body"]) for m in forked.messages] == [
        loads_untrusted(m.reply.value["body"]) for m in b.messages
    ]


def test_fork_refuses_to_overwrite(relay_trace: Path, tmp_path: Path) -> None:
    """A fork writes a new trace: an existing file is refused, untouched."""
    existing = tmp_path / "there.bin"
    existing.write_bytes(b"keep")
    with pytest.raises(HostError, match="exists"):
        fork_trace(relay_trace, 1, 0, existing, progress=_quiet)
    assert existing.read_bytes() == b"keep"
