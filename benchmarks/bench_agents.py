"""Agent runtime costs, each against a baseline measured in the same run.

Run: .venv/bin/python benchmarks/bench_agents.py [--json]

- per-message overhead: a host `ask` to the WAT echo agent through the runtime (mailbox,
  scheduler, protocol, future) vs calling its `handle` export directly on an Instance (target
  <= 1.3x). Three times: with a per-message budget timeout (1 s) within the ask's timeout, so
  the asking thread runs the idle agent's turn itself (``AgentProcess.run_here``); with the
  defaults (budget 10 s, an ask waiting for the budget plus a second: in place too, since the
  ask default changed; an older tree's 5 s default went through a worker); and with the
  default budget and an explicit 5 s ask timeout (shorter than the budget: via a worker).
- guest-to-guest ping-pong: asks between two CPython agents, round trips per second (target
  >= 8,000), with a 4 s budget and with the default one (the SDK's ask without a timeout waits
  the asker's own deadline, and a target whose budget ends within half a second of it runs in
  place: both in place), and with the default budget and an explicit 5 s ask timeout (shorter
  than the target's budget: via workers). An older tree's SDK default was 5 s, so its default
  row went via workers; ``--against`` builds the guest from this tree's SDK for both trees.
- one-way sends from the host to 100 WAT echo agents on 2 workers: messages handled per second
  (target >= 25,000), against direct ``handle`` calls on one thread in the same run; and the
  same sends on 1 worker (two workers must not handle fewer: light work stays on one worker).
- ``--against REV``: the message rows above also for the tree at git revision REV (its
  ``host/`` unpacked into a temporary directory, its C extensions compiled there, run in a
  child process), for an A/B in one run. ``--messages`` runs only the message rows.
- CPU-bound throughput with 1 vs 2 workers (target >= 1.8x on 2 cores).
- resident memory per idle agent after one handled message: CPython agent with copy-on-write
  memory images (the default) vs the same component loaded with ``share_memory=False``, and the
  WAT agent. RSS counts a shared image page once per mapping that touched it; PSS (from
  /proc/self/smaps_rollup) shares it out and is the honest figure. bench_instances.py does
  1,000 CPython agents, each variant in a fresh process.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

from _common import FIXTURES, ROOT, median, report, samples, wasm_tools

from mighty import Component, Instance, MightyError
from mighty.agents import AgentType, Runtime
from mighty.budget import Budget
from mighty.build import build_component

ROUNDS = 3
"""Each message figure is the median of this many rounds, the variants interleaved."""

SPIN = """
    (func $spin (local $i i32)
      (loop $l
        local.get $i i32.const 1 i32.add local.tee $i
        i32.const 3000000 i32.lt_u br_if $l))"""


def _component(text: str) -> Component:
    import subprocess

    done = subprocess.run(
        [wasm_tools(), "parse", "-", "-o", "/dev/stdout"],
        input=text.encode(),
        capture_output=True,
        check=True,
    )
    return Component.load(done.stdout)


def _memory() -> tuple[int, int]:
    """(VmRSS, Pss) of this process, in bytes."""
    rss = pss = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss


def _pingpong() -> tuple[Path, Component]:
    out = Path(tempfile.mkdtemp()) / "pingpong.wasm"
    build_component(
        ROOT / "examples" / "agents" / "pingpong.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out, Component.load(out)


def _cpu(fn: Callable[[], object], repeat: int) -> float:
    """CPU seconds of the whole process (every thread: workers too) per call of ``fn``. On a
    shared machine this is the steadier figure: waiting for a CPU costs no CPU time."""
    started = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - started) / repeat


def _ask_seconds(
    echo: Component, budget: Budget, repeat: int, timeout: float | None = None
) -> list[float]:
    """[direct ``handle`` call, host ask through the runtime]: wall medians, then CPU means."""
    message = {"name": "x", "body": b"\x01"}
    with Runtime(workers=2) as rt:
        direct = Instance(echo, gate=rt.gate)
        rt.register(AgentType("echo", echo, budget=budget))
        address = rt.spawn("echo")

        def call() -> object:
            return direct.call("handle", "host", message)

        def ask() -> object:
            return (
                rt.ask(address, "x", 1)
                if timeout is None
                else rt.ask(address, "x", 1, timeout=timeout)
            )

        floor = median(samples(call, repeat=repeat))
        via = median(samples(ask, repeat=repeat))
        return [floor, via, _cpu(call, repeat), _cpu(ask, repeat)]


def _pingpong_rate(
    component: Component, budget: Budget, rounds: int, timeout: float | None = None
) -> list[float]:
    """[round trips per wall second, per CPU second, wasm fuel per round trip (both guests:
    their own work, load-independent)] between two CPython agents (``timeout``: the guest's
    ask timeout, None for the SDK's default)."""
    with Runtime(workers=2) as rt:
        rt.register(AgentType("pp", component, budget=budget))
        rt.spawn("pp", name="a")
        rt.spawn("pp", name="b")
        start = (
            {"peer": "b", "rounds": 50}
            if timeout is None
            else {"peer": "b", "rounds": 50, "timeout": timeout}
        )
        rt.ask("a", "start", start, timeout=60)
        fuel = sum(rt.process(name).stats.fuel for name in ("a", "b"))
        started, cpu = time.perf_counter(), time.process_time()
        rt.ask("a", "start", {**start, "rounds": rounds}, timeout=60)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        fuel = sum(rt.process(name).stats.fuel for name in ("a", "b")) - fuel
        return [rounds / wall, rounds / cpu, fuel / rounds]


def _send_rates(echo: Component, count: int, workers: int = 2) -> list[float]:
    """[direct ``handle`` calls per second on one thread, host sends to 100 agents on
    ``workers`` workers handled per second (from the first send until every mailbox is empty),
    the same two per CPU second]."""
    message = {"name": "x", "body": b"\x01"}
    with Runtime(workers=workers) as rt:
        direct = Instance(echo, gate=rt.gate)
        for _ in range(100):
            direct.call("handle", "host", message)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            direct.call("handle", "host", message)
        calls = count / (time.perf_counter() - started)
        calls_cpu = count / (time.process_time() - cpu)
        rt.register(AgentType("echo", echo))
        agents = [rt.spawn("echo") for _ in range(100)]
        for address in agents:
            rt.send(address, "x", 1)
        assert rt.drain(60)
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            rt.send(agents[i % 100], "x", 1)
        if not rt.drain(120):
            raise SystemExit("the sends were not all handled within 120 s")
        sends = count / (time.perf_counter() - started)
        sends_cpu = count / (time.process_time() - cpu)
        handled = sum(p.stats.handled for p in rt.agents())
        assert handled == count + 100, handled
    return [calls, sends, calls_cpu, sends_cpu]


def message_runs(quick: bool = False, rounds: int = ROUNDS) -> dict[str, list[Any]]:
    """``rounds`` rounds of the message-path figures, each round running every variant."""
    echo = _component((FIXTURES / "echo_agent.wat").read_text())
    _, pingpong = _pingpong()
    repeat, trips, count = (500, 200, 2000) if quick else (3000, 500, 5000)
    here, default = Budget(timeout=1.0), Budget()
    keys = ("here", "default", "worker", "pp_here", "pp", "pp_worker", "send", "send_1")
    runs: dict[str, list[Any]] = {k: [] for k in keys}
    for _ in range(rounds):
        runs["here"].append(_ask_seconds(echo, here, repeat))
        runs["default"].append(_ask_seconds(echo, default, repeat))
        runs["worker"].append(_ask_seconds(echo, default, repeat, timeout=5.0))
        try:
            pp_here = _pingpong_rate(pingpong, Budget(timeout=4.0), trips)
        except MightyError as exc:
            # An older tree (--against) cannot run a guest built by this tree's SDK when the
            # SDK imports an interface it does not provide: its ping-pong rows are left out.
            if "imports what nothing provides" not in str(exc):
                raise
        else:
            runs["pp_here"].append(pp_here)
            runs["pp"].append(_pingpong_rate(pingpong, default, trips))
            runs["pp_worker"].append(_pingpong_rate(pingpong, default, trips, timeout=5.0))
        runs["send"].append(_send_rates(echo, count))
        runs["send_1"].append(_send_rates(echo, count, workers=1))
    return runs


def message_rows(runs: dict[str, list[Any]]) -> list[dict[str, object]]:
    """Rows of :func:`message_runs`' figures: medians of the rounds."""
    rows: list[dict[str, object]] = []
    for key, label in (
        ("here", "budget 1 s: run in place"),
        ("default", "default budget and ask timeout"),
        ("worker", "default budget, ask timeout 5 s: via a worker"),
    ):
        floor, via, floor_cpu, via_cpu = (median([r[i] for r in runs[key]]) for i in range(4))
        rows.append(
            {
                "name": f"per-message: runtime ask / direct handle call ({label})",
                "ratio": round(median([r[1] / r[0] for r in runs[key]]), 2),
                "ratio_cpu": round(median([r[3] / r[2] for r in runs[key]]), 2),
                "ask_us": round(via * 1e6, 1),
                "direct_us": round(floor * 1e6, 1),
                "ask_cpu_us": round(via_cpu * 1e6, 1),
                "direct_cpu_us": round(floor_cpu * 1e6, 1),
                "target": "<= 1.3",
            }
        )
    for key, label in (
        ("pp_here", "budget 4 s: in place"),
        ("pp", "default budget and ask timeout: in place"),
        ("pp_worker", "default budget, ask timeout 5 s: via workers"),
    ):
        if not runs.get(key):
            continue  # not run (see message_runs)
        rate, rate_cpu = (median([r[i] for r in runs[key]]) for i in range(2))
        row: dict[str, object] = {
            "name": f"guest-to-guest ping-pong, CPython agents ({label})",
            "round_trips_per_s": round(rate),
            "us_per_round_trip": round(1e6 / rate, 1),
            "round_trips_per_cpu_s": round(rate_cpu),
        }
        if all(len(r) > 2 for r in runs[key]):
            row["fuel_per_round_trip"] = round(median([r[2] for r in runs[key]]))
        rows.append({**row, "target": ">= 8000"})
    calls, sends, calls_cpu, sends_cpu = (median([r[i] for r in runs["send"]]) for i in range(4))
    rows.append(
        {
            "name": "one-way host sends to 100 agents, 2 workers / direct calls, 1 thread",
            "ratio": round(median([r[1] / r[0] for r in runs["send"]]), 2),
            "ratio_cpu": round(median([r[3] / r[2] for r in runs["send"]]), 2),
            "sends_handled_per_s": round(sends),
            "direct_calls_per_s": round(calls),
            "sends_handled_per_cpu_s": round(sends_cpu),
            "direct_calls_per_cpu_s": round(calls_cpu),
            "target": ">= 25000 handled/s",
        }
    )
    if runs.get("send_1"):
        one = median([r[1] for r in runs["send_1"]])
        rows.append(
            {
                "name": "one-way host sends to 100 agents: 2 workers / 1 worker",
                "ratio": round(
                    median(
                        [a[1] / b[1] for a, b in zip(runs["send"], runs["send_1"], strict=True)]
                    ),
                    2,
                ),
                "two_workers_per_s": round(sends),
                "one_worker_per_s": round(one),
                "target": ">= 1 (a second worker must not cost)",
            }
        )
    return rows


def _old_tree(revision: str) -> Path:
    """The ``host/`` of ``revision`` (with ``sandbox/`` and ``wit/``) unpacked into a temporary
    directory, as ``mighty``, its C
    extensions compiled in place as this tree's are (by this tree's ``hatch_build.py``), so an
    A/B compares compiled with compiled (unless ``MIGHTY_PURE_PYTHON`` is set)."""
    # ``host/sandbox`` is a link to ``sandbox/``; the host reads ``wit/`` and ``guests/`` beside it:
    # both come along where the revision has them.
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", revision],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.split()
    paths = [p for p in ("host", "sandbox", "wit", "guests") if p in listed]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, *paths], capture_output=True, check=True
    ).stdout
    tree = Path(tempfile.mkdtemp(prefix="mighty-old-"))
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (tree / "mighty").symlink_to("host")
    if os.environ.get("MIGHTY_PURE_PYTHON", "") in ("", "0"):
        spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
        assert spec is not None and spec.loader is not None
        hatch_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hatch_build)
        hatch_build.build_in_place(tree)
    return tree


