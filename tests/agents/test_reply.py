"""The runtime's one-shot reply future behaves as ``concurrent.futures.Future`` does for what
the runtime and its waits do with a reply: settle once, read, wait (from another thread too),
done callbacks."""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.agents._reply import Reply
from mighty.budget import CallScope

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("result"), st.one_of(st.none(), st.binary(max_size=8))),
        st.tuples(st.just("exception"), st.sampled_from([ValueError, KeyError, TimeoutError])),
        st.tuples(st.just("callback"), st.none()),
        st.tuples(st.just("read"), st.none()),
    ),
    max_size=8,
)


def _run(future: Future[bytes | None], ops: list[tuple[str, Any]]) -> list[object]:
    """What each op did, comparable between the two kinds of future."""
    seen: list[object] = []
    for op, arg in ops:
        if op == "result":
            try:
                future.set_result(arg)
                seen.append(("set", arg))
            except InvalidStateError:
                seen.append("invalid")
        elif op == "exception":
            try:
                future.set_exception(arg("x"))
                seen.append(("raised", arg.__name__))
            except InvalidStateError:
                seen.append("invalid")
        elif op == "callback":
            future.add_done_callback(lambda done: seen.append(("called", done.done())))
        else:
            seen.append(("done", future.done(), future.cancelled()))
            try:
                error = future.exception(0)
                seen.append(("exception", type(error).__name__ if error else None))
                seen.append(("value", future.result(0)))
            except TimeoutError:
                seen.append("timeout")
            except Exception as exc:  # noqa: BLE001 - compared as a name
                seen.append(("result raised", type(exc).__name__))
    return seen


@given(_OPS)
def test_reply_does_what_a_future_does(ops: list[tuple[str, Any]]) -> None:
    assert _run(Reply(), ops) == _run(Future(), ops)


def test_a_reply_settled_on_another_thread_wakes_its_waiter() -> None:
    reply = Reply()
    started = threading.Event()

    def settle() -> None:
        started.wait(10)
        reply.set_result(b"late")

    thread = threading.Thread(target=settle)
    thread.start()
    started.set()
    assert reply.result(30) == b"late"
    thread.join(10)
    with pytest.raises(TimeoutError):
        Reply().result(0.01)


def test_a_call_scope_waits_for_a_reply() -> None:
    """``CallScope.wait`` takes it as a future (the guest's asks wait through it)."""
    scope = CallScope(10.0, None)
    reply = Reply()
    assert not scope.wait(reply, 0.01)
    threading.Timer(0.01, reply.set_exception, (KeyError("k"),)).start()
    assert scope.wait(reply, 30)
    assert isinstance(reply.exception(0), KeyError)
    assert not reply.cancel()


def test_every_waiter_wakes_and_a_timed_out_wait_can_wait_again() -> None:
    reply = Reply()
    with pytest.raises(TimeoutError):
        reply.result(0.01)  # the first wait times out: the next ones still wake
    heard: list[bytes | None] = []
    waiters = [threading.Thread(target=lambda: heard.append(reply.result(30))) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    reply.set_result(b"all")
    for waiter in waiters:
        waiter.join(30)
    assert heard == [b"all"] * 3
    assert reply.result(0) == b"all"
    assert reply.exception(None) is None
