"""Cheap instances: copy-on-write memory images vs copying the data segments, vs raw wasmtime.

Run: .venv/bin/python benchmarks/bench_instances.py [--json] [--quick]

1. The interpreter component (mighty.sandbox, the ~21 MB componentize-py CPython guest), in one
   process, the three variants interleaved round by round so drift hits all of them alike:
   - mighty, images on (``Component.load(path)``, the default);
   - mighty, ``share_memory=False`` (wasmtime copies the ~15.6 MB of data segments);
   - raw wasmtime-py on the same component bytes, with mighty's engine settings minus the host
     memory creator, i.e. wasmtime's own default (on-demand, copy-on-write) allocator; WASI p2
     linked, the remaining imports defined as traps (instantiation calls none of them).
   Instantiate p50/p99 (target: mighty images <= 1.2x raw) and close p50/p99 of each.
2. CPython agents (examples/agents/counter.py) in a `mighty.agents.Runtime`, each variant in a
   fresh child process: spawn N agents, send each one message, then measure VmRSS and the PSS
   and Private_Dirty of /proc/self/smaps_rollup against the figures before the spawns.
   RSS counts a shared image page once per mapping that touched it, so it overstates what the
   images cost; PSS divides shared pages among their mappings and is the honest total.
   Images on with 1,000 agents (targets: <= 1 MB per agent, <= 2 GB total RSS) and 50 agents;
   ``share_memory=False`` with 50 agents (the baseline; 1,000 of those would need ~15 GB).

3. A whole interpreter instance's life (made, first call, closed) with recycled memories on
   and off in the same run (the baseline), fresh from the image and from a warmed state:
   thread CPU and page faults. ``--lifecycle`` skips part 2.

``--quick`` runs fewer samples and 200 agents instead of 1,000 (a smoke test).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import wasmtime
from _common import ROOT, p, report
from wasmtime import component as wc

QUICK = "--quick" in sys.argv


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def memory() -> dict[str, int]:
    """VmRSS, and Pss / Private_Dirty / Rss of smaps_rollup, in bytes."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss"] = int(line.split()[1]) * 1024
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in {"Pss", "Private_Dirty", "Shared_Clean", "Private_Clean"}:
            out[key.lower()] = int(rest.split()[0]) * 1024
    return out


# -- 1. the interpreter component -----------------------------------------------------------


def _raw(path: str) -> tuple[wasmtime.Engine, wc.Component, wc.Linker]:
    """The component compiled for a raw engine (cached in the temp dir: compiling takes ~7 s)."""
    from mighty.engine._engine import EngineSettings

    settings = EngineSettings(host_memory=False)
    engine = wasmtime.Engine(settings.to_config())
    data = Path(path).read_bytes()
    key = hashlib.sha256(data).hexdigest()[:24] + "-" + settings.fingerprint
    cached = Path(tempfile.gettempdir()) / "mighty-bench" / f"raw-{key}.cwasm"
    if cached.exists():
        component = wc.Component.deserialize_file(engine, str(cached))
    else:
        component = wc.Component(engine, data)
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(component.serialize())
        tmp.replace(cached)
    linker = wc.Linker(engine)
    linker.add_wasip2()
    linker.define_unknown_imports_as_traps(component)
    return engine, component, linker


