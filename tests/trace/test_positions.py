"""Source positions of Python agents (issue 35 #5): recorded beside each import as a side field,
shown by `mty debug` and the timelines, bounded, and never part of what replay compares."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import wasmtime
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty.cli import main
from mighty.gate import Binding, GuestContext
from mighty.gate._source import MAX_FILE, MAX_FUNCTION, SourceProvider, bounded_position
from mighty.trace import Recorder, ReplayEvent, TraceWriter, read_trace, replay_trace
from mighty.trace._recorder import POSITION_BYTES
from mighty.trace._replay import recorded_source
from mighty.trace._timeline import chrome_trace, timeline_data

RELAY = Path(__file__).parent / "agents" / "relay.py"


def _quiet(_message: str) -> None:
    return None


def _line_of(text: str) -> int:
    """The line of relay.py holding ``text``."""
    (number,) = [n for n, line in enumerate(RELAY.read_text().splitlines(), 1) if text in line]
    return number


def _rewrite(src: Path, dst: Path, change: Any) -> Path:
    trace = read_trace(src)
    with TraceWriter(dst, {k: v for k, v in trace.header.items() if k != "format"}) as w:
        for record in trace.records():
            w.append(change(dict(record)))
    return dst


def _calls(path: Path) -> list[tuple[Any, ...]]:
    """Every import of the trace: instance, step, interface, function, args."""
    return [
        (r["i"], r["s"], r["if"], r["fn"], r["args"])
        for r in read_trace(path).records()
        if r["k"] == "import"
    ]


def test_debug_shows_the_file_line_and_function_of_an_import(relay_positions_trace: Path) -> None:
    """`mty debug` stopped at b's ask shows relay.py:LINE in Relay.relay, and `print` the path."""
    script = "break ask\ncontinue\nprint\nstep\nquit\n"
    ran = CliRunner().invoke(main, ["debug", str(relay_positions_trace)], input=script)
    assert ran.exit_code == 0, ran.output
    ask_line, self_line = _line_of("below = ask("), _line_of('"by": self_address()')
    (stopped,) = [line for line in ran.output.splitlines() if "#ask('c'" in line][:1]
    assert stopped.endswith(f"  at relay.py:{ask_line} in Relay.relay"), stopped
    assert f"  source:    /0/relay.py:{ask_line} in Relay.relay" in ran.output  # print, whole
    assert f"#self-address() -> 'relay:2'  at relay.py:{self_line} in Relay.relay" in ran.output


def test_positions_add_no_import_and_replay_as_recorded(
    relay_positions_trace: Path, relay_trace: Path
) -> None:
    """The same run with and without positions makes the same imports; both replay; every
    agent import of the positions trace carries one, and no record of the plain one does."""
    assert _calls(relay_positions_trace) == _calls(relay_trace)
    for path in (relay_positions_trace, relay_trace):
        assert replay_trace(path, progress=_quiet).instances
    with_src = read_trace(relay_positions_trace).records()
    agent_imports = [r for r in with_src if r["k"] == "import" and r["if"] == "mighty:agent/host"]
    assert agent_imports and all(recorded_source(r.get("src")) for r in agent_imports)
    heads = [r for r in read_trace(relay_positions_trace).records() if r["k"] == "instance"]
    assert all(r.get("positions") is True for r in heads)
    assert not any("src" in r or "positions" in r for r in read_trace(relay_trace).records())


def test_src_is_not_compared_by_replay(relay_trace: Path, tmp_path: Path) -> None:
    """Any "src" written into a trace recorded without positions (lies, junk, a megabyte)
    leaves its replay ok with the same digest; the debugger shows only well-formed ones, cut."""
    junk = ["x" * 1_000_000, 7, "f"], [1, 2, 3], "text", ["a.py", -5, "g" * 500]
    count = [0]

    def lie(record: dict[str, Any]) -> dict[str, Any]:
        if record["k"] == "import":
            record["src"] = junk[count[0] % len(junk)]
            count[0] += 1
        return record

    lied = _rewrite(relay_trace, tmp_path / "lied.trace", lie)
    events: list[ReplayEvent] = []
    plain = replay_trace(relay_trace, progress=_quiet)
    replayed = replay_trace(lied, observer=events.append, progress=_quiet)
    assert replayed.digest == plain.digest
    sources = {e.source for e in events if e.kind == "import"}
    assert None in sources
    shown = [s for s in sources if s is not None]
    assert shown and all(len(f) <= MAX_FILE and len(fn) <= MAX_FUNCTION for f, _, fn in shown)
    assert ("a.py", 0, "g" * (MAX_FUNCTION - 3) + "...") in shown


def test_timelines_carry_the_source(relay_positions_trace: Path) -> None:
    """The chrome export's import instants and the HTML page's imports name their source."""
    line = _line_of("below = ask(")
    document = chrome_trace(relay_positions_trace)
    asks = [e for e in document["traceEvents"] if e.get("name") == "mighty:agent/host#ask"]
    assert asks and all(e["args"]["source"] == f"/0/relay.py:{line} in Relay.relay" for e in asks)
    data = json.dumps(timeline_data(relay_positions_trace))
    assert f"/0/relay.py:{line} in Relay.relay" in data


