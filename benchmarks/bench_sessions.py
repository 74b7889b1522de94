"""Code-mode sessions: fork, snapshot and restore, against a fresh pooled run in the same run.

A session is set up with a small working state (a few imports, functions, a class, a dict of
1,000 entries). Figures, p50 and p90 of ``--repeat`` samples (default 40):
- baseline: ``Sandbox.run("result = 1 + 1")`` from a ready pool (the pool refills between runs);
- ``fork()`` of a session with a run in between (its state is frozen anew: on the spares
  thread right after the fork returns, or by whichever needs it first), and ``fork()`` again with
  nothing run in between (the frozen state is reused), each with the spares thread idle (spaced
  out like the pooled baseline); a fork after a run and the fork's first run together (a fork
  makes its instance when first used: a spare mapped ahead, or its own); the session's own run
  after a fork, once the thread is idle, and right after the fork (the freeze then done on the
  caller's thread, before the run); a fork closed unused and the session's next run (nothing
  frozen); closing a fork; forks back to back; the first run in each of those forks (most make
  their instance: one spare per size);
- the freeze alone (pagemap + copying the changed pages into a sealed memfd); a layered state
  mapped whole into another instance, alone and beside a thread running Python;
- ``snapshot()`` (freeze, read, zlib level 1) with its size, and ``restore(bytes)``;
- a fresh ``session()``'s first run (instantiate, start-up, the run), for comparison.
The machine's load average is printed too; on 2 CPUs above ~2 the figures share the CPUs.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from _common import p, report

from mighty.sandbox import Sandbox, Session

SETUP = """
import json, re, fractions
table = {f"k{i}": i * i for i in range(1000)}
def lookup(key):
    return table.get(key)
class Acc:
    def __init__(self):
        self.total = 0
    def add(self, n):
        self.total += n
        return self.total
