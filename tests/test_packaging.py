"""The sdist and the wheel carry what users build from, and mighty finds it in either install.

The full check (a fresh venv, `pip install` of the wheel, `mty exec`/`build`/`run` outside the
checkout) is .ci/wheel-check; these tests pin the pieces it relies on, faster.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from mighty import _resources

ROOT = Path(__file__).resolve().parent.parent

SHIPPED = [
    "mighty/_data/wit/agent/agent.wit",
    "mighty/_data/wit/sandbox/sandbox.wit",
    "mighty/_data/guests/sdk/mighty_agent/__init__.py",
    "mighty/_data/guests/interpreter/interpreter.py",
    "mighty/_resources.py",
    "mighty/sandbox/_interpreter.py",
    "mighty/py.typed",
]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel built from it, as `python -m build` makes them."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--quiet", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return out


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("mighty_host-*.whl")
    return wheel


def test_checkout_resources_resolve_into_the_checkout() -> None:
    """In an editable install the WIT, SDK and interpreter are the checkout's own files."""
    assert _resources.data_root() == ROOT
    assert _resources.agent_wit() == ROOT / "wit" / "agent"
    assert _resources.agent_sdk() == ROOT / "guests" / "sdk"
    assert _resources.sandbox_wit() == ROOT / "wit" / "sandbox"
    assert _resources.interpreter_source().is_file()


@pytest.mark.slow
def test_wheel_ships_the_data_and_not_the_test_guests(dist: Path) -> None:
    """The wheel holds the WIT packages, the agent SDK and the interpreter, but no test guests."""
    names = zipfile.ZipFile(_wheel(dist)).namelist()
    for shipped in SHIPPED:
        assert shipped in names
    assert not [n for n in names if "testing" in n or "__pycache__" in n or n.startswith("tests/")]


@pytest.mark.slow
def test_sdist_holds_what_the_wheel_is_built_from(dist: Path) -> None:
    """The sdist carries wit/, guests/ and the sandbox (the wheel above was built from it)."""
    (sdist,) = dist.glob("mighty_host-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {
        "wit/agent/agent.wit",
        "guests/sdk/mighty_agent/__init__.py",
        "guests/interpreter/interpreter.py",
        "host/sandbox/_interpreter.py",
    } <= names


@pytest.mark.slow
def test_unpacked_wheel_finds_its_data_inside_the_package(dist: Path, tmp_path: Path) -> None:
    """Imported from an unpacked wheel, mighty finds wit/ and guests/ in its package data."""
    site = tmp_path / "site"
    zipfile.ZipFile(_wheel(dist)).extractall(site)
    probe = (
        "from mighty import _resources as r; "
        "print(r.agent_wit()); print(r.agent_sdk()); print(r.interpreter_source())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    data = site / "mighty" / "_data"
    assert done.stdout.splitlines() == [
        str(data / "wit" / "agent"),
        str(data / "guests" / "sdk"),
        str(data / "guests" / "interpreter" / "interpreter.py"),
    ]
    assert (data / "wit" / "agent" / "agent.wit").is_file()
