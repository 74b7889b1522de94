"""Application: a manifest run from Python does what `mty run` does, and reports the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mighty import BadInput
from mighty.agents import Application, StartReply, run_manifest
from mighty.cli import main
from mighty.control import application_ops
from mighty.trace import read_trace


def _manifest(tmp_path: Path, counter_wasm: Path, start: str) -> Path:
    path = tmp_path / "mighty.toml"
    path.write_text(
        "workers = 2\n\n"
        f'[agents.counter]\ncomponent = "{counter_wasm}"\naccepts = ["incr", "get", "work"]\n\n'
        '[supervisor]\nchildren = [ { name = "counter", type = "counter" } ]\n\n' + start
    )
    return path


START = (
    '[[start]]\nto = "counter"\nmessage = "incr"\nbody = { by = 5 }\n\n'
    '[[start]]\nto = "counter"\nmessage = "incr"\nask = false\n\n'
    '[[start]]\nto = "counter"\nmessage = "get"\n'
)


def test_run_reports_what_mty_run_prints(tmp_path: Path, counter_wasm: Path) -> None:
    """run() sends the start messages in order and its report is `mty run --json`'s object."""
    path = _manifest(tmp_path, counter_wasm, START)
    seen: list[StartReply] = []
    report = run_manifest(path, on_reply=seen.append)
    assert report.ok
    assert report.supervisor == "running"  # as `mty run` prints it: the tree never failed
    assert [r.reply for r in report.replies] == [
        {"count": 5, "version": 1},
        {"count": 6, "version": 1},
    ]
    assert seen == report.replies
    (agent,) = report.summary["agents"]
    assert (agent["accepted"], agent["handled"], agent["unhandled"]) == (3, 3, 0)

    result = CliRunner().invoke(main, ["run", str(path), "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    ours = report.to_json()
    assert set(printed) == set(ours)
    for key in ("ok", "replies", "failures", "unhandled", "events"):
        assert printed[key] == ours[key], key
    keep = ("address", "name", "accepted", "handled", "failed", "crashes", "fuel")
    assert [{k: a[k] for k in keep} for a in printed["agents"]] == [
        {k: a[k] for k in keep} for a in ours["agents"]
    ]


def test_the_parts_one_by_one(tmp_path: Path, counter_wasm: Path) -> None:
    """start, send_start, an ask of our own, wait and shutdown, with the runtime in between."""
    path = _manifest(tmp_path, counter_wasm, START)
    with Application.from_manifest(path, telemetry=None) as app:
        root = app.start()
        assert root.state == "running"
        with pytest.raises(BadInput, match="already started"):
            app.start()
        _, failures = app.send_start()
        assert failures == []
        assert app.runtime.ask("counter", "incr", {"by": 10})["count"] == 16
        assert app.wait()
        assert app.summary()["agents"][0]["handled"] == 4
        status = application_ops(app)["status"]({})
        assert status["agents"][0]["handled"] == 4
        with pytest.raises(BadInput, match="reload takes"):
            application_ops(app)["reload"]({"agent_type": 3})
    with pytest.raises(BadInput, match="shut down"):
        app.start()


def test_a_failed_start_message_is_reported_and_the_rest_still_run(
    tmp_path: Path, counter_wasm: Path
) -> None:
    """A start ask to no such agent is a failure line; the next message still goes."""
    start = '[[start]]\nto = "nobody"\nmessage = "incr"\n\n' + START
    path = _manifest(tmp_path, counter_wasm, start)
    heard: list[tuple[str, str, str]] = []
    report = run_manifest(path, on_failure=lambda *args: heard.append(args))
    assert not report.ok
    assert len(report.failures) == 1
    assert report.failures[0].startswith("nobody <- incr: ")
    assert [(to, message) for to, message, _ in heard] == [("nobody", "incr")]
    assert [r.reply["count"] for r in report.replies] == [5, 6]


def test_interrupted_before_anything_is_sent(tmp_path: Path, counter_wasm: Path) -> None:
    """interrupted() true from the start: the tree starts and stops, no start message goes."""
    report = run_manifest(_manifest(tmp_path, counter_wasm, START), interrupted=lambda: True)
    assert report.interrupted
    assert report.replies == []
    assert report.summary["agents"][0]["accepted"] == 0


def test_a_cluster_manifest_is_refused(tmp_path: Path, counter_wasm: Path) -> None:
    """A [cluster] manifest is for `mty node`: BadInput before anything is built."""
    path = _manifest(tmp_path, counter_wasm, '[cluster]\nname = "c"\n')
    with pytest.raises(BadInput, match=r"\[cluster\]"):
        Application.from_manifest(path)


def test_a_bad_state_dir_is_bad_input_and_the_trace_is_closed(
    tmp_path: Path, counter_wasm: Path
) -> None:
    """A state_dir that is a file fails the build with BadInput; the started trace is whole."""
    (tmp_path / "state").write_text("not a directory")
    path = _manifest(tmp_path, counter_wasm, START)
    path.write_text(path.read_text() + '\n[runtime]\nstate_dir = "state"\n')
    trace = tmp_path / "run.trace"
    with pytest.raises(BadInput, match="state"):
        Application.from_manifest(path, record=trace, telemetry=None)
    assert not read_trace(trace).truncated  # closed, not left open mid-frame
