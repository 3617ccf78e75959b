"""Specification of the caches: what each holds and returns after any sequence of updates.

A stream of random keys/values ``(B, H, T, D)`` is fed in chunks; after every
update we compare with slices of the stream itself, so a cache that keeps the
wrong tokens, the wrong order or the wrong count cannot pass.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swkv_teach import (
    LRUKVCache,
    RingBufferKVCache,
    SinkKVCache,
    SlidingWindowKVCache,
    make_cache,
)

B, H, D = 2, 3, 4


def stream(T, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(T)
    k = torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype)
    return k, v


def feed(cache, k, v, chunks):
    """Feed the stream in chunks; yield (start, stop, returned k, returned v) per update."""
    start = 0
    for c in chunks:
        rk, rv = cache.update(k[:, :, start : start + c], v[:, :, start : start + c])
        yield start, start + c, rk, rv
        start += c


def expected_stored(seen, W, S=0):
    """Positions a cache of window W and S sinks must hold after `seen` tokens, chronologically."""
    return sorted(set(range(min(S, seen))) | set(range(max(0, seen - W), seen)))


def expected_returned(start, stop, W, S=0):
    """Positions the new tokens start..stop-1 attend over: sinks, the first query's W-1 predecessors, the chunk."""
    return sorted(set(range(min(S, start))) | set(range(max(0, start - (W - 1)), stop)))


def stored_of(cache):
    """(positions, k, v) the cache stores, chronologically, whatever its layout."""
    if isinstance(cache, RingBufferKVCache):
        k, v = cache.ordered()
        return cache.stored_positions().tolist(), k, v
    return list(range(cache.seen - len(cache), cache.seen)), cache.k, cache.v


# ------------------------------------------------------------------ the seed
def test_seed_doctest():
    cache = SlidingWindowKVCache(window_size=3)
    k1, v1 = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4)
    ck, cv = cache.update(k1, v1)
    assert ck.shape == torch.Size([1, 2, 1, 4])
    assert torch.equal(ck, k1) and torch.equal(cv, v1)


@pytest.mark.parametrize("kind", ["naive", "ring", "lru"])
def test_a_chunk_after_the_window_filled_worked_by_hand(kind):
    """W = 3, keys = position + 1. After 0..4 one at a time, the cache holds 2, 3, 4. The chunk 5, 6: its first
    query (5) sees its W - 1 = 2 predecessors, 3 and 4, so the update returns 3, 4, 5, 6 (values 4, 5, 6, 7), in
    that order; afterwards the cache holds 4, 5, 6. (issue 24: a direct case, beside the property tests.)"""
    cache = make_cache(kind, 3)
    for p in range(5):
        cache.update(torch.full((1, 1, 1, 1), p + 1.0), torch.full((1, 1, 1, 1), -(p + 1.0)))
    chunk = torch.tensor([6.0, 7.0]).view(1, 1, 2, 1)
    k, v = cache.update(chunk, -chunk)
    assert k.flatten().tolist() == [4.0, 5.0, 6.0, 7.0]
    assert v.flatten().tolist() == [-4.0, -5.0, -6.0, -7.0]
    assert cache.positions.tolist() == [3, 4, 5, 6]
    assert cache.seen == 7 and len(cache) == 3
    if kind == "ring":
        held, _ = cache.ordered()
        assert held.flatten().tolist() == [5.0, 6.0, 7.0]
        assert cache.stored_positions().tolist() == [4, 5, 6]
    elif kind == "naive":
        assert cache.k.flatten().tolist() == [5.0, 6.0, 7.0]
    else:
        assert cache.ids() == [4, 5, 6]


@pytest.mark.parametrize("kind", ["naive", "ring"])
def test_window_4_holding_1_2_3_4_given_5_holds_2_3_4_5(kind):
    cache = make_cache(kind, 4)
    for x in [1.0, 2.0, 3.0, 4.0]:
        cache.update(torch.full((1, 1, 1, 1), x), torch.full((1, 1, 1, 1), -x))
    k, v = cache.update(torch.full((1, 1, 1, 1), 5.0), torch.full((1, 1, 1, 1), -5.0))
    held_k, held_v = cache.ordered() if kind == "ring" else (k, v)
    assert held_k.flatten().tolist() == [2.0, 3.0, 4.0, 5.0]
    assert held_v.flatten().tolist() == [-2.0, -3.0, -4.0, -5.0]
    if kind == "ring":
        assert k.flatten().tolist() == [5.0, 2.0, 3.0, 4.0], "slot order: 5 overwrote 1 in slot 4 % 4 = 0"
        assert cache.positions.tolist() == [4, 1, 2, 3]


