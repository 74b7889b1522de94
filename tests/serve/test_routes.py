"""Route templates (hypothesis): a path built from a template's values matches it with those
values; the most specific route wins; duplicates are refused; any target is safe to match."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty._errors import BadInput
from mighty.serve import BodyConflict, RouteTable, build_body, parse_route

LITERAL = st.text(
    alphabet=st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789-._~"), min_size=1, max_size=8
)
NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
METHOD = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE"])


@st.composite
def templates(draw: st.DrawFn) -> tuple[str, list[tuple[str, Any]]]:
    """A template and, per segment, ("lit", text) or (kind, (name, value))."""
    count = draw(st.integers(0, 6))
    names = draw(st.lists(NAME, min_size=count, max_size=count, unique=True))
    parts: list[str] = []
    plan: list[tuple[str, Any]] = []
    for name in names:
        kind = draw(st.sampled_from(["lit", "str", "int"]))
        if kind == "lit":
            text = draw(LITERAL)
            parts.append(text)
            plan.append(("lit", text))
        elif kind == "int":
            number = draw(st.integers(-(10**17), 10**17))
            parts.append("{" + name + ":int}")
            plan.append(("int", (name, number)))
        else:
            text = draw(st.text(min_size=1, max_size=12).filter(lambda t: t not in (".", "..")))
            parts.append("{" + name + "}")
            plan.append(("str", (name, text)))
    return "/" + "/".join(parts), plan


@given(METHOD, templates())
def test_a_path_made_from_values_matches_with_those_values(
    method: str, made: tuple[str, list[tuple[str, Any]]]
) -> None:
    """Percent-encoded values in place of the parameters come back decoded (ints as ints)."""
    template, plan = made
    route = parse_route(f"{method} {template}")
    assert str(route) == f"{method} {template}"
    segments = []
    expected: dict[str, Any] = {}
    for kind, item in plan:
        if kind == "lit":
            segments.append(item)
        else:
            name, value = item
            segments.append(quote(str(value), safe=""))
            expected[name] = value
    found = RouteTable([route]).match(method, "/" + "/".join(segments) + "?q=1")
    assert found.route == route
    assert found.params == expected


@given(METHOD, templates(), st.text(max_size=60))
def test_any_target_is_matched_or_not_without_error(
    method: str, made: tuple[str, list[tuple[str, Any]]], target: str
) -> None:
    """Arbitrary request targets (not paths, bad escapes, odd unicode) never raise."""
    table = RouteTable([parse_route(f"{method} {made[0]}")])
    result = table.match(method, target)
    assert result.route is None or result.route.method == method


@given(NAME, NAME, LITERAL)
def test_the_most_specific_route_wins(a: str, b: str, literal: str) -> None:
    """At the same place a literal beats {x:int}, which beats {x}, whatever the order."""
    routes = [
        parse_route("GET /kv/{" + a + "}"),
        parse_route("GET /kv/{" + b + ":int}"),
        parse_route(f"GET /kv/{literal}"),
    ]
    for order in (routes, routes[::-1]):
        table = RouteTable(order)
        assert table.match("GET", f"/kv/{literal}").route == routes[2]
        if not literal.lstrip("-+").isdigit():
            assert table.match("GET", "/kv/12").route == routes[1]
        assert table.match("GET", "/kv/x~y").route == routes[0]


@given(NAME, NAME, METHOD)
def test_the_same_shape_twice_is_a_duplicate(a: str, b: str, method: str) -> None:
    """Renaming the parameters does not make a route new; another method does."""
    first = parse_route(f"{method} /a/{{{a}}}/b")
    with pytest.raises(BadInput, match="duplicates"):
        RouteTable([first, parse_route(f"{method} /a/{{{b}}}/b")])
    other = "GET" if method != "GET" else "POST"
    table = RouteTable([first, parse_route(f"{other} /a/{{{b}}}/b")])
    assert table.match(other, "/a/1/b").allowed == ()
    missing = table.match("PUT" if "PUT" not in (method, other) else "PATCH", "/a/1/b")
    assert missing.route is None and missing.allowed == tuple(sorted((method, other)))


@pytest.mark.parametrize(
    "text",
    ["GET", "GET kv", "get /kv", "GET /kv/", "GET /a//b", "GET /{}", "GET /{1x}", "GET /{a}/{a}",
     "GET /x{a}", "GET /{a:float}", "GET /a?b", "GET /a b", "HEAD /a", "GET /" + "a/" * 40 + "a"],
)  # fmt: skip
def test_bad_templates_are_refused(text: str) -> None:
    """Each malformed template is a BadInput naming the route."""
    with pytest.raises(BadInput, match="route"):
        parse_route(text)


@given(
    st.dictionaries(NAME, st.integers() | st.text(max_size=5), max_size=4),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=4),
)
def test_the_default_body_is_the_union_or_a_conflict(
    params: dict[str, Any], payload: dict[str, Any]
) -> None:
    """No template: the JSON object and the parameters merged, a shared key refused."""
    if set(params) & set(payload):
        with pytest.raises(BodyConflict):
            build_body(None, params, payload)
    else:
        assert build_body(None, params, payload) == ({**payload, **params} if params else payload)


def test_a_body_template_fills_parameters_and_the_json_body() -> None:
    """{name} is the parameter (typed), $body the body, $body.FIELD one field or null."""
    template = {"k": "{key}", "n": ["{n}", "$body.v", "$body.none"], "all": "$body", "x": 1}
    body = build_body(template, {"key": "a/b", "n": 3}, {"v": [1]})
    assert body == {"k": "a/b", "n": [3, [1], None], "all": {"v": [1]}, "x": 1}
    assert build_body(template, {"key": "a", "n": 1})["all"] is None
