"""Tests for the vendored WASI WIT a build adds to a WIT folder that refers to ``wasi:``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mighty import _resources
from mighty.build import build_component
from mighty.build._build import _stage_wit
from mighty.build._inputs import compute_digest, find_worlds, wasi_deps
from mighty.engine import Component

REPO = Path(__file__).parents[2]
WASM_TOOLS = str(Path(sys.executable).parent / "wasm-tools")
PACKAGES = ("cli", "clocks", "filesystem", "http", "io", "random", "sockets")

HTTP_WORLD = """\
package demo:fetch;

world fetcher {
  import wasi:http/outgoing-handler@0.2.0;
  export run: func() -> string;
}
"""

HANDLER = """\
import wit_world
from wit_world.imports import outgoing_handler


class WitWorld(wit_world.WitWorld):
    def run(self) -> str:
        return outgoing_handler.__name__
"""


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("mty-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MTY_CACHE_DIR", str(path))
        yield path


def _wit(tmp_path: Path, text: str) -> Path:
    wit = tmp_path / "wit"
    wit.mkdir()
    (wit / "world.wit").write_text(text)
    return wit


def _digest(wit: Path, roots: list[Path]) -> str:
    return compute_digest(
        module="handler", roots=roots, wit=wit, world="fetcher", tool_version="0.25.1"
    )


def test_vendored_packages_are_the_seven_wasi_0_2_0_ones() -> None:
    """wit/wasi holds one 0.2.0 folder per WASI package the builds add, found by wasi_wit()."""
    assert _resources.wasi_wit() == REPO / "wit" / "wasi"
    folders = sorted(p.name for p in _resources.wasi_wit().iterdir() if p.is_dir())
    assert folders == [f"{name}-0.2.0" for name in PACKAGES]


def test_a_world_without_wasi_gets_nothing(tmp_path: Path) -> None:
    """A WIT package that never names wasi: is built from its own folder, as before."""
    wit = _wit(tmp_path, "package a:b;\nworld w {\n  export run: func();\n}\n")
    assert wasi_deps(wit) == []
    assert _stage_wit(wit, tmp_path / "stage") == wit.resolve()
    assert not (tmp_path / "stage").exists()


def test_a_wasi_import_adds_every_vendored_package(tmp_path: Path) -> None:
    """Importing wasi:http adds all seven packages under their folder names."""
    added = dict(wasi_deps(_wit(tmp_path, HTTP_WORLD)))
    assert {rel.partition("/")[0] for rel in added} == {f"{n}-0.2.0" for n in PACKAGES}
    assert added["http-0.2.0/types.wit"] == _resources.wasi_wit() / "http-0.2.0" / "types.wit"


@pytest.mark.parametrize(
    "line",
    [
        "use wasi:io/streams@0.2.0.{input-stream};",
        "include wasi:cli/imports@0.2.0;",
        "export wasi:http/incoming-handler@0.2.0;",
        "import wasi:http/types;",
    ],
)
def test_each_kind_of_reference_counts(tmp_path: Path, line: str) -> None:
    """use (with a version before its brace), include, export and an unversioned import count."""
    text = f"package a:b;\nworld w {{\n  {line}\n}}\n"
    assert wasi_deps(_wit(tmp_path, text)) != []


def test_a_commented_out_reference_does_not_count(tmp_path: Path) -> None:
    """A wasi: import inside a comment adds nothing."""
    text = (
        "package a:b;\n// import wasi:http/types@0.2.0;\n/* use wasi:io/poll@0.2.0.{pollable}; */\n"
    )
    assert wasi_deps(_wit(tmp_path, text + "world w {}\n")) == []


def test_own_deps_that_declare_the_package_are_left_alone(tmp_path: Path) -> None:
    """A WIT folder whose deps/ declare the wasi: packages it uses is built as it is."""
    wit = _wit(tmp_path, HTTP_WORLD)
    shutil.copytree(_resources.wasi_wit(), wit / "deps", ignore=shutil.ignore_patterns("*.md"))
    assert wasi_deps(wit) == []
    assert _stage_wit(wit, tmp_path / "stage") == wit.resolve()


def test_own_deps_keep_their_packages_and_get_the_rest(tmp_path: Path) -> None:
    """A deps/ declaring wasi:io but not wasi:http keeps its io and gets the other six."""
    wit = _wit(tmp_path, HTTP_WORLD)
    (wit / "deps").mkdir()
    shutil.copytree(_resources.wasi_wit() / "io-0.2.0", wit / "deps" / "my-io")
    added = {rel.partition("/")[0] for rel, _ in wasi_deps(wit)}
    assert added == {f"{n}-0.2.0" for n in PACKAGES if n != "io"}
    staged = _stage_wit(wit, tmp_path / "stage")
    assert (staged / "deps" / "my-io" / "streams.wit").is_file()
    assert not (staged / "deps" / "io-0.2.0").exists()


def test_staging_copies_the_package_and_adds_deps(tmp_path: Path) -> None:
    """The staged folder holds the package's files and the vendored deps; the user's is untouched."""
    wit = _wit(tmp_path, HTTP_WORLD)
    staged = _stage_wit(wit, tmp_path / "stage")
    assert staged == tmp_path / "stage"
    assert (staged / "world.wit").read_text() == HTTP_WORLD
    assert (staged / "deps" / "http-0.2.0" / "handler.wit").is_file()
    assert find_worlds(staged) == ["fetcher"]
    assert sorted(p.name for p in wit.iterdir()) == ["world.wit"]


def test_a_vendored_file_is_in_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing one vendored WASI file changes the digest of a build that adds it, and only it."""
    for name in ("plain", "http"):
        (tmp_path / name).mkdir()
    plain = _wit(tmp_path / "plain", "package a:b;\nworld fetcher {}\n")
    wit = _wit(tmp_path / "http", HTTP_WORLD)
    vendored = tmp_path / "vendored"
    shutil.copytree(_resources.wasi_wit(), vendored)
    monkeypatch.setattr(_resources, "wasi_wit", lambda: vendored)
    before, plain_before = _digest(wit, [tmp_path]), _digest(plain, [tmp_path])
    types = vendored / "http-0.2.0" / "types.wit"
    types.write_text(types.read_text() + "\n// changed\n")
    assert _digest(wit, [tmp_path]) != before
    assert _digest(plain, [tmp_path]) == plain_before


