"""Signals during guest calls: a clean ``Cancelled`` or exit 130/143, never a crash of the host.

Each process test starts a real ``mty`` (or Python) process, waits until it has installed its
handlers (read from /proc), sends SIGINT or SIGTERM after a random delay and checks how it
ended: never a death by signal, never "Exception ignored" from a ctypes callback, never a
traceback, and one line (or one JSON object) saying what happened.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import pytest

from mighty import Budget, Cancelled, Component, Instance
from mighty.engine import SignalShield

TRIES = 20
# Fuel no loaded machine can burn before the signal comes: only the signal may end the call.
_FUEL = str(10**15)
_MTY = str(Path(sys.executable).parent / "mty")


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (SigCgt in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _interrupt(
    argv: list[str], signum: int, rng: random.Random, late: float
) -> tuple[int, str, str]:
    """Start ``argv``, signal it once it is past start-up plus up to ``late`` s; its outcome."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_DUMPING)
    try:
        deadline = time.monotonic() + 60
        while not _catches(proc.pid, signal.SIGTERM) and proc.poll() is None:
            assert time.monotonic() < deadline, "the process never installed its handlers"
            time.sleep(0.005)
        time.sleep(rng.uniform(0, late))
        if proc.poll() is None:
            proc.send_signal(signum)
        try:
            # Longer than an exit takes on a loaded machine (over 20 s was seen at load 8,
            # beside two busy loops and other tests), shorter than the processes' own 60 s
            # deadlines, so a lost signal is still sent again before the deadline ends them.
            out, err = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            # As a user would: a signal CPython lost (its handler ran inside some object's
            # __del__ or a weakref callback, where exceptions are only printed) is sent again.
            # `mty` loses none since its unraisable hook (tests/cli/test_interrupts.py); a plain
            # Python program (test_python_instance_call_is_cancelled) still can.
            # Its threads' Python stacks and mighty's signal state, for the message (_SITE): signals
            # whose default is to be ignored, as they are once the process is exiting.
            proc.send_signal(signal.SIGWINCH)
            proc.send_signal(signal.SIGURG)
            time.sleep(1)
            _RESENT.append(_where(proc.pid))
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=120)
            stacks, rest = _split_dump(err.decode(errors="replace"))
            states = [line for line in rest.splitlines() if line.startswith("MIGHTY-STATE")]
            _RESENT[-1] += "\n" + "\n".join(states) + "\n" + stacks
            err = "".join(
                line for line in rest.splitlines(keepends=True) if not line.startswith("MIGHTY-")
            ).encode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out.decode(), err.decode()


_RESENT: list[str] = []

