"""`mighty.toml`: agent types, the supervision tree and the messages to send at start.

workers = 2

[agents.kv]
source = "kvstore.py"              # a handler, built with `mty build` (cached); or
# component = "kvstore.wasm"       # a component built elsewhere
fuel = 1_000_000_000               # per message
memory = "128MiB"
timeout = 5.0
accepts = ["put", "get", "crash"]  # anything else is refused before the guest sees it
dirs = ["data:/data"]              # read-only; HOST:GUEST:rw to write; HOST relative to here
mailbox = { capacity = 256, on_full = "block" }
hibernate_after = 30.0             # idle seconds before it leaves memory (needs state_dir)
durable = false                    # true: its state is stored after every message
cancellable = true                 # false: a handler runs on when its asker gives up
retry = { attempts = 3, backoff = 0.1, dead_letter = "dlq" }  # a message that crashed it

[runtime]
state_dir = "state"                # the snapshot store (SQLite, WAL); relative to here

[supervisor]
strategy = "one_for_one"
intensity = 3
period = 5.0
children = [ { name = "kv", type = "kv", init = { seed = 1 } } ]

[[start]]
to = "kv"
message = "put"
body = { key = "a", value = 1 }

[http]                             # agents behind HTTP routes (mty run serves them)
listen = "127.0.0.1:8080"
routes = [ { route = "POST /kv/{key}", to = "kv", message = "put",
             body = { key = "{key}", value = "$body.value" } } ]
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mighty._errors import BadInput
from mighty._resources import agent_sdk, agent_wit
from mighty.agents._tree import AgentChild, BreakerSettings, SupervisorSpec
from mighty.agents._types import AgentType, Grants, MailboxSettings, RetryPolicy
from mighty.budget import Budget
from mighty.capabilities import Capabilities, HostTool, McpServer
from mighty.engine import Component
from mighty.wasi import Policy

if TYPE_CHECKING:
    from mighty.serve import AgentRoute

__all__ = [
    "Manifest",
    "agent_types",
    "capabilities",
    "http_routes",
    "load_manifest",
    "state_dir",
    "supervisor_spec",
]

_UNITS = {"": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 1 << 20}
_UNITS |= {"g": 10**9, "gb": 10**9, "gib": 1 << 30}


def _size(value: int | str) -> int:
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits) :].strip()
    if not digits.strip().isdigit() or unit not in _UNITS:
        raise ValueError(f"{value!r} is not a size (examples: 67108864, 64MiB, 1G)")
    return int(digits) * _UNITS[unit]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MailboxModel(_Model):
    capacity: int = Field(1024, ge=1)
    on_full: Literal["block", "drop", "fail"] = "block"
    block_timeout: float = Field(1.0, gt=0)


class HttpGrantModel(_Model):
    origin: str
    methods: list[str] | None = None
    secrets: dict[str, str] = {}
    """Header -> where its value is: ``"Bearer ${ENV_VAR}"`` or ``"@path/to/file"``."""
    allow_private: bool = False


class McpModel(_Model):
    command: list[str] | None = None
    url: str | None = None
    token: str | None = None
    """Where a bearer token for ``url`` is: ``"${ENV_VAR}"`` or ``"@path/to/file"``."""
    env: dict[str, str] = {}
    cwd: str | None = None
    tools: list[str] | None = None
    timeout: float = Field(60.0, gt=0)
    connect_timeout: float = Field(30.0, gt=0)
    max_message: int | str = 4 << 20

    @field_validator("max_message")
    @classmethod
    def _max_message(cls, value: int | str) -> int | str:
        _size(value)
        return value


class CapabilityModel(_Model):
    """One ``[capabilities.NAME]``: exactly one of ``tool``, ``mcp`` and ``http``."""

    tool: str | None = None
    """A host tool: ``module:function``, imported with the manifest's directory on the path."""
    timeout: float | None = Field(None, gt=0)
    mcp: McpModel | None = None
    http: list[str | HttpGrantModel] | None = None


class RetryModel(_Model):
    attempts: int = Field(3, ge=1, le=100)
    backoff: float = Field(0.1, ge=0, le=3600)
    max_backoff: float = Field(10.0, ge=0, le=3600)
    dead_letter: str | None = None


