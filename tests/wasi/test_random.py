"""wasi:random: OS entropy, seeded determinism, bounds."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.wasi._policy import Policy
from mighty.wasi._random import POOL_SIZE, RandomTooLong
from tests.wasi import call, make_ctx

R = "wasi:random/random"
INS = "wasi:random/insecure"
U64_MAX = (1 << 64) - 1


def _draws(seed: int | None) -> list[object]:
    ctx = make_ctx(Policy(seed=seed))
    return [
        call(ctx, R, "get-random-bytes", 16),
        call(ctx, R, "get-random-u64"),
        call(ctx, INS, "get-insecure-random-bytes", 5),
        call(ctx, INS, "get-insecure-random-u64"),
        call(ctx, "wasi:random/insecure-seed", "insecure-seed"),
    ]


@given(seed=st.integers(-(2**70), 2**70))
def test_seeded_random_is_deterministic(seed: int) -> None:
    """The same seed gives the same sequence in a fresh instance."""
    assert _draws(seed) == _draws(seed)


def test_different_seeds_differ() -> None:
    """Different seeds give different bytes."""
    assert _draws(1) != _draws(2)


def test_seeded_values_are_pinned() -> None:
    """The seeded stream is shake_256 in counter mode, as documented (pinned bytes)."""
    import hashlib

    ctx = make_ctx(Policy(seed=7))
    assert call(ctx, R, "get-random-bytes", 4) == hashlib.shake_256(
        b"mighty.random\x007\x000"
    ).digest(4)
    raw = hashlib.shake_256(b"mighty.random\x007\x001").digest(8)
    assert call(ctx, INS, "get-insecure-random-u64") == int.from_bytes(raw, "little")


def test_os_entropy_by_default() -> None:
    """Without a seed two instances draw different bytes, and types and ranges are right."""
    a, b = _draws(None), _draws(None)
    assert a[0] != b[0]
    assert isinstance(a[0], bytes) and len(a[0]) == 16
    assert isinstance(a[1], int) and 0 <= a[1] <= U64_MAX
    seed = a[4]
    assert isinstance(seed, tuple) and len(seed) == 2
    assert all(0 <= x <= U64_MAX for x in seed)


def test_insecure_seed_is_stable_per_instance() -> None:
    """insecure-seed returns the same pair on every call of an instance."""
    ctx = make_ctx()
    first = call(ctx, "wasi:random/insecure-seed", "insecure-seed")
    assert call(ctx, "wasi:random/insecure-seed", "insecure-seed") == first


@given(length=st.integers(0, 64))
def test_exact_length(length: int) -> None:
    """get-random-bytes returns exactly len bytes within max_read."""
    ctx = make_ctx(Policy(seed=1))
    assert len(call(ctx, R, "get-random-bytes", length)) == length
    assert len(call(ctx, INS, "get-insecure-random-bytes", length)) == length


@pytest.mark.parametrize("length", [1025, U64_MAX])
def test_absurd_length_stops_the_guest(length: int) -> None:
    """A length beyond max_read raises RandomTooLong (the gate traps the guest)."""
    ctx = make_ctx(Policy(max_read=1024))
    with pytest.raises(RandomTooLong, match="max_read"):
        call(ctx, R, "get-random-bytes", length)
    with pytest.raises(RandomTooLong):
        call(ctx, INS, "get-insecure-random-bytes", length)


@given(
    max_read=st.integers(1, 600),
    lengths=st.lists(st.integers(0, 700), min_size=1, max_size=12),
)
def test_os_bytes_honour_max_read_and_length(max_read: int, lengths: list[int]) -> None:
    """Unseeded draws, pooled or not: exactly ``len`` bytes up to ``max_read``, and beyond it
    RandomTooLong, whatever the pool's state (a smaller ``max_read`` than the pool serves)."""
    ctx = make_ctx(Policy(max_read=max_read))
    for length in lengths:
        if length > max_read:
            with pytest.raises(RandomTooLong):
                call(ctx, R, "get-random-bytes", length)
        else:
            assert len(call(ctx, R, "get-random-bytes", length)) == length
    if max_read >= 8:
        assert 0 <= call(ctx, R, "get-random-u64") <= U64_MAX
    else:
        with pytest.raises(RandomTooLong):
            call(ctx, R, "get-random-u64")


def test_pooled_bytes_are_never_handed_out_twice() -> None:
    """Draws across several pool refills never repeat a 16-byte block (a pool position that
    did not advance, or a refill that reused the block, would)."""
    ctx = make_ctx()
    count = 3 * POOL_SIZE // 16
    draws = [call(ctx, R, "get-random-bytes", 16) for _ in range(count)]
    draws += [call(ctx, INS, "get-insecure-random-u64").to_bytes(8, "little") for _ in range(99)]
    assert len(set(draws)) == len(draws)


def test_a_forked_child_does_not_repeat_its_parents_pool() -> None:
    """After fork, the parent and the child draw different bytes from what was one pool."""
    ctx = make_ctx()
    first = call(ctx, R, "get-random-bytes", 16)  # the pool is filled
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next 16 bytes, to the parent, and out at once
        try:
            os.write(write, call(ctx, R, "get-random-bytes", 16))
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 64)
    os.close(read)
    os.waitpid(pid, 0)
    mine = call(ctx, R, "get-random-bytes", 16)
    assert len(child) == 16
    assert child not in (first, mine)
