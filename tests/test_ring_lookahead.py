"""A ring with lookahead slots takes back its last tokens (speculative decoding, issue 39).

The specification: ``RingBufferKVCache(W, lookahead=k)`` keeps ``W + k`` slots; ``rollback(r)``
forgets the last ``r`` tokens by moving a counter (no tensor op at all) and refuses, by name and
changing nothing, an ``r`` it cannot restore. Whatever the updates and rollbacks, every query sees
exactly the keys ``i - W < j <= i`` (plus sinks) of the sequence as it stands after the rollbacks:
checked here against a dense reference that keeps the whole history and truncates it on rollback.
Every key carries a serial number, so a stale key (a rolled-back token left in its slot) that
leaked into a window would show up as the wrong serial at the right position.
"""

from __future__ import annotations

import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from swkv_teach.caches import RingBufferKVCache, SinkKVCache
from swkv_teach.masks import allowed, window_mask


class Reference:
    """The sequence as it stands: serial number of the key at each position; a rollback truncates it."""

    def __init__(self):
        self.serials: list[int] = []
        self.next_serial = 1

    def chunk(self, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values ``(1, 1, c, 2)`` for the next ``c`` positions: ``[serial, position]`` each."""
        start = len(self.serials)
        serials = list(range(self.next_serial, self.next_serial + c))
        self.next_serial += c
        self.serials += serials
        k = torch.tensor([[s, start + i] for i, s in enumerate(serials)], dtype=torch.float64)[None, None]
        return k, -k

    def rollback(self, r: int) -> None:
        del self.serials[len(self.serials) - r :]


def make(W: int, lookahead: int, sinks: int):
    return SinkKVCache(sinks, W, lookahead) if sinks else RingBufferKVCache(W, lookahead)


def check_update(cache, ref: Reference, c: int, W: int, S: int) -> None:
    """Feed the next ``c`` tokens; every query sees exactly its window of the reference, serials included."""
    k_new, v_new = ref.chunk(c)
    k, v = cache.update(k_new, v_new)
    n = len(ref.serials)
    q = torch.arange(n - c, n)
    pos = cache.positions
    assert pos.shape == (k.shape[2],) and torch.equal(v, -k)
    mask = window_mask(q, pos, W, S)  # (c, keys): what the decoder masks with
    for row, i in enumerate(q.tolist()):
        seen = {(int(pos[j]), int(k[0, 0, j, 0])) for j in torch.nonzero(mask[row]).flatten().tolist()}
        want = {(j, ref.serials[j]) for j in range(n) if allowed(i, j, W, S)}
        assert seen == want, (f"query {i} (W={W}, sinks={S}, lookahead={cache.lookahead}) sees {sorted(seen)}; "
                              f"expected {sorted(want)}")
        for j in torch.nonzero(mask[row]).flatten().tolist():  # a visible key is rotated at the position reported
            assert int(k[0, 0, j, 1]) == int(pos[j])
    if c == 1 and cache.one_token_in_window:  # the decoder then skips the mask: it must be all True
        assert bool(mask.all()), f"one_token_in_window, yet keys {pos[~mask[0]].tolist()} are outside the window"
    check_held(cache, ref, W, S)


def check_held(cache, ref: Reference, W: int, S: int) -> None:
    """What the ring says it holds is true (serials match), and it holds the next query's window."""
    n = len(ref.serials)
    held = cache.stored_positions().tolist()
    assert len(cache) == len(held) == len(set(held))
    if n:
        keys, _ = cache.ordered()
        assert [int(x) for x in keys[0, 0, :, 1]] == held
        assert [int(x) for x in keys[0, 0, :, 0]] == [ref.serials[p] for p in held]
    needed = [j for j in range(n) if allowed(n, j, W, S)]  # the next query's window (before its own key)
    assert set(needed) <= set(held), f"after {n} tokens the ring lost {sorted(set(needed) - set(held))}"


# --------------------------------------------------------------------------- the property
@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    W=st.integers(1, 6),
    lookahead=st.integers(0, 4),
    sinks=st.sampled_from([0, 0, 2]),
    ops=st.lists(st.tuples(st.integers(1, 7), st.floats(0, 1)), min_size=1, max_size=25),
)
def test_every_query_sees_exactly_its_window_through_updates_and_rollbacks(W, lookahead, sinks, ops):
    """Random chunks, each followed by a rollback of a random share of what the ring allows."""
    cache, ref = make(W, lookahead, sinks), Reference()
    for c, share in ops:
        check_update(cache, ref, c, W, sinks)
        r = int(share * (cache.rollback_limit + 0.999))
        cache.rollback(r)
        ref.rollback(r)
        assert cache.seen == len(ref.serials)
        check_held(cache, ref, W, sinks)


