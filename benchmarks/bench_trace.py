"""Recording and replay costs on an import-heavy guest, against the same run unrecorded.

Run: .venv/bin/python benchmarks/bench_trace.py [--json]

The probe guest prints 300 lines and reads the clocks and random bytes 300 times per call
(about 2700 imports). The unrecorded, recorded and floor runs take turns, one call each per
round (25 rounds), and each figure is the median of its rounds: wall time, and the calling
thread's CPU time (``cpu_ratio``; the imports run on it, and on a shared machine it is the
steadier figure). Reported: recording overhead with the default durability (flush="call")
and with flush="record" (recorded / plain, target <= 1.25), replay time against an unrecorded
run and against recording (whole runs, instantiation included; target replay / unrecorded
<= 1.5), and trace bytes per import.

The floors of recording: the same run with a hook that watches every import and does nothing
(the gate's general hooked path), and with one that taps every import and does nothing (the
gate's tapped frames, which the recorder uses: what it pays before it records anything).

Replay loads the component on a thread while it reads the trace, so its CPU figure is the
process's (``time.process_time``, every thread), not the calling thread's.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import ROOT, median, report

from mighty import Component, Instance
from mighty.build import build_component
from mighty.trace import Recorder, replay_trace

LINES = 300
CHURN = 300
ROUNDS = 25
FLUSHES = ("call", "record")


def work(instance: Instance) -> None:
    instance.call("spam", "hello mighty", LINES)
    instance.call("churn", CHURN)


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    out = tmp / "probe.wasm"
    build_component(ROOT / "guests" / "testing" / "probe" / "probe.py", output=out)
    component = Component.load(out)

    # Every configuration runs once per round, in turn, and each is the median of its rounds:
    # drift of a shared machine (other jobs starting and stopping) then hits all of them alike
    # instead of whichever ran while it lasted.
    plain = Instance(component)
    watched = Instance(component, record=_Watching())
    tapped = Instance(component, record=_Tapping())
    recorders = {flush: Recorder(tmp / f"warm-{flush}.bin", flush=flush) for flush in FLUSHES}
    recorded = {flush: Instance(component, record=r) for flush, r in recorders.items()}
    runs = {"plain": plain, "watched": watched, "tapped": tapped, **recorded}
    for instance in runs.values():
        work(instance)
    imports_before = recorded["call"].context.calls
    work(recorded["call"])
    imports = recorded["call"].context.calls - imports_before
    wall, cpu = _interleaved(runs, rounds=ROUNDS)
    for flush in FLUSHES:
        recorded[flush].close()
        recorders[flush].close()
    plain_t, watched_t, tapped_t = wall["plain"], wall["watched"], wall["tapped"]
    plain_cpu, watched_cpu, tapped_cpu = cpu["plain"], cpu["watched"], cpu["tapped"]
    recorded_ts = {flush: wall[flush] for flush in FLUSHES}
    recorded_cpu = {flush: cpu[flush] for flush in FLUSHES}
    recorded_t = recorded_ts["call"]
    traces: list[Path] = []

    one = tmp / "one.bin"
    with Recorder(one) as single, Instance(component, record=single) as instance:
        work(instance)
    traces.append(one)
    size = one.stat().st_size
    # Whole runs, interleaved round by round (as the per-call figures above), so the machine's
    # drift between blocks of runs does not land on one side of the ratio.
    whole = _interleaved_runs(
        {
            "replay": lambda: replay_trace(one),
            "record": lambda: _record_once(component, tmp),
            "plain": lambda: _plain_once(out),
        },
        rounds=9,
    )
    replay_t, record_once, plain_once = (whole[k][0] for k in ("replay", "record", "plain"))
    replay_cpu, plain_once_cpu = whole["replay"][1], whole["plain"][1]
    report(
        [
            {
                "name": "recording overhead: recorded / plain",
                "ratio": round(recorded_t / plain_t, 2),
                "recorded_ms": round(recorded_t * 1e3, 2),
                "plain_ms": round(plain_t * 1e3, 2),
                "imports": imports,
                "extra_us_per_import": round((recorded_t - plain_t) / imports * 1e6, 2),
                "cpu_ratio": round(recorded_cpu["call"] / plain_cpu, 2),
                "cpu_extra_us_per_import": round(
                    (recorded_cpu["call"] - plain_cpu) / imports * 1e6, 2
                ),
                "target": "<= 1.25",
                "taps": _taps(),
            },
            {
                "name": 'recording overhead, flush="record"',
                "ratio": round(recorded_ts["record"] / plain_t, 2),
                "recorded_ms": round(recorded_ts["record"] * 1e3, 2),
                "extra_us_per_import": round((recorded_ts["record"] - plain_t) / imports * 1e6, 2),
                "cpu_ratio": round(recorded_cpu["record"] / plain_cpu, 2),
            },
            {
                "name": "floor: a hook that watches and does nothing / plain",
                "ratio": round(watched_t / plain_t, 2),
                "extra_us_per_import": round((watched_t - plain_t) / imports * 1e6, 2),
                "cpu_ratio": round(watched_cpu / plain_cpu, 2),
            },
            {
                "name": "floor: a hook that taps and does nothing / plain",
                "ratio": round(tapped_t / plain_t, 2),
                "extra_us_per_import": round((tapped_t - plain_t) / imports * 1e6, 2),
                "cpu_ratio": round(tapped_cpu / plain_cpu, 2),
            },
            {
                "name": "replay / unrecorded (whole run incl. load + instantiate)",
                "ratio": round(replay_t / plain_once, 2),
                "replay_ms": round(replay_t * 1e3, 2),
                "unrecorded_ms": round(plain_once * 1e3, 2),
                "cpu_ratio": round(replay_cpu / plain_once_cpu, 2),
                "target": "<= 1.5",
            },
            {
                "name": "replay / record (whole run incl. instantiate)",
                "ratio": round(replay_t / record_once, 2),
                "replay_ms": round(replay_t * 1e3, 2),
                "record_ms": round(record_once * 1e3, 2),
            },
            {
                "name": "trace bytes per import",
                "bytes_per_import": round(size / imports, 1),
                "trace_bytes": size,
            },
        ]
    )


class _Watching:
    """A recording that records nothing: what the gate's hook path costs by itself."""

    fuel_limit = 0

    def attach(self, *args: Any, **kwargs: Any) -> _Watching:
        return self

    def watch_import(
        self, ctx: Any, binding: Any, args: Sequence[Any], value: Any, failed: bool
    ) -> None:
        return None

    def __call__(self, ctx: Any, binding: Any, args: Sequence[Any], call: Callable[[], Any]) -> Any:
        return call()

    def begin_export(self, *args: Any) -> None:
        return None

    def end_export(self, *args: Any) -> None:
        return None

    def close(self, *args: Any) -> None:
        return None