def interpreter_rows() -> list[dict[str, object]]:
    from mighty import Component, Instance
    from mighty.budget import Budget
    from mighty.budget._budget import Meter
    from mighty.engine import get_engine
    from mighty.sandbox import interpreter_component
    from mighty.sandbox._pool import _gate

    shared = interpreter_component()
    assert shared.images, "the interpreter component got no memory images"
    path = shared.origin
    started = time.perf_counter()
    Component.load(path)
    load_images = time.perf_counter() - started
    Component.load(path, share_memory=False)  # compiled (and cached) before timing
    started = time.perf_counter()
    copying = Component.load(path, share_memory=False)
    load_copying = time.perf_counter() - started
    assert not copying.images
    gate = _gate()
    engine, raw_component, linker = _raw(path)

    def mighty(component: Component) -> tuple[float, float]:
        t0 = time.perf_counter()
        instance = Instance(component, gate=gate)
        t1 = time.perf_counter()
        instance.close()
        return t1 - t0, time.perf_counter() - t1

    def raw() -> tuple[float, float]:
        t0 = time.perf_counter()
        store = wasmtime.Store(engine)
        store.set_fuel(1 << 62)
        store.set_epoch_deadline(1 << 40)
        store.set_wasi(wasmtime.WasiConfig())
        linker.instantiate(store, raw_component)
        t1 = time.perf_counter()
        store.close()
        return t1 - t0, time.perf_counter() - t1

    linker_mighty = gate.linker_for(get_engine(), shared.imports, shared.origin, shared.modules)

    def bare() -> tuple[float, float]:
        # mighty's engine, memory creator and images, without the Instance wrapper (gate
        # context, meter, signal shield): where the time of "images" goes.
        t0 = time.perf_counter()
        meter = Meter(Budget())
        meter.store.set_fuel(1 << 62)
        meter.store.set_epoch_deadline(1 << 40)
        with shared.instantiating(meter.account):
            linker_mighty.instantiate(meter.store, shared.wasm)
        t1 = time.perf_counter()
        meter.store.close()
        return t1 - t0, time.perf_counter() - t1

    variants = {
        "images": lambda: mighty(shared),
        "bare": bare,
        "copying": lambda: mighty(copying),
        "raw": raw,
    }
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in variants}
    for fn in variants.values():
        for _ in range(10):
            fn()
    rounds, per_round = (4, 25) if QUICK else (10, 60)
    for _ in range(rounds):
        for name, fn in variants.items():
            for _ in range(per_round):
                made, closed = fn()
                times[name][0].append(made)
                times[name][1].append(closed)
    ms = 1e3
    img, cpy, raw_t, bare_t = times["images"], times["copying"], times["raw"], times["bare"]
    return [
        {
            "name": "interpreter load from compiled cache (s)",
            "images_s": round(load_images, 3),
            "copying_s": round(load_copying, 3),
            "ratio": round(load_images / load_copying, 2),
            "image_mb": round(sum(i.length for i in shared.images) / 1e6, 1),
            "load": load(),
        },
        {
            "name": "interpreter instantiate, images / raw CoW",
            "ratio_p50": round(p(img[0], 0.5) / p(raw_t[0], 0.5), 2),
            "ratio_p99": round(p(img[0], 0.99) / p(raw_t[0], 0.99), 2),
            "images_p50_ms": round(p(img[0], 0.5) * ms, 3),
            "images_p99_ms": round(p(img[0], 0.99) * ms, 3),
            "raw_p50_ms": round(p(raw_t[0], 0.5) * ms, 3),
            "raw_p99_ms": round(p(raw_t[0], 0.99) * ms, 3),
            "bare_p50_ms": round(p(bare_t[0], 0.5) * ms, 3),
            "ratio_bare_raw_p50": round(p(bare_t[0], 0.5) / p(raw_t[0], 0.5), 2),
            "n": len(img[0]),
            "target": "ratio <= 1.2",
            "met": p(img[0], 0.5) / p(raw_t[0], 0.5) <= 1.2,
            "load": load(),
        },
        {
            "name": "interpreter instantiate, images / copying",
            "ratio_p50": round(p(img[0], 0.5) / p(cpy[0], 0.5), 3),
            "ratio_p99": round(p(img[0], 0.99) / p(cpy[0], 0.99), 3),
            "copying_p50_ms": round(p(cpy[0], 0.5) * ms, 3),
            "copying_p99_ms": round(p(cpy[0], 0.99) * ms, 3),
            "load": load(),
        },
        {
            "name": "interpreter close, images / raw / copying",
            "images_p50_ms": round(p(img[1], 0.5) * ms, 3),
            "images_p99_ms": round(p(img[1], 0.99) * ms, 3),
            "raw_p50_ms": round(p(raw_t[1], 0.5) * ms, 3),
            "raw_p99_ms": round(p(raw_t[1], 0.99) * ms, 3),
            "copying_p50_ms": round(p(cpy[1], 0.5) * ms, 3),
            "copying_p99_ms": round(p(cpy[1], 0.99) * ms, 3),
            "ratio_images_raw_p50": round(p(img[1], 0.5) / p(raw_t[1], 0.5), 2),
            "ratio_images_copying_p50": round(p(img[1], 0.5) / p(cpy[1], 0.5), 3),
            "load": load(),
        },
    ]