# Every process the tests signal dumps its threads' Python stacks on SIGWINCH (faulthandler, from
# a sitecustomize module on its path: the command itself is run unchanged), so that a lost
# signal's failure message says where the main thread was.
# And on SIGURG (a Python handler: it runs at the main thread's next bytecode, which a guest call
# reaches at its next epoch tick), the state of mighty's signal machinery: whether a lost signal
# was kept by a shield, told to the running call, or owed.
_STATE_DUMP = """
import sys
def _mighty_state(signum, frame):
    try:
        import _signal
        got = sys.modules.get
        shield, cli, budget = (
            got("mighty.engine._signals"), got("mighty.cli._interrupts"), got("mighty.budget._budget")
        )
        parts = ["handlers " + " ".join(
            f"{n}={getattr(_signal.getsignal(n), '__qualname__', _signal.getsignal(n))}"
            for n in (2, 15)
        )]
        if shield is not None:
            st = shield._State
            parts.append(f"shield depth={st.depth} saved={sorted(st.saved)} "
                         f"listeners={len(st.listeners)} pending={st.pending!r} signum={st.signum}")
        if cli is not None:
            it = cli._State
            parts.append(f"interrupts depth={it.depth} owed={it.owed} owes={it.owes} in_hook={it.in_hook} "
                         f"live={getattr(it, 'live', '?')} exiting={getattr(it, 'exiting', '?')} "
                         f"last_ran={getattr(it, 'last_ran', '?')}")
            # A handler's exception still alive (its token): who holds it, two levels up.
            import gc
            for exc in [o for o in gc.get_objects()
                        if isinstance(o, BaseException) and "_mty_signal_token" in o.__dict__]:
                holders = []
                for ref in gc.get_referrers(exc):
                    up = [type(r).__name__ for r in gc.get_referrers(ref)][:6]
                    name = getattr(getattr(ref, "f_code", None), "co_name", "")
                    holders.append(f"{type(ref).__name__}{':' + name if name else ''} < {up}")
                parts.append(f"alive {exc!r} held by {holders[:8]}")
        if budget is not None:
            parts.append("calls " + " ".join(
                f"(interrupted={c.interrupted} stopped={c.stopped})"
                for c in list(budget._ACTIVE.values())
            ))
        sys.stderr.write("MIGHTY-STATE " + " | ".join(parts) + chr(10))
        sys.stderr.flush()
    except BaseException as exc:
        sys.stderr.write(f"MIGHTY-STATE failed: {exc!r}" + chr(10))
signal.signal(signal.SIGURG, _mighty_state)
"""
_SITE = Path(tempfile.mkdtemp(prefix="mty-signals-"))
atexit.register(shutil.rmtree, _SITE, True)
(_SITE / "sitecustomize.py").write_text(
    "import faulthandler, signal\nfaulthandler.register(signal.SIGWINCH, all_threads=True)\n"
    + _STATE_DUMP
)
_DUMPING = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(_SITE), os.environ.get("PYTHONPATH")) if p),
}
_DUMP_LINE = re.compile(
    r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$|  File |$"
)


def _split_dump(err: str) -> tuple[str, str]:
    """faulthandler's dump in ``err`` (from its first thread header), and ``err`` without it."""
    lines = err.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if re.match(r"(Current thread|Thread) 0x", line)), None
    )
    if start is None:
        return "(no stacks dumped)", err
    end = start
    while end < len(lines) and _DUMP_LINE.match(lines[end].rstrip("\n")):
        end += 1
    return "".join(lines[start:end]), "".join(lines[:start] + lines[end:])


def _where(pid: int) -> str:
    """What a process that did not end is doing: each thread's state and kernel wait channel,
    and the process's signal masks (for the failure message of a lost signal)."""
    lines = []
    with suppress(OSError):
        status = Path(f"/proc/{pid}/status").read_text()
        lines += [line for line in status.splitlines() if line.startswith(("Sig", "Shd"))]
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        with suppress(OSError):
            name = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = (task / "wchan").read_text().strip()
            lines.append(f"thread {task.name} {name}: {state} in {wchan or '-'}")
    return "\n".join(lines)


class SignalLost(UserWarning):
    """A lost signal the test tolerates (see test_mty_exec_exits_130_or_143), with evidence."""


# Shown in the warnings summary, not turned into an error as other warnings are (pyproject).
pytestmark = pytest.mark.filterwarnings("always::tests.budget.test_signals.SignalLost")


def _many(
    make: Callable[[random.Random], tuple[int, str, str]], seed: int, *, lost_at_most: int = 1
) -> list[tuple[int, str, str]]:
    """TRIES outcomes of ``make``, a few processes at a time; at most ``lost_at_most`` needed
    a resend."""
    rngs = [random.Random(seed * 1000 + i) for i in range(TRIES)]
    before = len(_RESENT)
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(make, rngs))
    # A code that prints whose signal was lost is not left running for the resend: it ends by
    # itself at its output limit (2 MiB of 'x\n') with status 1. That is the same lost signal,
    # counted with the resends. When it ends just as the resend comes (CI: ~40 s to the limit),
    # the resend may find it exiting, with Python's handlers gone: its status is then the
    # signal's, and its output still says how the run ended.
    ended = [o for o in outcomes if '"kind": "output_limit"' in o[1]]
    lost = len(_RESENT) - before + len(ended)
    evidence = "\n--\n".join(_RESENT[before:] + [f"ended by itself: {o[2][-2000:]}" for o in ended])
    assert lost <= lost_at_most, f"a signal was lost {lost} times in the tries:\n" + evidence
    if lost:
        # Tolerated, but never silent: the warnings summary of a passing run carries the
        # evidence (the open bug is only ever seen in full-suite runs).
        warnings.warn(SignalLost(f"{lost} of {TRIES} lost (tolerated):\n{evidence}"), stacklevel=2)
    return [o for o in outcomes if o not in ended]