acc = Acc()
acc.add(5)
"""


def _time(
    fn: Callable[[], object], repeat: int, between: Callable[[], object] | None = None
) -> list[float]:
    out = []
    for _ in range(repeat):
        if between is not None:
            between()
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def _row(name: str, values: list[float], **extra: object) -> dict[str, object]:
    return {
        "name": name,
        "p50_ms": round(p(values, 0.5) * 1e3, 3),
        "p90_ms": round(p(values, 0.9) * 1e3, 3),
        **extra,
    }


def _wait_full(sandbox: Sandbox, size: int) -> None:
    deadline = time.monotonic() + 30
    while sandbox.pool_ready < size and time.monotonic() < deadline:
        time.sleep(0.0005)


def _mapped_whole(box: Sandbox, session: Session) -> list[dict[str, object]]:
    """A layered state of the session mapped whole into another instance (what a spare or a
    fork without one does: ``restore_memory`` over a memory that does not hold its base),
    alone and with another thread running Python meanwhile (an event loop, say): each call
    into the C library that lets go of the GIL waits for that thread's switch interval (5 ms)
    to get it back."""
    from mighty.sandbox._sessions import _started

    held = []
    for _ in range(4):  # a few layers: a chain's mapping has a few hundred ranges
        session.run("acc.add(1)")
        held.append(session.fork())
    live = session._live
    assert live is not None
    state = live.instance.capture_memory()
    spare, _holdings = _started(box._config, state)
    rows: list[dict[str, object]] = []
    try:
        alone = _time(lambda: spare.instance.restore_memory(state), 15)
        stop = threading.Event()

        def busy() -> None:
            while not stop.is_set():
                pass

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            beside = _time(lambda: spare.instance.restore_memory(state), 15)
        finally:
            stop.set()
            thread.join()
        rows.append(_row("map a state whole", alone, ranges=len(state.mapping)))
        rows.append(
            _row(
                "map a state whole, a thread running Python beside",
                beside,
                vs_alone=round(p(beside, 0.5) / p(alone, 0.5), 2),
            )
        )
    finally:
        spare.close()
        for fork in held:
            fork.close()
    return rows


def main() -> None:
    repeat = 40
    if "--repeat" in sys.argv:
        repeat = int(sys.argv[sys.argv.index("--repeat") + 1])
    rows: list[dict[str, object]] = [{"name": "load average", "1min": os.getloadavg()[0]}]
    with Sandbox(pool=2) as box:
        for _ in range(20):
            box.run("result = 1 + 1")

        def pooled() -> None:
            _wait_full(box, 2)
            time.sleep(0.01)

        base = _time(lambda: box.run("result = 1 + 1"), repeat, pooled)
        baseline = p(base, 0.5)
        rows.append(_row("baseline: pooled run 1 + 1", base))

        def ratio(values: list[float]) -> float:
            return round(p(values, 0.5) / baseline, 2)

        session = box.session()
        assert session.run(SETUP).ok

        made: list[Session] = []
        spares = box._spares
        assert spares is not None

        def spare_ready() -> None:
            # As the pool baseline: the background thread has frozen the last fork's state and
            # made (mapped, populated) the next spare: it has nothing left to do.
            deadline = time.monotonic() + 30
            while not spares.idle() and time.monotonic() < deadline:
                time.sleep(0.0005)
            time.sleep(0.01)

        def after_run() -> None:
            session.run("acc.add(1)")
            spare_ready()

        def closed() -> None:
            while made:
                made.pop().close()

        def measured(name: str, fn: Callable[[], object], between: Callable[[], object]) -> None:
            values = _time(fn, repeat, between)
            rows.append(_row(name, values, vs_baseline=ratio(values)))
            closed()

        measured("fork() after a run", lambda: made.append(session.fork()), after_run)

        def fork_and_run() -> None:
            child = session.fork()
            made.append(child)
            child.run("acc.add(1)")

        measured("fork() after a run + the fork's first run", fork_and_run, after_run)

        def run_after_fork() -> None:
            session.run("acc.add(1)")
            made.append(session.fork())
            spare_ready()

        measured(
            "the session's run after a fork", lambda: session.run("acc.add(1)"), run_after_fork
        )

        def fork_then_run() -> None:
            made.append(session.fork())
            session.run("acc.add(1)")  # before the thread has frozen it: frozen here, first

        measured("fork() and the session's run right after", fork_then_run, after_run)

        def fork_closed() -> None:
            session.fork().close()
            session.run("acc.add(1)")

        measured("fork(), close it unused, the session's run", fork_closed, after_run)
        fork_same = _time(lambda: made.append(session.fork()), repeat, spare_ready)
        rows.append(_row("fork() again, no run between", fork_same, vs_baseline=ratio(fork_same)))
        closing = _time(lambda: made.pop().close(), len(made))
        rows.append(_row("close a fork", closing))
        back_to_back = _time(lambda: made.append(session.fork()), repeat)
        closed()
        rows.append(
            _row(
                "fork() back to back (no spare ready)",
                back_to_back,
                vs_baseline=ratio(back_to_back),
            )
        )

        forks = [session.fork() for _ in range(repeat)]
        first = []
        for child in forks:
            started = time.perf_counter()
            assert child.run("acc.add(1)").ok
            first.append(time.perf_counter() - started)
            child.close()
        rows.append(_row("first run in a fork", first, vs_baseline=ratio(first)))

        live = session._live
        assert live is not None
        freeze = _time(live.instance.capture_memory, repeat, lambda: session.run("acc.add(1)"))
        state = live.instance.capture_memory()
        rows.append(
            _row(
                "freeze the memory (pagemap + copy)",
                freeze,
                changed_kib=state.changed_bytes // 1024,
                ranges=len(state.ranges),
            )
        )
        rows += _mapped_whole(box, session)

        blobs: list[bytes] = []
        snap = _time(
            lambda: blobs.append(session.snapshot()), repeat, lambda: session.run("acc.add(1)")
        )
        rows.append(_row("snapshot()", snap, vs_baseline=ratio(snap), bytes=len(blobs[-1])))
        data = blobs[-1]
        restore = _time(lambda: box.restore(data).close(), repeat)
        rows.append(_row("restore(bytes)", restore, vs_baseline=ratio(restore)))

        def fresh() -> None:
            with box.session() as new:
                new.run("result = 1 + 1")

        fresh_first = _time(fresh, repeat)
        rows.append(_row("fresh session(): first run", fresh_first, vs_baseline=ratio(fresh_first)))
        session.close()
    report(rows)


if __name__ == "__main__":
    main()
