"""State schemas parse hostile JSON safely, and the hot-swap compatibility rules hold."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.reload._schema import (
    MAX_FIELDS,
    MAX_SCHEMA_BYTES,
    Compatibility,
    FieldInfo,
    SchemaError,
    StateSchema,
    check_compatible,
    normalise_type,
    parse_schema,
    to_json,
)

H1 = "a" * 64
H2 = "b" * 64
H3 = "c" * 64


def schema(h: str = H1, migrates_from: tuple[str, ...] = (), **fields: FieldInfo) -> StateSchema:
    """A schema with the given hash and fields."""
    return StateSchema(h, fields, frozenset(migrates_from))


def f(type_: str, default: bool = True, renamed_from: str | None = None) -> FieldInfo:
    """A field shorthand."""
    return FieldInfo(type_, default, renamed_from)


# -- parsing -------------------------------------------------------------------------------------


def test_parse_the_documented_example() -> None:
    """The example from the export's documentation parses to the expected schema."""
    text = json.dumps(
        {
            "hash": H1,
            "fields": {
                "count": {"type": "int", "default": True},
                "names": {"type": "list", "default": False, "renamed_from": "labels"},
            },
            "migrates_from": [H2],
        }
    )
    parsed = parse_schema(text)
    assert parsed == StateSchema(
        H1,
        {"count": f("int", True), "names": f("list", False, "labels")},
        frozenset({H2}),
    )
    assert parse_schema(text.encode()) == parsed


def test_migrates_from_is_optional_and_hash_is_lowercased() -> None:
    """A schema without migrates_from has none, and an uppercase hash compares as lowercase."""
    parsed = parse_schema(json.dumps({"hash": H1.upper(), "fields": {}}))
    assert parsed.hash == H1
    assert parsed.migrates_from == frozenset()


def test_schema_is_frozen_and_hashable() -> None:
    """A schema copies its fields read-only and can be a dict key."""
    fields = {"x": f("int")}
    s = StateSchema(H1, fields)
    fields["y"] = f("str")
    assert set(s.fields) == {"x"}
    with pytest.raises(TypeError):
        s.fields["y"] = f("str")  # type: ignore[index]
    assert {s: 1}[StateSchema(H1, {"x": f("int")})] == 1