def _assert_clean(outcome: tuple[int, str, str], signum: int) -> None:
    code, _out, err = outcome
    assert code == 128 + signum, outcome
    assert "Traceback" not in err, err
    assert "Exception ignored" not in err, err
    assert "corruption" not in err, err


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_mty_call_exits_130_or_143(budget_wasm_path: Path, signum: int) -> None:
    """`mty call` of an endless loop, signalled at random moments: exit 128+N and one line."""

    def once(rng: random.Random) -> tuple[int, str, str]:
        argv = [_MTY, "call", str(budget_wasm_path), "spin", "--timeout", "60", "--fuel", _FUEL]
        return _interrupt(argv, signum, rng, 0.4)

    for outcome in _many(once, signum):
        _assert_clean(outcome, signum)
        lines = [line for line in outcome[2].splitlines() if line.strip()]
        assert len(lines) == 1, outcome
        assert lines[0].startswith("mty: error: "), outcome


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_mty_call_json_is_one_cancelled_object(budget_wasm_path: Path, signum: int) -> None:
    """With --json a signalled `mty call` prints exactly one object of kind `cancelled`."""

    def once(rng: random.Random) -> tuple[int, str, str]:
        argv = [_MTY, "call", str(budget_wasm_path), "spin", "--timeout", "60", "--fuel", _FUEL]
        argv.append("--json")
        return _interrupt(argv, signum, rng, 0.4)

    for outcome in _many(once, signum + 100):
        _assert_clean(outcome, signum)
        lines = [line for line in outcome[1].splitlines() if line.strip()]
        assert len(lines) == 1, outcome
        document = json.loads(lines[0])
        assert document["ok"] is False
        assert document["error"]["kind"] == "cancelled"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize(
    "code",
    [
        "while True: pass",  # only epoch checks: the signal lands in the epoch callback
        "import time\nwhile True: time.sleep(0.001)",  # the signal lands in a host wait (poll)
        # The signal lands in a host function (stdout). Two bytes a print: 'x' * 100 reached
        # the output limit (2 MiB) within the test's 0.6 s on a fast machine, and the run ended
        # by itself before the signal came.
        "while True: print('x')",
    ],
    ids=["compute", "sleep", "print"],
)
def test_mty_exec_exits_130_or_143(
    interpreter: Component, tmp_path: Path, signum: int, code: str
) -> None:
    """`mty exec` of code that spins, sleeps or prints, signalled at random: exit 128+N."""
    script = tmp_path / "spin.py"
    script.write_text(code)

    def once(rng: random.Random) -> tuple[int, str, str]:
        argv = [_MTY, "exec", str(script), "--timeout", "60", "--fuel", _FUEL, "--json"]
        return _interrupt(argv, signum, rng, 0.6)

    # A known, open bug: a SIGTERM to `mty exec` is sometimes lost: up to 2 in 20 in some
    # full-suite runs, on CI's machine and here, first seen with the print loop only, then (a
    # cold run here, 2026-12-07, with builds on the other worker) with compute and sleep too,
    # each 2 in 20. Never SIGINT so far; never when this test runs alone, nor in scripted tries
    # beside a build loop (150) or at load 13 (1,400). The lost ones' stacks show the main
    # thread inside the code's own guest call with the call's listener in place, nothing
    # blocked or pending in the kernel: the signal was delivered and had no effect. The kept-but-
    # unheard signal before a guest call (test_mty_exec_signalled_before_its_guest_call_begins)
    # was one cause and is fixed; what is left is not found. Tolerated here up to three for
    # SIGTERM so that a fourth says so; the message carries each lost one's stacks and mighty's
    # signal state at the time (SIGURG, _STATE_DUMP). What that showed in a cold run on 3
    # workers (2026-12-07, load ~10: 4 of 20 lost for print-15, 2 for compute-15): in each,
    # the handler had last run with no shield open, inside an import compiling its module's
    # source (with PYTHONDONTWRITEBYTECODE=1 every import compiles), and its Terminated went
    # nowhere; `last_ran` now names the importing frames too. A SIGTERM sent at each of `mty
    # exec`'s 92 imports in turn (a harness, warm cache) always ended in 143, and 300 sent at
    # random instants of the cold import of mighty.sandbox too: the dropping place is not found.
    # What CPython drops silently is now sent again wherever it happens (the handler's
    # exceptions carry tokens, mighty.cli._interrupts; tests/cli/test_interrupts.py drops one in
    # a file object's close()), so a lost one here means a new way to lose it.
    allowed = 3 if signum == signal.SIGTERM else 1
    for outcome in _many(once, signum + 200, lost_at_most=allowed):
        _assert_clean(outcome, signum)
        lines = [line for line in outcome[1].splitlines() if line.strip()]
        assert len(lines) == 1, outcome
        assert json.loads(lines[0])["error"]["kind"] == "cancelled"


