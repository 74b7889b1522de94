"""Cancellation and deadlines across agents: an ask's deadline and cancel reach the callee."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mighty import Budget, CancelScope, Component
from mighty.agents import (
    AgentEvent,
    AgentType,
    AskTimeout,
    MessageCancelled,
    Runtime,
)
from mighty.budget import RunContext, using_context
from mighty.wasi import Policy

pytestmark = pytest.mark.slow

GUESTS = Path(__file__).resolve().parent / "guests"
ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
"""How long a test waits for what happens at once on a quiet machine."""
FOREVER = 10**12
"""Loop iterations no test waits for: only a cancel or a deadline ends them."""
SPIN = Budget(fuel=10**15, timeout=600.0)
"""A per-message budget no test reaches: the asker's deadline is what ends a handler."""


@pytest.fixture(scope="session")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Component:
    """The relay test agent (passes an ask down a chain; the last one spins), built once."""
    from mighty.build import build_component

    out = tmp_path_factory.mktemp("relay") / "relay.wasm"
    build_component(
        GUESTS / "relay.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return Component.load(out)


class Events:
    """Agent events as they come, and a wait for one that matches."""

    def __init__(self) -> None:
        self.seen: list[AgentEvent] = []
        self.cond = threading.Condition()

    def __call__(self, event: AgentEvent) -> None:
        with self.cond:
            self.seen.append(event)
            self.cond.notify_all()

    def wait_for(self, match: Callable[[AgentEvent], bool]) -> AgentEvent:
        deadline = time.monotonic() + WAIT
        with self.cond:
            while True:
                for event in self.seen:
                    if match(event):
                        return event
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event in {self.seen}"
                self.cond.wait(left)


def crashed(address: str) -> Callable[[AgentEvent], bool]:
    return lambda e: e.kind == "agent.crashed" and e.address == address


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def test_an_expired_ask_stops_the_whole_chain(relay: Component) -> None:
    """A host ask of A -> B -> C with a deadline: when it passes, A, B and C all stop."""
    events = Events()
    with Runtime(workers=4, on_event=events) as rt:
        rt.register(AgentType("relay", relay, budget=SPIN))
        a, b, c = rt.spawn("relay"), rt.spawn("relay"), rt.spawn("relay")
        with pytest.raises(AskTimeout):
            rt.ask(a, "relay", {"to": [b, c], "n": FOREVER}, timeout=1.0)
        for address in (a, b, c):
            event = events.wait_for(crashed(address))
            assert "cancel" in event.data["reason"], event


def test_a_handler_that_opts_out_finishes_after_its_asker_gives_up(relay: Component) -> None:
    """A type that is not cancellable runs its handler to the end; a cancellable one stops."""
    events = Events()
    with Runtime(workers=2, on_event=events) as rt:
        rt.register(AgentType("must", relay, budget=SPIN, cancellable=False))
        rt.register(AgentType("may", relay, budget=SPIN))
        must, may = rt.spawn("must"), rt.spawn("may")
        for address in (must, may):
            with pytest.raises(AskTimeout):
                rt.ask(address, "relay", {"n": 3_000_000}, timeout=0.05)
        wait_until(lambda: rt.ask(must, "get", timeout=WAIT) == {"spun": 1})
        assert rt.process(must).stats.crashes == 0
        event = events.wait_for(crashed(may))
        assert "cancel" in event.data["reason"]


def test_runtime_cancel_stops_a_running_message_by_its_id(relay: Component) -> None:
    """Runtime.cancel(id) of a running handler stops it; the asker hears the crash."""
    events = Events()
    with Runtime(workers=2, on_event=events) as rt:
        rt.register(AgentType("relay", relay, budget=SPIN))
        address = rt.spawn("relay")
        future = rt.ask_future(address, "relay", {"n": FOREVER})
        wait_until(lambda: rt.inspect(address).get("in_flight") is not None)
        message_id = rt.inspect(address)["in_flight"]["id"]
        assert message_id.startswith("msg-")
        assert rt.cancel(message_id, "the user pressed stop")
        event = events.wait_for(crashed(address))
        assert "the user pressed stop" in event.data["reason"]
        with pytest.raises(Exception, match="the user pressed stop"):
            future.result(WAIT)
        assert not rt.cancel("msg-999999999")  # no such message: nothing to cancel
        with pytest.raises(ValueError, match="msg-12"):
            rt.cancel("12")


def test_runtime_cancel_skips_a_queued_message(relay: Component) -> None:
    """A message cancelled while it waits is never handled; its asker gets MessageCancelled."""
    with Runtime(workers=1) as rt:
        rt.register(AgentType("relay", relay, budget=SPIN))
        address = rt.spawn("relay")
        busy = rt.ask_future(address, "relay", {"n": FOREVER})
        wait_until(lambda: rt.inspect(address).get("in_flight") is not None)
        queued = rt.ask_future(address, "relay", {"n": 1})
        process = rt.process(address)
        waiting = process.mailbox.waiting()
        assert len(waiting) == 1
        assert rt.cancel(waiting[0].context_id, "not needed any more")
        running = rt.inspect(address)["in_flight"]["id"]
        assert rt.cancel(running)
        with pytest.raises(MessageCancelled, match="not needed any more"):
            queued.result(WAIT)
        with pytest.raises(Exception, match="cancel"):
            busy.result(WAIT)
        assert process.stats.handled == 0


def test_a_cancel_scope_given_to_ask_reaches_the_handler(relay: Component) -> None:
    """Runtime.ask(cancel=scope): cancelling the scope from another thread stops the handler."""
    events = Events()
    with Runtime(workers=2, on_event=events) as rt:
        rt.register(AgentType("relay", relay, budget=SPIN))
        address = rt.spawn("relay")
        scope = CancelScope()
        threading.Thread(
            target=lambda: (
                wait_until(lambda: rt.inspect(address).get("in_flight") is not None),
                scope.cancel("the caller changed its mind"),
            ),
            daemon=True,
        ).start()
        with pytest.raises(Exception, match="the caller changed its mind"):
            rt.ask(address, "relay", {"n": FOREVER}, timeout=600.0, cancel=scope)
        events.wait_for(crashed(address))


def test_an_ask_made_in_a_context_is_its_child(relay: Component) -> None:
    """A host ask made inside a run context (a tool, a request) is cancelled with it, and the
    handler's context names it as parent."""
    events = Events()
    with Runtime(workers=2, on_event=events) as rt:
        rt.register(AgentType("relay", relay, budget=SPIN))
        address = rt.spawn("relay")
        request = RunContext.top("request")
        parents: list[str] = []

        def stop_when_running() -> None:
            wait_until(lambda: rt.inspect(address).get("in_flight") is not None)
            parents.append(rt.inspect(address)["in_flight"].get("parent", ""))
            request.stop("the HTTP client went away")

        threading.Thread(target=stop_when_running, daemon=True).start()
        with using_context(request), pytest.raises(Exception, match="went away"):
            rt.ask(address, "relay", {"n": FOREVER}, timeout=600.0)
        assert parents == [request.id]


def test_an_http_request_in_flight_stops_with_its_handler(relay: Component) -> None:
    """The handler waits on a loopback server that never answers: the asker's deadline stops
    the handler, and the server sees the request's connection closed."""
    import http.server

    seen, closed = threading.Event(), threading.Event()

    class Stall(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.set()
            self.rfile.read(1)  # b"" once the client closes the connection
            closed.set()

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stall)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    events = Events()
    try:
        with Runtime(workers=2, on_event=events) as rt:
            # Read timeouts far past WAIT: the connection must close at the cancel, not when
            # a read timeout ends the worker's wait (it did: 58 s after the cancel).
            policy = (
                Policy()
                .with_http(origin)
                .with_http_limits(first_byte_timeout=3600.0, between_bytes_timeout=3600.0)
            )
            rt.register(AgentType("relay", relay, budget=SPIN, policy=policy))
            address = rt.spawn("relay")
            with pytest.raises(AskTimeout):
                rt.ask(address, "fetch", {"url": f"{origin}/slow"}, timeout=2.0)
            assert seen.is_set()
            assert "cancel" in events.wait_for(crashed(address)).data["reason"]
            assert closed.wait(WAIT), "the request's connection was never closed"
    finally:
        server.shutdown()
        server.server_close()
