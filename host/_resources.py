"""Where mighty's data files are: the WIT packages and the guest sources users build from.

A wheel carries them as package data under ``mighty/_data/`` (``wit/``, ``guests/sdk``,
``guests/interpreter``; see ``[tool.hatch.build.targets.wheel.force-include]``) and they are
found through :mod:`importlib.resources`. An editable install has no ``_data`` folder: the
package is the checkout's ``host/`` directory, so the files are read where they are kept, in the
checkout beside it.

Rejected: symlinks ``host/_data/* -> ../../wit`` (one lookup path for both installs, but every
tool that walks ``host/`` - ruff, mypy, the import-graph tests - would also walk the guests,
which import modules that only exist inside a build), and ``importlib.resources.as_file`` (a
zipped install would extract to a temporary folder whose path then changes every run, and the
path is part of what a build reads).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = [
    "agent_sdk",
    "agent_wit",
    "data_root",
    "interpreter_source",
    "sandbox_wit",
    "wasi_wit",
]


def data_root() -> Path:
    """The folder holding ``wit/`` and ``guests/``: the installed package data, or the checkout.

    Raises ``FileNotFoundError`` naming both places when neither holds them (a broken install).
    """
    package = Path(str(files("mighty")))
    installed = package / "_data"
    if installed.is_dir():
        return installed
    checkout = package.resolve().parent
    if (checkout / "wit").is_dir() and (checkout / "guests" / "sdk").is_dir():
        return checkout
    raise FileNotFoundError(
        f"mighty's data files (wit/, guests/) are in neither {installed} nor {checkout}; "
        "reinstall mighty-host"
    )


def agent_wit() -> Path:
    """The ``mighty:agent`` WIT package every agent is built against."""
    return data_root() / "wit" / "agent"


def wasi_wit() -> Path:
    """The vendored WASI 0.2.0 WIT packages, one folder each (``http-0.2.0/``, ``io-0.2.0/``...),
    that a build adds as ``deps/`` to a WIT package referring to ``wasi:`` without its own."""
    return data_root() / "wit" / "wasi"


def agent_sdk() -> Path:
    """The folder to put on a guest's Python path so it can ``import mighty_agent``."""
    return data_root() / "guests" / "sdk"


def sandbox_wit() -> Path:
    """The ``mighty:sandbox`` WIT package the code-mode interpreter is built against."""
    return data_root() / "wit" / "sandbox"


def interpreter_source() -> Path:
    """The code-mode interpreter's handler module."""
    return data_root() / "guests" / "interpreter" / "interpreter.py"