def _old_round(tree: Path, quick: bool) -> dict[str, list[Any]]:
    """One round of :func:`message_runs` with the old tree, in a child process."""
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import mighty; "
        "assert mighty.__file__.startswith(sys.argv[2]), mighty.__file__; "
        "import bench_agents; print(json.dumps(bench_agents.message_runs(sys.argv[3] == '1', 1)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), str(tree), str(int(quick))],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,  # not this tree's root, whose ``mighty`` would come first on sys.path
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the run of the old tree failed:\n{done.stderr[-2000:]}")
    runs: dict[str, list[Any]] = json.loads(done.stdout.splitlines()[-1])
    return runs


def _messages(quick: bool) -> list[dict[str, object]]:
    """The message rows; with ``--against REV`` also REV's, the two trees taking turns round
    by round (so a noisy neighbour hits both alike)."""
    if "--against" not in sys.argv:
        return message_rows(message_runs(quick))
    revision = sys.argv[sys.argv.index("--against") + 1]
    tree = _old_tree(revision)
    old: dict[str, list[Any]] = {}
    new: dict[str, list[Any]] = {}
    for _ in range(ROUNDS):
        for runs, one in ((old, _old_round(tree, quick)), (new, message_runs(quick, 1))):
            for key, values in one.items():
                runs.setdefault(key, []).extend(values)
    rows = message_rows(old)
    for row in rows:
        row["name"] = f"[{revision}] {row['name']}"
    return rows + message_rows(new)


