"""docs/manifest.md documents exactly the keys of the manifest's model, and its examples load."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from mighty.agents._manifest import (
    AgentTypeModel,
    BreakerModel,
    ChildModel,
    MailboxModel,
    Manifest,
    RuntimeModel,
    StartModel,
    SupervisorModel,
    load_manifest,
)
from tests.docs._markdown import Block, blocks

PAGE = Path(__file__).resolve().parent.parent.parent / "docs" / "manifest.md"

# The heading of the section documenting each model's keys.
SECTIONS: dict[str, type[BaseModel]] = {
    "Top level": Manifest,
    "[agents.NAME]": AgentTypeModel,
    "mailbox": MailboxModel,
    "[runtime]": RuntimeModel,
    "[supervisor]": SupervisorModel,
    "circuit_breaker": BreakerModel,
    "children": ChildModel,
    "[[start]]": StartModel,
}

_HEADING = re.compile(r"^#{2,3} `?(?P<title>[^`:]+)`?")
_KEY_ROW = re.compile(r"^\| `(?P<key>[a-z_]+)` \|")


def documented_keys() -> dict[str, set[str]]:
    """The keys in each section's table, by section heading."""
    keys: dict[str, set[str]] = {}
    section = ""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        heading = _HEADING.match(line)
        if heading is not None:
            section = heading["title"].strip()
            keys.setdefault(section, set())
        row = _KEY_ROW.match(line)
        if row is not None and section:
            keys[section].add(row["key"])
    return keys


@pytest.mark.parametrize("section", SECTIONS)
def test_every_model_field_is_documented(section: str) -> None:
    """Each section's table lists exactly the fields of its pydantic model."""
    keys = documented_keys()
    assert section in keys, f"docs/manifest.md has no section {section!r}"
    assert keys[section] == set(SECTIONS[section].model_fields)


def test_every_model_has_a_section() -> None:
    """Every model reachable from Manifest has its section, so a new table cannot go unlisted."""
    seen: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [Manifest]
    while pending:
        model = pending.pop()
        if model in seen:
            continue
        seen.add(model)
        for field in model.model_fields.values():
            for kind in re.findall(r"\w+Model\b", str(field.annotation)):
                pending.extend(m for m in SECTIONS.values() if m.__name__ == kind)
    assert seen == set(SECTIONS.values())


@pytest.mark.parametrize(
    "block", [b for b in blocks(PAGE) if b.lang == "toml"], ids=lambda b: b.where
)
def test_examples_are_valid_manifests(block: Block, tmp_path: Path) -> None:
    """Every TOML example on the page passes the manifest's validation."""
    path = tmp_path / "mighty.toml"
    path.write_text(block.code, encoding="utf-8")
    manifest, _ = load_manifest(path)
    assert manifest.agents
