"""Outgoing HTTP from inside a guest, over ``wasi:http/outgoing-handler``.

    from mighty_agent import http

    resp = http.get("https://api.example.com/items", timeout=5)
    items = resp.json()
    http.post(url, json={"name": "x"}).status

    with http.stream("GET", url) as resp:          # the body read chunk by chunk
        for chunk in resp.iter_bytes():
            ...

    pending = [http.start("GET", u) for u in urls]  # all in flight at once
    responses = [p.wait() for p in pending]

The component's world must import ``wasi:http/outgoing-handler@0.2.0`` (the agent world does),
and the host answers only what its HTTP policy allows; a refused request raises
:class:`HttpError` with code ``"HTTP-request-denied"``. Every failure is an ``HttpError`` whose
``code`` is the ``wasi:http`` ``error-code`` case name (``"connection-refused"``,
``"HTTP-response-timeout"``...), except ``"too-many-redirects"``, which is this module's own,
and :class:`HeaderError`, whose code is a ``header-error`` case name.

Blocking by design: a guest runs one call at a time, so a request waits on its ``pollable``
(``block()``) and the host runs the wait under the call's deadline. Rejected: an ``asyncio`` API
over componentize-py's ``poll_loop`` (a second event loop inside every agent for what ``start``
and ``wait`` give), and reading the bindings by one fixed module name: componentize-py names
a binding module by its interface (``types``) and prefixes the package only when two imports
clash (``wasi_http_types`` in the agent world, whose own interface is ``types`` too), so the
names are found from the ``outgoing_handler`` module's own imports.
"""

import importlib
import json as _json
import re
import urllib.parse
from collections.abc import Mapping
from types import ModuleType

from componentize_py_types import Err, Ok

__all__ = [
    "HeaderError",
    "Headers",
    "HttpError",
    "Pending",
    "Response",
    "error_code_name",
    "get",
    "header_error_name",
    "post",
    "request",
    "start",
    "stream",
]


def _binding(*names):
    for name in names:
        try:
            return importlib.import_module(f"wit_world.imports.{name}")
        except ImportError:
            continue
    raise ImportError(
        "mighty_agent.http needs a world that imports wasi:http/outgoing-handler@0.2.0;"
        " add that line to the world this handler is built against"
    )


def _imported(module, attribute):
    # The module a binding module imported that defines `attribute`, whatever its name.
    for value in vars(module).values():
        if isinstance(value, ModuleType) and hasattr(value, attribute):
            return value
    raise ImportError(f"no binding module defining {attribute} beside {module.__name__}")


_handler = _binding("outgoing_handler", "wasi_http_outgoing_handler")
_types = _imported(_handler, "OutgoingRequest")
_streams = _imported(_types, "InputStream")

_CHUNK = 4096  # the most a blocking-write-and-flush must accept at once (wasi:io streams)
_READ_SIZE = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_METHODS = {
    "GET": _types.Method_Get,
    "HEAD": _types.Method_Head,
    "POST": _types.Method_Post,
    "PUT": _types.Method_Put,
    "DELETE": _types.Method_Delete,
    "CONNECT": _types.Method_Connect,
    "OPTIONS": _types.Method_Options,
    "TRACE": _types.Method_Trace,
    "PATCH": _types.Method_Patch,
}

# The words wasi:http spells in capitals in its case names ("destination-IP-prohibited").
_ACRONYMS = frozenset({"dns", "http", "ip", "tls", "uri"})
_WORD = re.compile(r"[A-Z][a-z0-9]*")


class HttpError(Exception):
    """A request failed; ``code`` is the wasi:http error-code case name, ``message`` the detail."""

    def __init__(self, code, message=""):
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class HeaderError(HttpError):
    """A request header was refused; ``code`` is the header-error case ("forbidden"...)."""


def error_code_name(code):
    """The WIT case name of a wasi:http ``error-code`` value ("HTTP-request-denied"...)."""
    return _case_name(code, "ErrorCode_")


def header_error_name(error):
    """The WIT case name of a wasi:http ``header-error`` value ("forbidden"...)."""
    return _case_name(error, "HeaderError_")


def _case_name(value, prefix):
    # The binding's class names the case in CamelCase: ErrorCode_HttpRequestUriInvalid.
    words = _WORD.findall(type(value).__name__.removeprefix(prefix))
    return "-".join(w.upper() if w.lower() in _ACRONYMS else w.lower() for w in words)


def _http_error(code, context=""):
    detail = getattr(code, "value", None)
    message = "" if detail is None else str(detail)
    if context:
        message = f"{context}: {message}" if message else context
    return HttpError(error_code_name(code), message)


def _stream_error(error, context):
    """The HttpError for a stream's ``last-operation-failed`` io-error (dropped here)."""
    try:
        code = _types.http_error_code(error)
        if code is not None:
            return _http_error(code, context)
        return HttpError("internal-error", f"{context}: {error.to_debug_string()}")
    finally:
        error.__exit__(None, None, None)


