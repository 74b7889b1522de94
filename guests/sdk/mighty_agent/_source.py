"""Source positions: the agent's Python file, line and function at each import the SDK makes.

The host says once per instance whether it wants them (``mighty:agent/debug#positions``: true
only while a recording that keeps them watches the instance, or a replay of one runs it); then
:func:`here`, called by every SDK function just before its import, hands its caller's frame
to ``mighty:agent/debug#at``. When the host does not want
them, :func:`here` costs a call and a list read. Strings are cut here as the host cuts them
(``MAX_FILE``, ``MAX_FUNCTION``), so long names are not copied out of the guest only to be cut.

Rejected: asking at import time (componentize-py runs the module's top level while building,
where there is no host to ask); walking up to the first frame outside this package (its
per-frame module-name test cost more fuel than the rest: each SDK function passes its depth).
"""

import sys

try:
    from wit_world.imports import debug as _debug
except ImportError:  # built against a world without mighty:agent/debug
    _debug = None

__all__ = ["here"]

MAX_FILE = 160
MAX_FUNCTION = 80

# [None]: not asked yet; then [True] or [False] for the instance's life.
_wanted = [None]


def _ask():
    if _debug is None:
        return False
    try:
        return bool(_debug.positions())
    except Exception:  # a host that does not answer: no positions
        return False


def here(depth=2):
    """Send the position of the frame ``depth`` above this one to the host, when it wants
    them (2: the caller of the SDK function that calls this)."""
    wanted = _wanted[0]
    if wanted is None:
        wanted = _wanted[0] = _ask()
    if not wanted:
        return
    frame = sys._getframe(depth)
    code = frame.f_code
    names = _names.get(code)
    if names is None:
        names = _names[code] = _names_of(code)
    _debug.at(names[0], frame.f_lineno or 0, names[1])


def _names_of(code):
    file = code.co_filename
    if len(file) > MAX_FILE:
        file = "..." + file[-(MAX_FILE - 3) :]
    function = getattr(code, "co_qualname", code.co_name)
    if len(function) > MAX_FUNCTION:
        function = function[: MAX_FUNCTION - 3] + "..."
    return file, function


# A code object's (file, function), cut: looked up once per function, not per import.
_names = {}