def test_schema_error_is_bad_input() -> None:
    """SchemaError belongs to the host's bad-input family."""
    assert issubclass(SchemaError, BadInput)
    assert SchemaError.kind == "bad_schema"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "not valid JSON"),
        ("[]", "must be a JSON object"),
        ('{"fields": {}}', "no 'hash'"),
        ('{"hash": "zz", "fields": {}}', "hex"),
        ('{"hash": 5, "fields": {}}', "hex string"),
        ('{"hash": "ab"}', "no 'fields'"),
        ('{"hash": "ab", "fields": []}', "'fields' must be an object"),
        ('{"hash": "ab", "fields": {}, "extra": 1}', "unknown keys: 'extra'"),
        ('{"hash": "ab", "fields": {"1x": {"type": "int", "default": true}}}', "identifier"),
        ('{"hash": "ab", "fields": {"x": "int"}}', "field 'x' must be an object"),
        ('{"hash": "ab", "fields": {"x": {"default": true}}}', "field 'x' has no 'type'"),
        ('{"hash": "ab", "fields": {"x": {"type": "int"}}}', "field 'x' has no 'default'"),
        ('{"hash": "ab", "fields": {"x": {"type": "int", "default": 1}}}', "true or false"),
        ('{"hash": "ab", "fields": {"x": {"type": " ", "default": true}}}', "'type' is empty"),
        ('{"hash": "ab", "fields": {"x": {"type": 3, "default": true}}}', "must be a string"),
        (
            '{"hash": "ab", "fields": {"x": {"type": "int", "default": true, "renamed": "y"}}}',
            "unknown keys: 'renamed'",
        ),
        (
            '{"hash": "ab", "fields": {"x": {"type": "int", "default": true, "renamed_from": "x"}}}',
            "renamed from itself",
        ),
        (
            '{"hash": "ab", "fields": {"x": {"type": "int", "default": true}, "x": {"type": "str", "default": true}}}',
            "repeats the key 'x'",
        ),
        ('{"hash": "ab", "fields": {}, "migrates_from": "ab"}', "must be a list"),
        ('{"hash": "ab", "fields": {}, "migrates_from": [null]}', "'migrates_from'[0]"),
        ('{"hash": "ab", "fields": {"x": {"type": NaN, "default": true}}}', "not valid JSON"),
        ("[" * 100_000, "limit"),
        ("[" * 10_000, "nested too deeply"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_malformed_schemas_are_rejected_with_a_reason(text: str | bytes, fragment: str) -> None:
    """Each kind of malformed schema raises SchemaError whose message names the fault."""
    with pytest.raises(SchemaError) as info:
        parse_schema(text)
    assert fragment in str(info.value)


def test_limits_on_size_fields_and_lengths() -> None:
    """Oversize documents, too many fields, and overlong names or types are refused."""
    with pytest.raises(SchemaError, match="limit"):
        parse_schema(b" " * (MAX_SCHEMA_BYTES + 1))
    many = {f"f{i}": {"type": "int", "default": True} for i in range(MAX_FIELDS + 1)}
    # Compact separators so the field count, not the byte size, is what trips.
    text = json.dumps({"hash": "ab", "fields": many}, separators=(",", ":"))
    assert len(text) < MAX_SCHEMA_BYTES
    with pytest.raises(SchemaError, match="fields, more than"):
        parse_schema(text)
    long_name = {"x" * 200: {"type": "int", "default": True}}
    with pytest.raises(SchemaError, match="longer than"):
        parse_schema(json.dumps({"hash": "ab", "fields": long_name}))
    long_type = {"x": {"type": "int | " * 100 + "int", "default": True}}
    with pytest.raises(SchemaError, match="more than"):
        parse_schema(json.dumps({"hash": "ab", "fields": long_type}))


# -- type normalisation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Optional[int]", "int | None"),
        ("Optional[int]", "None | int"),
        ("typing.Optional[int]", "int|None"),
        ("Union[int, None]", "int | None"),
        ("NoneType", "None"),
        ("List[int]", "list[int]"),
        ("typing.List[int]", "list[int]"),
        ("Dict[str, List[int]]", "dict[str, list[int]]"),
        ("Tuple[int, ...]", "tuple[int, ...]"),
        ("Set[str]", "set[str]"),
        ("dict[ str , int ]", "dict[str,int]"),
        ("'int'", "int"),
        ("Union[int, Union[str, None]]", "str | None | int"),
    ],
)
def test_normalisation_equates_spellings(a: str, b: str) -> None:
    """Different spellings of one annotation normalise to the same text."""
    assert normalise_type(a) == normalise_type(b)


def test_normalisation_keeps_quoted_literals_and_opaque_text() -> None:
    """Spaces inside a Literal string survive; unparsable text stays as (space-stripped) text."""
    assert normalise_type("Literal['a b']") != normalise_type("Literal['ab']")
    assert normalise_type("my.Thing") == "my.Thing"
    assert normalise_type("[[[[") == "[[[["


# -- compatibility: fixed cases ------------------------------------------------------------------


def test_identical_hash_is_ok_whatever_the_fields() -> None:
    """Two schemas with one hash are the same version, so the swap is ok."""
    assert check_compatible(schema(x=f("int")), schema(y=f("str", False))) == Compatibility(True)


def test_declared_migration_is_ok_and_flagged() -> None:
    """A new version that lists the old hash in migrates_from is ok with migration=True."""
    verdict = check_compatible(schema(H1, x=f("int")), schema(H2, (H1,), x=f("str", False)))
    assert verdict.ok
    assert verdict.migration
    assert verdict.problems == ()


def test_migration_from_another_hash_does_not_count() -> None:
    """migrates_from naming some other hash falls back to the field rules."""
    verdict = check_compatible(schema(H1, x=f("int")), schema(H2, (H3,), x=f("str")))
    assert not verdict.ok
    assert not verdict.migration