# Widens the moment CI's lost signals fell in: while `Instance.call` prepares the first call of an
# export (under its shield, before the guest call's own listener), it marks a file and sleeps.
_WIDENED = """
import os, pathlib, time
import mighty.instance._instance as instance_module
_export = instance_module.Instance._export
def _widened(self, name):
    if name == "run" and not getattr(self, "_widened", False):
        self._widened = True
        pathlib.Path(os.environ["MTY_TEST_MARKER"]).touch()
        time.sleep(2)
    return _export(self, name)
instance_module.Instance._export = _widened
"""


@pytest.mark.slow
def test_mty_exec_signalled_before_its_guest_call_begins(
    interpreter: Component, tmp_path: Path
) -> None:
    """A SIGTERM while `mty exec` prepares its guest call stops the run at once, not at its
    deadline (the signal was kept, and the call it came before ran on, 60 s in CI)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WIDENED)
    marker = tmp_path / "marker"
    script = tmp_path / "spin.py"
    script.write_text("while True: pass")
    env = {**os.environ, "PYTHONPATH": str(site), "MTY_TEST_MARKER": str(marker)}
    argv = [_MTY, "exec", str(script), "--timeout", "600", "--fuel", _FUEL, "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never began"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)  # the run's own deadline is 600 s away
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, (out, err)
    assert json.loads(out)["error"]["kind"] == "cancelled"


# The SIGTERM handler, which the harness waits for before it signals, is installed after the
# imports: a signal landing while Python imports can raise inside one of importlib's weakref
# callbacks, where CPython only prints "Exception ignored" and the import goes on (nothing
# mighty can shield: it happens in the user's own imports). What is tested starts after them.
_SCRIPT = """
import signal, sys

from mighty import Budget, Cancelled, Component, Instance

def terminate(signum, frame):
    sys.exit(143)

signal.signal(signal.SIGTERM, terminate)
try:
    component = Component.load(sys.argv[1])
    # Fuel no loaded machine can burn before the signal comes: only the signal ends the call.
    with Instance(component, budget=Budget(fuel=10**15, timeout=60)) as instance:
        while True:
            instance.call("spin")
except Cancelled as exc:
    print("cancelled", exc.reason, exc.signal, flush=True)
    sys.exit(130)