# -- the bounds, without a guest -----------------------------------------------------------


def _at_binding() -> Binding:
    (at,) = [b for b in SourceProvider().bindings() if b.name == "at"]
    return at


def _positions_binding() -> Binding:
    (positions,) = [b for b in SourceProvider().bindings() if b.name == "positions"]
    return positions


class _Keeper:
    keeps_positions = True

    def __init__(self) -> None:
        self.taken: list[tuple[str, int, str]] = []

    def take_position(self, file: str, line: int, function: str) -> None:
        self.taken.append((file, line, function))

    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        raise AssertionError("not an import of a trace")


class _Silent:
    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        raise AssertionError("not an import of a trace")


def test_positions_answer_true_only_when_every_hook_keeps_them() -> None:
    """No hook, a hook that does not say, or one of two that does not: false."""
    positions = _positions_binding()
    assert positions.hooked is False and _at_binding().hooked is False
    store = wasmtime.Store()
    assert positions.fn(GuestContext(store, [])) is False
    assert positions.fn(GuestContext(store, [_Keeper()])) is True
    assert positions.fn(GuestContext(store, [_Silent()])) is False
    assert positions.fn(GuestContext(store, [_Keeper(), _Silent()])) is False


@settings(max_examples=200, deadline=None)
@given(
    file=st.text(max_size=400),
    line=st.integers(min_value=-(2**70), max_value=2**70),
    function=st.text(max_size=300),
)
def test_a_position_is_cut_to_its_bounds(file: str, line: int, function: str) -> None:
    """Whatever a guest passes, the hooks get at most MAX_FILE + MAX_FUNCTION characters, the
    end of the file name and the start of the function's, and a line in u32."""
    keeper = _Keeper()
    _at_binding().fn(GuestContext(wasmtime.Store(), [keeper]), file, line, function)
    ((f, n, fn),) = keeper.taken
    assert len(f) <= MAX_FILE and len(fn) <= MAX_FUNCTION and 0 <= n <= 0xFFFFFFFF
    assert f == file or (f.startswith("...") and file.endswith(f[3:]))
    assert fn == function or (fn.endswith("...") and function.startswith(fn[:-3]))
    assert recorded_source([file, line, function]) == (f, n, fn)  # the reader cuts alike
    assert bounded_position(file, line, function) == (f, n, fn)


@settings(max_examples=100, deadline=None)
@given(src=st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers(), max_size=4)))
def test_a_malformed_src_is_no_source(src: Any) -> None:
    """A "src" that is not [str, int, str] is shown as no source, never raised on."""
    assert recorded_source(src) is None


class _FakeBinding:
    interface = "mighty:agent/host"
    name = "log"


@settings(max_examples=60, deadline=None)
@given(
    args=st.lists(st.one_of(st.text(max_size=40), st.integers(0, 2**40), st.binary(max_size=40))),
    file=st.text(max_size=MAX_FILE),
    line=st.integers(0, 2**32 - 1),
    function=st.text(max_size=MAX_FUNCTION),
    agent=st.sampled_from([None, "kv:1"]),
)
def test_a_positioned_record_reads_back_as_written(
    tmp_path_factory: Any, args: list[Any], file: str, line: int, function: str, agent: Any
) -> None:
    """The one-go encoding of an import record with "src" reads back as the record it stands
    for (the same as the dict path would write)."""
    path = tmp_path_factory.mktemp("pos") / "t.trace"
    with Recorder(path, flush="record", positions=True) as recorder:
        recording = recorder.attach(_component_stub(), {"fuel": 1}, None, agent=agent)
        recording.take_position(file, line, function)
        recording._record_positioned(3, _FakeBinding(), args, None, "ok", 17)  # type: ignore[arg-type]
    records = [r for r in read_trace(path, schema=True).records() if r["k"] == "import"]
    want = {
        "k": "import",
        "i": 1,
        "s": 3,
        "if": "mighty:agent/host",
        "fn": "log",
        "args": args,
        "res": None,
        "out": "ok",
        "fuel": 17,
        "src": [file, line, function],
    }
    if agent is not None:
        want["a"] = agent
    assert records == [want]
    assert recording._position is None  # a position goes with one import only


class _ComponentStub:
    sha256 = "0" * 64
    origin = "<bytes>"
    size = 0


def _component_stub() -> Any:
    return _ComponentStub()


def test_an_instance_keeps_at_most_position_bytes(tmp_path: Path) -> None:
    """A guest sending the longest positions it can, forever: the trace keeps POSITION_BYTES of
    them and counts the rest as dropped."""
    with Recorder(tmp_path / "t.trace", positions=True) as recorder:
        recording = recorder.attach(_component_stub(), {"fuel": 1}, None)
        at = _at_binding().fn
        ctx = GuestContext(wasmtime.Store(), [recording])
        kept = 0
        per = MAX_FILE + MAX_FUNCTION + 8
        for _ in range(POSITION_BYTES // per + 100):
            at(ctx, "f" * 10_000, 1, "g" * 10_000)
            if recording._position is not None:
                kept += 1
                recording._position = None
        assert kept == POSITION_BYTES // per
        assert recording.positions_dropped == 100