@pytest.mark.parametrize("W,k", [(4, 2), (5, 1), (3, 4), (1, 3)])
@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("laps", [0, 1, 2])
def test_rollbacks_of_0_to_k_at_w_minus_1_w_w_plus_1_and_across_the_wrap(W, k, offset, laps):
    """Fill ``W + offset`` tokens (plus whole laps of the ``W + k`` slots), roll back each r in 0..k, go on."""
    n = max(1, W + offset + laps * (W + k))
    for r in range(k + 1):
        for chunked in (False, True):
            cache, ref = RingBufferKVCache(W, k), Reference()
            if chunked:
                check_update(cache, ref, n, W, 0)
            else:
                for _ in range(n):
                    check_update(cache, ref, 1, W, 0)
            assert cache.rollback_limit >= min(n, k)
            r_here = min(r, n)
            cache.rollback(r_here)
            ref.rollback(r_here)
            check_held(cache, ref, W, 0)
            for c in (1, k + 1, 1, 1):  # a verify-sized chunk, then single tokens past the next wrap
                check_update(cache, ref, c, W, 0)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(W=st.integers(1, 6), k=st.integers(1, 5), prompt=st.integers(1, 20),
       rounds=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=20))
def test_the_speculative_pattern_is_never_refused(W, k, prompt, rounds):
    """Verify ``m + 1 <= k + 1`` tokens, keep ``a + 1``: the ring with lookahead ``k`` always has the room."""
    cache, ref = RingBufferKVCache(W, k), Reference()
    check_update(cache, ref, prompt, W, 0)
    for m, a in rounds:
        m = min(m, k)
        a = min(a, m)
        check_update(cache, ref, m + 1, W, 0)
        cache.rollback(m - a)  # would raise if the ring could not restore it
        ref.rollback(m - a)
        check_held(cache, ref, W, 0)