def lifecycle_rows() -> list[dict[str, object]]:
    """A whole instance's life, made, first call, closed, with recycled memories on and off
    (``mighty.engine._memory``: a freed memory made from a state or an image serves the next
    one made alike), alternated round by round in one process: the interpreter fresh from its
    image (its start-up and a constant run: ``_Live.warm``), and made from the pool's warmed
    state (a reseed run: ``_Live.reseed``). Thread CPU, the main thread's."""
    import resource

    from mighty.engine import _memory
    from mighty.sandbox import Sandbox
    from mighty.sandbox import _pool as sandbox_pool

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt

    with Sandbox(pool=1) as box:
        box.run("1")
        deadline = time.monotonic() + 120
        while box._pool._warmed is None:
            assert time.monotonic() < deadline, "the pool never captured its warmed state"
            time.sleep(0.01)
        state = box._pool._warmed
        config = box._pool._config

        def from_image() -> tuple[float, int]:
            c0, f0 = time.thread_time(), faults()
            live = sandbox_pool._Live(config)
            live.warm()
            live.close()
            return time.thread_time() - c0, faults() - f0

        def from_state() -> tuple[float, int]:
            c0, f0 = time.thread_time(), faults()
            live = sandbox_pool._Live(config, memory=state)
            live.reseed()
            live.close()
            return time.thread_time() - c0, faults() - f0

        kinds = {"image": from_image, "state": from_state}
        cpu: dict[tuple[str, bool], list[float]] = {}
        flt: dict[tuple[str, bool], list[int]] = {}
        rounds, per_round = (4, 10) if QUICK else (8, 25)
        try:
            for _ in range(rounds):
                for reuse in (False, True):
                    _memory._reuse_enabled = reuse
                    for kind, fn in kinds.items():
                        fn()  # the first of a round may find nothing kept
                        for _ in range(per_round):
                            took, count = fn()
                            cpu.setdefault((kind, reuse), []).append(took)
                            flt.setdefault((kind, reuse), []).append(count)
        finally:
            _memory._reuse_enabled = True
    rows: list[dict[str, object]] = []
    for kind, what in (
        ("image", "fresh from the image, warm run"),
        ("state", "from the warmed state, reseed run"),
    ):
        on, off = cpu[(kind, True)], cpu[(kind, False)]
        rows.append(
            {
                "name": f"interpreter made + first call + closed, {what}: reuse on / off",
                "ratio_cpu_p50": round(p(on, 0.5) / p(off, 0.5), 2),
                "reuse_cpu_p50_ms": round(p(on, 0.5) * 1e3, 3),
                "no_reuse_cpu_p50_ms": round(p(off, 0.5) * 1e3, 3),
                "reuse_faults_p50": int(p([float(f) for f in flt[(kind, True)]], 0.5)),
                "no_reuse_faults_p50": int(p([float(f) for f in flt[(kind, False)]], 0.5)),
                "n": len(on),
                "load": load(),
            }
        )
    return rows


# -- 2. idle CPython agents ------------------------------------------------------------------


