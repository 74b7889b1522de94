"""Eval fixtures: the example's builds (once per session, content-cached) and its traces."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval"


@pytest.fixture(scope="session")
def example_wasm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three assistant builds of examples/eval, built with the agent world and SDK."""
    from mighty._resources import agent_sdk, agent_wit
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("eval-members")
    built = {}
    for name in ("assistant", "assistant_refactor", "assistant_regression"):
        path = out / f"{name}.wasm"
        build_component(
            EXAMPLE / f"{name}.py", output=path, wit=agent_wit(), python_path=[agent_sdk()]
        )
        built[name] = path
    return built


@pytest.fixture(scope="session")
def tools() -> dict[str, object]:
    """The example's tool set (real functions, as a member would bring them)."""
    from mighty.eval import load_tools

    return load_tools(EXAMPLE / "tools.py")