def test_removed_field_is_ok() -> None:
    """Dropping a field loses its state but is allowed."""
    assert check_compatible(schema(H1, x=f("int"), y=f("str")), schema(H2, x=f("int"))).ok


def test_added_field_needs_a_default() -> None:
    """A new field with a default is ok; one without is a problem naming the field."""
    old = schema(H1, x=f("int"))
    assert check_compatible(old, schema(H2, x=f("int"), y=f("str", True))).ok
    verdict = check_compatible(old, schema(H2, x=f("int"), y=f("str", False)))
    assert not verdict.ok
    assert len(verdict.problems) == 1
    assert "'y'" in verdict.problems[0]
    assert "no default" in verdict.problems[0]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("int", "int"),
        ("int", "float"),
        ("int", "int | None"),
        ("int", "Optional[int]"),
        ("str", "str | None"),
        ("list[int]", "list"),
        ("List[int]", "list"),
        ("dict[str, int]", "dict"),
        ("Dict[str, int]", "dict"),
        ("int | None", "float | None"),
        ("list[int]", "list[float]"),
        ("list[int]", "list[int | None]"),
        ("dict[str, int]", "dict[str, float]"),
        ("tuple[int, str]", "tuple[int, str | None]"),
        ("tuple[int, int]", "tuple[int, ...]"),
        ("tuple[int, ...]", "tuple[float, ...]"),
        ("int", "int | str"),
        ("int | str", "str | int | None"),
        ("MyThing", "MyThing"),
        ("MyThing", "MyThing | None"),
        ("dict", "Any"),
        ("bytes", "typing.Any"),
        ("str", "object"),
        ("None", "int | None"),
    ],
)
def test_widening_types_are_compatible(old: str, new: str) -> None:
    """A kept field may keep its type or widen it."""
    assert check_compatible(schema(H1, x=f(old)), schema(H2, x=f(new))).ok


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("int", "str"),
        ("float", "int"),
        ("int | None", "int"),
        ("Optional[str]", "str"),
        ("list", "list[int]"),
        ("dict", "dict[str, int]"),
        ("list[int]", "list[str]"),
        ("list[float]", "list[int]"),
        ("dict[str, int]", "dict[int, int]"),
        ("tuple[int, ...]", "tuple[int, int]"),
        ("tuple[int, int]", "tuple[int]"),
        ("list[int]", "set[int]"),
        ("MyThing", "OtherThing"),
        ("Box[int]", "Box[float]"),
        ("Any", "int"),
        ("bool", "int"),
        ("int | str", "int"),
        ("[[[[", "int"),
    ],
)
def test_other_type_changes_are_problems(old: str, new: str) -> None:
    """A narrowing or unrelated type change is refused with a sentence naming the field and types."""
    verdict = check_compatible(schema(H1, count=f(old)), schema(H2, count=f(new)))
    assert not verdict.ok
    assert len(verdict.problems) == 1
    problem = verdict.problems[0]
    assert "'count'" in problem
    assert normalise_type(old) in problem
    assert normalise_type(new) in problem


def test_rename_carries_the_old_field() -> None:
    """A field renamed from an old one that is gone is ok when the types fit."""
    old = schema(H1, labels=f("list[str]", False))
    new = schema(H2, names=f("list", False, "labels"))
    assert check_compatible(old, new).ok


def test_rename_type_must_fit() -> None:
    """A rename whose type narrows is a problem naming both names."""
    old = schema(H1, labels=f("list", False))
    verdict = check_compatible(old, schema(H2, names=f("list[str]", False, "labels")))
    assert not verdict.ok
    assert "'names'" in verdict.problems[0]
    assert "'labels'" in verdict.problems[0]


def test_rename_from_a_missing_field_is_a_problem() -> None:
    """Renaming from a field the old state never had is a problem."""
    verdict = check_compatible(schema(H1, x=f("int")), schema(H2, names=f("list", True, "labels")))
    assert not verdict.ok
    assert "'names'" in verdict.problems[0]
    assert "'labels'" in verdict.problems[0]


