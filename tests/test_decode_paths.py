"""The paged and int8 decode paths the decoder takes, held to a second method at every step.

* ``PagedKVCache.update_in_place`` (attention reads the whole pool, a bias masks what is not the
  window) against a :class:`RingBufferKVCache` fed the same stream, with another sequence writing
  into the same pool between steps, and against a twin cache driven by ``update`` only (same
  blocks, same free count).
* ``Int8RingBufferKVCache`` (keys and values quantised together) against a ring fed tokens
  quantised and dequantised by a formula written here.
* The decoder: ``generate(cache="paged")`` equals the ring's, and its decode steps gather nothing.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swkv_teach import BlockPool, Decoder, DecoderConfig, Int8RingBufferKVCache, PagedKVCache, RingBufferKVCache
from swkv_teach.caches import PoolExhausted
from swkv_teach.caches.int8 import quantize_int8

H, D = 2, 4


def attend64(q, k, v, bias=None):
    """float64 softmax attention of one query ``(H, D)`` over ``(H, n, D)`` keys, written out."""
    scores = torch.einsum("hd,hnd->hn", q.double(), k.double()) / math.sqrt(q.shape[-1])
    if bias is not None:
        scores = scores + bias.double()
    return torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), v.double())


@settings(max_examples=40, deadline=None)
@given(W=st.integers(1, 9), bs=st.integers(1, 5), ops=st.lists(st.tuples(st.integers(1, 4), st.booleans(),
                                                                          st.booleans()), min_size=1, max_size=40),
       seed=st.integers(0, 1000))
def test_update_in_place_is_the_window(W, bs, ops, seed):
    """Every step: attention over (pool, bias) == attention over the ring's window; state == update()'s twin.

    ``ops``: (tokens, in place?, does the other sequence write first?). A chunk always goes through
    ``update``; one token through ``update_in_place`` when asked, so the bias is rebuilt after chunks.
    """
    g = torch.Generator().manual_seed(seed)
    blocks = 2 * PagedKVCache.max_blocks(W, bs) + 2
    pool_a, pool_b = BlockPool(blocks, bs), BlockPool(blocks, bs)
    fast, twin = PagedKVCache(pool_a, W), PagedKVCache(pool_b, W)
    other_a, other_b = PagedKVCache(pool_a, W), PagedKVCache(pool_b, W)
    ring = RingBufferKVCache(W)
    for c, in_place, other_first in ops:
        if other_first:  # another sequence on the same pool: its blocks must be masked out
            ko = torch.randn(1, H, 1, D, generator=g)
            other_a.update(ko, ko)
            other_b.update(ko, ko)
        k, v = torch.randn(1, H, c, D, generator=g), torch.randn(1, H, c, D, generator=g)
        ring.update(k, v)
        twin.update(k, v)
        q = torch.randn(H, D, generator=g)
        rk, rv = ring.ordered()
        expected = attend64(q, rk[0, :, -W:], rv[0, :, -W:])
        if c == 1 and in_place:
            k_all, v_all, bias = fast.update_in_place(k, v)
            assert k_all.shape == (1, H, blocks * bs, D)
            got = attend64(q, k_all[0], v_all[0], bias.flatten())
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
            # the bias is 0 on exactly the slots of the last W positions, found through the table
            lo = max(0, fast.seen - W)
            first = lo // bs  # logical block of block_table[0]
            window = {fast.block_table[p // bs - first] * bs + p % bs for p in range(lo, fast.seen)}
            assert set(torch.nonzero(bias.flatten() == 0).flatten().tolist()) == window
            assert bool(torch.isinf(bias.flatten()[[i for i in range(blocks * bs) if i not in window]]).all())
        else:
            fk, fv = fast.update(k, v)  # chronological, ending with the newest token: its window is the last W
            torch.testing.assert_close(attend64(q, fk[0, :, -W:], fv[0, :, -W:]), expected, atol=1e-6, rtol=1e-6)
        assert fast.seen == twin.seen == ring.seen
        assert fast.block_table == twin.block_table, "update_in_place took or returned other blocks than update"
        assert pool_a.free_blocks == pool_b.free_blocks
        assert torch.equal(fast.positions.cpu(), torch.arange(max(0, fast.seen - W), fast.seen)) or c > 1
        fk, fv = fast.ordered()
        tk, tv = twin.ordered()
        assert torch.equal(fk, tk) and torch.equal(fv, tv)


def test_in_place_refused_when_the_pool_is_full_changes_nothing():
    """Regression guard: the fast path must check the pool before flipping the bias or moving blocks."""
    W, bs = 4, 2
    pool = BlockPool(PagedKVCache.max_blocks(W, bs), bs)  # 3 blocks: exactly one sequence's worst case
    a, b = PagedKVCache(pool, W), PagedKVCache(pool, W)
    k = torch.randn(1, H, 1, D)
    for _ in range(4):
        a.update_in_place(k, k)  # positions 0..3: blocks 0, 1
    b.update(k, k)  # takes the last free block
    before = (a.seen, a.block_table, a.positions.clone(), a._bias.clone(), pool.free_blocks)
    with pytest.raises(PoolExhausted, match="cannot serve sequence"):
        a.update_in_place(k, k)  # position 4 needs a third block; block 0 still holds position 1, in the window
    after = (a.seen, a.block_table, a.positions.clone(), a._bias.clone(), pool.free_blocks)
    assert before[:2] == after[:2] and before[4] == after[4]
    assert torch.equal(before[2], after[2]) and torch.equal(before[3], after[3]), "the bias or positions moved"
    b.reset()
    k_all, v_all, bias = a.update_in_place(k, k)
    assert a.seen == 5 and int((bias == 0).sum()) == W


def test_in_place_refuses_bad_input_like_update():
    """The first one-token update goes through every check of ``update``."""
    cache = PagedKVCache(BlockPool(4, 2), 3)
    with pytest.raises(ValueError, match="batch=2"):
        cache.update_in_place(torch.randn(2, H, 1, D), torch.randn(2, H, 1, D))
    cache.update_in_place(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D))
    with pytest.raises(ValueError, match="heads=3"):
        cache.update_in_place(torch.randn(1, 3, 1, D), torch.randn(1, 3, 1, D))
    assert cache.seen == 1


@pytest.mark.parametrize("W, prompt_len", [(1, 3), (3, 2), (5, 12), (8, 8), (16, 5)])
def test_decoder_paged_equals_ring_and_gathers_nothing(W, prompt_len, monkeypatch):
    """generate(cache="paged") == generate(cache="ring"); once the prompt is in, no decode step gathers a window.

    Regression for issue 21: the paged path copied the window out of the pool (``_range``) on every step.
    """
    torch.manual_seed(W)
    model = Decoder(DecoderConfig(window_size=W)).eval()
    prompt = torch.randint(0, 128, (1, prompt_len))
    ring = model.generate(prompt, 20, cache="ring")
    gathers = []
    original = PagedKVCache._range
    monkeypatch.setattr(PagedKVCache, "_range", lambda self, lo, hi: gathers.append((lo, hi)) or original(self, lo, hi))
    paged = model.generate(prompt, 20, cache="paged")
    assert torch.equal(paged, ring)
    # the prompt chunk reads through update(); each layer's first one-token step rebuilds its bias from
    # update() (one _range for its return value); after that, nothing
    assert len(gathers) <= 2 * model.config.n_layers, f"{len(gathers)} window gathers in 20 steps"
    caches = model.new_caches("paged")
    logits = torch.cat([model.step(prompt[:, i : i + 1], caches) for i in range(prompt_len)], dim=1)
    torch.testing.assert_close(logits, model(prompt), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ int8

def reference_roundtrip(x: torch.Tensor) -> torch.Tensor:
    """absmax / 127 per row, round half to even, back: the int8 cache's promise, by hand (float32)."""
    x32 = x.float()
    scale = x32.abs().amax(-1, keepdim=True) / 127
    q = torch.where(scale > 0, torch.round(x32 / torch.where(scale > 0, scale, 1.0)), 0.0)
    return (q * scale).to(x.dtype)


