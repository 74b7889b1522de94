"""Test guest: outgoing HTTP the ways the host's wasi:http must answer (see wit/http-probe.wit).

Build it with the guest SDK on the path (``fetch``, ``fetch-follow`` and ``stream-sum`` go
through ``mighty_agent.http``; the rest use the raw bindings, to do what the SDK never does:
several futures in one ``poll``, a body left unread, futures dropped unawaited):

    mty build guests/testing/http_probe/probe.py -p guests/sdk -o http_probe.wasm
"""

import urllib.parse

import wit_world
from componentize_py_types import Err, Ok
from mighty_agent import http
from wit_world.imports import outgoing_handler, poll, types

# Resources `leak` keeps: a binding object dropped by Python's GC would drop its handle too.
_LEAKED = []


def _failure(error):
    return f"{error.code}: {error.message}" if error.message else error.code


def _response(resp):
    headers = [(name, value.decode("utf-8", "replace")) for name, value in resp.header_list]
    return wit_world.Response(resp.status, headers, resp.content)


def _request(url):
    """A bare GET ``outgoing-request`` for ``url``."""
    parts = urllib.parse.urlsplit(url)
    request = types.OutgoingRequest(types.Fields())
    request.set_scheme(types.Scheme_Https() if parts.scheme == "https" else types.Scheme_Http())
    request.set_authority(parts.netloc)
    request.set_path_with_query((parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
    return request


def _error_text(code):
    detail = getattr(code, "value", None)
    name = http.error_code_name(code)
    return name if detail is None else f"{name}: {detail}"


def _outcome(result):
    """A ready future's ``get()``: the response's status, dropping it, or the error text."""
    if not isinstance(result, Ok):
        return Err("internal-error: the response was taken already")
    if isinstance(result.value, Err):
        return Err(_error_text(result.value.value))
    with result.value.value as response:
        return Ok(response.status())


class WitWorld(wit_world.WitWorld):
    def fetch(self, method, url, headers, body, timeout_ms):
        try:
            resp = http.request(
                method,
                url,
                headers=headers,
                content=body,
                timeout=timeout_ms / 1000 if timeout_ms else None,
                follow_redirects=False,
            )
        except http.HttpError as exc:
            raise Err(_failure(exc)) from None
        return _response(resp)

    def fetch_follow(self, url, max_redirects):
        try:
            return _response(http.get(url, max_redirects=max_redirects))
        except http.HttpError as exc:
            raise Err(_failure(exc)) from None

    def fetch_many(self, urls):
        results = [None] * len(urls)
        waiting = {}
        for index, url in enumerate(urls):
            try:
                waiting[index] = outgoing_handler.handle(_request(url), None)
            except Err as err:
                results[index] = Err(_error_text(err.value))
        while waiting:
            indices = list(waiting)
            pollables = [waiting[index].subscribe() for index in indices]
            try:
                ready = poll.poll(pollables)
            finally:
                # Each pollable is its future's child: dropped before any future is.
                for pollable in pollables:
                    pollable.__exit__(None, None, None)
            for position in ready:
                index = indices[position]
                future = waiting.pop(index)
                with future:
                    results[index] = _outcome(future.get())
        return results

    def stream_sum(self, url):
        total = 0
        try:
            with http.stream("GET", url, follow_redirects=False) as resp:
                for chunk in resp.iter_bytes():
                    total += len(chunk)
        except http.HttpError as exc:
            raise Err(_failure(exc)) from None
        return total

    def leak(self, url):
        try:
            future = outgoing_handler.handle(_request(url), None)
        except Err as err:
            raise Err(_error_text(err.value)) from None
        with future.subscribe() as ready:
            ready.block()
        result = future.get()
        if not isinstance(result, Ok) or isinstance(result.value, Err):
            future.__exit__(None, None, None)
            raise Err(_outcome(result).value)
        response = result.value.value
        body = response.consume()
        _LEAKED.extend([future, response, body, body.stream()])
        return response.status()

    def bad_header(self, name, value):
        try:
            types.Fields.from_list([(name, value)]).__exit__(None, None, None)
        except Err as err:
            return http.header_error_name(err.value)
        with types.Fields() as fields:
            try:
                fields.append(name, value)
            except Err as err:
                return http.header_error_name(err.value)
        return "ok"

    def hammer(self, url, n):
        failed = 0
        for _ in range(n):
            try:
                future = outgoing_handler.handle(_request(url), None)
            except Err:
                failed += 1
            else:
                future.__exit__(None, None, None)
        return failed