def test_sinks_window_2_plus_1_sink_scalar_trace():
    cache = SinkKVCache(num_sinks=1, window_size=2)
    got = []
    for x in range(1, 7):
        k, _ = cache.update(torch.full((1, 1, 1, 1), float(x)), torch.zeros(1, 1, 1, 1))
        got.append(sorted(k.flatten().tolist()))
    assert got == [[1], [1, 2], [1, 2, 3], [1, 3, 4], [1, 4, 5], [1, 5, 6]]


# --------------------------------------------------- properties over streams
CASES = [("naive", 0), ("ring", 0), ("sinks", 1), ("sinks", 3)]


def check_stream(kind, S, W, chunks, device="cpu"):
    T = sum(chunks)
    k, v = stream(T, device)
    cache = make_cache(kind, W, num_sinks=S)
    for start, stop, rk, rv in feed(cache, k, v, chunks):
        pos = cache.positions.tolist()
        assert sorted(pos) == expected_returned(start, stop, W, S), (start, stop)
        idx = torch.tensor(pos, device=device)
        assert torch.equal(rk, k[:, :, idx]) and torch.equal(rv, v[:, :, idx]), "returned keys/values vs positions"
        held, hk, hv = stored_of(cache)
        assert held == expected_stored(stop, W, S)
        idx = torch.tensor(held, device=device)
        assert torch.equal(hk, k[:, :, idx]) and torch.equal(hv, v[:, :, idx])
        assert cache.seen == stop and len(cache) == len(held)


@settings(max_examples=60, deadline=None)
@given(
    W=st.integers(1, 9),
    chunks=st.lists(st.integers(1, 12), min_size=1, max_size=12),
    case=st.sampled_from(CASES),
)
def test_any_chunking_holds_exactly_the_window(W, chunks, case):
    kind, S = case
    check_stream(kind, S, W, chunks)


@pytest.mark.parametrize("kind,S", CASES)
@pytest.mark.parametrize("offset", [-1, 0, 1, 3])  # lengths W-1, W, W+1, W+3 ...
@pytest.mark.parametrize("W", [1, 3, 4, 8])
def test_boundary_lengths_token_by_token(kind, S, W, offset, device):
    T = max(1, W + offset)
    check_stream(kind, S, W, [1] * T, device)
    check_stream(kind, S, W, [1] * (2 * W + 3), device)


@pytest.mark.parametrize("kind,S", CASES)
@pytest.mark.parametrize("W", [1, 3, 8])
def test_one_long_prompt_then_decode(kind, S, W, device):
    check_stream(kind, S, W, [2 * W + 3, 1, 1, W + 1, 1], device)


def test_lru_without_get_is_exactly_the_sliding_window():
    W, T = 4, 13
    k, v = stream(T)
    lru, ref = LRUKVCache(W), SlidingWindowKVCache(W)
    for (_, _, lk, lv), (_, _, rk, rv) in zip(feed(lru, k, v, [1] * T), feed(ref, k, v, [1] * T)):
        assert torch.equal(lk, rk) and torch.equal(lv, rv)
        assert lru.positions.tolist() == ref.positions.tolist()


# ------------------------------------------------------ flat memory, O(1) ring
@pytest.mark.parametrize("kind", ["naive", "ring", "sinks", "lru"])
def test_memory_is_flat_after_the_window(kind):
    W, S = 5, 2
    cache = make_cache(kind, W, num_sinks=S)
    cap = W + (S if kind == "sinks" else 0)
    k, v = stream(300)
    sizes = []
    for t in range(300):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        assert len(cache) == min(t + 1, cap)
        sizes.append(cache.nbytes)
    full = 2 * B * H * cap * D * 4
    assert set(sizes[cap:]) == {full}, "bytes held must be exactly 2*B*H*capacity*D*itemsize once full"