class AgentTypeModel(_Model):
    source: str | None = None
    component: str | None = None
    fuel: int | None = Field(None, gt=0)
    memory: int | str | None = None
    timeout: float | None = Field(None, gt=0)
    lifetime_fuel: int | None = Field(None, gt=0)
    accepts: list[str] | None = None
    dirs: list[str] = []
    env: dict[str, str] = {}
    http: list[str | HttpGrantModel] = []
    http_limits: dict[str, int | float] = {}
    mailbox: MailboxModel = MailboxModel()
    hibernate_after: float | None = Field(None, gt=0)
    durable: bool = False
    cancellable: bool = True
    """False: a message's handler runs to its own budget when its asker gives up or is
    cancelled (see ``AgentType.cancellable``)."""
    retry: RetryModel | None = None
    """Deliver a message that crashed the agent again (see ``AgentType.retry``)."""
    capabilities: list[str] = []
    """Names from ``[capabilities]`` (``files`` or ``files.read`` for one tool of a server)."""
    spawns: list[str] = []
    """Agent types its agents may spawn (``"*"``: any); none by default."""
    messages: list[str] = ["*"]
    """Agent types or registered names its agents may send to and ask; any by default."""
    inspects: list[str] = []
    """Agent types whose bodies its agents may read with ``__inspect`` (introspect on)."""

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            _size(value)
        return value


class BreakerModel(_Model):
    failure_threshold: int = Field(5, ge=1)
    window: float = Field(10.0, gt=0)
    cooldown: float = Field(5.0, gt=0)


class ChildModel(_Model):
    name: str
    type: str | None = None
    init: Any = None
    restart: Literal["permanent", "transient", "temporary"] = "permanent"
    supervisor: SupervisorModel | None = None


class SupervisorModel(_Model):
    name: str = "root"
    strategy: Literal["one_for_one", "rest_for_one", "one_for_all"] = "one_for_one"
    intensity: int = Field(3, ge=0)
    period: float = Field(5.0, gt=0)
    circuit_breaker: BreakerModel | None = None
    children: list[ChildModel] = []


class StartModel(_Model):
    to: str
    message: str
    body: Any = None
    ask: bool = True
    timeout: float = Field(30.0, gt=0)


class RuntimeModel(_Model):
    state_dir: str | None = None


class HttpRouteModel(_Model):
    """One ``[[http.routes]]``: ``route`` ("METHOD /path/{param}") asks ``to`` ``message``."""

    route: str
    to: str
    """An agent of the tree by name, or ``"{param}"``: the name comes from the path."""
    message: str
    body: Any = None
    """A template (``"{param}"``, ``"$body"``, ``"$body.FIELD"``); none: the path parameters
    merged into the JSON object body (docs/serve.md)."""
    timeout: float | None = Field(None, gt=0)
    type: str | None = None
    """With ``to = "{param}"``: the agent type the named agents have (checks ``message``)."""


class HttpModel(_Model):
    """The ``[http]`` block: agents behind routes of mighty.serve's HTTP server."""

    listen: str | None = None
    """HOST:PORT that `mty run` serves (``--http`` overrides); none: only with ``--http``."""
    token_file: str | None = None
    """A file holding the bearer token (relative to the manifest); required off loopback."""
    max_concurrent: int = Field(32, ge=1)
    max_connections: int = Field(1024, ge=1)
    max_request_bytes: int | str = 1 << 20
    max_response_bytes: int | str = 16 << 20
    header_timeout: float = Field(10.0, gt=0)
    body_timeout: float = Field(30.0, gt=0)
    idle_timeout: float = Field(5.0, gt=0)
    shutdown_timeout: float = Field(30.0, gt=0)
    routes: list[HttpRouteModel] = Field(min_length=1)

    @field_validator("max_request_bytes", "max_response_bytes")
    @classmethod
    def _max_bytes(cls, value: int | str) -> int | str:
        _size(value)  # a positive size is checked by ServeLimits when it serves
        return value