@pytest.mark.slow
def test_a_world_importing_wasi_http_builds(tmp_path: Path) -> None:
    """A handler whose world imports wasi:http/outgoing-handler@0.2.0 and has no deps/ builds,
    and the component imports the runtime's wasi:http@0.2.9."""
    project = tmp_path / "project"
    project.mkdir()
    wit = _wit(project, HTTP_WORLD)
    (project / "handler.py").write_text(HANDLER)
    result = build_component(project / "handler.py", output=tmp_path / "fetcher.wasm")
    imports = set(Component.load(result.path).imports)
    assert "wasi:http/outgoing-handler@0.2.9" in imports
    assert "wasi:http/types@0.2.9" in imports
    text = subprocess.run(
        [WASM_TOOLS, "component", "wit", str(result.path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "import wasi:http/outgoing-handler@0.2.9;" in text
    assert sorted(p.name for p in wit.iterdir()) == ["world.wit"]


@pytest.mark.slow
def test_the_http_probe_and_an_agent_build_with_wasi_http(tmp_path: Path) -> None:
    """The http probe (SDK on the path) and an agent using mighty_agent.http both build and
    import wasi:http/outgoing-handler@0.2.9."""
    sdk = [_resources.agent_sdk()]
    probe = build_component(
        REPO / "guests" / "testing" / "http_probe" / "probe.py",
        output=tmp_path / "probe.wasm",
        python_path=sdk,
    )
    agent_source = tmp_path / "fetcher.py"
    agent_source.write_text(
        "from mighty_agent import Agent, export, http, on\n\n\n"
        "class Fetcher(Agent):\n"
        '    @on("get")\n'
        "    def get(self, body, sender):\n"
        '        return http.get(body["url"]).status\n\n\n'
        "WitWorld = export(Fetcher)\n"
    )
    agent = build_component(
        agent_source, output=tmp_path / "agent.wasm", wit=_resources.agent_wit(), python_path=sdk
    )
    for result in (probe, agent):
        assert "wasi:http/outgoing-handler@0.2.9" in Component.load(result.path).imports
