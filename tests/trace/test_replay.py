"""Record a run, replay it byte for byte, and catch every way a replay can differ."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import Budget, Component, DeadlineExceeded, GuestExit, Instance, MightyError
from mighty.cli import main
from mighty.engine import ComponentStore
from mighty.trace import (
    NondeterminismError,
    Recorder,
    TraceCorrupt,
    TraceWriter,
    read_trace,
    replay_trace,
)
from mighty.wasi import Policy

FIXTURE = (Path(__file__).parent.parent / "fixtures" / "random_sum.wat").read_text()


def random_sum(
    wat: Callable[[str], bytes], tmp: Path, name: str, extra: int = 0, xor: int = 0
) -> Path:
    """A build of the random-sum guest written to a file."""
    path = tmp / f"{name}.wasm"
    path.write_bytes(wat(FIXTURE.replace("CALLS_EXTRA", str(extra)).replace("XOR", str(xor))))
    return path


def record(
    path: Path, component: Path, calls: list[tuple[str, tuple[Any, ...]]], **kwargs: Any
) -> list[Any]:
    """Record some export calls of one instance into a trace file."""
    results = []
    with (
        Recorder(path) as recorder,
        Instance(Component.load(component), record=recorder, **kwargs) as instance,
    ):
        for name, args in calls:
            try:
                results.append(instance.call(name, *args))
            except MightyError as exc:
                results.append(exc)
    return results


def rewrite(
    src: Path, dst: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> None:
    """Copy a trace with its records changed (valid frames: only the replayer can tell)."""
    trace = read_trace(src)
    header = {
        k: v
        for k, v in trace.header.items()
        if k not in ("format", "mighty", "wasmtime", "created")
    }
    with TraceWriter(dst, header) as writer:
        for item in change([r for r in trace.records() if r["k"] != "blob"]):
            writer.append(item)


def test_wat_guest_replays_exactly(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """A guest whose result comes only from imports replays to the same value and digest."""
    guest = random_sum(wat, tmp_path, "v1")
    trace = tmp_path / "t.bin"
    [first, second] = record(trace, guest, [("run", (5,)), ("run", (3,))])
    assert first != second
    reports = [replay_trace(trace) for _ in range(3)]
    assert len({r.digest for r in reports}) == 1
    assert reports[0].instances[0].exports == 2
    assert reports[0].instances[0].imports == 8


def test_digest_is_the_same_with_records_read_by_template_or_decoded(
    wat: Callable[[str], bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading by template changes no byte of what replay digests (nor what it replays)."""
    from mighty.trace import _format
    from mighty.trace._template import ImportTemplates

    class Never(ImportTemplates):
        __slots__ = ()

        def get(self, payload: bytes, canonical: bool) -> None:
            return None

    guest = random_sum(wat, tmp_path, "v1")
    trace = tmp_path / "t.bin"
    record(trace, guest, [("run", (40,)), ("run", (30,))])
    templated = replay_trace(trace)
    monkeypatch.setattr(_format, "ImportTemplates", Never)
    decoded = replay_trace(trace)
    assert templated.to_json() == decoded.to_json()
    assert templated.instances[0].imports > 40