class Manifest(_Model):
    """A parsed, validated `mighty.toml`."""

    workers: int | None = Field(None, ge=1)
    runtime: RuntimeModel = RuntimeModel()
    agents: dict[str, AgentTypeModel]
    capabilities: dict[str, CapabilityModel] = {}
    """Host tools, MCP servers and HTTP grants, granted to agent types by name."""
    supervisor: SupervisorModel = SupervisorModel()
    start: list[StartModel] = []
    introspect: bool = False
    """The introspect capability: snapshots and spans carry bodies (docs/observability.md)."""
    telemetry: dict[str, Any] | None = None
    """OpenTelemetry export settings, checked by mighty.telemetry.load_config."""
    cluster: dict[str, Any] | None = None
    """The ``[cluster]`` block, validated by ``mighty.cluster`` (``mty node``), not here."""
    http: HttpModel | None = None
    """Agents behind HTTP routes (``mty run`` serves them; docs/serve.md)."""


ChildModel.model_rebuild()


def load_manifest(path: str | Path) -> tuple[Manifest, Path]:
    """Parse and validate a manifest; BadInput naming the problem otherwise."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"{path} is not valid TOML: {exc}") from None
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise BadInput(f"{path}: {problems}") from None
    _check_tree(manifest, manifest.supervisor)
    _check_grants(path, manifest)
    if manifest.http is not None:
        http_routes(manifest, path)
    if manifest.runtime.state_dir is None:
        for name, spec in manifest.agents.items():
            if spec.durable or spec.hibernate_after is not None:
                raise BadInput(
                    f"{path}: agent type {name!r} sets hibernate_after or durable, which need "
                    "[runtime] state_dir"
                )
    return manifest, path.resolve().parent


def _check_grants(path: Path, manifest: Manifest) -> None:
    """Every granted name is declared (types for spawns; capabilities for capabilities)."""
    for name, spec in manifest.agents.items():
        for granted in spec.spawns:
            if granted != "*" and granted not in manifest.agents:
                raise BadInput(f"{path}: agent type {name!r} spawns unknown type {granted!r}")
        for granted in spec.capabilities:
            server, dot, _tool = granted.partition(".")
            declared = manifest.capabilities.get(granted if not dot else server)
            if declared is None or (dot and declared.mcp is None):
                known = ", ".join(sorted(manifest.capabilities)) or "none are declared"
                raise BadInput(
                    f"{path}: agent type {name!r} is granted {granted!r}, which is not in "
                    f"[capabilities] ({known})"
                )
    for name, cap in manifest.capabilities.items():
        kinds = [k for k in ("tool", "mcp", "http") if getattr(cap, k) is not None]
        if len(kinds) != 1:
            raise BadInput(f"{path}: [capabilities.{name}] needs exactly one of tool, mcp and http")


def _children(node: SupervisorModel, found: dict[str, str]) -> dict[str, str]:
    for child in node.children:
        if child.supervisor is not None:
            _children(child.supervisor, found)
        elif child.type is not None:
            found[child.name] = child.type
    return found


def http_routes(manifest: Manifest, path: Path | str = "mighty.toml") -> list[AgentRoute]:
    """The ``[http]`` routes, checked: each template parses, no two are the same route, each
    asks an agent of the tree (or a ``{param}`` of its path, with a known ``type``) a message
    its type accepts, and its body template names only its path's parameters. BadInput
    naming the route otherwise."""
    from mighty.serve import AgentRoute, RouteTable, parse_route

    assert manifest.http is not None
    children = _children(manifest.supervisor, {})
    routes: list[AgentRoute] = []
    for index, model in enumerate(manifest.http.routes):
        where = f"{path}: [http] routes[{index}] ({model.route!r})"
        try:
            route = parse_route(model.route)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc.message}") from None
        from_path = model.to.startswith("{") and model.to.endswith("}")
        if from_path:
            type_name = model.type
            if type_name is not None and type_name not in manifest.agents:
                known = ", ".join(sorted(manifest.agents))
                raise BadInput(f"{where}: unknown agent type {type_name!r} ({known})")
        else:
            type_name = children.get(model.to)
            if type_name is None:
                known = ", ".join(sorted(children)) or "none"
                raise BadInput(
                    f"{where}: to {model.to!r} is no agent of the supervision tree (its "
                    f"agents: {known}); name a child, or take it from the path with "
                    f'to = "{{param}}"'
                )
            if model.type is not None and model.type != type_name:
                raise BadInput(f"{where}: {model.to!r} has type {type_name!r}, not {model.type!r}")
        accepts = manifest.agents[type_name].accepts if type_name is not None else None
        if accepts is not None and model.message not in accepts:
            raise BadInput(
                f"{where}: unknown message {model.message!r}: agent type {type_name!r} accepts "
                f"{', '.join(accepts) or 'nothing'}"
            )
        try:
            routes.append(
                AgentRoute(route, model.to, model.message, model.body, timeout=model.timeout)
            )
        except BadInput as exc:
            raise BadInput(f"{where}: {exc.message}") from None
    try:
        RouteTable([r.route for r in routes])
    except BadInput as exc:
        raise BadInput(f"{path}: [http]: {exc.message}") from None
    return routes


def capabilities(manifest: Manifest, base: Path) -> Capabilities:
    """The manifest's ``[capabilities]`` as a registry: host tools imported (the manifest's
    directory first on the path), MCP servers' paths relative to the manifest."""
    registry = Capabilities()
    for name, cap in manifest.capabilities.items():
        try:
            if cap.tool is not None:
                fn = HostTool(name, cap.tool, cap.timeout).load(base).fn
                registry = registry.with_tool(name, fn, timeout=cap.timeout)
            elif cap.mcp is not None:
                mcp = cap.mcp
                registry = registry.with_mcp(
                    McpServer(
                        name,
                        command=tuple(mcp.command or ()),
                        url=mcp.url,
                        token=_file_relative(mcp.token, base),
                        env=mcp.env,
                        cwd=str(base / mcp.cwd) if mcp.cwd is not None else str(base),
                        tools=None if mcp.tools is None else frozenset(mcp.tools),
                        timeout=mcp.timeout,
                        connect_timeout=mcp.connect_timeout,
                        max_message=_size(mcp.max_message),
                    )
                )
            else:
                grants = _http_policy(name, cap.http or [], base, Policy()).http.grants
                registry = registry.with_http(name, *grants)
        except BadInput as exc:
            raise BadInput(f"[capabilities.{name}]: {exc}") from None
    return registry