def main() -> None:
    quick = "--quick" in sys.argv
    rows = _messages(quick)
    if "--messages" in sys.argv:
        rows.append(
            {"name": "machine", "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg())}
        )
        report(rows)
        return
    wat = (FIXTURES / "echo_agent.wat").read_text()
    echo = _component(wat)
    spin = _component(
        wat.replace('(func (export "reset0")', SPIN + '\n    (func (export "reset0")').replace(
            "(local $r i32) (local $name i32)\n",
            "(local $r i32) (local $name i32)\n      call $spin\n",
        )
    )
    out, pingpong = _pingpong()

    def throughput(workers: int) -> float:
        with Runtime(workers=workers) as rt:
            rt.register(AgentType("spin", spin))
            agents = [rt.spawn("spin") for _ in range(8)]
            started = time.perf_counter()
            futures = [rt.ask_future(agents[i % 8], "x", i) for i in range(400)]
            for future in futures:
                future.result(120)
            return 400 / (time.perf_counter() - started)

    one, two = throughput(1), throughput(2)
    rows.append(
        {
            "name": "CPU-bound messages/s: 2 workers / 1 worker",
            "ratio": round(two / one, 2),
            "one_worker": round(one, 1),
            "two_workers": round(two, 1),
            "target": ">= 1.8",
        }
    )

    copying = Component.load(out, share_memory=False)
    per_agent: dict[str, tuple[int, int]] = {}
    for name, component, count in (
        ("CPython agent", pingpong, 50),
        ("CPython agent, share_memory=False", copying, 50),
        ("WAT agent", echo, 1000),
    ):
        with Runtime(workers=1) as rt:
            rt.register(AgentType("idle", component))
            rt.ask(rt.spawn("idle"), "ping", {"n": 1})  # one-time costs out of the delta
            gc.collect()
            before = _memory()
            addresses = [rt.spawn("idle") for _ in range(count)]
            for future in [rt.ask_future(a, "ping", {"n": 1}) for a in addresses]:
                future.result(60)
            gc.collect()
            after = _memory()
        per_agent[name] = (
            (after[0] - before[0]) // count,
            (after[1] - before[1]) // count,
        )
        rows.append(
            {
                "name": f"memory per idle {name} (1 message handled)",
                "rss_bytes": per_agent[name][0],
                "pss_bytes": per_agent[name][1],
                "agents": count,
            }
        )
    images, old = per_agent["CPython agent"], per_agent["CPython agent, share_memory=False"]
    rows.append(
        {
            "name": "memory per idle CPython agent: images / share_memory=False",
            "ratio_rss": round(images[0] / old[0], 3),
            "ratio_pss": round(images[1] / old[1], 3),
            "target": "<= 1 MB per agent (PSS)",
            "met": images[1] <= 1_000_000,
        }
    )
    rows.append(
        {"name": "machine", "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg())}
    )
    report(rows)


if __name__ == "__main__":
    main()
