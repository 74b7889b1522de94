"""Recording and replay costs on an import-heavy guest, against the same run unrecorded.

Run: .venv/bin/python benchmarks/bench_trace.py [--json]

The probe guest prints 300 lines and reads the clocks and random bytes 300 times per call
(about 2700 imports). Reported: recording overhead with the default durability (flush="call")
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

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import ROOT, cpu_samples, median, report, samples

from mighty import Component, Instance
from mighty.build import build_component
from mighty.trace import Recorder, replay_trace

LINES = 300
CHURN = 300


def work(instance: Instance) -> None:
    instance.call("spam", "hello mighty", LINES)
    instance.call("churn", CHURN)


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    out = tmp / "probe.wasm"
    build_component(ROOT / "guests" / "testing" / "probe" / "probe.py", output=out)
    component = Component.load(out)

    plain = Instance(component)
    plain_t = median(samples(lambda: work(plain), repeat=15, warmup=2))
    plain_cpu = median(cpu_samples(lambda: work(plain), repeat=15, warmup=1))
    watched = Instance(component, record=_Watching())
    watched_t = median(samples(lambda: work(watched), repeat=15, warmup=2))
    watched_cpu = median(cpu_samples(lambda: work(watched), repeat=15, warmup=1))
    tapped = Instance(component, record=_Tapping())
    tapped_t = median(samples(lambda: work(tapped), repeat=15, warmup=2))
    tapped_cpu = median(cpu_samples(lambda: work(tapped), repeat=15, warmup=1))

    traces: list[Path] = []
    recorded_ts = {}
    recorded_cpu = {}
    imports = 0
    for flush in ("call", "record"):
        recorder = Recorder(tmp / f"warm-{flush}.bin", flush=flush)
        recorded = Instance(component, record=recorder)
        work(recorded)
        imports_before = recorded.context.calls
        work(recorded)
        imports = recorded.context.calls - imports_before
        recorded_ts[flush] = median(
            samples(lambda r=recorded: work(r), repeat=15, warmup=2)  # type: ignore[misc]
        )
        recorded_cpu[flush] = median(
            cpu_samples(lambda r=recorded: work(r), repeat=15, warmup=1)  # type: ignore[misc]
        )
        recorded.close()
        recorder.close()
    recorded_t = recorded_ts["call"]

    one = tmp / "one.bin"
    with Recorder(one) as single, Instance(component, record=single) as instance:
        work(instance)
    traces.append(one)
    size = one.stat().st_size
    replay_t = median(samples(lambda: replay_trace(one), repeat=7, warmup=1))
    record_once = median(samples(lambda: _record_once(component, tmp), repeat=7, warmup=1))
    plain_once = median(samples(lambda: _plain_once(out), repeat=7, warmup=1))
    replay_cpu = median(_process_cpu(lambda: replay_trace(one), repeat=7))
    plain_once_cpu = median(_process_cpu(lambda: _plain_once(out), repeat=7))
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


def _process_cpu(fn: Callable[[], object], *, repeat: int) -> list[float]:
    """CPU seconds of the whole process (every thread) for each of ``repeat`` calls."""
    fn()
    out = []
    for _ in range(repeat):
        started = time.process_time()
        fn()
        out.append(time.process_time() - started)
    return out


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