def _counter() -> Path:
    from mighty.build import build_component

    out = Path(tempfile.mkdtemp()) / "counter.wasm"
    build_component(
        ROOT / "examples" / "agents" / "counter.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


def agents_child(path: str, share: bool, count: int) -> dict[str, object]:
    """In a fresh process: spawn ``count`` counters, one message each, memory before/after."""
    from mighty import Component
    from mighty.agents import AgentType, Runtime

    component = Component.load(path, share_memory=share)
    assert bool(component.images) == share
    with Runtime(workers=2) as rt:
        rt.register(AgentType("counter", component))
        # One agent first, so one-time costs (linker, gate, first image faults) are not counted.
        warm = rt.spawn("counter")
        rt.ask(warm, "incr", {"by": 1})
        gc.collect()
        before = memory()
        spawns = []
        addresses = []
        started = time.perf_counter()
        for _ in range(count):
            t0 = time.perf_counter()
            addresses.append(rt.spawn("counter"))
            spawns.append(time.perf_counter() - t0)
        spawn_total = time.perf_counter() - started
        futures = [rt.ask_future(a, "incr", {"by": 1}) for a in addresses]
        for future in futures:
            future.result(120)
        gc.collect()
        after = memory()
    return {
        "count": count,
        "spawn_total_s": spawn_total,
        "spawn_p50": p(spawns, 0.5),
        "spawn_p99": p(spawns, 0.99),
        "before": before,
        "after": after,
        "load": load(),
    }


def _run_child(path: Path, share: bool, count: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--agents-child", str(path), str(int(share)), str(count)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def agent_rows() -> list[dict[str, object]]:
    path = _counter()
    from mighty import Component

    Component.load(path)  # compile both forms into the cache before any child runs
    Component.load(path, share_memory=False)
    big = 200 if QUICK else 1000
    runs = {
        "images_big": _run_child(path, True, big),
        "images_50": _run_child(path, True, 50),
        "copying_50": _run_child(path, False, 50),
    }

    def per(run: dict[str, Any], key: str) -> float:
        return (run["after"][key] - run["before"][key]) / run["count"]

    mb = 1e6
    rows: list[dict[str, object]] = []
    for key, label in (("rss", "RSS"), ("pss", "PSS"), ("private_dirty", "Private_Dirty")):
        rows.append(
            {
                "name": f"idle CPython agent after 1 message, {label} delta / N (MB)",
                "ratio_images_copying_at_50": round(
                    per(runs["images_50"], key) / per(runs["copying_50"], key), 3
                ),
                f"images_{big}": round(per(runs["images_big"], key) / mb, 3),
                "images_50": round(per(runs["images_50"], key) / mb, 3),
                "copying_50": round(per(runs["copying_50"], key) / mb, 3),
                "target": "<= 1 MB",
                "met": per(runs["images_big"], key) <= mb,
                "load": runs["images_big"]["load"],
            }
        )
    big_run = runs["images_big"]
    after = big_run["after"]
    spawn_total = big_run["spawn_total_s"]
    rows.append(
        {
            "name": f"{big} live CPython agents (images): process total",
            "rss_gb": round(after["rss"] / 1e9, 3),
            "pss_gb": round(after["pss"] / 1e9, 3),
            "target": "RSS <= 2 GB",
            "met": after["rss"] <= 2e9,
            f"copying_extrapolated_rss_gb_for_{big}": round(
                per(runs["copying_50"], "rss") * big / 1e9, 1
            ),
            "load": big_run["load"],
        }
    )
    copy_run, img50 = runs["copying_50"], runs["images_50"]
    ratio = img50["spawn_p50"] / copy_run["spawn_p50"]
    rows.append(
        {
            "name": f"spawn {big} CPython agents (images)",
            "total_s": round(spawn_total, 2),
            "per_agent_p50_ms": round(big_run["spawn_p50"] * 1e3, 2),
            "per_agent_p99_ms": round(big_run["spawn_p99"] * 1e3, 2),
            "ratio_p50_images_copying_at_50": round(ratio, 3),
            "copying_p50_ms_at_50": round(copy_run["spawn_p50"] * 1e3, 2),
            "images_p50_ms_at_50": round(img50["spawn_p50"] * 1e3, 2),
            "load": big_run["load"],
        }
    )
    return rows


def main() -> None:
    if "--agents-child" in sys.argv:
        at = sys.argv.index("--agents-child")
        path, share, count = sys.argv[at + 1 : at + 4]
        print(json.dumps(agents_child(path, share == "1", int(count))))
        return
    rows = [{"name": "machine", "loadavg_1_5_15": load(), "cpus": os.cpu_count()}]
    rows += interpreter_rows()
    rows += lifecycle_rows()
    if "--lifecycle" not in sys.argv:
        rows += agent_rows()
    rows.append({"name": "machine at the end", "loadavg_1_5_15": load()})
    report(rows)


if __name__ == "__main__":
    main()