def test_stale_rename_is_a_kept_field() -> None:
    """A renamed_from left over from an earlier version (old state already uses the new name) is ok."""
    old = schema(H1, names=f("list", False))
    assert check_compatible(old, schema(H2, names=f("list", False, "labels"))).ok
    verdict = check_compatible(old, schema(H2, names=f("str", False, "labels")))
    assert not verdict.ok
    assert "'names'" in verdict.problems[0]


def test_rename_while_old_name_still_exists_is_a_conflict() -> None:
    """Renaming from a field that the new version still has is a conflict."""
    old = schema(H1, labels=f("list"))
    verdict = check_compatible(old, schema(H2, labels=f("list"), names=f("list", True, "labels")))
    assert not verdict.ok
    assert len(verdict.problems) == 1
    assert "'names'" in verdict.problems[0]
    assert "'labels'" in verdict.problems[0]


def test_two_renames_from_one_field_is_a_conflict() -> None:
    """Two new fields renamed from the same old field is one problem naming all three."""
    old = schema(H1, labels=f("list"))
    new = schema(H2, a=f("list", True, "labels"), b=f("list", True, "labels"))
    verdict = check_compatible(old, new)
    assert not verdict.ok
    assert len(verdict.problems) == 1
    assert all(name in verdict.problems[0] for name in ("'a'", "'b'", "'labels'"))


def test_rename_onto_a_name_the_old_state_has_is_ambiguous() -> None:
    """Renaming y from x when the old state has both x and y is refused as ambiguous."""
    old = schema(H1, x=f("int"), y=f("int"))
    verdict = check_compatible(old, schema(H2, y=f("int", True, "x")))
    assert not verdict.ok
    assert "ambiguous" in verdict.problems[0]


def test_every_problem_is_reported() -> None:
    """Several faults give one sentence each."""
    old = schema(H1, a=f("int"), b=f("str"))
    new = schema(H2, a=f("str"), b=f("int"), c=f("int", False))
    verdict = check_compatible(old, new)
    assert len(verdict.problems) == 3
    assert all(p.endswith(".") for p in verdict.problems)


# -- compatibility: properties -------------------------------------------------------------------

TYPES = [
    "int",
    "float",
    "str",
    "bytes",
    "bool",
    "list",
    "dict",
    "tuple",
    "set",
    "None",
    "Optional[int]",
    "int | None",
    "list[int]",
    "List[str]",
    "dict[str, int]",
    "tuple[int, ...]",
    "Any",
    "MyThing",
    "Box[int]",
]

names = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)
hashes = st.from_regex(r"[0-9a-f]{64}", fullmatch=True)
type_texts = st.one_of(
    st.sampled_from(TYPES),
    st.text(
        st.characters(codec="ascii", categories=["L", "N", "P", "S", "Zs"]), max_size=30
    ).filter(str.strip),
)


@st.composite
def schemas(draw: st.DrawFn) -> StateSchema:
    """Well-formed schemas: a renamed_from never names a field of the same schema, nor twice."""
    field_names = draw(st.lists(names, unique=True, max_size=8))
    sources = draw(st.lists(names, unique=True, max_size=4))
    sources = [s for s in sources if s not in field_names]
    fields: dict[str, FieldInfo] = {}
    for name in field_names:
        rename: bool = draw(st.booleans())
        renamed_from = sources.pop() if sources and rename else None
        fields[name] = FieldInfo(draw(type_texts), draw(st.booleans()), renamed_from)
    migrates = draw(st.frozensets(hashes, max_size=3))
    return StateSchema(draw(hashes), fields, migrates)


@given(schemas(), hashes)
def test_a_schema_is_compatible_with_itself(s: StateSchema, other_hash: str) -> None:
    """(a) A schema is compatible with itself, also under a different hash (field rules apply)."""
    assert check_compatible(s, s).ok
    relabelled = replace(s, hash=other_hash, migrates_from=frozenset())
    if other_hash != s.hash:
        verdict = check_compatible(s, relabelled)
        assert verdict.ok, verdict.problems
        assert not verdict.migration


