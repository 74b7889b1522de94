"""The guest SDK: write a mighty agent as an ordinary Python class.

    from mighty_agent import Agent, on, export, send, ask

    class Counter(Agent):
        count: int = 0                      # state fields: snapshot/restore and a schema hash

        @on("incr")
        def incr(self, body, sender):
            self.count += body.get("by", 1)
            return {"count": self.count}    # the reply (None: no reply)

    WitWorld = export(Counter)

Build it with `mty build counter.py --wit <mighty>/wit/agent -p <mighty>/guests/sdk -o counter.wasm`
(`mty build` finds both by itself when the handler imports `mighty_agent`).

Outgoing HTTP is the submodule ``mighty_agent.http`` (``from mighty_agent import http``), imported
only by the agents that use it; it also works in a plain handler whose world imports
``wasi:http/outgoing-handler``, where the rest of this package is inert.

Bodies are CBOR on the wire and plain Python data here (dict, list, str, int, float, bytes,
bool, None). Errors from the host arrive as :class:`AgentError` subclasses (``NoProc``,
``Timeout``, ...); an exception escaping a handler fails that message (the sender sees
``failed``) and the agent keeps running unless its supervisor decides otherwise.
"""

import hashlib
import json
import os as _os
import random as _random

import wit_world
from componentize_py_types import Err

from mighty_agent import _cbor
from mighty_agent._source import here as _here

try:
    from wit_world.imports import host
except ImportError:
    # Built against another world (a plain handler using only ``mighty_agent.http``): the
    # package must still import; the agent calls then fail, naming why.
    host = None

if host is not None:
    try:
        # The agent world also imports wasi:http, whose interface is named `types` too, so
        # componentize-py names both bindings by package.
        from wit_world.imports import mighty_agent_types as types
    except ImportError:
        from wit_world.imports import types

__all__ = [
    "Agent",
    "AgentError",
    "BadSpawn",
    "CircuitOpen",
    "Cycle",
    "Failed",
    "MailboxFull",
    "NoProc",
    "Refused",
    "Timeout",
    "ask",
    "cancel_timer",
    "emit",
    "export",
    "http",
    "log",
    "migrates_from",
    "on",
    "self_address",
    "send",
    "send_after",
    "spawn",
]


class AgentError(Exception):
    """A send, ask or spawn did not happen; ``str(e)`` says why."""


class NoProc(AgentError):
    """No live agent has that address."""


class MailboxFull(AgentError):
    """The target's mailbox is full."""


class Refused(AgentError):
    """The target does not accept that message."""


class Failed(AgentError):
    """The target's handler failed on the message."""


class Timeout(AgentError):
    """No reply came in time."""


class Cycle(AgentError):
    """The ask would wait on itself."""


class CircuitOpen(AgentError):
    """The target's circuit breaker is open."""


class BadSpawn(AgentError):
    """The agent type is unknown or could not start."""


def _raise(err):
    value = err.value
    cls = _ERRORS.get(type(value), AgentError)
    raise cls(getattr(value, "value", "timed out")) from None


_dumps = _cbor.dumps
_loads = _cbor.loads

if host is not None:
    _ERRORS = {
        types.AgentError_Noproc: NoProc,
        types.AgentError_MailboxFull: MailboxFull,
        types.AgentError_Refused: Refused,
        types.AgentError_Failed: Failed,
        types.AgentError_Timeout: Timeout,
        types.AgentError_Cycle: Cycle,
        types.AgentError_CircuitOpen: CircuitOpen,
        types.AgentError_BadSpawn: BadSpawn,
    }
    # Looked up once: each module attribute read costs on every message inside wasm.
    _Message = types.Message
    _host_ask = host.ask
    _host_self_address = host.self_address
    _ASKED = _Message("", b"")
    _REPLY = _Message("reply", b"")
