"""Differential: where the policy allows it, a guest's output under mighty's WASI equals its
output under wasmtime's native WASI."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from wasmtime import component as wc

from mighty import Budget, Component, Instance, Ok
from mighty.wasi import Policy

pytestmark = pytest.mark.slow

ENV = (("LANG", "C"), ("NAME", "mighty"))
ARGS = ("probe", "--flag", "ü")
STDIN = b"line one\nline two\n\xff"


@pytest.fixture(scope="module")
def native(probe_wasm: Path) -> tuple[wasmtime.Engine, wc.Component]:
    """The probe compiled for a plain wasmtime engine."""
    engine = wasmtime.Engine()
    return engine, wc.Component(engine, probe_wasm.read_bytes())


def run_native(
    native: tuple[wasmtime.Engine, wc.Component], code: str, tmp: Path, data: Path
) -> tuple[Any, bytes]:
    """Run a snippet under wasmtime's own WASI with the same grants."""
    engine, component = native
    linker = wc.Linker(engine)
    linker.add_wasip2()
    store = wasmtime.Store(engine)
    config = wasmtime.WasiConfig()
    config.env = list(ENV)
    config.argv = list(ARGS)
    stdin = tmp / "stdin"
    stdin.write_bytes(STDIN)
    config.stdin_file = str(stdin)
    stdout = tmp / "stdout"
    config.stdout_file = str(stdout)
    config.preopen_dir(str(data), "/data")
    store.set_wasi(config)
    instance = linker.instantiate(store, component)
    func = instance.get_func(store, "run")
    assert func is not None
    value = func(store, code)
    return value, stdout.read_bytes()


SNIPPETS = [
    "result = json.dumps([sorted(os.environ.items()), sys.argv])",
    "result = sys.stdin.buffer.read().hex()",
    "print('hello'); print('wörld', end=''); sys.stdout.flush(); result = 0",
    "result = json.dumps(sorted(os.listdir('/data')))",
    "result = open('/data/in.txt').read()",
    "result = json.dumps([os.stat('/data/in.txt').st_size, os.path.isdir('/data/dir'), os.path.exists('/data/nope')])",
    "open('/data/out.txt', 'w').write('written'); result = open('/data/out.txt').read()",
    "os.mkdir('/data/new'); os.rename('/data/in.txt', '/data/new/moved.txt'); result = json.dumps(sorted(os.listdir('/data/new')))",
    "\ntry:\n    open('/data/missing.txt')\nexcept OSError as e:\n    result = e.errno\n",
    "\ntry:\n    os.rmdir('/data/dir')\nexcept OSError as e:\n    result = e.errno\n",
    "result = json.dumps([e.name for e in sorted(os.scandir('/data'), key=lambda e: e.name)])",
]


@pytest.mark.parametrize("code", SNIPPETS)
def test_same_output_as_native_wasi(
    probe_wasm: Path, native: tuple[wasmtime.Engine, wc.Component], tmp_path: Path, code: str
) -> None:
    """The snippet's result and stdout match wasmtime's native WASI byte for byte."""
    template = tmp_path / "template"
    (template / "dir").mkdir(parents=True)
    (template / "dir" / "keep").write_text("k")
    (template / "in.txt").write_text("input text")
    ours_dir, native_dir = tmp_path / "ours", tmp_path / "native"
    shutil.copytree(template, ours_dir)
    shutil.copytree(template, native_dir)

    native_value, native_stdout = run_native(native, code, tmp_path, native_dir)
    policy = Policy(env=ENV, args=ARGS, stdin=STDIN).with_dir(ours_dir, "/data", readonly=False)
    instance = Instance(Component.load(probe_wasm), policy=policy, budget=Budget(timeout=30))
    ours_value = instance.call("run", code)

    assert isinstance(ours_value, Ok), ours_value
    # Stock wasmtime-py returns result<string, string> as a tagged Variant.
    assert (native_value.tag, native_value.payload) == ("ok", ours_value.value)
    assert instance.stdout.getvalue() == native_stdout
    assert sorted(p.name for p in ours_dir.rglob("*")) == sorted(
        p.name for p in native_dir.rglob("*")
    )