def _file_relative(token: str | None, base: Path) -> str | None:
    if token is not None and token.startswith("@") and not token.startswith("@/"):
        return "@" + str(base / token[1:])
    return token


def state_dir(manifest: Manifest, base: Path) -> Path | None:
    """The manifest's ``[runtime] state_dir``, relative to the manifest's directory."""
    if manifest.runtime.state_dir is None:
        return None
    return base / manifest.runtime.state_dir


def _check_tree(manifest: Manifest, node: SupervisorModel) -> None:
    for child in node.children:
        if child.supervisor is not None:
            _check_tree(manifest, child.supervisor)
        elif child.type is None:
            raise BadInput(f"child {child.name!r} needs a type (or a nested supervisor)")
        elif child.type not in manifest.agents:
            known = ", ".join(sorted(manifest.agents))
            raise BadInput(f"child {child.name!r} has unknown type {child.type!r} ({known})")


def agent_types(
    manifest: Manifest,
    base: Path,
    progress: Callable[[str], None] | None = None,
    registry: Capabilities | None = None,
) -> list[AgentType]:
    """Build or load every agent type's component and turn the settings into AgentTypes.

    ``registry``: the manifest's capabilities (:func:`capabilities`), whose HTTP grants are
    merged into the policies of the types granted them."""
    from mighty.build import build_component

    if registry is None:
        registry = capabilities(manifest, base)
    types: list[AgentType] = []
    for name, spec in manifest.agents.items():
        if (spec.source is None) == (spec.component is None):
            raise BadInput(f"agent type {name!r} needs exactly one of source or component")
        if spec.source is not None:
            source = (base / spec.source).resolve()
            out = base / ".mighty" / f"{name}.wasm"
            out.parent.mkdir(exist_ok=True)
            built = build_component(
                source,
                output=out,
                wit=agent_wit(),
                python_path=[agent_sdk()],
                progress=progress,
            )
            component = Component.load(built.path, progress=progress)
        else:
            component = Component.load(base / str(spec.component), progress=progress)
        budget = Budget()
        changes: dict[str, Any] = {}
        if spec.fuel is not None:
            changes["fuel"] = spec.fuel
        if spec.memory is not None:
            changes["memory"] = _size(spec.memory)
        if spec.timeout is not None:
            changes["timeout"] = spec.timeout
        policy = Policy(env=tuple(spec.env.items()))
        for grant in spec.dirs:
            parts = grant.split(":")
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
                raise BadInput(
                    f"agent type {name!r}: dirs takes HOST:GUEST (read-only) or "
                    f"HOST:GUEST:rw (read-write), got {grant!r}"
                )
            host = (base / parts[0]).resolve()
            if not host.is_dir():
                raise BadInput(f"agent type {name!r}: {host} is not a directory")
            # Read-only unless asked for, as on the command line and in Policy.with_dir.
            readonly = not (len(parts) == 3 and parts[2] == "rw")
            policy = policy.with_dir(host, parts[1], readonly=readonly)
        policy = _http_policy(name, spec.http, base, policy)
        if spec.http_limits:
            try:
                policy = policy.with_http_limits(**spec.http_limits)
            except (BadInput, TypeError) as exc:
                raise BadInput(f"agent type {name!r}: http_limits: {exc}") from None
        for named in registry.http_grants(spec.capabilities):
            policy = policy.with_http(
                named.origin,
                methods=named.methods,
                secrets=named.secrets,
                allow_private=named.allow_private,
            )
        types.append(
            AgentType(
                name,
                component,
                accepts=None if spec.accepts is None else dict.fromkeys(spec.accepts),
                budget=budget.replace(**changes) if changes else budget,
                lifetime_fuel=spec.lifetime_fuel,
                mailbox=MailboxSettings(
                    spec.mailbox.capacity, spec.mailbox.on_full, spec.mailbox.block_timeout
                ),
                policy=policy,
                hibernate_after=spec.hibernate_after,
                durable=spec.durable,
                cancellable=spec.cancellable,
                retry=None if spec.retry is None else _retry_policy(name, spec.retry),
                grants=Grants(
                    spawn=frozenset(spec.spawns),
                    message=frozenset(spec.messages),
                    inspect=frozenset(spec.inspects),
                    tools=frozenset(
                        g for g in spec.capabilities if registry.kind_of(g, name) != "http"
                    ),
                ),
            )
        )
    return types


