"""Tests for build_component: real componentize-py builds (slow) and argument checks (fast)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import mighty.build
from mighty._errors import BadInput, BuildError
from mighty.build import BuildResult, ComponentizeError, build_component

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "hello" / "handler.py"
BROKEN = REPO / "guests" / "testing" / "broken"
WASM_TOOLS = str(Path(sys.executable).parent / "wasm-tools")
RUST_NOISE = ("stack backtrace", "RUST_BACKTRACE", "panicked at", "anyhow")


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mty-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTY_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def hello(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildResult, list[str]]:
    # A copy: the guest interpreter writes __pycache__ into the source directory while it
    # builds, and a copy of the example must hit the same cache entry anyway.
    workdir = tmp_path_factory.mktemp("hello")
    project = workdir / "hello"
    shutil.copytree(EXAMPLE.parent, project, ignore=shutil.ignore_patterns("__pycache__"))
    messages: list[str] = []
    result = build_component(
        project / "handler.py", output=workdir / "hello.wasm", progress=messages.append
    )
    return result, messages


@pytest.fixture
def no_componentize(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"componentize-py was run: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(subprocess, "run", refuse)


def test_public_names() -> None:
    """mighty.build exports exactly its documented names."""
    assert set(mighty.build.__all__) == {
        "DEFAULT_TIMEOUT",
        "BuildResult",
        "ComponentizeError",
        "ExportNameClash",
        "HandlerSyntaxError",
        "build_component",
    }


@pytest.mark.slow
def test_example_builds_a_valid_component(hello: tuple[BuildResult, list[str]]) -> None:
    """Building the example gives a valid component exporting the demo functions."""
    result, _ = hello
    assert not result.cached
    assert result.path.read_bytes()[:8] == b"\0asm\x0d\x00\x01\x00"
    subprocess.run([WASM_TOOLS, "validate", str(result.path)], check=True)
    wit = subprocess.run(
        [WASM_TOOLS, "component", "wit", str(result.path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "export greet: func(name: string) -> string;" in wit
    assert "export divide: func(a: f64, b: f64) -> result<f64, string>;" in wit
    assert len(result.digest) == len(result.component_sha256) == 64


@pytest.mark.slow
def test_progress_reports_start_ticks_and_end(hello: tuple[BuildResult, list[str]]) -> None:
    """progress gets a start line naming the tool, elapsed-time ticks, and a done line."""
    _, messages = hello
    assert messages[0] == "building handler.py with componentize-py 0.25.1 ..."
    assert messages[-1].startswith("done in ")
    assert any(m.startswith("building handler.py: ") for m in messages[1:-1])


@pytest.mark.slow
@pytest.mark.usefixtures("no_componentize")
def test_unchanged_rebuild_is_cached(hello: tuple[BuildResult, list[str]], tmp_path: Path) -> None:
    """An unchanged rebuild is served from the cache without running componentize-py."""
    first, _ = hello
    messages: list[str] = []
    again = build_component(
        first.path.parent / "hello" / "handler.py",
        output=tmp_path / "again.wasm",
        progress=messages.append,
    )
    assert again.cached
    assert again.digest == first.digest
    assert again.component_sha256 == first.component_sha256
    assert again.path.read_bytes() == first.path.read_bytes()
    assert messages == []


@pytest.mark.slow
@pytest.mark.usefixtures("no_componentize")
def test_no_output_leaves_the_component_in_the_cache(
    hello: tuple[BuildResult, list[str]], cache_dir: Path
) -> None:
    """output=None returns the cache's own entry: nothing is copied, written or synced."""
    first, _ = hello
    entries = sorted(p.name for p in (cache_dir / "builds").iterdir())
    again = build_component(first.path.parent / "hello" / "handler.py", output=None)
    assert again.cached
    assert again.path == cache_dir / "builds" / f"{first.digest}.wasm"
    assert again.component_sha256 == first.component_sha256
    assert again.path.read_bytes() == first.path.read_bytes()
    assert sorted(p.name for p in (cache_dir / "builds").iterdir()) == entries


@pytest.mark.slow
def test_one_changed_byte_rebuilds(hello: tuple[BuildResult, list[str]], tmp_path: Path) -> None:
    """Another copy hits the cache; changing one byte of it changes the digest and rebuilds."""
    first, _ = hello
    project = tmp_path / "copy"
    shutil.copytree(EXAMPLE.parent, project, ignore=shutil.ignore_patterns("__pycache__"))
    source = project / "handler.py"
    copied = build_component(source, output=tmp_path / "copy.wasm")
    assert copied.cached
    assert copied.digest == first.digest

    source.write_bytes(source.read_bytes().replace(b"Hello, ", b"Hallo, "))
    changed = build_component(source, output=tmp_path / "changed.wasm")
    assert not changed.cached
    assert changed.digest != first.digest
    assert changed.component_sha256 != first.component_sha256