except KeyboardInterrupt:
    print("keyboard-interrupt", flush=True)
    sys.exit(130)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_python_instance_call_is_cancelled(budget_wasm_path: Path, signum: int) -> None:
    """`Instance.call` from Python: SIGINT is `Cancelled("interrupted")`; a SIGTERM handler's exit runs."""

    def once(rng: random.Random) -> tuple[int, str, str]:
        argv = [sys.executable, "-c", _SCRIPT, str(budget_wasm_path)]
        return _interrupt(argv, signum, rng, 0.3)

    for outcome in _many(once, signum + 300):
        _assert_clean(outcome, signum)
        if signum == signal.SIGINT:
            assert outcome[1].strip() in {"cancelled interrupted 2", "keyboard-interrupt"}
    # The signal lands during the call far more often than between calls: most are Cancelled.


def test_sigint_during_a_call_is_cancelled_with_its_signal(budget_wasm: bytes) -> None:
    """In the main thread, SIGINT during a guest call ends it as Cancelled(reason='interrupted')."""
    component = Component.load(budget_wasm)
    with Instance(component, budget=Budget(timeout=30)) as instance:
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with pytest.raises(Cancelled) as caught:
            instance.call("spin")
        timer.join()
    assert caught.value.reason == "interrupted"
    assert caught.value.signal == signal.SIGINT
    assert time.monotonic() - started < 25  # stopped by the signal, not by the deadline
    # The default handler is back: Ctrl-C outside a call is a KeyboardInterrupt again.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_that_does_not_raise_leaves_the_call_running(budget_wasm: bytes) -> None:
    """A signal whose handler only takes note runs the handler; the guest call goes on."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: seen.append(signum))
    try:
        component = Component.load(budget_wasm)
        with Instance(component) as instance:
            timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
            timer.start()
            assert instance.call("count", 200_000_000) == 200_000_000
            timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [signal.SIGUSR1]


def test_a_raising_handler_gets_its_exception_out_after_the_call(budget_wasm: bytes) -> None:
    """A handler that raises (SystemExit) stops the call; its exception comes out of `call`."""

    def leave(_signum: int, _frame: object) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGUSR1, leave)
    try:
        component = Component.load(budget_wasm)
        with Instance(component, budget=Budget(timeout=30)) as instance:
            timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
            timer.start()
            with pytest.raises(SystemExit) as caught:
                instance.call("spin")
            timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert caught.value.code == 143
    assert isinstance(caught.value.__context__, Cancelled)


def test_a_signal_kept_before_a_call_interrupts_the_call(budget_wasm: bytes) -> None:
    """A handler that raised in an open shield before a guest call began stops that call too."""
    component = Component.load(budget_wasm)
    # Fuel ends the spin if the signal is not heard (the bug: it ran to its deadline, while the
    # kept KeyboardInterrupt waited; `Instance.call` is shielded as a whole, so a Ctrl-C while
    # its Python prepared the guest call landed there).
    with (
        Instance(component, budget=Budget(fuel=10**10, timeout=600)) as instance,
        SignalShield() as shield,
    ):
        signal.raise_signal(signal.SIGINT)  # kept: no guest call is running yet
        with pytest.raises(Cancelled) as caught:
            instance.call("spin")
    assert caught.value.reason == "interrupted"
    assert caught.value.signal == signal.SIGINT
    assert isinstance(shield.pending, KeyboardInterrupt)


def test_shield_restores_handlers_and_nests() -> None:
    """Shields nest; the outermost puts the handlers back and alone reports the exception."""
    heard: list[int] = []
    before = signal.getsignal(signal.SIGINT)
    with SignalShield(heard.append) as outer:
        with SignalShield() as inner:
            assert signal.getsignal(signal.SIGINT) is not before
            signal.raise_signal(signal.SIGINT)  # the handler runs here, and does not raise
        assert inner.pending is None
    assert signal.getsignal(signal.SIGINT) is before
    assert isinstance(outer.pending, KeyboardInterrupt)
    assert outer.signum == signal.SIGINT
    assert heard == [signal.SIGINT]


def test_shield_off_the_main_thread_does_nothing() -> None:
    """Python runs handlers only in the main thread: elsewhere the shield changes nothing."""
    seen: list[object] = []

    def body() -> None:
        with SignalShield() as shield:
            seen.append(signal.getsignal(signal.SIGINT))
        seen.append(shield.pending)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler, None]