@settings(max_examples=30, deadline=None)
@given(W=st.integers(1, 8), chunks=st.lists(st.integers(1, 5), min_size=1, max_size=25), B=st.integers(1, 2),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 1000))
def test_int8_is_a_ring_of_quantised_tokens(W, chunks, B, dtype, seed):
    """Keys and values quantised together come back exactly as a ring fed their own round trips.

    Some rows are all zeros (scale 0) and some have one loud element.
    """
    g = torch.Generator().manual_seed(seed)
    cache, ring = Int8RingBufferKVCache(W), RingBufferKVCache(W)
    for c in chunks:
        k, v = torch.randn(B, H, c, D, generator=g), torch.randn(B, H, c, D, generator=g) * 10
        k[:, 0, 0] = 0.0
        v[..., 0] *= 1000
        k, v = k.to(dtype), v.to(dtype)
        got_k, got_v = cache.update(k, v)
        want_k, want_v = ring.update(reference_roundtrip(k), reference_roundtrip(v))
        assert torch.equal(cache.positions, ring.positions)
        assert got_k.dtype == dtype
        assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), f"after {cache.seen} tokens"


def test_int8_one_token_path_refuses_bad_input_and_changes_nothing():
    cache = Int8RingBufferKVCache(3)
    k = torch.randn(1, H, 1, D)
    cache.update(k, k)
    with pytest.raises(TypeError, match="dtype"):
        cache.update(k.double(), k.double())
    with pytest.raises(ValueError, match="heads"):
        cache.update(torch.randn(1, 3, 1, D), torch.randn(1, 3, 1, D))
    assert cache.seen == 1