@given(schemas(), st.data())
def test_removing_fields_and_adding_defaulted_ones_stays_ok(
    s: StateSchema, data: st.DataObject
) -> None:
    """(b) Removing any fields and adding fields with defaults keeps the swap ok."""
    keep = data.draw(st.sets(st.sampled_from(sorted(s.fields))) if s.fields else st.just(set()))
    fields = {name: info for name, info in s.fields.items() if name in keep}
    added = data.draw(st.lists(names, unique=True, max_size=4))
    for name in added:
        if name not in s.fields:
            fields[name] = FieldInfo(data.draw(type_texts), True, None)
    new_hash = data.draw(hashes.filter(lambda h: h != s.hash))
    verdict = check_compatible(s, StateSchema(new_hash, fields))
    assert verdict.ok, verdict.problems


# Pairs where no value of the first type is guaranteed to fit the second.
INCOMPATIBLE = [
    ("int", "str"),
    ("float", "int"),
    ("str", "bytes"),
    ("bytes", "str"),
    ("int | None", "int"),
    ("Optional[str]", "str"),
    ("list", "list[int]"),
    ("dict", "dict[str, int]"),
    ("list[int]", "list[str]"),
    ("list[int]", "tuple[int, ...]"),
    ("set", "list"),
    ("Any", "int"),
    ("MyThing", "OtherThing"),
    ("bool", "str"),
]


@given(schemas(), st.sampled_from(INCOMPATIBLE), st.data())
def test_an_incompatible_type_change_is_never_ok(
    s: StateSchema, pair: tuple[str, str], data: st.DataObject
) -> None:
    """(c) Changing a kept field to an incompatible type is refused, naming that field."""
    old_type, new_type = pair
    target = data.draw(names)
    old_fields = dict(s.fields)
    old_fields[target] = FieldInfo(old_type, data.draw(st.booleans()), None)
    new_fields = dict(old_fields)
    new_fields[target] = FieldInfo(new_type, data.draw(st.booleans()), None)
    old = StateSchema(s.hash, old_fields)
    new_hash = data.draw(hashes.filter(lambda h: h != s.hash))
    verdict = check_compatible(old, StateSchema(new_hash, new_fields))
    assert not verdict.ok
    assert any(f"'{target}'" in p for p in verdict.problems)


arbitrary_fields = st.dictionaries(
    names,
    st.builds(FieldInfo, type_texts, st.booleans(), st.none() | names),
    max_size=8,
)
arbitrary_schemas = st.builds(
    StateSchema,
    st.sampled_from([H1, H2, H3]),
    arbitrary_fields,
    st.frozensets(st.sampled_from([H1, H2, H3])),
)


@given(arbitrary_schemas, arbitrary_schemas)
def test_check_compatible_never_raises(old: StateSchema, new: StateSchema) -> None:
    """(d) Any pair of schemas gets a verdict, and ok is exactly 'no problems'."""
    verdict = check_compatible(old, new)
    assert verdict.ok == (not verdict.problems)
    assert all(isinstance(p, str) and p for p in verdict.problems)


@given(arbitrary_schemas)
def test_parse_round_trips_to_json(s: StateSchema) -> None:
    """to_json then parse_schema gives back the same schema (renamed_from=self excepted)."""
    fields = {
        name: info if info.renamed_from != name else replace(info, renamed_from=None)
        for name, info in s.fields.items()
    }
    s = replace(s, fields=fields)
    assert parse_schema(to_json(s)) == s


garbage_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(st.one_of(st.binary(max_size=200), st.text(max_size=200), garbage_json.map(json.dumps)))
def test_garbage_raises_only_schema_error(garbage: str | bytes) -> None:
    """Random bytes, text and JSON either parse or raise SchemaError, never anything else."""
    with contextlib.suppress(SchemaError):
        parse_schema(garbage)


@given(
    st.fixed_dictionaries(
        {"hash": hashes, "fields": st.dictionaries(names, garbage_json, max_size=3)},
        optional={"migrates_from": garbage_json},
    )
)
def test_near_miss_schemas_raise_only_schema_error(doc: dict[str, object]) -> None:
    """Schema-shaped JSON with garbage inside either parses or raises SchemaError only."""
    with contextlib.suppress(SchemaError):
        parse_schema(json.dumps(doc))
