"""Code mode: a sandbox run end to end, against Monty and native `python -c`, same run.

Figures: `run("result = 1 + 1")` p50/p99 with a ready pool (each run waits until the pool is
full again and 10 ms more, as an agent's spaced-out runs find it) and 60 back to back;
the per-run time by part (take an instance, the call: guest and mighty's Python around it,
release); Monty (pydantic-monty, a fresh session from its subprocess worker pool) when it is
installed (`pip install pydantic-monty`); native subprocess p50; runs per second with 1 and 2
threads; per-call overhead of a tool-calling loop, then the same loop timed inside one run
(beside the guest's raw import with pre-encoded arguments and a guest function), and the floor of
any call on a worker thread (a bare round trip between two threads, through locks and through
pipes). The machine's load average is printed too, and the process CPU per sync call (the
hand-off's bounded spin, ``MIGHTY_TOOL_SPIN_US``, costs CPU: see docs/sandbox.md). Last, pooled
instances made from the pool's warmed state against instances warmed in full (as before it),
interleaved in the same process (``--warm-state``: only that part); and instances rewound after
each run against instances closed after it, with Monty in the same process (``--rewind``: only
that part); ``print`` loops with the interpreter's line-buffered stdout against the unbuffered
one it had before (``--print``: only that part).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from _common import p, report, samples

import mighty.sandbox._tools as tools_module
from mighty.abi import Ok
from mighty.sandbox import Limits, Sandbox
from mighty.sandbox._results import _encode_inputs

Row = dict[str, object]


def add(a: int, b: int) -> int:
    return a + b


def _wait_full(sandbox: Sandbox, size: int) -> None:
    deadline = time.monotonic() + 30
    while sandbox.pool_ready < size and time.monotonic() < deadline:
        time.sleep(0.0005)


def _parts(sandbox: Sandbox, size: int) -> dict[str, object]:
    """Where a run's time goes: take, the call (the guest's own wall time inside it), release."""
    payload = _encode_inputs(None, keep=False, max_value=1 << 20)
    take: list[float] = []
    call: list[float] = []
    guest: list[float] = []
    release: list[float] = []
    pool = sandbox._pool
    for _ in range(200):
        _wait_full(sandbox, size)
        time.sleep(0.01)
        t0 = time.perf_counter()
        live = pool.take()
        assert live is not None
        t1 = time.perf_counter()
        result = live.execute("result = 1 + 1", payload, None, None)
        t2 = time.perf_counter()
        pool.release(live)
        t3 = time.perf_counter()
        take.append(t1 - t0)
        call.append(t2 - t1)
        guest.append(result.usage.wall_time)
        release.append(t3 - t2)
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    return {
        "name": "per run, by part (p50)",
        "take_ms": ms(take),
        "call_ms": ms(call),
        "of_which_guest_ms": ms(guest),
        "of_which_host_python_ms": round(ms(call) - ms(guest), 3),
        "release_ms": ms(release),
    }


def _monty() -> float | None:
    """Monty's fresh-session `1 + 1` p50 in seconds, or None when pydantic-monty is absent."""
    try:
        import pydantic_monty
    except ImportError:
        return None
    with pydantic_monty.Monty() as pool:

        def once() -> None:
            with pool.checkout() as session:
                session.feed_run("1 + 1")

        return p(samples(once, repeat=200, warmup=10), 0.5)


def _without_warm_state(sandbox: Sandbox, size: int) -> Sandbox:
    """``sandbox`` with its pool made to warm every instance in full, as before the warmed
    state (issue 40): for a comparison in the same process."""
    pool = sandbox._pool
    pool._warm_state = False
    _wait_full(sandbox, size)
    pool._warmed = None  # in case the state was taken before the line above
    for _ in range(size):  # drop what may have come from it
        live = pool.take()
        if live is not None:
            pool.release(live)
    _wait_full(sandbox, size)
    return sandbox