else:

    def _not_an_agent(*args):
        raise RuntimeError(
            "mighty_agent: agent calls need the mighty:agent world (build with --wit"
            " <mighty>/wit/agent); this component was built against another one"
        )

    class _NotAnAgent:
        """Stands in for the agent bindings: every call says which world they need."""

        def __getattr__(self, name):
            return _not_an_agent

    host = _NotAnAgent()
    _ERRORS = {}
    _Message = _host_ask = _host_self_address = _not_an_agent
    _ASKED = _REPLY = None


def self_address():
    """This agent's own address, ``type:pid``."""
    _here()
    return _host_self_address()


def send(to, name, body=None):
    """Put message ``name`` with ``body`` in ``to``'s mailbox."""
    _here()
    try:
        host.send(to, _Message(name, _dumps(body)))
    except Err as err:
        _raise(err)


# The most a `timeout-ms` holds (about 49.7 days): "no timeout of my own" to the host, which
# then waits as long as this agent's own deadline allows (its per-message budget).
_NO_TIMEOUT_MS = 0xFFFFFFFF


def ask(to, name, body=None, timeout=None):
    """Send and wait for the reply body, at most ``timeout`` seconds (None: as long as this
    agent's own deadline for the message it is handling allows)."""
    if timeout is None:
        timeout_ms = _NO_TIMEOUT_MS
    else:
        timeout_ms = min(max(int(timeout * 1000), 0), _NO_TIMEOUT_MS)
    # One message object for every ask: the binding copies it into the call and nothing
    # keeps it (a guest cannot be re-entered while it waits), and making a dataclass costs
    # more here than two attribute stores.
    msg = _ASKED
    msg.name = name
    msg.body = _dumps(body)
    _here()
    try:
        reply = _host_ask(to, msg, timeout_ms)
    except Err as err:
        _raise(err)
    body = reply.body
    return _loads(body) if body else None


_TIMERS = "__timers"


def send_after(delay, to, name, body=None, every=None):
    """Have the host send ``name`` with ``body`` to ``to`` in ``delay`` seconds, as this agent
    (then every ``every`` seconds, until cancelled); returns the timer's id. With a runtime
    ``state_dir`` the timer survives a restart; a durable agent's recovered message does not
    set it twice (docs/durability.md). Refused (``Refused``) for a target this agent may not
    message, or a delay, period or body out of bounds."""
    request = {"delay": delay, "to": to, "name": name, "body": _dumps(body), "every": every}
    return ask(_TIMERS, "after", request)


def cancel_timer(timer_id):
    """Cancel one of this agent's timers; False when it is not pending (fired, cancelled)."""
    return ask(_TIMERS, "cancel", {"id": timer_id})


def spawn(agent_type, init=None):
    """Start an agent of a declared type; returns its address."""
    _here()
    try:
        return host.spawn(agent_type, _cbor.dumps(init))
    except Err as err:
        _raise(err)


def log(text, level="info"):
    text = str(text)
    _here()
    host.log(level, text)


def emit(name, body=None):
    """A structured event for the host's event stream."""
    body = _cbor.dumps(body)
    _here()
    host.emit(name, body)


def on(name):
    """Mark a method as the handler of message ``name``: ``method(self, body, sender)``."""

    def mark(method):
        method._mighty_message = name
        return method

    return mark


class Agent:
    """Base class for agents. Class-level annotated attributes are the agent's state."""

    def setup(self, init):
        """Called once with the spawn's init body (override to use it)."""


def migrates_from(schema_hash):
    """Mark a static function ``(old_state: dict) -> dict`` that maps the state saved by the
    version whose schema hash is ``schema_hash`` to this version's fields."""

    def mark(function):
        function._mighty_migrates_from = schema_hash
        return function

    return mark