def _retry_policy(name: str, spec: RetryModel) -> RetryPolicy:
    try:
        return RetryPolicy(spec.attempts, spec.backoff, spec.max_backoff, spec.dead_letter)
    except BadInput as exc:
        raise BadInput(f"agent type {name!r}: retry: {exc.message}") from None


def _http_policy(
    name: str, entries: list[str | HttpGrantModel], base: Path, policy: Policy
) -> Policy:
    """``policy`` with these wasi:http grants (file secrets relative to the manifest)."""
    from mighty.wasi import Secret

    try:
        for entry in entries:
            grant = HttpGrantModel(origin=entry) if isinstance(entry, str) else entry
            secrets = []
            for header, value in grant.secrets.items():
                secret = Secret.parse(f"{header}={value}")
                if secret.file is not None:
                    path = str(base / secret.file)
                    secret = Secret(secret.header, file=path, prefix=secret.prefix)
                secrets.append(secret)
            policy = policy.with_http(
                grant.origin,
                methods=grant.methods,
                secrets=secrets,
                allow_private=grant.allow_private,
            )
    except (BadInput, TypeError) as exc:
        raise BadInput(f"agent type {name!r}: http: {exc}") from None
    return policy


def supervisor_spec(node: SupervisorModel) -> SupervisorSpec:
    """The runtime's SupervisorSpec for a manifest's supervisor section."""
    children: list[AgentChild | SupervisorSpec] = []
    for child in node.children:
        if child.supervisor is not None:
            nested = supervisor_spec(child.supervisor)
            children.append(
                SupervisorSpec(
                    child.name,
                    nested.children,
                    nested.strategy,
                    nested.intensity,
                    nested.period,
                    child.restart,
                    nested.circuit_breaker,
                )
            )
        else:
            assert child.type is not None
            children.append(AgentChild(child.name, child.type, child.init, child.restart))
    breaker = node.circuit_breaker
    return SupervisorSpec(
        node.name,
        children,
        node.strategy,
        node.intensity,
        node.period,
        circuit_breaker=None
        if breaker is None
        else BreakerSettings(breaker.failure_threshold, breaker.window, breaker.cooldown),
    )
