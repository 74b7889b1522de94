"""Sandbox(packages=[...]): pure-Python distributions built into an interpreter variant."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mighty.engine import Component
from mighty.sandbox import PackageError, Sandbox, SnapshotMismatch

TOY = {
    "mtytoy/__init__.py": (
        "import importlib\n"
        "from mtytoy.extra import twice\n"
        "def greet(name):\n"
        "    return f'hello {name}, ' + str(twice(21))\n"
        "def load_lazy():\n"
        "    return importlib.import_module('mtytoy.plugins.lazy').VALUE\n"
    ),
    "mtytoy/extra.py": "def twice(n):\n    return 2 * n\n",
    "mtytoy/plugins/__init__.py": "",
    "mtytoy/plugins/lazy.py": "VALUE = 'loaded lazily'\n",
    "mtytoy/__main__.py": "raise SystemExit('a __main__ module is never imported')\n",
}


def make_wheel(
    directory: Path,
    files: dict[str, str],
    *,
    name: str = "mtytoy",
    purelib: bool = True,
    extra: dict[str, bytes] | None = None,
) -> Path:
    """A real wheel file (PEP 427): the files, METADATA, WHEEL and RECORD."""
    dist_info = f"{name}-1.0.dist-info"
    contents: dict[str, bytes] = {path: text.encode() for path, text in files.items()}
    contents.update(extra or {})
    contents[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode()
    )
    contents[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: tests\n"
        f"Root-Is-Purelib: {'true' if purelib else 'false'}\nTag: py3-none-any\n"
    ).encode()
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    contents[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = directory / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in sorted(contents.items()):
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            wheel.writestr(info, data)
    return path


@pytest.fixture(scope="session")
def toy_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_wheel(tmp_path_factory.mktemp("wheels"), TOY)


@pytest.fixture(scope="module")
def with_packages(interpreter: Component, toy_wheel: Path) -> Iterator[Sandbox]:
    """The one variant these tests build (cached by content afterwards): iniconfig from the
    host environment and the toy wheel."""
    with Sandbox(packages=["iniconfig", toy_wheel], pool=1) as box:
        yield box


@pytest.mark.slow
def test_an_installed_distribution_is_importable(with_packages: Sandbox) -> None:
    code = (
        "import iniconfig\nini = iniconfig.IniConfig('x.ini', data='[a]\\nb = 1\\n')\nini['a']['b']"
    )
    result = with_packages.run(code)
    assert result.ok, result
    assert result.value == "1"


@pytest.mark.slow
def test_a_wheel_is_importable_with_its_lazy_submodules(with_packages: Sandbox) -> None:
    result = with_packages.run("import mtytoy\n[mtytoy.greet('you'), mtytoy.load_lazy()]")
    assert result.ok, result
    assert result.value == ["hello you, 42", "loaded lazily"]
    assert with_packages.run("from mtytoy.plugins import lazy\nlazy.VALUE").value == "loaded lazily"


@pytest.mark.slow
def test_anything_else_is_module_not_found(with_packages: Sandbox) -> None:
    for name in ("sortedcontainers", "mtytoy.nothing", "cbor2"):
        result = with_packages.run(f"import {name}")
        assert not result.ok and result.error is not None
        assert result.error.message.startswith("ModuleNotFoundError"), result.error
    caught = with_packages.run(
        "try:\n    import attrs\nexcept ModuleNotFoundError as e:\n    r = e.name\nr"
    )
    assert caught.value == "attrs"


@pytest.mark.slow
def test_the_plain_interpreter_lacks_them(sandbox: Sandbox) -> None:
    result = sandbox.run("import iniconfig")
    assert result.error is not None and result.error.message.startswith("ModuleNotFoundError")


@pytest.mark.slow
def test_a_variant_is_built_once_and_is_its_own_build(
    with_packages: Sandbox, toy_wheel: Path, interpreter: Component
) -> None:
    with Sandbox(packages=["iniconfig", toy_wheel], pool=0) as again:
        assert again._config.component is with_packages._config.component
        with again.session() as session:
            assert session.run("import mtytoy\nmtytoy.greet('s')").ok
            snap = session.snapshot()
        with again.restore(snap) as restored:
            assert restored.run("mtytoy.greet('r')").value == "hello r, 42"
    assert with_packages._config.component.sha256 != interpreter.sha256
    with Sandbox(pool=0) as plain, pytest.raises(SnapshotMismatch, match="interpreter build"):
        plain.restore(snap)


def test_native_extensions_are_refused(interpreter: Component) -> None:
    with pytest.raises(PackageError, match="native extensions"):
        Sandbox(packages=["cbor2"], pool=0)


def test_a_native_wheel_is_refused(tmp_path: Path, interpreter: Component) -> None:
    wheel = make_wheel(
        tmp_path, TOY, extra={"mtytoy/_speed.cpython-311-x86_64-linux-gnu.so": b"\x7fELF"}
    )
    with pytest.raises(PackageError, match="native extensions"):
        Sandbox(packages=[wheel], pool=0)


def test_a_platlib_wheel_is_refused(tmp_path: Path, interpreter: Component) -> None:
    with pytest.raises(PackageError, match="Root-Is-Purelib"):
        Sandbox(packages=[make_wheel(tmp_path, TOY, purelib=False)], pool=0)


def test_a_missing_distribution_is_refused(interpreter: Component) -> None:
    with pytest.raises(PackageError, match="no distribution named 'mighty-no-such-dist'"):
        Sandbox(packages=["mighty-no-such-dist"], pool=0)


def test_bad_wheels_are_refused(tmp_path: Path, interpreter: Component) -> None:
    broken = tmp_path / "broken-1.0-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(PackageError, match="cannot be read"):
        Sandbox(packages=[broken], pool=0)
    with pytest.raises(PackageError, match="does not exist"):
        Sandbox(packages=[tmp_path / "absent-1.0-py3-none-any.whl"], pool=0)
    unsafe = make_wheel(tmp_path, {**TOY, "../evil.py": "x = 1\n"}, name="unsafe")
    with pytest.raises(PackageError, match="unsafe path"):
        Sandbox(packages=[unsafe], pool=0)
    shadow = make_wheel(tmp_path, {"json/__init__.py": "x = 1\n"}, name="shadow")
    with pytest.raises(PackageError, match="shadow"):
        Sandbox(packages=[shadow], pool=0)


def test_bad_package_arguments_are_refused(interpreter: Component) -> None:
    with pytest.raises(PackageError, match="a list"):
        Sandbox(packages="iniconfig", pool=0)
    with pytest.raises(PackageError, match="distribution name"):
        Sandbox(packages=["iniconfig; rm -rf /"], pool=0)


@pytest.mark.slow
def test_a_missing_dependency_is_a_package_error(tmp_path: Path, interpreter: Component) -> None:
    """Dependencies are not resolved: the build's import error comes back as a PackageError
    (a failed build is not cached, so this runs componentize-py each time)."""
    needy = make_wheel(
        tmp_path, {"needy/__init__.py": "import mighty_absent_dependency\n"}, name="needy"
    )
    with pytest.raises(PackageError, match=r"mighty_absent_dependency.*list them in packages"):
        Sandbox(packages=[needy], pool=0)


PROBE = {
    "mtyprobe/__init__.py": (
        "import os\n"
        "SEEN = {}\n"
        "for path in ['/python', '/bundled', *(f'/{i}' for i in range(8))]:\n"
        "    if not os.path.isdir(path):\n"
        "        continue\n"
        "    try:\n"
        "        entries = sorted(os.listdir(path))[:200]\n"
        "    except OSError as exc:\n"
        "        entries = [f'unreadable: {exc}']\n"
        "    wrote = False\n"
        "    try:\n"
        "        with open(path + '/mtyprobe-was-here.pth', 'a') as f:\n"
        "            f.write('import sys\\n')\n"
        "        wrote = True\n"
        "    except OSError:\n"
        "        pass\n"
        "    SEEN[path] = {'entries': entries, 'wrote': wrote}\n"
    ),
}


def _host_site_dirs() -> list[Path]:
    """Every site-packages a build could have mounted: this venv's, and what componentize-py
    asks `python3` for when no virtual environment is named (the system's and the user's)."""
    import site
    import subprocess
    import sys

    found = {Path(p) for p in site.getsitepackages()} | {Path(site.getusersitepackages())}
    found |= {Path(p) for p in sys.path if p.endswith("site-packages")}
    asked = subprocess.run(
        [
            "python3",
            "-c",
            "import site; print(';'.join([site.getusersitepackages(), *site.getsitepackages()]))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    found |= {Path(p) for p in asked.stdout.strip().split(";") if p}
    return sorted(found)


@pytest.mark.slow
def test_a_package_running_at_build_time_reaches_no_host_directory(tmp_path: Path) -> None:
    """A wheel's top-level code runs while its variant is built (pre-initialisation): it may
    read and write only its build's own throw-away copies, never a host site-packages (where a
    dropped .pth would run in every later Python start)."""
    wheel = make_wheel(tmp_path, PROBE, name="mtyprobe")
    markers = [d / "mtyprobe-was-here.pth" for d in _host_site_dirs()]
    try:
        with Sandbox(packages=[wheel], pool=0) as box:
            seen = box.run("import mtyprobe\nresult = mtyprobe.SEEN").value
        assert [m for m in markers if m.exists()] == []
        host_only = {"pytest", "wasmtime", "mighty_host-0.1.0.dist-info", "pip"}
        for path, entry in seen.items():
            assert not host_only & set(entry["entries"]), (path, entry["entries"][:20])
    finally:
        for marker in markers:
            marker.unlink(missing_ok=True)