def _state_fields(cls):
    fields = {}
    renamed = {}
    for klass in reversed(cls.__mro__):
        renamed.update(getattr(klass, "__renamed__", {}))
        for name, annotation in getattr(klass, "__annotations__", {}).items():
            if name.startswith("_"):
                continue
            # A plain class by its name; anything generic (list[int], Optional[str]) in full.
            if isinstance(annotation, str):
                text = annotation
            elif isinstance(annotation, type):
                text = annotation.__name__
            else:
                text = repr(annotation)
            info = {"type": text, "default": any(name in vars(k) for k in cls.__mro__)}
            if name in renamed:
                info["renamed_from"] = renamed[name]
            fields[name] = info
    return fields


def _migrations(cls):
    found = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            function = getattr(attr, "__func__", attr)
            source = getattr(function, "_mighty_migrates_from", None)
            if source is not None:
                found[source] = function
    return found


def export(cls):
    """Turn an Agent subclass into the ``WitWorld`` class componentize-py exports."""
    handlers = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            name = getattr(attr, "_mighty_message", None)
            if name is not None:
                handlers[name] = attr
    fields = _state_fields(cls)
    migrations = _migrations(cls)
    schema_hash = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    renames = {
        info["renamed_from"]: name for name, info in fields.items() if "renamed_from" in info
    }

    holder = []
    handler_for = handlers.get
    _streams = []  # stdout and stderr opened by ``reseed``

    def the_agent():
        # componentize-py makes a new WitWorld object for every export call, so the agent
        # (and its state) lives here, once per instance.
        if not holder:
            agent = cls()
            for field in fields:
                if not hasattr(agent, field):
                    setattr(agent, field, None)
            holder.append(agent)
        return holder[0]

    class World(wit_world.WitWorld):
        @property
        def agent(self):
            return the_agent()

        def init(self, args):
            try:
                self.agent.setup(_cbor.loads(args) if args else None)
            except Exception as exc:
                raise Err(f"{type(exc).__name__}: {exc}") from None

        def handle(self, sender, msg):
            method = handler_for(msg.name)
            if method is None:
                raise Err(f"refused: no handler for message {msg.name!r}")
            try:
                body = msg.body
                body = _loads(body) if body else None
                reply = method(holder[0] if holder else the_agent(), body, sender)
            except Exception as exc:  # AgentError included: the same text
                raise Err(f"{type(exc).__name__}: {exc}") from None
            if reply is None:
                return None
            message = _REPLY  # as _ASKED in ask: one object, copied out on return
            message.body = _dumps(reply)
            return message

        def snapshot(self):
            state = {field: getattr(self.agent, field) for field in fields}
            return _cbor.dumps({"schema": schema_hash, "state": state})

        def restore(self, state):
            try:
                saved = _cbor.loads(state) if state else {}
                values = saved.get("state", {})
                if saved.get("schema") not in (None, schema_hash):
                    migrate = migrations.get(saved.get("schema"))
                    if migrate is not None:
                        values = migrate(dict(values))
                    else:
                        # Compatible by the host's rules: carry kept and renamed fields over;
                        # new fields keep their defaults; removed ones are dropped.
                        values = {renames.get(k, k): v for k, v in values.items()}
                agent = self.agent
                for field in fields:
                    if field in values:
                        setattr(agent, field, values[field])
            except Exception as exc:
                raise Err(f"cannot restore state: {type(exc).__name__}: {exc}") from None

        def reseed(self):
            # The host reuses instances (their memory rewound to a state another instance
            # drew its entropy in): a fresh ``random`` state from the host's secure random,
            # and stdout and stderr opened, so that every instance holds them under the same
            # handles before the agent runs (see the host's mighty.agents._seats).
            _random.seed(int.from_bytes(_os.urandom(32), "big"))
            if not _streams:  # a rewound instance holds them already (its memory says so)
                _os.write(1, b"")
                _os.write(2, b"")
                _streams.append(True)

        def state_schema(self):
            return json.dumps(
                {"hash": schema_hash, "fields": fields, "migrates_from": sorted(migrations)},
                sort_keys=True,
            )

    World.__name__ = "WitWorld"
    return World