def _warm_state_rows() -> list[Row]:
    """Pooled instances from the warmed state against instances warmed in full, interleaved in
    one process: the CPU to make and free one (on this thread, as the pool thread does), a
    spaced run's wall and caller-thread CPU, and sustained runs per second with the process CPU
    per run (pool thread included)."""
    size = 4
    rows: list[Row] = [
        {"name": "machine load (1, 5, 15 min)", "loadavg": [round(x, 2) for x in os.getloadavg()]}
    ]
    with Sandbox(tools=[add], pool=size) as state, Sandbox(tools=[add], pool=size) as full:
        _without_warm_state(full, size)
        _wait_full(state, size)
        state.run("1")
        full.run("1")
        make: dict[str, list[float]] = {"state": [], "full": []}
        make_wall: dict[str, list[float]] = {"state": [], "full": []}
        spaced: dict[str, list[float]] = {"state": [], "full": []}
        spaced_cpu: dict[str, list[float]] = {"state": [], "full": []}
        boxes = {"state": state, "full": full}
        for _ in range(60):
            for label, box in boxes.items():
                c0, t0 = time.thread_time(), time.perf_counter()
                box._pool._make().close()
                make[label].append(time.thread_time() - c0)
                make_wall[label].append(time.perf_counter() - t0)
        for _ in range(100):
            for label, box in boxes.items():
                _wait_full(box, size)
                time.sleep(0.01)
                c0, t0 = time.thread_time(), time.perf_counter()
                box.run("result = 1 + 1")
                spaced[label].append(time.perf_counter() - t0)
                spaced_cpu[label].append(time.thread_time() - c0)
        rate: dict[str, list[float]] = {"state": [], "full": []}
        cpu: dict[str, list[float]] = {"state": [], "full": []}
        for _ in range(2):
            for label, box in boxes.items():
                _wait_full(box, size)
                count = 0
                c0, t0 = time.process_time(), time.perf_counter()
                while time.perf_counter() - t0 < 2.0:
                    box.run("result = 1 + 1")
                    count += 1
                took = time.perf_counter() - t0
                rate[label].append(count / took)
                cpu[label].append((time.process_time() - c0) / count)

    def ms(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    for label, name in (("full", "warmed in full each"), ("state", "from the warmed state")):
        rows.append(
            {
                "name": f"pooled instance, {name}",
                "make_and_free_cpu_ms": ms(make[label]),
                "make_and_free_wall_ms": ms(make_wall[label]),
                "spaced_run_p50_ms": ms(spaced[label]),
                "spaced_run_caller_cpu_ms": ms(spaced_cpu[label]),
                "runs_per_s_1_thread": round(statistics.mean(rate[label]), 1),
                "process_cpu_per_run_ms": ms(cpu[label]),
            }
        )
    rows.append(
        {
            "name": "warmed state over full warming (ratio)",
            "make_and_free_cpu": round(ms(make["state"]) / ms(make["full"]), 2),
            "spaced_run": round(ms(spaced["state"]) / ms(spaced["full"]), 2),
            "runs_per_s": round(statistics.mean(rate["state"]) / statistics.mean(rate["full"]), 2),
            "process_cpu_per_run": round(ms(cpu["state"]) / ms(cpu["full"]), 2),
        }
    )
    rows.append(
        {
            "name": "machine load after (1, 5, 15 min)",
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return rows


def _rewind_rows() -> list[Row]:
    """Pooled instances rewound after each run against instances closed after it (each made
    anew from the warmed state), interleaved in one process, with Monty's fresh session in the
    same process: a spaced run's wall and caller-thread CPU, 60 back to back, and sustained
    runs per second with the process CPU per run (pool thread included)."""
    size = 4
    rows: list[Row] = [
        {"name": "machine load (1, 5, 15 min)", "loadavg": [round(x, 2) for x in os.getloadavg()]}
    ]
    with Sandbox(tools=[add], pool=size) as rewound, Sandbox(tools=[add], pool=size) as closed:
        closed._pool._rewind = False  # before its first instance is made from the state
        boxes = {"rewound": rewound, "closed": closed}
        for box in boxes.values():
            _wait_full(box, size)
            box.run("1")
        labels = list(boxes)
        spaced: dict[str, list[float]] = {label: [] for label in labels}
        spaced_cpu: dict[str, list[float]] = {label: [] for label in labels}
        back: dict[str, list[float]] = {label: [] for label in labels}
        rate: dict[str, list[float]] = {label: [] for label in labels}
        cpu: dict[str, list[float]] = {label: [] for label in labels}
        for _ in range(100):
            for label, box in boxes.items():
                _wait_full(box, size)
                time.sleep(0.01)
                c0, t0 = time.thread_time(), time.perf_counter()
                box.run("result = 1 + 1")
                spaced[label].append(time.perf_counter() - t0)
                spaced_cpu[label].append(time.thread_time() - c0)
        for _ in range(3):
            for label, box in boxes.items():
                _wait_full(box, size)
                back[label].extend(
                    samples(lambda box=box: box.run("result = 1 + 1"), repeat=60, warmup=0)
                )
                _wait_full(box, size)
                count = 0
                c0, t0 = time.process_time(), time.perf_counter()
                while time.perf_counter() - t0 < 2.0:
                    box.run("result = 1 + 1")
                    count += 1
                took = time.perf_counter() - t0
                rate[label].append(count / took)
                cpu[label].append((time.process_time() - c0) / count)
        assert rewound._pool.rewinds > 0 and closed._pool.rewinds == 0
        own = {label: box._pool.made_by_callers for label, box in boxes.items()}
        monty = _monty()

    def ms(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    for label, name in (("closed", "closed after its run"), ("rewound", "rewound after its run")):
        rows.append(
            {
                "name": f"pooled instance, {name}",
                "spaced_run_p50_ms": ms(spaced[label]),
                "spaced_run_caller_cpu_ms": ms(spaced_cpu[label]),
                "back_to_back_p50_ms": ms(back[label]),
                "runs_per_s_1_thread": round(statistics.mean(rate[label]), 1),
                "process_cpu_per_run_ms": ms(cpu[label]),
                "runs_that_made_their_own_instance": own[label],
            }
        )
    rows.append(
        {
            "name": "rewound over closed (ratio)",
            "spaced_run": round(ms(spaced["rewound"]) / ms(spaced["closed"]), 2),
            "back_to_back": round(ms(back["rewound"]) / ms(back["closed"]), 2),
            "runs_per_s": round(
                statistics.mean(rate["rewound"]) / statistics.mean(rate["closed"]), 2
            ),
            "process_cpu_per_run": round(ms(cpu["rewound"]) / ms(cpu["closed"]), 2),
        }
    )
    if monty is not None:
        rows.append(
            {
                "name": "Monty fresh session '1 + 1', same process",
                "p50_ms": round(monty * 1e3, 3),
                "rewound_spaced_over_monty": round(ms(spaced["rewound"]) / (monty * 1e3), 2),
                "rewound_back_to_back_over_monty": round(ms(back["rewound"]) / (monty * 1e3), 2),
            }
        )
    else:
        rows.append({"name": "Monty", "note": "pydantic-monty not installed"})
    rows.append(
        {
            "name": "machine load after (1, 5, 15 min)",
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return rows


def main() -> None:
    if "--warm-state" in sys.argv:
        report(_warm_state_rows())
        return
    if "--rewind" in sys.argv:
        report(_rewind_rows())
        return
    if "--print" in sys.argv:
        report(_print_rows())
        return
    if "--floor" in sys.argv:
        report(_floor_rows())
        return
    rows: list[dict[str, object]] = [
        {"name": "machine load (1, 5, 15 min)", "loadavg": [round(x, 2) for x in os.getloadavg()]}
    ]
    size = 4
    with Sandbox(tools=[add], pool=size) as sandbox:
        sandbox.run("1")

        spaced_times: list[float] = []
        for _ in range(200):
            _wait_full(sandbox, size)
            time.sleep(0.01)  # runs spaced out, as an agent's are
            started = time.perf_counter()
            sandbox.run("result = 1 + 1")
            spaced_times.append(time.perf_counter() - started)
        back = samples(lambda: sandbox.run("result = 1 + 1"), repeat=60, warmup=0)
        rows.append(_parts(sandbox, size))
        monty = _monty()
        native = samples(
            lambda: subprocess.run([sys.executable, "-c", "result = 1 + 1"], check=True),
            repeat=30,
            warmup=3,
        )
        rows.append(
            {
                "name": "run('result = 1 + 1'), pool ready",
                "p50_ms": round(p(spaced_times, 0.5) * 1e3, 3),
                "p99_ms": round(p(spaced_times, 0.99) * 1e3, 3),
            }
        )
        rows.append(
            {
                "name": "run('result = 1 + 1'), 60 back to back",
                "p50_ms": round(p(back, 0.5) * 1e3, 3),
                "p99_ms": round(p(back, 0.99) * 1e3, 3),
            }
        )
        rows.append(
            {
                "name": "native subprocess python -c",
                "p50_ms": round(p(native, 0.5) * 1e3, 3),
                "sandbox_spare_over_native": round(p(spaced_times, 0.5) / p(native, 0.5), 3),
                "sandbox_b2b_over_native": round(p(back, 0.5) / p(native, 0.5), 3),
            }
        )
        if monty is not None:
            rows.append(
                {
                    "name": "Monty fresh session '1 + 1'",
                    "p50_ms": round(monty * 1e3, 3),
                    "sandbox_ready_over_monty": round(p(spaced_times, 0.5) / monty, 2),
                }
            )
        else:
            rows.append({"name": "Monty", "note": "pydantic-monty not installed"})
        per_second = {}
        for threads in (1, 2):
            count = [0]
            stop = time.perf_counter() + 3.0

            def loop(count: list[int] = count, stop: float = stop) -> None:
                while time.perf_counter() < stop:
                    sandbox.run("result = 1 + 1")
                    count[0] += 1

            workers = [threading.Thread(target=loop) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            per_second[threads] = count[0] / 3.0
        rows.append(
            {
                "name": "runs per second",
                "1_thread": round(per_second[1], 1),
                "2_threads": round(per_second[2], 1),
                "ratio_2_over_1": round(per_second[2] / per_second[1], 2),
            }
        )
        n = 100
        loop_code = f"for i in range({n}):\n    add(i, 1)"
        plain_code = f"def add2(a, b):\n    return a + b\nfor i in range({n}):\n    add2(i, 1)"
        tools = samples(lambda: sandbox.run(loop_code), repeat=30, warmup=3)
        plain = samples(lambda: sandbox.run(plain_code), repeat=30, warmup=3)
        per_call = (p(tools, 0.5) - p(plain, 0.5)) / n
        rows.append(
            {
                "name": f"tool-calling loop ({n} calls)",
                "run_p50_ms": round(p(tools, 0.5) * 1e3, 3),
                "same_loop_in_guest_p50_ms": round(p(plain, 0.5) * 1e3, 3),
                "per_call_overhead_us": round(per_call * 1e6, 1),
            }
        )
    rows.extend(_tool_call_parts(100))
    rows.extend(_handoff_floor())
    rows.extend(_warm_state_rows())
    rows.extend(_rewind_rows())
    rows.extend(_print_rows())
    rows.extend(_floor_rows())
    report(rows)


_RAW_INPUTS = b'{"globals": {}, "keep": false, "max-value": 1048576}'


class _RawInterpreter:
    """The sandbox's interpreter component called through raw wasmtime-py: its own engine
    (the code-generation settings mighty's engine has: fuel, epoch checks, NaN
    canonicalisation; wasmtime's own memory allocator, copy-on-write from its images), its
    own WASI (``add_wasip2``), the tools interface answered by plain Python functions that
    offer no tool. Compiled through wasmtime's own cache (``config.cache``): the first run
    compiles for ~10 s."""

    def __init__(self, path: str) -> None:
        import dataclasses

        import wasmtime
        from wasmtime import component

        from mighty.engine import SETTINGS

        config = dataclasses.replace(SETTINGS, host_memory=False).to_config()
        config.cache = True
        self.engine = wasmtime.Engine(config)
        self.component = component.Component.from_file(self.engine, path)
        self.linker = component.Linker(self.engine)
        self.linker.add_wasip2()
        with self.linker.root() as root, root.add_instance("mighty:sandbox/tools@0.1.0") as api:
            api.add_func("list-tools", lambda _store: "[]")
            api.add_func("call", lambda _store, _name, _args: None)
            api.add_func("start", lambda _store, _name, _args: 0)
            api.add_func("wait", lambda _store, _timeout: [])
            api.add_func("cancel", lambda _store, _handle: None)
        self.store, self.run_export = self.instantiate()

    def instantiate(self) -> tuple[Any, Any]:
        """A new store and instance, ready to call (fuel and the epoch deadline far off)."""
        import wasmtime

        store = wasmtime.Store(self.engine)
        store.set_fuel(1 << 62)
        store.set_epoch_deadline(1 << 62)
        store.set_wasi(wasmtime.WasiConfig())
        instance = self.linker.instantiate(store, self.component)
        return store, instance.get_func(store, "run")

    def run(self, code: str) -> None:
        outcome = self.run_export(self.store, code, _RAW_INPUTS)
        self.run_export.post_return(self.store)
        if not outcome.ok:
            raise RuntimeError(f"raw run failed: {outcome.message}")


def _floor_rows() -> list[Row]:
    """What the runtime itself takes: the sandbox's interpreter called through raw wasmtime-py
    (no gate, budget, recording or pool; one instance kept hot and reused, never rewound: the
    best case for it), beside the sandbox's pooled run and Monty's fresh session, the three
    interleaved run by run, spaced 10 ms apart and back to back; then raw wasmtime-py's
    instantiation of the interpreter and its first run, thread CPU (the floor of the creation
    target), interleaved with the sandbox making an instance from its warmed state."""
    from mighty._cachedir import cache_root
    from mighty.sandbox._interpreter import interpreter_component

    rows: list[Row] = [
        {"name": "machine load (1, 5, 15 min)", "loadavg": [round(x, 2) for x in os.getloadavg()]}
    ]
    path = cache_root() / "sandbox" / f"interpreter-{interpreter_component().sha256}.wasm"
    raw = _RawInterpreter(str(path))
    size = 4
    monty_pool: Any = None
    try:
        import pydantic_monty

        monty_pool = pydantic_monty.Monty().__enter__()
    except ImportError:
        pass

    def monty_once() -> None:
        with monty_pool.checkout() as session:
            session.feed_run("1 + 1")

    labels = ["sandbox", "raw wasmtime-py", *(["Monty"] if monty_pool is not None else [])]
    spaced: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[float]] = {label: [] for label in labels}
    back: dict[str, list[float]] = {label: [] for label in labels}
    made: dict[str, list[float]] = {
        "sandbox from its warmed state": [],
        "raw wasmtime-py": [],
        "raw wasmtime-py, instantiated only (no run)": [],
    }
    try:
        with Sandbox(pool=size) as sandbox:
            runs = {
                "sandbox": lambda: sandbox.run("result = 1 + 1"),
                "raw wasmtime-py": lambda: raw.run("result = 1 + 1"),
                "Monty": monty_once,
            }
            for label in labels:
                for _ in range(20):
                    runs[label]()
            for _ in range(200):
                for label in labels:
                    _wait_full(sandbox, size)
                    time.sleep(0.01)
                    c0, t0 = time.thread_time(), time.perf_counter()
                    runs[label]()
                    spaced[label].append(time.perf_counter() - t0)
                    cpu[label].append(time.thread_time() - c0)
            for _ in range(3):
                for label in labels:
                    _wait_full(sandbox, size)
                    back[label].extend(samples(runs[label], repeat=60, warmup=0))
            pool = sandbox._pool
            for _ in range(60):
                c0 = time.thread_time()
                warmed = pool._warmed
                assert warmed is not None
                live = pool._from_state(warmed)  # what a run that finds the pool empty does
                live.close()
                made["sandbox from its warmed state"].append(time.thread_time() - c0)
                c0 = time.thread_time()
                store, run_export = raw.instantiate()
                outcome = run_export(store, "result = 1 + 1", _RAW_INPUTS)
                run_export.post_return(store)
                del store, run_export, outcome
                made["raw wasmtime-py"].append(time.thread_time() - c0)
                c0 = time.thread_time()
                store, run_export = raw.instantiate()
                del store, run_export
                made["raw wasmtime-py, instantiated only (no run)"].append(time.thread_time() - c0)
    finally:
        if monty_pool is not None:
            monty_pool.__exit__(None, None, None)

    def ms(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    for label in labels:
        row: Row = {
            "name": f"'result = 1 + 1': {label}",
            "spaced_p50_ms": ms(spaced[label]),
            "spaced_thread_cpu_ms": ms(cpu[label]),
            "back_to_back_p50_ms": ms(back[label]),
        }
        if label != "raw wasmtime-py":
            row["spaced_over_raw"] = round(ms(spaced[label]) / ms(spaced["raw wasmtime-py"]), 2)
            row["back_to_back_over_raw"] = round(ms(back[label]) / ms(back["raw wasmtime-py"]), 2)
        rows.append(row)
    for label, times in made.items():
        rows.append(
            {
                "name": f"an interpreter instance made (and run once): {label}",
                "thread_cpu_p50_ms": ms(times),
            }
        )
    rows.append(
        {
            "name": "machine load after (1, 5, 15 min)",
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    )
    return rows


_UNBUFFERED = "import sys\nsys.stdout.reconfigure(line_buffering=False, write_through=True)\n"
"""Puts back the stdout componentize-py starts CPython with (unbuffered, every write crossing
into the host), for the baseline of `_print_rows` in the same run: the pool rewinds each
instance after its run, so the next run has the interpreter's line-buffered stdout again."""


def _print_rows() -> list[Row]:
    """``print`` loops in one run: the interpreter's line-buffered stdout against the unbuffered
    one it had before (the same sandbox, the same loop, interleaved), and the loop with its
    prints replaced by appends to a list (what the loop costs without output)."""
    n = 2000
    loops = {
        "print(i)": (
            f"for i in range({n}):\n    print(i)",
            f"o = []\nfor i in range({n}):\n    o.append(i)",
        ),
        "print('x', i, 'y')": (
            f"for i in range({n}):\n    print('x', i, 'y')",
            f"o = []\nfor i in range({n}):\n    o.append(('x', i, 'y'))",
        ),
    }
    rows: list[Row] = [
        {
            "name": "print loops: load (1, 5, 15 min)",
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }
    ]
    with Sandbox(pool=2, limits=Limits(timeout=60)) as box:
        box.run("1")
        for name, (code, silent) in loops.items():
            timed: dict[str, list[float]] = {"line": [], "unbuffered": [], "silent": []}
            cpu: dict[str, list[float]] = {"line": [], "unbuffered": []}
            for _ in range(15):
                for kind, text in (
                    ("line", code),
                    ("unbuffered", _UNBUFFERED + code),
                    ("silent", silent),
                ):
                    _wait_full(box, 2)
                    started, thread = time.perf_counter(), time.thread_time()
                    result = box.run(text)
                    assert result.ok, result.error
                    if kind in cpu:
                        cpu[kind].append(time.thread_time() - thread)
                    timed[kind].append(time.perf_counter() - started)
            line, raw = statistics.median(timed["line"]), statistics.median(timed["unbuffered"])
            rows.append(
                {
                    "name": f"{n} x {name} in one run, p50",
                    "line_buffered_ms": round(line * 1e3, 2),
                    "unbuffered_ms": round(raw * 1e3, 2),
                    "ratio_line_over_unbuffered": round(line / raw, 3),
                    "per_print_us_line_unbuffered": [
                        round(line / n * 1e6, 2),
                        round(raw / n * 1e6, 2),
                    ],
                    "thread_cpu_ms_line_unbuffered": [
                        round(statistics.median(cpu["line"]) * 1e3, 2),
                        round(statistics.median(cpu["unbuffered"]) * 1e3, 2),
                    ],
                    "without_print_ms": round(statistics.median(timed["silent"]) * 1e3, 2),
                }
            )
    return rows


_IN_RUN = """
import time
from wit_world.imports import tools as _t
_p = b'{{"args":[1,1],"kwargs":{{}}}}'
def add2(a, b):
    return a + b
_c = time.perf_counter
for i in range(10):  # the first calls touch fresh pages of the instance: not in the figures
    add(i, 1)
    _t.call('add', _p)
    add2(i, 1)
stub, raw, plain = [], [], []
for i in range({n}):
    # The three, one after another, each timed alone: a preemption (this machine is shared)
    # lands in one sample, which the medians leave out.
    t0 = _c()
    add(i, 1)
    t1 = _c()
    _t.call('add', _p)
    t2 = _c()
    add2(i, 1)
    t3 = _c()
    stub.append(t1 - t0)
    raw.append(t2 - t1)
    plain.append(t3 - t2)
result = [sorted(x)[len(x) // 2] for x in (stub, raw, plain)]
"""


def _in_run(n: int) -> tuple[float, float]:
    """Per-call seconds (the median over 30 runs of each run's median call) of the stub and of
    the raw import, each minus a guest function's call (and the clock's). No pool: each run
    makes its instance before it starts, so no refill runs beside the calls (it competes for
    the CPU and the GIL)."""
    code = _IN_RUN.format(n=n)
    stub: list[float] = []
    raw: list[float] = []
    with Sandbox(tools=[add], pool=0, limits=Limits(tool_calls=2 * n + 20)) as sandbox:
        for index in range(33):
            result = sandbox.run(code)
            assert result.ok, result.error
            calls, imports, plain = result.value
            if index >= 3:
                stub.append(calls - plain)
                raw.append(imports - plain)
    return statistics.median(stub), statistics.median(raw)


def _tool_call_parts(n: int) -> list[Row]:
    """Where a sync call goes, timed call by call inside a run by the guest's clock (no run
    start or pool refill in the figure): a tool call, the guest's raw import with the arguments
    encoded once (no stub, no JSON in the guest), and a call of a guest function. Then
    the floors, with the host's side of the call replaced: answering at once (what is left is
    the guest's import and the gate), and the tool run on the calling thread (no hand-off to a
    worker, so no timeout: never what the sandbox does)."""
    us = lambda x: round(x * 1e6, 1)  # noqa: E731
    cpu, wall = time.process_time(), time.perf_counter()
    stub, raw = _in_run(n)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    calls = 33 * 2 * (n + 10)  # each run: the stub's and the raw import's calls
    rows: list[Row] = [
        {
            "name": f"sync tool call in one run ({n} calls, 30 runs)",
            "per_call_us": us(stub),
            "raw_import_pre_encoded_us": us(raw),
            "stub_share_us": us(stub - raw),
            "target_us": 60,
        },
        {
            # The spin's cost shows here: both threads' CPU over the runs' wall time (the
            # runs' own start and guest work included, the same on either side of an A/B).
            "name": "the same runs: process CPU and wall per tool call",
            "cpu_us": us(cpu / calls),
            "wall_us": us(wall / calls),
            "cpu_over_wall": round(cpu / wall, 2),
            "handoff_spin_us": getattr(tools_module, "HANDOFF_SPIN_NS", 0) / 1000,
        },
    ]
    real_call = tools_module.ToolHost.call

    def at_once(host: Any, ctx: Any, name: str, payload: bytes) -> Ok:
        return Ok(b"2")

    def on_this_thread(host: Any, ctx: Any, name: str, payload: bytes) -> Any:
        tool, bound = host._prepare(name, payload)
        return tools_module._call_sync(tool, bound, (1, host._context(tool, host.timeout)))

    try:
        tools_module.ToolHost.call = at_once  # type: ignore[method-assign]
        stub_floor, raw_floor = _in_run(n)
        sizes = _payload_sizes()
        tools_module.ToolHost.call = on_this_thread  # type: ignore[method-assign]
        stub_inline, raw_inline = _in_run(n)
    finally:
        tools_module.ToolHost.call = real_call  # type: ignore[method-assign]
    rows.append(
        {
            "name": "floor: the host answers at once",
            "per_call_us": us(stub_floor),
            "raw_import_us": us(raw_floor),
        }
    )
    rows.append(
        {
            "name": "floor: the tool on the calling thread",
            "per_call_us": us(stub_inline),
            "raw_import_us": us(raw_inline),
            "hand_off_share_us": us(stub - stub_inline),
        }
    )
    rows.append({"name": "floor: the import by argument size (host at once)", **sizes})
    return rows


_SIZES = """
import time
from wit_world.imports import tools as _t
_c = time.perf_counter
def median(payload):
    times = []
    for i in range(40):
        t0 = _c()
        _t.call('add', payload)
        times.append(_c() - t0)
    return sorted(times)[20]
result = [median(b'x' * size) for size in (1, 1000, 10000)]
"""


def _payload_sizes() -> dict[str, object]:
    """The raw import's cost by the size of its ``list<u8>`` argument (the host answering at
    once): wasmtime's component values carry a ``list<u8>`` as one value per byte."""
    runs: list[list[float]] = []
    with Sandbox(tools=[add], pool=0, limits=Limits(tool_calls=200)) as sandbox:
        for _ in range(10):
            result = sandbox.run(_SIZES)
            assert result.ok, result.error
            runs.append(result.value)
    medians = [statistics.median(run[i] for run in runs) for i in range(3)]
    return {
        "bytes_1_us": round(medians[0] * 1e6, 1),
        "bytes_1000_us": round(medians[1] * 1e6, 1),
        "bytes_10000_us": round(medians[2] * 1e6, 1),
        "ns_per_byte": round((medians[2] - medians[0]) / 9999 * 1e9, 1),
    }


def _handoff_floor() -> list[Row]:
    """The floor of any sync call on a worker thread: a bare round trip between two Python
    threads, through two locks (futex wake-ups) and through two pipes (sync wake-ups)."""

    def locks(rounds: int) -> float:
        go, back = threading.Lock(), threading.Lock()
        go.acquire()
        back.acquire()

        def peer() -> None:
            for _ in range(rounds):
                go.acquire()
                back.release()

        thread = threading.Thread(target=peer, daemon=True)
        thread.start()
        started = time.perf_counter()
        for _ in range(rounds):
            go.release()
            back.acquire()
        took = time.perf_counter() - started
        thread.join()
        return took / rounds

    def pipes(rounds: int) -> float:
        go_r, go_w = os.pipe()
        back_r, back_w = os.pipe()

        def peer() -> None:
            for _ in range(rounds):
                os.read(go_r, 1)
                os.write(back_w, b"x")

        thread = threading.Thread(target=peer, daemon=True)
        thread.start()
        started = time.perf_counter()
        for _ in range(rounds):
            os.write(go_w, b"x")
            os.read(back_r, 1)
        took = time.perf_counter() - started
        thread.join()
        for fd in (go_r, go_w, back_r, back_w):
            os.close(fd)
        return took / rounds

    def bells(rounds: int, spin: int, gap: float) -> tuple[float, float]:
        """Round trip through the pool's bells (``wait(ring=other)``, both sides), the caller
        busy for ``gap`` seconds between two (as the code is between two calls); returns
        seconds per round trip, minus the gap, and the peer thread's CPU per round trip."""
        here, there = tools_module._Bell(), tools_module._Bell()
        cpu: list[float] = []

        def peer() -> None:
            started = time.thread_time()
            assert there.wait(spin, -1)
            for n in range(rounds):
                if n == rounds - 1:
                    here.ring()
                else:
                    there.wait(spin, -1, here)
            cpu.append(time.thread_time() - started)

        thread = threading.Thread(target=peer, daemon=True)
        thread.start()
        started = time.perf_counter()
        for _ in range(rounds):
            here.wait(spin, 10**10, there)
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
        took = time.perf_counter() - started
        thread.join()
        here.close()
        there.close()
        return took / rounds - gap, cpu[0] / rounds

    lock_times = [locks(2000) for _ in range(7)]
    pipe_times = [pipes(2000) for _ in range(7)]
    rows: list[Row] = [
        {
            "name": "floor: thread round trip (2000 each, 7 x)",
            "locks_p50_us": round(statistics.median(lock_times) * 1e6, 1),
            "locks_max_us": round(max(lock_times) * 1e6, 1),
            "pipes_p50_us": round(statistics.median(pipe_times) * 1e6, 1),
            "pipes_max_us": round(max(pipe_times) * 1e6, 1),
        }
    ]
    spin = getattr(tools_module, "HANDOFF_SPIN_NS", None)
    if spin is not None:  # the tree has the pool's bells (and maybe their spin)
        row: Row = {"name": "floor: bells' round trip, 20 us of work between (2000, 5 x)"}
        for label, value in (("spin", spin), ("no_spin", 0)):
            runs = sorted(bells(2000, value, 20e-6) for _ in range(5))
            row[f"{label}_p50_us"] = round(runs[2][0] * 1e6, 1)
            row[f"{label}_peer_cpu_us"] = round(runs[2][1] * 1e6, 1)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