class _Tapping(_Watching):
    """A recording that taps every import the gate lets it and records nothing: the gate's
    tapped frames (what the recorder pays before its tap encodes anything)."""

    def tap_import(self, *args: Any) -> Callable[..., None]:
        return _ignore


def _ignore(*args: Any) -> None:
    return None


def _interleaved(
    runs: dict[str, Instance], *, rounds: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The median wall time and thread CPU time of ``work`` on each instance, over ``rounds``
    rounds that each run every instance once, in turn."""
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, instance in runs.items():
            started, started_cpu = time.perf_counter(), time.thread_time()
            work(instance)
            cpu[name].append(time.thread_time() - started_cpu)
            wall[name].append(time.perf_counter() - started)
    return (
        {name: median(v) for name, v in wall.items()},
        {name: median(v) for name, v in cpu.items()},
    )


def _interleaved_runs(
    runs: dict[str, Callable[[], object]], *, rounds: int
) -> dict[str, tuple[float, float]]:
    """(median wall time, median process CPU time) of each of ``runs``, after one warm-up
    each, over ``rounds`` rounds that each run every one once, in turn."""
    for fn in runs.values():
        fn()
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - started_cpu)
            wall[name].append(time.perf_counter() - started)
    return {name: (median(wall[name]), median(cpu[name])) for name in runs}


def _taps() -> str:
    """Which recorder taps ran: the compiled ones (host/trace/_speedups.c) or pure Python."""
    built = importlib.util.find_spec("mighty.trace._speedups") is not None
    pure = os.environ.get("MIGHTY_PURE_PYTHON", "") not in ("", "0")
    return "compiled" if built and not pure else "pure"


def _plain_once(path: Path) -> None:
    # As replay does (and `mty call`): load the component file, instantiate, call, close.
    with Instance(Component.load(path)) as instance:
        work(instance)


def _record_once(component: Component, tmp: Path) -> None:
    path = tmp / "again.bin"
    path.unlink(missing_ok=True)
    with Recorder(path) as recorder, Instance(component, record=recorder) as instance:
        work(instance)


if __name__ == "__main__":
    main()
