"""Route templates of the agents' HTTP front: ``POST /kv/{key}``, parsed once, matched per request.

A route is a method and a path template. A template is ``/`` and segments separated by ``/``;
a segment is literal text or a whole parameter, ``{name}`` (any one non-empty segment, a
string) or ``{name:int}`` (an optionally signed decimal integer). A request path is split at
``/`` and percent-decoded per segment (so ``%2F`` in a key is a slash inside one value, never
a separator), and the query is ignored.

Two routes of the same method with the same shape (literals equal, parameters of the same
kind at the same places, whatever their names) are a duplicate, refused when the table is
made. Overlapping routes are allowed and the most specific wins, segment by segment from
the left: a literal over ``{x:int}`` over ``{x}`` (``GET /kv/size`` before ``GET /kv/{key}``).

Rejected: regular expressions in templates (a route table is configuration, and a regex is
where a route silently matches too much or backtracks); parameters inside a segment
(``/v{n}``) and catch-all tails (``{rest:path}``): no route of an agent needs them yet, and each
makes duplicates and precedence harder to state; matching in the order written (a route added
later could never be reached, silently).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from mighty._errors import BadInput

__all__ = ["METHODS", "Route", "RouteMatch", "RouteTable", "parse_route", "split_path"]

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
"""The methods a route may name (HEAD and OPTIONS are not routed to agents)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_LITERAL = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@]+\Z")
_MAX_SEGMENTS = 32

Kind = Literal["str", "int"]
_RANK = {"lit": 0, "int": 1, "str": 2}


@dataclass(frozen=True, slots=True)
class Route:
    """One parsed route: ``method``, ``template`` as written, and its ``segments``: each a
    literal string or a (name, kind) parameter."""

    method: str
    template: str
    segments: tuple[str | tuple[str, Kind], ...]

    @property
    def params(self) -> tuple[str, ...]:
        """The parameter names, left to right."""
        return tuple(s[0] for s in self.segments if isinstance(s, tuple))

    @property
    def shape(self) -> tuple[str, tuple[str, ...]]:
        """What makes two routes a duplicate: the method and the segments with parameter
        names erased."""
        erased = tuple(s if isinstance(s, str) else "{" + s[1] + "}" for s in self.segments)
        return self.method, erased

    def __str__(self) -> str:
        return f"{self.method} {self.template}"

    def match(self, parts: tuple[str, ...]) -> dict[str, str | int] | None:
        """The parameters if the decoded path segments ``parts`` match, else None."""
        if len(parts) != len(self.segments):
            return None
        found: dict[str, str | int] = {}
        for part, segment in zip(parts, self.segments, strict=True):
            if isinstance(segment, str):
                if part != segment:
                    return None
                continue
            name, kind = segment
            if not part:
                return None
            if kind == "int":
                number = _integer(part)
                if number is None:
                    return None
                found[name] = number
            else:
                found[name] = part
        return found

    def _rank(self) -> tuple[int, ...]:
        return tuple(_RANK["lit" if isinstance(s, str) else s[1]] for s in self.segments)


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """What a request path found: the route (None: no route of any method matched the path)
    and its parameters; ``allowed`` lists the methods the path has when the method had none."""

    route: Route | None
    params: dict[str, str | int]
    allowed: tuple[str, ...] = ()


def _integer(text: str) -> int | None:
    digits = text[1:] if text[:1] in ("-", "+") else text
    if not digits or len(digits) > 18 or not (digits.isascii() and digits.isdigit()):
        return None
    return int(text)


def parse_route(text: str) -> Route:
    """``"METHOD /path/{param}"`` as a :class:`Route`; :class:`BadInput` saying what is wrong."""
    if not isinstance(text, str):
        raise BadInput(f"a route is a string like 'POST /kv/{{key}}', got {text!r}")
    method, _, template = text.strip().partition(" ")
    template = template.strip()
    if method not in METHODS:
        raise BadInput(
            f"route {text!r}: the method must be one of {', '.join(METHODS)} (upper case), "
            f"followed by a space and the path"
        )
    if not template.startswith("/"):
        raise BadInput(f"route {text!r}: the path must start with '/'")
    if "?" in template or "#" in template:
        raise BadInput(f"route {text!r}: a route has no query or fragment")
    body = template[1:]
    raw = body.split("/") if body else []
    if len(raw) > _MAX_SEGMENTS:
        raise BadInput(f"route {text!r}: more than {_MAX_SEGMENTS} segments")
    segments: list[str | tuple[str, Kind]] = []
    names: set[str] = set()
    for index, part in enumerate(raw):
        if part == "":
            where = "a trailing '/'" if index == len(raw) - 1 else "an empty segment ('//')"
            raise BadInput(f"route {text!r}: {where} is not allowed")
        if part.startswith("{") and part.endswith("}"):
            name, colon, kind = part[1:-1].partition(":")
            if not _NAME.match(name):
                raise BadInput(
                    f"route {text!r}: parameter {part!r} needs a name of letters, digits and _"
                )
            if colon and kind not in ("int", "str"):
                raise BadInput(f"route {text!r}: parameter {part!r}: the kind is int or str")
            if name in names:
                raise BadInput(f"route {text!r}: parameter {name!r} appears twice")
            names.add(name)
            segments.append((name, "int" if kind == "int" else "str"))
            continue
        if "{" in part or "}" in part:
            raise BadInput(
                f"route {text!r}: segment {part!r}: a parameter is a whole segment, {{name}}"
            )
        if not _LITERAL.match(part):
            raise BadInput(
                f"route {text!r}: segment {part!r} has a character a path segment cannot "
                "carry unescaped"
            )
        segments.append(part)
    return Route(method, template, tuple(segments))


def split_path(target: str) -> tuple[str, ...] | None:
    """A request target's path as decoded segments (query dropped); None if it is not an
    origin-form path (``*``, an absolute URL) or a segment does not decode."""
    path = target.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        return None
    body = path[1:]
    if not body:
        return ()
    try:
        return tuple(unquote(p, errors="strict") for p in body.split("/"))
    except UnicodeDecodeError:
        return None


class RouteTable:
    """Routes, checked for duplicates, matched most specific first."""

    def __init__(self, routes: list[Route]) -> None:
        seen: dict[tuple[str, tuple[str, ...]], Route] = {}
        for route in routes:
            twin = seen.get(route.shape)
            if twin is not None:
                raise BadInput(f"route {route} duplicates {twin} (the same method and path shape)")
            seen[route.shape] = route
        self.routes = tuple(routes)
        # Most specific first: literal < int < str at the first differing segment.
        self._ordered = sorted(self.routes, key=lambda r: (len(r.segments), r._rank()))

    def match(self, method: str, target: str) -> RouteMatch:
        """The route for ``method`` and the request ``target``; a :class:`RouteMatch` whose
        ``route`` is None when none matches (``allowed``: other methods that would)."""
        parts = split_path(target)
        if parts is None:
            return RouteMatch(None, {})
        allowed: list[str] = []
        for route in self._ordered:
            if len(route.segments) != len(parts):
                continue
            params = route.match(parts)
            if params is None:
                continue
            if route.method == method:
                return RouteMatch(route, params)
            if route.method not in allowed:
                allowed.append(route.method)
        return RouteMatch(None, {}, tuple(sorted(allowed)))