def test_ring_returns_a_view_of_its_buffer_and_never_reallocates():
    W = 4
    cache = RingBufferKVCache(W)
    k, v = stream(20)
    for t in range(20):
        rk, rv = cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
        if t == 0:
            ptr_k, ptr_v = cache.k_buf.data_ptr(), cache.v_buf.data_ptr()
        assert rk.data_ptr() == ptr_k and rv.data_ptr() == ptr_v, "a one-token update returns a view, not a copy"
        assert cache.k_buf.data_ptr() == ptr_k, f"buffer reallocated at step {t}"
        assert rk.shape[2] == min(t + 1, W), "only filled slots are returned, never zero slots"
    assert cache.nbytes == 2 * B * H * W * D * 4


def test_ring_before_full_returns_no_zero_slots():
    cache = RingBufferKVCache(8)
    k = torch.ones(1, 1, 1, 2)
    rk, _ = cache.update(k, k)
    rk, _ = cache.update(k, k)
    assert rk.shape[2] == 2 and bool((rk != 0).all())


def test_reset_starts_a_new_sequence_with_another_shape():
    for kind in ["naive", "ring", "sinks", "lru"]:
        cache = make_cache(kind, 3, num_sinks=1)
        cache.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))
        cache.reset()
        assert len(cache) == 0 and cache.seen == 0 and cache.nbytes == 0
        k, _ = cache.update(torch.ones(3, 1, 1, 2, dtype=torch.float64), torch.ones(3, 1, 1, 2, dtype=torch.float64))
        assert k.shape == (3, 1, 1, 2) and k.dtype == torch.float64


def test_instances_do_not_share_state():
    a, b = RingBufferKVCache(3), RingBufferKVCache(3)
    a.update(torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1))
    assert len(b) == 0 and b.k_buf is None


def test_caller_tensors_are_not_modified():
    k, v = stream(10)
    k0, v0 = k.clone(), v.clone()
    for kind in ["naive", "ring", "sinks", "lru"]:
        list(feed(make_cache(kind, 3, num_sinks=1), k, v, [4, 1, 1, 3, 1]))
    assert torch.equal(k, k0) and torch.equal(v, v0)


# ------------------------------------------------------------------- the LRU
def test_lru_seed_eviction_and_promotion():
    c = LRUKVCache(max_size=3)
    for i in range(3):
        c.put(i, f"k{i}", f"v{i}")
    c.put(3, "k3", "v3")
    assert 0 not in c and len(c) == 3
    c = LRUKVCache(max_size=3)
    for i in range(3):
        c.put(i, f"k{i}", f"v{i}")
    assert c.get(0) == ("k0", "v0")
    c.put(3, "k3", "v3")
    assert 1 not in c and 0 in c
    assert c.ids() == [2, 0, 3]


def test_lru_re_put_promotes_and_replaces():
    c = LRUKVCache(2)
    c.put("a", 1, 1)
    c.put("b", 2, 2)
    c.put("a", 10, 10)
    c.put("c", 3, 3)
    assert c.ids() == ["a", "c"] and c.get("a") == (10, 10)


def test_lru_miss_returns_none_and_peek_does_not_promote():
    c = LRUKVCache(2)
    c.put(0, "k", "v")
    c.put(1, "k", "v")
    assert c.get(7) is None
    assert c.peek(0) == ("k", "v")
    c.put(2, "k", "v")
    assert 0 not in c, "peek must not promote"


def test_lru_promotion_keeps_a_token_the_window_has_dropped():
    """Why LRU is not sliding-window attention: a read keeps an old key alive."""
    W = 3
    c = LRUKVCache(W)
    k, v = stream(6)
    for t in range(4):
        c.update(k[:, :, t : t + 1], v[:, :, t : t + 1])
    c.get(1)  # something read token 1
    c.update(k[:, :, 4:5], v[:, :, 4:5])
    assert 1 in c and 2 not in c
    assert sorted(c.positions.tolist()) != list(range(2, 5))


@pytest.mark.parametrize("bad", [0, -1])
def test_lru_max_size_not_positive_is_a_value_error(bad):
    with pytest.raises(ValueError, match="max_size"):
        LRUKVCache(bad)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "make",
    [
        lambda x: SlidingWindowKVCache(x),
        lambda x: RingBufferKVCache(x),
        lambda x: SinkKVCache(2, x),
        lambda x: LRUKVCache(x),
    ],
)
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4", None])
def test_sizes_must_be_positive_ints(make, bad):
    with pytest.raises((TypeError, ValueError), match=r"(window_size|max_size).*got"):
        make(bad)