def test_int8_stores_no_autograd_history():
    cache = Int8RingBufferKVCache(2)
    for _ in range(3):
        k = torch.randn(1, H, 1, D, requires_grad=True)
        cache.update(k, k * 2)
    assert not any(t.requires_grad for t in cache.buffers)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_quantize_int8_matches_the_formula(dtype):
    """q = round(x / (absmax / 127)), 0 for zero rows; scale float32; subnormal rows stay within [-127, 127]."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    x[3] = 0.0
    x[4, 2] = -5.0
    x = x.to(dtype)
    q, scale = quantize_int8(x)
    s = x.float().abs().amax(-1, keepdim=True) / 127
    work = torch.float64 if dtype == torch.float64 else torch.float32
    want = torch.round(x.to(work) / torch.where(s > 0, s, 1.0).to(work)).to(torch.int8)
    assert scale.dtype == torch.float32 and torch.equal(scale, s)
    assert torch.equal(q, want)
    tiny = torch.tensor([[1e-44, -3e-45, 0.0]])  # subnormal absmax: the scale rounds, |x / scale| may pass 127
    q, scale = quantize_int8(tiny)
    assert int(q.abs().max()) <= 127


# ------------------------------------------------------------------ the bench rows (never timed here)

def test_cache_decode_rows_and_their_targets():
    """Rows for every (window, cache); the ring's ratio is 1 and paged decodes the ring's tokens.

    The targets take the fastest repeats' ratio (not the medians', 0.1 here) at the worst window:
    hand-made rows 0.9 / 0.8 (paged) and 0.7 / 0.76 (int8) give
    0.8 and 0.7, both missed (targets 0.85 and 0.75); raising paged's worst to 0.86 meets it; a run that
    is not a full one reports and judges nothing.
    """
    from swkv_teach.bench.decode import cache_decode_rows
    from swkv_teach.bench.report import targets

    rows = cache_decode_rows(windows=(4, 6), new_tokens=3, repeats=1)
    assert [(r["window"], r["cache"]) for r in rows] == [(W, k) for W in (4, 6) for k in ("ring", "paged", "int8")]
    assert all(r["ratio_to_ring"] == r["ratio_to_ring_best"] == 1.0 for r in rows if r["cache"] == "ring")
    assert all(r["same_tokens_as_ring"] for r in rows if r["cache"] == "paged")

    def row(W, cache, ratio):
        return {"window": W, "cache": cache, "ratio_to_ring": 0.1, "ratio_to_ring_best": ratio}

    made = [row(64, "paged", 0.9), row(1024, "paged", 0.8), row(64, "int8", 0.7), row(1024, "int8", 0.76)]
    updates = [{"window": 64, "cache": c, "us": {"median": 1.0}, "bytes_per_step": 0, "bytes_held": 1,
                "bytes_formula": 1} for c in ("floor", "ring")]
    full = targets(updates, [], judged=True, cache_decode=made)
    assert full["paged_decode_vs_ring"]["value"] == 0.8 and full["paged_decode_vs_ring"]["met"] is False
    assert full["int8_decode_vs_ring"]["value"] == 0.7 and full["int8_decode_vs_ring"]["met"] is False
    made[1]["ratio_to_ring_best"] = 0.86
    assert targets(updates, [], judged=True, cache_decode=made)["paged_decode_vs_ring"]["met"] is True
    assert targets(updates, [], judged=False, cache_decode=made)["paged_decode_vs_ring"]["met"] is None


def test_serving_throughput_rows():
    from swkv_teach.bench.serving import serving_throughput

    torch.manual_seed(0)
    decoder = Decoder(DecoderConfig(window_size=4)).eval()
    requests = [dict(prompt=[1, 2, 3], max_new_tokens=5), dict(prompt=[4] * 9, max_new_tokens=3),
                dict(prompt=[7], max_new_tokens=6)]
    result = serving_throughput(decoder, requests, concurrency=(1, 3), block_size=2, repeats=1)
    assert [r["concurrency"] for r in result["rows"]] == [1, 3]
    assert all(r["same_as_solo"] for r in result["rows"])
    assert result["one_by_one"]["new_tokens"] == 14
    assert result["rows"][1]["steps"] < result["rows"][0]["steps"], "three at a time must take fewer steps"
    assert max(t["running"] for t in result["trace"]) == 3


def test_in_place_after_the_first_token_still_refuses_another_dtype():
    """Guards the fast path's dtype test: once running, a token of another dtype must leave it for ``update``'s
    checks (the pool's layout), not be copied into the float32 pool with a silent cast."""
    cache = PagedKVCache(BlockPool(4, 2), 3)
    for _ in range(3):
        cache.update_in_place(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D))
    k = torch.randn(1, H, 1, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dtype"):
        cache.update_in_place(k, k)
    assert cache.seen == 3


def test_int8_one_token_path_checks_the_values_too():
    """Guards the int8 fast path's tests on ``v_new``: keys like the cache's but values of another dtype or shape
    are refused (as ``update``'s checks say), never concatenated with the keys and quantised."""
    cache = Int8RingBufferKVCache(3)
    k = torch.randn(1, H, 1, D)
    cache.update(k, k)
    with pytest.raises(TypeError, match="same dtype"):
        cache.update(k, k.double())
    with pytest.raises(ValueError, match="same shape"):
        cache.update(k, torch.randn(2, H, 1, D))
    assert cache.seen == 1
