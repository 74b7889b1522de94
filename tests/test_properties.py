"""Property tests for the formats and policies that have no other hypothesis coverage."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import cbor2
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mighty import BadInput
from mighty.agents._manifest import load_manifest
from mighty.cli import parse_size
from mighty.wasi import Policy

ROOT = Path(__file__).resolve().parent.parent


def _guest_cbor() -> ModuleType:
    """The guest SDK's CBOR codec, loaded as a plain module (it only needs `struct`)."""
    path = ROOT / "guests" / "sdk" / "mighty_agent" / "_cbor.py"
    spec = importlib.util.spec_from_file_location("guest_cbor", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CBOR = _guest_cbor()

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)


@given(json_like)
def test_guest_cbor_round_trips_and_agrees_with_cbor2(value: Any) -> None:
    """The guest's CBOR decodes what it encodes, and both sides agree with cbor2."""
    encoded = CBOR.dumps(value)
    assert CBOR.loads(encoded) == value
    assert cbor2.loads(encoded) == value
    assert CBOR.loads(cbor2.dumps(value)) == value


@given(st.binary(max_size=64))
@example(b"\xa1\xa0\x00")  # a map whose key is a map (CI found it: a TypeError then)
@example(b"\xa1\xa0\x18\x00")
@example(b"\xa1\xa0\x19\x00\x00")
@example(b"\x81\xa1\x80\x00")
def test_guest_cbor_rejects_garbage_cleanly(data: bytes) -> None:
    """Random bytes decode or fail with ValueError/UnicodeDecodeError, never anything else."""
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        CBOR.loads(data)


@given(
    st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "k", "KiB", "M", "MiB", "G"])
)
def test_parse_size_units(number: int, unit: str) -> None:
    """Sizes parse to number x unit for every supported unit."""
    factor = {"": 1, "k": 1000, "KiB": 1024, "M": 10**6, "MiB": 2**20, "G": 10**9}[unit]
    assert parse_size(f"{number}{unit}") == number * factor


env_key = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="=\x00"), min_size=1, max_size=10
)


@given(
    st.dictionaries(
        env_key,
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10),
        max_size=5,
    )
)
def test_policy_copies_never_change_the_original(env: dict[str, str]) -> None:
    """with_* returns a changed copy; the original policy is untouched (frozen data)."""
    base = Policy()
    changed = base.with_env(**env).with_args("a", "b").with_stdin(b"x").with_seed(3)
    assert base == Policy()
    assert dict(changed.env) == env
    assert changed.args == ("a", "b")
    assert changed.seed == 3


@given(st.text(max_size=10))
def test_policy_rejects_keys_with_equals_or_nul(key: str) -> None:
    """An environment key with '=' or NUL is refused at construction."""
    bad = ("=" in key) or ("\x00" in key)
    if bad:
        with pytest.raises(ValueError, match="environment"):
            Policy(env=((key, "v"),))
    else:
        assert Policy(env=((key, "v"),)).env == ((key, "v"),)


@settings(max_examples=60)
@given(
    capacity=st.integers(min_value=-5, max_value=5000),
    on_full=st.sampled_from(["block", "drop", "fail", "explode"]),
    strategy=st.sampled_from(["one_for_one", "rest_for_one", "one_for_all", "chaos"]),
    intensity=st.integers(min_value=-2, max_value=10),
    child_type=st.sampled_from(["kv", "missing"]),
)
def test_manifest_validation_is_all_or_bad_input(
    tmp_path_factory: pytest.TempPathFactory,
    capacity: int,
    on_full: str,
    strategy: str,
    intensity: int,
    child_type: str,
) -> None:
    """A manifest either loads with exactly its values or fails with one BadInput."""
    text = f"""
[agents.kv]
component = "kv.wasm"
mailbox = {{ capacity = {capacity}, on_full = "{on_full}" }}

[supervisor]
strategy = "{strategy}"
intensity = {intensity}
children = [ {{ name = "a", type = "{child_type}" }} ]
"""
    path = tmp_path_factory.mktemp("manifest") / "mighty.toml"
    path.write_text(text)
    valid = (
        capacity >= 1
        and on_full != "explode"
        and strategy != "chaos"
        and intensity >= 0
        and child_type == "kv"
    )
    if not valid:
        with pytest.raises(BadInput):
            load_manifest(path)
        return
    manifest, base = load_manifest(path)
    assert base == path.parent
    assert manifest.agents["kv"].mailbox.capacity == capacity
    assert manifest.supervisor.strategy == strategy
    assert tomllib.loads(text)["supervisor"]["intensity"] == manifest.supervisor.intensity


def test_manifest_syntax_errors_are_bad_input(tmp_path: Path) -> None:
    """TOML that does not parse, and a missing file, are BadInput naming the file."""
    broken = tmp_path / "broken.toml"
    broken.write_text("[agents\n")
    with pytest.raises(BadInput, match="not valid TOML"):
        load_manifest(broken)
    with pytest.raises(BadInput, match="no such file"):
        load_manifest(tmp_path / "missing.toml")


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_guest_cbor_floats_are_exact(number: float) -> None:
    """Floats (NaN, infinities, -0.0 included) survive the guest codec bit for bit."""
    back = CBOR.loads(CBOR.dumps(number))
    if math.isnan(number):
        assert math.isnan(back)
    else:
        assert back == number
        assert math.copysign(1.0, back) == math.copysign(1.0, number)
