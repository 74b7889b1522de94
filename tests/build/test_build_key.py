"""The build key covers what the build reads of site-packages, not everything installed there.

Pure unit tests over ``compute_digest`` with a fake site-packages (dist-info folders written
here): installing an unrelated distribution keeps the key, a change the build reads moves it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty.build._inputs import build_inputs, compute_digest, reached_distributions

WIT = "package demo:app;\n\nworld app {\n  export run: func() -> string;\n}\n"


def _install(
    site: Path, name: str, version: str, *, top: str, requires: tuple[str, ...] = ()
) -> None:
    """Write a minimal installed distribution ``name`` providing the top-level module ``top``."""
    (site / top).mkdir(parents=True, exist_ok=True)
    (site / top / "__init__.py").write_text(f"VERSION = {version!r}\n")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text(f"{top}/__init__.py,,\n{info.name}/METADATA,,\n")


def _uninstall(site: Path, name: str, version: str) -> None:
    """Remove the dist-info of ``name`` (the module files stay: only the metadata matters)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    for child in info.iterdir():
        child.unlink()
    info.rmdir()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A handler importing one installed package (``dep``), the standard library and bindings."""
    root = tmp_path / "proj"
    (root / "wit").mkdir(parents=True)
    (root / "wit" / "app.wit").write_text(WIT)
    (root / "handler.py").write_text("import json\nimport wit_world\nimport dep\nimport helper\n")
    (root / "helper.py").write_text("X = 1\n")
    return root


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A fake site-packages holding ``dep`` (which requires ``base``) and ``base``."""
    path = tmp_path / "site-packages"
    path.mkdir()
    _install(path, "dep", "1.0", top="dep", requires=("base>=2; python_version >= '3'",))
    _install(path, "base", "2.0", top="base")
    return path


def _key(project: Path, site: Path) -> str:
    """The digest of the project's build, seeing ``site`` as its site-packages."""
    return compute_digest(
        module="handler",
        roots=[project],
        wit=project / "wit",
        world="app",
        tool_version="0.25.1",
        site_paths=[site],
    )


def test_unrelated_install_keeps_the_key(project: Path, site: Path) -> None:
    """Installing (or removing) a distribution the handler does not reach keeps the key."""
    before = _key(project, site)
    _install(site, "mcp", "2.3", top="mcp", requires=("httpx",))
    _install(site, "httpx", "0.28", top="httpx")
    assert _key(project, site) == before
    _uninstall(site, "mcp", "2.3")
    assert _key(project, site) == before


def test_reached_distributions_follow_requirements(project: Path, site: Path) -> None:
    """The imported distribution and what it requires count; stdlib and bindings do not."""
    found, loose = reached_distributions(build_inputs("handler", [project]), [project], [site])
    assert found == ["base==2.0", "dep==1.0"]
    assert loose == []


def test_upgrading_an_imported_distribution_changes_the_key(project: Path, site: Path) -> None:
    """A new version of the imported distribution, or of one it requires, moves the key."""
    before = _key(project, site)
    _uninstall(site, "base", "2.0")
    _install(site, "base", "2.1", top="base")
    after_base = _key(project, site)
    assert after_base != before
    _uninstall(site, "dep", "1.0")
    _install(site, "dep", "1.1", top="dep", requires=("base",))
    assert _key(project, site) != after_base


def test_a_loose_module_in_site_packages_counts_by_its_bytes(project: Path, site: Path) -> None:
    """A module in site-packages that no distribution owns is hashed like a local one."""
    (project / "handler.py").write_text("import loose\n")
    (site / "loose.py").write_text("A = 1\n")
    before = _key(project, site)
    (site / "loose.py").write_text("A = 2\n")
    assert _key(project, site) != before


def test_local_inputs_still_change_the_key(project: Path, site: Path) -> None:
    """The handler's own files, a new import and the tool version are still in the key."""
    before = _key(project, site)
    (project / "helper.py").write_text("X = 2\n")
    assert _key(project, site) != before
    changed = _key(project, site)
    (project / "handler.py").write_text("import dep\nimport helper\nimport other\n")
    assert _key(project, site) != changed
    _install(site, "other", "1.0", top="other")
    with_other = _key(project, site)
    assert with_other != changed
    assert (
        compute_digest(
            module="handler",
            roots=[project],
            wit=project / "wit",
            world="app",
            tool_version="0.26.0",
            site_paths=[site],
        )
        != with_other
    )


def test_a_local_module_shadows_an_installed_one(project: Path, site: Path) -> None:
    """A name found among the roots is local: the installed distribution of that name is not read."""
    (project / "dep.py").write_text("LOCAL = True\n")
    before = _key(project, site)
    _uninstall(site, "dep", "1.0")
    _install(site, "dep", "9.9", top="dep")
    assert _key(project, site) == before