def test_changed_component_reports_first_divergence(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """A build that makes one more import diverges at the first import it should not make."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,))])
    changed = random_sum(wat, tmp_path, "v2", extra=1)
    with pytest.raises(NondeterminismError) as info:
        replay_trace(trace, substitute=changed)
    assert "after the last recorded import" in info.value.message
    assert info.value.got["fn"] == "get-random-u64"


def test_changed_result_reports_the_export(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """A build returning something else diverges at the export's result."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,))])
    with pytest.raises(NondeterminismError) as info:
        replay_trace(trace, substitute=random_sum(wat, tmp_path, "v3", xor=1))
    assert "result of run" in info.value.message


def test_recorded_component_must_match(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """If the recorded path now holds other bytes, replay says so instead of running them."""
    guest = random_sum(wat, tmp_path, "v1")
    trace = tmp_path / "t.bin"
    record(trace, guest, [("run", (1,))])
    guest.write_bytes(random_sum(wat, tmp_path, "v9", xor=9).read_bytes())
    with pytest.raises(MightyError, match="not the recorded component"):
        replay_trace(trace, store=ComponentStore(tmp_path / "empty-store"))


def test_damage_read_while_the_component_loads_is_what_replay_reports(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """Replay starts loading the component as soon as the instance record is read, on a
    thread, while it reads on: a damaged frame later in the trace is still the error (the
    load's outcome is dropped), and a component that cannot be found is still a HostError
    naming where replay looked (raised where the load's result is needed)."""
    guest = random_sum(wat, tmp_path, "v1")
    trace = tmp_path / "t.bin"
    record(trace, guest, [("run", (3,)), ("run", (2,))])
    damaged = tmp_path / "damaged.bin"
    data = bytearray(trace.read_bytes())
    data[-3] ^= 0xFF  # in the last frame's payload: its checksum no longer matches
    damaged.write_bytes(bytes(data))
    with pytest.raises(TraceCorrupt, match="payload checksum mismatch"):
        replay_trace(damaged)
    guest.unlink()
    with pytest.raises(MightyError, match="cannot find the recorded component"):
        replay_trace(trace, store=ComponentStore(tmp_path / "empty-store"))
    # With the component back, the same trace replays (the failed load left nothing behind).
    random_sum(wat, tmp_path, "v1")
    assert replay_trace(trace, store=ComponentStore(tmp_path / "empty-store")).instances


def test_tampered_import_result_is_caught(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """Changing one recorded random number makes the replayed result differ: caught."""
    trace, tampered = tmp_path / "t.bin", tmp_path / "x.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (3,))])

    def change(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        imports = [r for r in records if r["k"] == "import"]
        imports[1]["res"] = imports[1]["res"] ^ 1
        return records

    rewrite(trace, tampered, change)
    with pytest.raises(NondeterminismError):
        replay_trace(tampered)


def test_reordered_records_are_caught(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """Swapping an import with the export record it belongs before is a divergence."""
    trace, tampered = tmp_path / "t.bin", tmp_path / "x.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,))])

    def swap(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        i = next(n for n, r in enumerate(records) if r["k"] == "export")
        records[i - 1], records[i] = records[i], records[i - 1]
        return records

    rewrite(trace, tampered, swap)
    with pytest.raises(NondeterminismError):
        replay_trace(tampered)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.floats(min_value=0.0, max_value=1.0))
def test_cut_trace_never_crashes_replay(
    wat: Callable[[str], bytes], tmp_path: Path, cut: float
) -> None:
    """A trace cut anywhere replays what is whole or fails with a mighty error, never worse."""
    trace = tmp_path / "whole.bin"
    if not trace.exists():
        record(trace, random_sum(wat, tmp_path, "v1"), [("run", (3,)), ("run", (2,))])
    data = trace.read_bytes()
    cut_path = tmp_path / "cut.bin"
    cut_path.write_bytes(data[: int(len(data) * cut)])
    try:
        report = replay_trace(cut_path)
    except MightyError:
        return
    # Either the reader saw the cut, or the cut fell between two frames (a shorter valid trace).
    assert report.truncated or read_trace(cut_path).readable_bytes == int(len(data) * cut)


def test_two_instances_and_agent_selection(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """One trace holds several instances; each replays alone."""
    trace = tmp_path / "t.bin"
    component = Component.load(random_sum(wat, tmp_path, "v1"))
    with (
        Recorder(trace) as recorder,
        Instance(component, record=recorder) as a,
        Instance(component, record=recorder) as b,
    ):
        a.call("run", 2)
        b.call("run", 4)
        a.call("run", 1)
    whole = replay_trace(trace)
    assert [(r.instance, r.exports, r.imports) for r in whole.instances] == [(1, 2, 3), (2, 1, 4)]
    only = replay_trace(trace, instance=2)
    assert [r.instance for r in only.instances] == [2]
    with pytest.raises(MightyError, match="no instance 7"):
        replay_trace(trace, instance=7)


@pytest.mark.slow
def test_probe_run_replays_byte_for_byte(probe_wasm: Path, tmp_path: Path) -> None:
    """Clocks, random bytes, uuid4, files, stdin and output all replay from the trace alone."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("file text")
    code = (
        "print(time.time(), time.monotonic_ns(), os.urandom(8).hex(), uuid.uuid4());"
        "result = json.dumps([open('/data/in.txt').read(), sys.stdin.read(), sorted(os.listdir('/data'))])"
    )
    policy = Policy().with_dir(data, "/data", readonly=False).with_stdin(b"stdin bytes")
    trace = tmp_path / "probe.bin"
    [value] = record(trace, probe_wasm, [("run", (code,))], policy=policy)
    (data / "in.txt").write_text("changed on disk after recording")  # replay never reads it
    report = replay_trace(trace)
    assert report.instances[0].imports > 10
    assert replay_trace(trace).digest == report.digest
    closing = next(r for r in read_trace(trace).records() if r["k"] == "close")
    assert closing["stdout"].count(b" ") == 3
    assert json.loads(value.value)[0] == "file text"


@pytest.mark.slow
def test_interrupted_call_replays_up_to_the_interruption(probe_wasm: Path, tmp_path: Path) -> None:
    """A call stopped by its deadline replays every import it made, then stops there too."""
    trace = tmp_path / "t.bin"
    [outcome, _after] = record(
        trace,
        probe_wasm,
        [("run", ("while True: time.monotonic_ns()",)), ("run", ("result = 1",))],
        budget=Budget(timeout=0.3, fuel=10**15),
    )
    assert isinstance(outcome, DeadlineExceeded)
    report = replay_trace(trace)
    assert report.instances[0].interrupted == ["run"]


@pytest.mark.slow
def test_exit_replays_as_exit(probe_wasm: Path, tmp_path: Path) -> None:
    """A guest that exited exits again at the same point in replay."""
    trace = tmp_path / "t.bin"
    [outcome] = record(trace, probe_wasm, [("run", ("print('bye'); os._exit(1)",))])
    assert isinstance(outcome, GuestExit)
    assert replay_trace(trace).instances[0].exports == 1


def test_cli_record_show_replay(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """`mty call --record`, `mty trace show --json` and `mty replay --json` work together."""
    guest = random_sum(wat, tmp_path, "v1")
    trace = tmp_path / "cli.bin"
    runner = CliRunner()
    called = runner.invoke(main, ["call", str(guest), "run", "4", "--record", str(trace), "--json"])
    assert called.exit_code == 0, called.output
    shown = runner.invoke(main, ["trace", "show", str(trace), "--json"])
    summary = json.loads(shown.stdout)
    assert summary["instances"][0]["imports"] == {"wasi:random/random#get-random-u64": 4}
    replayed = runner.invoke(main, ["replay", str(trace), "--json"])
    assert replayed.exit_code == 0
    assert json.loads(replayed.stdout)["ok"] is True
    diverged = runner.invoke(
        main,
        [
            "replay",
            str(trace),
            "--component",
            str(random_sum(wat, tmp_path, "v2", extra=1)),
            "--json",
        ],
    )
    assert diverged.exit_code == 1
    error = json.loads(diverged.stdout)["error"]
    assert error["kind"] == "nondeterminism"


def test_debugger_scripted_session(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """`mty debug` takes commands on stdin: break, continue, print, bt, step, list, next, peek."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,)), ("run", (1,))])
    script = "break get-random-u64\ncontinue\nprint msg\nbt\nstep\nlist\nnext\npeek 1\ndelete get-random-u64\ncontinue\nstep\nbogus\nquit\n"
    result = CliRunner().invoke(main, ["debug", str(trace)], input=script)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "#1 instance 1 step 1: call run(2,)" in out
    assert "(mty) continue\n#2 instance 1 step 2: wasi:random/random#get-random-u64() -> " in out
    assert "  function:  get-random-u64" in out
    assert "instance 1\n  export run(2,)\n    import wasi:random/random#get-random-u64" in out
    assert "=> #3 instance 1 step 3" in out
    assert "(mty) next\n#5 instance 1 step 5: call run(1,)" in out
    assert "recent imports:" in out
    assert "replay finished: ok, digest" in out
    assert "the replay has finished" in out
    assert "unknown command 'bogus'" in out
    assert out.rstrip().endswith("bye")


def test_debugger_shows_divergence_where_it_happens(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """Stepping a tampered trace stops with the NondeterminismError at the divergent point."""
    from mighty.trace import Debugger

    trace, tampered = tmp_path / "t.bin", tmp_path / "x.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,))])

    def change(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for r in records:
            if r["k"] == "import":
                r["fn"] = "get-random-bytes"
                break
        return records

    rewrite(trace, tampered, change)
    debugger = Debugger(tampered)
    debugger.start()
    lines, done = debugger.command("continue")
    assert not done
    assert any("NondeterminismError" in line and "get-random-bytes" in line for line in lines)
    debugger.command("quit")


def test_debugger_quit_mid_replay_stops_the_guest(
    wat: Callable[[str], bytes], tmp_path: Path
) -> None:
    """Quitting while the guest is paused inside an import ends the replay thread."""
    from mighty.trace import Debugger

    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (50,))])
    debugger = Debugger(trace)
    debugger.start()
    debugger.command("step")
    debugger.command("quit")
    assert not debugger._thread.is_alive()


@pytest.mark.slow
def test_hello_example_records_and_replays_from_the_cli(hello_wasm: Path, tmp_path: Path) -> None:
    """The README's example records and replays byte-identically through `mty`."""
    runner = CliRunner()
    trace = tmp_path / "hello.bin"
    called = runner.invoke(
        main, ["call", str(hello_wasm), "word-stats", '"a b a"', "--record", str(trace)]
    )
    assert called.exit_code == 0, called.output
    first = runner.invoke(main, ["replay", str(trace), "--json"])
    second = runner.invoke(main, ["replay", str(trace), "--json"])
    assert first.exit_code == second.exit_code == 0
    assert json.loads(first.stdout)["digest"] == json.loads(second.stdout)["digest"]