@pytest.mark.slow
def test_concurrent_builds_of_one_source_run_the_tool_once(tmp_path: Path) -> None:
    """Two builders of the same new inputs: one runs componentize-py, the other waits for the
    lock and is served its cache entry (xdist workers share guest builds this way)."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE.parent, project, ignore=shutil.ignore_patterns("__pycache__"))
    source = project / "handler.py"
    source.write_bytes(source.read_bytes().replace(b"Hello, ", b"Hej, "))  # a digest of its own
    results: list[BuildResult] = []
    errors: list[BaseException] = []

    def build(index: int) -> None:
        try:
            results.append(build_component(source, output=tmp_path / f"out{index}.wasm"))
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(r.cached for r in results) == [False, True]
    assert len({r.component_sha256 for r in results}) == 1
    assert (tmp_path / "out0.wasm").read_bytes() == (tmp_path / "out1.wasm").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "filename", "lineno", "error"),
    [
        ("import_error", "import_error.py", 4, "No module named 'no_such_module_xyz'"),
        ("raises_at_import", "_broken_helper.py", 6, "KeyError: 'timeout'"),
        ("missing_method", "missing_method.py", 6, "abstract method 'twice'"),
    ],
)
def test_broken_handler_reports_python_error_and_line(
    module: str, filename: str, lineno: int, error: str, tmp_path: Path
) -> None:
    """A broken handler gives BuildError with its Python error and file/line, no Rust noise."""
    # Build from a copy: the guest interpreter writes __pycache__ into the source directory.
    shutil.copytree(BROKEN, tmp_path / "broken")
    source = tmp_path / "broken" / f"{module}.py"
    with pytest.raises(BuildError) as caught:
        build_component(source, output=tmp_path / "out.wasm")
    err = caught.value
    assert err.filename == str(tmp_path / "broken" / filename)
    assert err.lineno == lineno
    assert error in err.message
    assert len(err.message.splitlines()) <= 4
    for noise in RUST_NOISE:
        assert noise.lower() not in err.message.lower()
    assert isinstance(err, ComponentizeError)
    assert "AssertionError" in err.details
    assert not (tmp_path / "out.wasm").exists()


@pytest.mark.slow
def test_bad_wit_reports_the_wit_error(tmp_path: Path) -> None:
    """Bad WIT syntax gives BuildError with the parser's message and the .wit file/line."""
    with pytest.raises(BuildError) as caught:
        build_component(
            BROKEN / "missing_method.py", output=tmp_path / "o.wasm", wit=BROKEN / "bad_wit"
        )
    assert "name `strin` is not defined" in caught.value.message
    assert caught.value.filename == str(BROKEN / "bad_wit" / "bad.wit")
    assert caught.value.lineno == 4
    assert "stack backtrace" not in caught.value.message.lower()


@pytest.mark.slow
def test_unknown_world_is_a_build_error(tmp_path: Path) -> None:
    """An explicit world that the WIT lacks gives BuildError naming the available worlds."""
    with pytest.raises(BuildError, match=r"World `nope` not found.*mighty:broken/broken"):
        build_component(BROKEN / "missing_method.py", output=tmp_path / "o.wasm", world="nope")


def test_missing_source_is_bad_input(tmp_path: Path) -> None:
    """A nonexistent handler file is BadInput naming the path."""
    with pytest.raises(BadInput, match=r"nope\.py does not exist"):
        build_component(tmp_path / "nope.py", output=tmp_path / "o.wasm")


def test_missing_wit_dir_is_bad_input(tmp_path: Path) -> None:
    """Without a wit/ directory beside the handler, BadInput points at --wit."""
    (tmp_path / "h.py").write_text("")
    with pytest.raises(BadInput, match=r"expected .*wit/ beside the handler.*--wit"):
        build_component(tmp_path / "h.py", output=tmp_path / "o.wasm")


def test_ambiguous_world_is_bad_input(tmp_path: Path) -> None:
    """A WIT package with several worlds and no --world is BadInput listing them."""
    (tmp_path / "h.py").write_text("")
    (tmp_path / "wit").mkdir()
    (tmp_path / "wit" / "w.wit").write_text("package a:b;\nworld one {}\nworld two {}\n")
    with pytest.raises(BadInput, match=r"several worlds \(one, two\).*--world"):
        build_component(tmp_path / "h.py", output=tmp_path / "o.wasm")


def test_missing_componentize_py_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When componentize-py is neither beside the interpreter nor on PATH, BadInput says so."""
    (tmp_path / "h.py").write_text("")
    (tmp_path / "wit").mkdir()
    (tmp_path / "wit" / "w.wit").write_text("package a:b;\nworld one {}\n")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BadInput, match=r"cannot find the componentize-py executable"):
        build_component(tmp_path / "h.py", output=tmp_path / "o.wasm")