class Headers(Mapping):
    """Response headers: a case-insensitive mapping of name -> value, repeats joined by ", "."""

    def __init__(self, entries):
        self._entries = list(entries)
        joined = {}
        for name, value in self._entries:
            key = name.lower()
            text = value.decode("utf-8", "replace")
            joined[key] = f"{joined[key]}, {text}" if key in joined else text
        self._joined = joined

    def __getitem__(self, name):
        return self._joined[name.lower()]

    def __iter__(self):
        return iter(self._joined)

    def __len__(self):
        return len(self._joined)

    def __repr__(self):
        return f"Headers({self._joined!r})"


class Response:
    """An HTTP response. The body is read on first use of ``content``/``text``/``json()``, or
    chunk by chunk with ``iter_bytes()``; ``close()`` (or a ``with`` block) frees it unread."""

    def __init__(self, url, incoming):
        self.url = url
        self._incoming = incoming
        self.status = incoming.status()
        with incoming.headers() as fields:
            self.header_list = fields.entries()
        self.headers = Headers(self.header_list)
        self._body = incoming.consume()
        self._stream = self._body.stream()
        self._content = None

    def iter_bytes(self):
        """The body's chunks as they arrive (the rest of it, if some was read already)."""
        if self._content is not None:
            if self._content:
                yield self._content
            return
        stream = self._stream
        if stream is None:
            raise HttpError("internal-error", "the response is closed")
        try:
            while True:
                try:
                    chunk = stream.read(_READ_SIZE)
                except Err as err:
                    if isinstance(err.value, _streams.StreamError_Closed):
                        return
                    raise _stream_error(err.value.value, f"reading {self.url}") from None
                if chunk:
                    yield chunk
                else:
                    # Nothing buffered yet: wait for the host, then read again. The pollable
                    # is the stream's child, so it goes before the stream does.
                    with stream.subscribe() as ready:
                        ready.block()
        finally:
            self.close()

    def read(self):
        """The whole body, read once and kept."""
        if self._content is None:
            self._content = b"".join(self.iter_bytes())
        return self._content

    @property
    def content(self):
        """The whole body as bytes."""
        return self.read()

    @property
    def text(self):
        """The body decoded by the Content-Type charset, else UTF-8."""
        charset = "utf-8"
        for part in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset" and value:
                charset = value.strip("\"' ")
        try:
            return self.content.decode(charset, "replace")
        except LookupError:
            return self.content.decode("utf-8", "replace")

    def json(self):
        """The body parsed as JSON."""
        return _json.loads(self.content)

    def close(self):
        """Free the body and the response (children first, as the host requires)."""
        for name in ("_stream", "_body", "_incoming"):
            resource = getattr(self, name)
            if resource is not None:
                setattr(self, name, None)
                resource.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        return f"<Response {self.status} {self.url}>"


class Pending:
    """A request sent and not yet answered: ``wait()`` gives its :class:`Response`."""

    def __init__(self, method, url, headers, body, timeout, follow_redirects, max_redirects):
        self._method = method
        self._url = url
        self._headers = headers
        self._body = body
        self._timeout = timeout
        self._follow = follow_redirects
        self._redirects_left = max_redirects
        self._future = _send(method, url, headers, body, timeout)

    def wait(self):
        """Block until the response's status and headers arrive (following redirects)."""
        while True:
            future, self._future = self._future, None
            if future is None:
                raise HttpError("internal-error", "this request was waited for already")
            response = Response(self._url, _receive(future))
            location = response.headers.get("location")
            if not (self._follow and response.status in _REDIRECTS and location):
                return response
            response.close()
            self._redirect(response.status, location)

    def _redirect(self, status, location):
        if self._redirects_left <= 0:
            raise HttpError("too-many-redirects", f"stopped at {self._url}")
        self._redirects_left -= 1
        target = urllib.parse.urljoin(self._url, location)
        headers = self._headers
        if _origin(target) != _origin(self._url):
            # Credentials meant for one site are not sent on to another (as httpx does).
            headers = [(k, v) for k, v in headers if k.lower() != "authorization"]
        if status == 303 or (status in (301, 302) and self._method == "POST"):
            # Browsers' and httpx's rule: the redirected request is a GET without the body.
            if self._method != "HEAD":
                self._method = "GET"
            self._body = b""
            headers = [(k, v) for k, v in headers if k.lower() not in _BODY_HEADERS]
        self._url, self._headers = target, headers
        self._future = _send(self._method, target, headers, self._body, self._timeout)


_BODY_HEADERS = frozenset({"content-length", "content-type", "content-encoding"})


def _origin(url):
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc


def start(
    method,
    url,
    *,
    headers=None,
    content=None,
    json=None,
    timeout=None,
    follow_redirects=True,
    max_redirects=5,
):
    """Send a request and return at once; ``.wait()`` on the result gives the Response.

    Several started requests are in flight together: the host works on all of them while the
    guest waits on the first.
    """
    method = method.upper()
    pairs = list(headers.items() if isinstance(headers, Mapping) else headers or ())
    names = {name.lower() for name, _ in pairs}
    if json is not None:
        content = _json.dumps(json, separators=(",", ":")).encode()
        if "content-type" not in names:
            pairs.append(("content-type", "application/json"))
    if isinstance(content, str):
        content = content.encode("utf-8")
    body = bytes(content or b"")
    if body and "content-length" not in names:
        pairs.append(("content-length", str(len(body))))
    return Pending(method, url, pairs, body, timeout, follow_redirects, max_redirects)


def stream(method, url, **kwargs):
    """A Response whose body is not read yet: ``with stream(...) as r: r.iter_bytes()``."""
    return start(method, url, **kwargs).wait()


def request(method, url, **kwargs):
    """Send a request and read its whole response (see :func:`start` for the arguments)."""
    with stream(method, url, **kwargs) as response:
        response.read()
    return response


def get(url, **kwargs):
    """``request("GET", url, ...)``."""
    return request("GET", url, **kwargs)


def post(url, **kwargs):
    """``request("POST", url, ...)``."""
    return request("POST", url, **kwargs)


def _fields(pairs):
    entries = [
        (name, value if isinstance(value, bytes) else str(value).encode()) for name, value in pairs
    ]
    try:
        return _types.Fields.from_list(entries)
    except Err as err:
        raise HeaderError(header_error_name(err.value), "a request header was refused") from None


def _send(method, url, headers, body, timeout):
    """Hand one request to the host and write its body; returns the future response."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise HttpError("HTTP-request-URI-invalid", f"{url!r} is not an absolute http(s) URL")
    outgoing = _types.OutgoingRequest(_fields(headers))
    try:
        method_case = _METHODS.get(method)
        outgoing.set_method(method_case() if method_case else _types.Method_Other(method))
        outgoing.set_scheme(_types.Scheme_Https() if scheme == "https" else _types.Scheme_Http())
        # The authority without any user:password@ part (which would go in a header).
        outgoing.set_authority(parts.netloc.rpartition("@")[2])
        outgoing.set_path_with_query(
            (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        )
    except Err:
        outgoing.__exit__(None, None, None)
        raise HttpError("HTTP-request-URI-invalid", f"the host refused {url!r}") from None
    # Taken before `handle`, which consumes the request; written after, when the host is
    # already reading it (a large body written first could fill the stream and block).
    outgoing_body = outgoing.body() if body else None
    try:
        future = _handler.handle(outgoing, _options(timeout))
    except Err as err:
        if outgoing_body is not None:
            outgoing_body.__exit__(None, None, None)
        raise _http_error(err.value, f"{method} {url}") from None
    if outgoing_body is not None:
        try:
            _write(outgoing_body, body, url)
        except BaseException:
            future.__exit__(None, None, None)
            raise
    return future


def _options(timeout):
    if timeout is None:
        return None
    options = _types.RequestOptions()
    nanoseconds = max(int(timeout * 1_000_000_000), 0)
    try:
        options.set_connect_timeout(nanoseconds)
        options.set_first_byte_timeout(nanoseconds)
        options.set_between_bytes_timeout(nanoseconds)
    except Err:
        options.__exit__(None, None, None)
        raise HttpError("configuration-error", "the host does not take this timeout") from None
    return options


def _write(outgoing_body, body, url):
    stream = outgoing_body.write()
    try:
        for offset in range(0, len(body), _CHUNK):
            stream.blocking_write_and_flush(body[offset : offset + _CHUNK])
    except Err as err:
        failure = err.value
        stream.__exit__(None, None, None)
        outgoing_body.__exit__(None, None, None)
        if isinstance(failure, _streams.StreamError_Closed):
            raise HttpError(
                "HTTP-request-body-size", f"the host closed the body of {url}"
            ) from None
        raise _stream_error(failure.value, f"writing {url}") from None
    # The stream is the body's child: it goes first, then finish consumes the body.
    stream.__exit__(None, None, None)
    try:
        _types.OutgoingBody.finish(outgoing_body, None)
    except Err as err:
        raise _http_error(err.value, f"finishing the body of {url}") from None


def _receive(future):
    """Wait for a future response; its IncomingResponse, or the HttpError it carries."""
    try:
        with future.subscribe() as ready:
            ready.block()
        result = future.get()
    finally:
        future.__exit__(None, None, None)
    if result is None or not isinstance(result, Ok):
        raise HttpError("internal-error", "the host gave no response for a ready future")
    inner = result.value
    if isinstance(inner, Err):
        raise _http_error(inner.value)
    return inner.value