# --------------------------------------------------------------------------- O(1) and refusals
class Ops(TorchDispatchMode):
    """Records every tensor operation run inside it."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_rollback_runs_no_tensor_operation_and_moves_no_data():
    cache, ref = RingBufferKVCache(4, 3), Reference()
    for c in (5, 1, 4):
        cache.update(*ref.chunk(c))
    before = cache.k_buf.clone()
    ptr = cache.k_buf.data_ptr()
    with Ops() as seen_ops:
        cache.rollback(3)
    assert seen_ops.ops == [], f"rollback ran tensor operations: {seen_ops.ops}"
    assert cache.k_buf.data_ptr() == ptr and torch.equal(cache.k_buf, before)
    assert cache.seen == 7


def test_the_worked_example_of_the_docstring():
    """W = 3, k = 2: after 7 tokens the slots hold [p5, p6, p2, p3, p4]; verify 7..9, roll back 2."""
    cache, ref = RingBufferKVCache(3, 2), Reference()
    for _ in range(7):
        cache.update(*ref.chunk(1))
    assert cache.k_buf[0, 0, :, 1].tolist() == [5, 6, 2, 3, 4]
    assert cache.rollback_limit == 3  # positions 4, 5, 6 can go: query 4 needs only 2, 3 (+ itself)
    cache.update(*ref.chunk(3))
    assert cache.k_buf[0, 0, :, 1].tolist() == [5, 6, 7, 8, 9]
    cache.rollback(2)
    ref.rollback(2)
    assert cache.seen == 8 and cache.stored_positions().tolist() == [5, 6, 7] and len(cache) == 3
    assert cache.rollback_limit == 1  # 7 can still go (query 7 needs 5, 6); 6 cannot: slot 1 is next for 11
    cache.update(*ref.chunk(1))  # position 8 into slot 3, where the rejected p8 lay
    assert cache.k_buf[0, 0, :, 1].tolist() == [5, 6, 7, 8, 9]
    assert cache.k_buf[0, 0, 3, 0] == ref.serials[8]  # the new p8, not the rejected one
    assert cache.stored_positions().tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize("bad", [-1, 4, 2.0, True, "1", None])
def test_rollback_beyond_what_it_can_restore_is_refused_by_name_and_changes_nothing(bad):
    cache, ref = RingBufferKVCache(3, 2), Reference()
    for c in (6, 1):
        cache.update(*ref.chunk(c))
    assert cache.rollback_limit == 3
    before = cache.state_dict()
    with pytest.raises(ValueError, match=r"rollback: r must be an int in \[0, 3\].*lookahead=2.*got"):
        cache.rollback(bad)
    after = cache.state_dict()
    assert after.keys() == before.keys() and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before.values(), after.values()))


def test_a_plain_ring_can_take_back_one_token_once_it_has_wrapped():
    """With no lookahead the next query needs only W - 1 old keys: the last token can go, no more."""
    cache, ref = RingBufferKVCache(3), Reference()
    for _ in range(5):
        check_update(cache, ref, 1, 3, 0)
    assert cache.rollback_limit == 1
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        cache.rollback(2)
    cache.rollback(1)
    ref.rollback(1)
    assert cache.rollback_limit == 0
    for _ in range(4):
        check_update(cache, ref, 1, 3, 0)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_lookahead_must_be_a_non_negative_int(bad):
    with pytest.raises((TypeError, ValueError), match="lookahead must be a non-negative int"):
        RingBufferKVCache(4, bad)


def test_a_compiled_step_refuses_a_ring_with_lookahead():
    cache = RingBufferKVCache(4, 2)
    cache.update(*Reference().chunk(2))
    with pytest.raises(ValueError, match="lookahead"):
        cache.count_written()


# --------------------------------------------------------------------------- state_dict and stats
def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_a_plain_ring_saves_what_it_always_saved():
    """No lookahead, no pending rollback: the state has exactly the keys it had before rollback existed."""
    cache = RingBufferKVCache(3)
    cache.update(*Reference().chunk(5))
    assert set(cache.state_dict()) == {"kind", "window_size", "num_sinks", "layout", "seen", "positions", "k", "v"}
    assert set(cache.stats()) == {"tokens_seen", "tokens_stored", "tokens_evicted", "bytes_held"}


@pytest.mark.parametrize("lookahead,sinks", [(0, 0), (2, 0), (3, 2)])
def test_a_pending_rollback_survives_the_round_trip_and_decides_what_follows(lookahead, sinks):
    W = 3
    live, ref = make(W, lookahead, sinks), Reference()
    for c in (4, 1, 1, 3, 1):
        live.update(*ref.chunk(c))
    r = live.rollback_limit
    live.rollback(r)
    ref.rollback(r)
    state = roundtrip(live.state_dict())
    assert ("top" in state) and state.get("lookahead", 0) == lookahead
    restored = make(W, lookahead, sinks)
    restored.load_state_dict(state)
    assert restored.stats() == live.stats() and restored.rollback_limit == live.rollback_limit == 0
    assert len(restored) == len(live) and torch.equal(restored.stored_positions(), live.stored_positions())
    twin = Reference()
    twin.serials, twin.next_serial = list(ref.serials), ref.next_serial
    for c in (1, 2, 1):
        check_update(live, ref, c, W, sinks)
        check_update(restored, twin, c, W, sinks)


def test_stats_carry_the_lookahead_and_what_can_be_taken_back():
    cache, ref = RingBufferKVCache(4, 2), Reference()
    cache.update(*ref.chunk(9))
    stats = cache.stats()
    assert stats["lookahead"] == 2 and stats["rollback_limit"] == 3
    assert stats["tokens_stored"] == 6 and stats["tokens_evicted"] == 3  # W + k slots held
    assert stats["bytes_held"] == 2 * 1 * 1 * 6 * 2 * 8
    cache.rollback(3)
    stats = cache.stats()
    assert stats["rollback_limit"] == 0 and stats["tokens_stored"] == 3 and stats["tokens_seen"] == 6


def test_a_state_of_another_lookahead_is_refused_naming_it():
    src, dst = RingBufferKVCache(4, 2), RingBufferKVCache(4)
    src.update(*Reference().chunk(5))
    with pytest.raises(ValueError, match="lookahead is 2 in the state but 0 in this cache"):
        dst.load_state_dict(src.state_dict())
    with pytest.raises(ValueError, match="lookahead is 0 in the state but 2 in this cache"):
        src.load_state_dict(dst.state_dict())
    assert dst.seen == 0 and src.seen == 5


@pytest.mark.parametrize("top", [5, 9, "7"])
def test_a_state_whose_pending_rollback_could_not_have_happened_is_refused(top):
    """seen = 5 after a rollback: top (one past the highest written) must be in [6, seen + k + 1] = [6, 8]."""
    cache, ref = RingBufferKVCache(3, 2), Reference()
    cache.update(*ref.chunk(8))
    cache.rollback(3)
    state = cache.state_dict()
    assert state["top"] == 8
    state["top"] = top
    fresh = RingBufferKVCache(3, 2)
    with pytest.raises(ValueError, match=r"state\['top'\]"):
        fresh.load_state_dict(state)
    assert fresh.seen == 0


# --------------------------------------------------------------------------- the verify in place
def check_in_place(cache, ref: Reference, c: int, W: int) -> None:
    """Feed ``c`` tokens through ``update_in_place``: each query's bias row opens exactly its window, serials
    included (a stale slot opened by mistake shows a wrong serial; a slot of a later chunk token, a position
    past the query)."""
    k_new, v_new = ref.chunk(c)
    k, v, bias = cache.update_in_place(k_new, v_new)
    n = len(ref.serials)
    assert bias.shape == (c, k.shape[2]) and bias.dtype == k.dtype and torch.equal(v, -k)
    assert bool(((bias == 0) | (bias == float("-inf"))).all()), "the bias is additive: 0 or -inf, nothing between"
    for row, i in enumerate(range(n - c, n)):
        opened = torch.nonzero(bias[row] == 0).flatten().tolist()
        seen = {(int(k[0, 0, j, 1]), int(k[0, 0, j, 0])) for j in opened}  # (position written there, serial)
        want = {(j, ref.serials[j]) for j in range(n) if allowed(i, j, W)}
        assert seen == want, (f"query {i} (W={W}, lookahead={cache.lookahead}, seen={n}) opens {sorted(seen)}; "
                              f"expected {sorted(want)}")
        pos = cache.positions  # the positions the ring reports for what it returned, as the decoder would mask
        assert {int(pos[j]) for j in opened} == {j for j, _ in want}
    check_held(cache, ref, W, 0)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(W=st.integers(1, 6), k=st.integers(1, 4), prompt=st.integers(1, 20),
       ops=st.lists(st.tuples(st.integers(1, 5), st.floats(0, 1), st.booleans()), min_size=1, max_size=25))
def test_a_verify_in_place_opens_exactly_each_querys_window_through_rollbacks(W, k, prompt, ops):
    """Random verifies of ``c <= k + 1`` tokens through ``update_in_place`` (or ``update``, mixed in), each followed
    by a rollback of a random share of what the ring allows; from the first token, across every wrap."""
    cache, ref = RingBufferKVCache(W, k), Reference()
    check_update(cache, ref, prompt, W, 0)
    for c, share, in_place in ops:
        c = min(c, k + 1)
        if in_place:
            check_in_place(cache, ref, c, W)
        else:
            check_update(cache, ref, c, W, 0)
        r = int(share * (cache.rollback_limit + 0.999))
        cache.rollback(r)
        ref.rollback(r)
        check_held(cache, ref, W, 0)


@pytest.mark.parametrize("W,k", [(4, 2), (5, 1), (3, 4), (1, 3)])
@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("laps", [0, 1, 2])
def test_a_verify_in_place_at_w_minus_1_w_w_plus_1_before_and_after_rollbacks(W, k, offset, laps):
    """``W + offset`` tokens (plus laps of the ``W + k`` slots), a rollback of each r in 0..k, then verifies of
    every size 1..k + 1 past the next wrap, each rolled back as a rejection would be."""
    n = max(1, W + offset + laps * (W + k))
    for r in range(k + 1):
        cache, ref = RingBufferKVCache(W, k), Reference()
        check_update(cache, ref, n, W, 0)
        cache.rollback(min(r, n))
        ref.rollback(min(r, n))
        for c in [*range(1, k + 2), k + 1, 1, k + 1]:
            check_in_place(cache, ref, c, W)
            back = min(c - 1, cache.rollback_limit)  # all but the first rejected, as far as the ring allows
            cache.rollback(back)
            ref.rollback(back)


def test_a_verify_in_place_past_the_first_lap_reads_the_buffers_where_they_lie():
    """The fast path's promise: once ``W + k`` tokens are in, the keys returned are the buffers themselves
    (nothing gathered) and a one-token mask is a view (nothing built)."""
    cache, ref = RingBufferKVCache(4, 2), Reference()
    cache.update(*ref.chunk(6))
    k, v, bias = cache.update_in_place(*ref.chunk(3))
    assert k.data_ptr() == cache.k_buf.data_ptr() and k.shape == cache.k_buf.shape
    assert v.data_ptr() == cache.v_buf.data_ptr()
    cache.rollback(2)
    _, _, one = cache.update_in_place(*ref.chunk(1))
    assert one._base is not None, "a one-token mask is a view of the pattern made at allocation"


@pytest.mark.parametrize("make_it,c", [(lambda: RingBufferKVCache(4, 2), 4), (lambda: RingBufferKVCache(4), 2),
                                       (lambda: SinkKVCache(2, 4, 2), 1)])
def test_update_in_place_refuses_more_than_lookahead_plus_one_tokens_or_sinks_and_changes_nothing(make_it, c):
    cache, ref = make_it(), Reference()
    cache.update(*ref.chunk(7))
    before = cache.state_dict()
    with pytest.raises(ValueError, match=r"update_in_place takes 1 to lookahead \+ 1 = \d tokens.*got k_new shape"):
        cache.update_in_place(*ref.chunk(c))
    after = cache.state_dict()
    assert after.keys() == before.keys() and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(before.values(), after.values()))


def test_only_a_ring_with_lookahead_and_no_sinks_offers_it_to_the_decoder():
    assert RingBufferKVCache(4, 2).reads_in_place and RingBufferKVCache(4, 2).in_place_tokens == 3
    assert not RingBufferKVCache(4).reads_in_place  # the plain ring has its own one-token path
    assert not SinkKVCache(2, 4, 2).reads_in_place  # the pattern knows no sinks: update + a mask from positions