@pytest.mark.parametrize("bad", [0, -1, 1.0, False])
def test_num_sinks_must_be_a_positive_int(bad):
    with pytest.raises((TypeError, ValueError), match="num_sinks"):
        SinkKVCache(bad, 4)


def snapshot(cache):
    return copy.deepcopy(cache.__dict__)


def same_state(a, b):
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), key
        elif isinstance(x, tuple) and x and isinstance(x[0], torch.Tensor):
            assert all(torch.equal(p, q) for p, q in zip(x, y)), key
        elif key == "_entries":
            assert list(x) == list(y)
        else:
            assert x == y, key


BAD_UPDATES = [
    ("3-D", lambda: (torch.zeros(B, H, D), torch.zeros(B, H, D)), ValueError, "3 dims"),
    ("not a tensor", lambda: ([[0.0]], torch.zeros(B, H, 1, D)), TypeError, "k_new"),
    ("k/v shapes", lambda: (torch.zeros(B, H, 1, D), torch.zeros(B, H, 2, D)), ValueError, "same shape"),
    ("no tokens", lambda: (torch.zeros(B, H, 0, D), torch.zeros(B, H, 0, D)), ValueError, "no tokens"),
    ("batch", lambda: (torch.zeros(B + 1, H, 1, D),) * 2, ValueError, "batch=3.*batch=2"),
    ("heads", lambda: (torch.zeros(B, H + 1, 1, D),) * 2, ValueError, "heads=4.*heads=3"),
    ("head_dim", lambda: (torch.zeros(B, H, 1, D + 1),) * 2, ValueError, "head_dim=5.*head_dim=4"),
    ("dtype", lambda: (torch.zeros(B, H, 1, D, dtype=torch.float64),) * 2, TypeError, "float64.*float32"),
    ("k/v dtype", lambda: (torch.zeros(B, H, 1, D), torch.zeros(B, H, 1, D).half()), TypeError, "same dtype"),
    ("device", lambda: (torch.zeros(B, H, 1, D, device="meta"),) * 2, TypeError, "device meta"),
]


@pytest.mark.parametrize("kind", ["naive", "ring", "sinks", "lru"])
@pytest.mark.parametrize("name,make_bad,err,words", BAD_UPDATES, ids=[b[0] for b in BAD_UPDATES])
def test_rejected_update_names_the_problem_and_leaves_the_cache_as_it_was(kind, name, make_bad, err, words):
    cache = make_cache(kind, 3, num_sinks=1)
    k, v = stream(5)
    list(feed(cache, k, v, [2, 1, 1, 1]))
    before = snapshot(cache)
    with pytest.raises(err, match=words):
        cache.update(*make_bad())
    same_state(before, snapshot(cache))
    # and it still works afterwards
    cache.update(k[:, :, :1], v[:, :, :1])
    assert cache.seen == 6


def test_make_cache_rejects_unknown_kinds():
    with pytest.raises(ValueError, match="'fifo'"):
        make_cache("fifo", 3)


@pytest.mark.parametrize("kind", ["naive", "ring", "sinks", "lru"])
def test_caches_hold_values_not_autograd_history(kind):
    """Regression: the ring crashed on inputs that require grad (copy_ into a split() view), and the
    naive cache kept every past step alive through the autograd graph."""
    cache = make_cache(kind, 3, num_sinks=1)
    w = torch.ones(1, requires_grad=True)
    for t in range(6):
        k = torch.randn(1, 2, 1, 4) * w
        rk, rv = cache.update(k, k * 2)
        assert not rk.requires_grad and not rv.requires_grad
    assert cache.seen == 6


@pytest.mark.parametrize("kind", ["naive", "ring", "sinks", "lru"])
def test_positions_live_on_the_keys_device(kind, device):
    cache = make_cache(kind, 3, num_sinks=1)
    k, _ = cache.update(torch.zeros(1, 1, 2, 2, device=device), torch.zeros(1, 1, 2, 2, device=device))
    assert cache.positions.device == k.device
