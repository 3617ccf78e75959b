"""Specification of the paged cache: the ring's tokens, in blocks from a shared pool, returned as soon as they leave.

Every update of every sequence is compared with a :class:`RingBufferKVCache` fed the same
stream: the keys and values returned (once sorted by position) and the ones stored must be
exactly the ring's. Between updates each sequence holds exactly the blocks its last ``W``
tokens occupy, and the pool's free count is the number of blocks no sequence holds.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swkv_teach as sw
from swkv_teach import BlockPool, PagedKVCache, RingBufferKVCache
from swkv_teach.caches import PoolExhausted, make_cache

H, D = 3, 4


def tokens(n, seed, dtype=torch.float32, device="cpu", heads=H, dim=D):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, heads, n, dim, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(1, heads, n, dim, generator=g).to(device=device, dtype=dtype)
    return k, v


def blocks_spanned(seen, W, bs):
    """Logical blocks holding the last W of `seen` tokens: what a sequence must hold, no more, no less."""
    if seen == 0:
        return 0
    return (seen - 1) // bs - max(0, seen - W) // bs + 1


def assert_like_ring(paged, ring, rk, rv, pk, pv):
    """The update's returned keys/values are the ring's once sorted by position; the stored ones are the ring's."""
    order = torch.argsort(ring.positions)
    assert paged.positions.tolist() == ring.positions[order].tolist()
    assert torch.equal(pk, rk[:, :, order.to(rk.device)]) and torch.equal(pv, rv[:, :, order.to(rv.device)])
    ok, ov = paged.ordered()
    rok, rov = ring.ordered()
    assert torch.equal(ok, rok) and torch.equal(ov, rov)
    assert paged.stored_positions().tolist() == ring.stored_positions().tolist()
    assert paged.seen == ring.seen and len(paged) == len(ring)


def assert_pool_consistent(pool, caches):
    tables = [c.block_table for c in caches]
    held = [b for t in tables for b in t]
    assert len(held) == len(set(held)), f"two sequences share a block: {tables}"
    assert pool.used_blocks == len(held) and pool.free_blocks == pool.num_blocks - len(held), "a block leaked"
    for c in caches:
        W, bs = c.window_size, pool.block_size
        assert len(c.block_table) == blocks_spanned(c.seen, W, bs), (c.seen, W, bs, c.block_table)
        assert len(c.block_table) <= PagedKVCache.max_blocks(W, bs)
        assert c.nbytes == len(c.block_table) * pool.bytes_per_block


# ------------------------------------------------------------------ the worked example
def test_docstring_example_window_3_block_size_2():
    pool = BlockPool(8, 2)
    cache = PagedKVCache(pool, 3)
    tables = []
    for t in range(7):
        cache.update(*tokens(1, t))
        tables.append(cache.block_table)
    assert tables == [[0], [0], [0, 1], [0, 1], [1, 2], [1, 2], [2, 3]]
    assert cache.stored_positions().tolist() == [4, 5, 6]
    assert cache.positions.tolist() == [4, 5, 6], "one token: the W - 1 stored before it, then itself"


@pytest.mark.parametrize("W,bs", [(1, 1), (3, 2), (4, 4), (5, 4), (8, 3), (16, 16), (17, 16)])
def test_a_block_returns_the_step_its_last_token_leaves_the_window(W, bs):
    """Block b holds tokens b*bs .. b*bs+bs-1; its last token leaves when seen = b*bs + bs + W. Not before, not after."""
    pool = BlockPool(64, bs)
    cache = PagedKVCache(pool, W)
    first_block = None
    for t in range(4 * W + 2 * bs):
        cache.update(*tokens(1, t))
        if first_block is None:
            first_block = cache.block_table[0]
        seen = t + 1
        assert (first_block in cache.block_table) == (seen < bs + W), (seen, cache.block_table)
    assert pool.used_blocks == len(cache.block_table)


# ------------------------------------------------------------------ random streams vs the ring
@settings(max_examples=80, deadline=None)
@given(
    W=st.integers(1, 10),
    bs=st.integers(1, 6),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14), st.booleans()), min_size=1, max_size=30),
    n_seq=st.integers(1, 4),
)
def test_interleaved_sequences_on_one_pool_match_the_ring_at_every_update(W, bs, ops, n_seq):
    """Random one-token and chunked updates of up to 4 sequences, interleaved, sometimes reset."""
    pool = BlockPool(n_seq * PagedKVCache.max_blocks(W, bs), bs)  # exactly enough for all at once
    paged = [PagedKVCache(pool, W) for _ in range(n_seq)]
    rings = [RingBufferKVCache(W) for _ in range(n_seq)]
    for step, (which, c, reset) in enumerate(ops):
        i = which % n_seq
        if reset and step % 5 == 4:
            paged[i].reset()
            rings[i].reset()
            assert paged[i].block_table == [] and paged[i].seen == 0 and paged[i].nbytes == 0
        else:
            k, v = tokens(c, 1000 * step + i)
            pk, pv = paged[i].update(k, v)
            rk, rv = rings[i].update(k, v)
            assert_like_ring(paged[i], rings[i], rk, rv, pk, pv)
        assert_pool_consistent(pool, paged)
    for p in paged:
        p.reset()
    assert pool.free_blocks == pool.num_blocks, "reset returns every block"


@pytest.mark.parametrize("W,bs", [(1, 1), (3, 1), (3, 2), (4, 2), (5, 4), (8, 8), (9, 4)])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_boundary_lengths_and_a_long_prompt(W, bs, offset, device):
    for chunks in ([1] * max(1, W + offset) + [1] * (2 * W + 3), [max(1, W + offset), 1, 1, 2 * W + 3, 1]):
        pool = BlockPool(PagedKVCache.max_blocks(W, bs), bs)
        paged, ring = PagedKVCache(pool, W), RingBufferKVCache(W)
        for n, c in enumerate(chunks):
            k, v = tokens(c, n, device=device)
            pk, pv = paged.update(k, v)
            rk, rv = ring.update(k, v)
            assert pk.device == k.device and paged.positions.device == k.device
            assert_like_ring(paged, ring, rk, rv, pk, pv)
            assert_pool_consistent(pool, [paged])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_are_stored_exactly(dtype):
    pool = BlockPool(4, 3)
    paged, ring = PagedKVCache(pool, 5), RingBufferKVCache(5)
    for n, c in enumerate([2, 1, 7, 1, 1]):
        k, v = tokens(c, n, dtype=dtype)
        pk, pv = paged.update(k, v)
        rk, rv = ring.update(k, v)
        assert pk.dtype == dtype and pool.k.dtype == dtype
        assert_like_ring(paged, ring, rk, rv, pk, pv)


# ------------------------------------------------------------------ a pool serving more than it holds
def test_a_small_pool_serves_interleaved_sequences_far_longer_than_itself():
    W, bs, n_seq, T = 6, 2, 3, 200
    pool = BlockPool(n_seq * PagedKVCache.max_blocks(W, bs), bs)  # 12 blocks = 24 token slots
    paged = [PagedKVCache(pool, W) for _ in range(n_seq)]
    rings = [RingBufferKVCache(W) for _ in range(n_seq)]
    for t in range(T):
        for i in range(n_seq):
            k, v = tokens(1, 7 * t + i)
            pk, pv = paged[i].update(k, v)
            rk, rv = rings[i].update(k, v)
            assert_like_ring(paged[i], rings[i], rk, rv, pk, pv)
        assert_pool_consistent(pool, paged)
    assert n_seq * T > 20 * pool.num_blocks * bs


@pytest.mark.parametrize("W,bs,bound", [
    (1, 1, 1), (2, 1, 2), (3, 2, 2), (4, 2, 3), (4, 4, 2), (5, 4, 2), (6, 4, 3), (8, 4, 3), (9, 4, 3),
    (16, 16, 2), (17, 16, 2), (18, 16, 3),
])
def test_the_block_bound_is_hand_worked_and_reached_by_a_real_sequence(W, bs, bound):
    """Regression (issue 24, a wrong block bound): W consecutive tokens straddle at most ceil((W - 1) / bs) + 1
    blocks, worked by hand per row (W = 5, bs = 4: tokens 3..7 span blocks 0 and 1, never three). A real sequence
    fed one token at a time holds exactly that many blocks at its worst, and a pool one block smaller runs out."""
    assert PagedKVCache.max_blocks(W, bs) == bound
    pool = BlockPool(64, bs)
    cache = PagedKVCache(pool, W)
    worst = 0
    for t in range(3 * (W + bs)):
        cache.update(*tokens(1, t))
        worst = max(worst, len(cache.block_table))
    assert worst == bound
    if bound > 1:
        small = PagedKVCache(BlockPool(bound - 1, bs), W)
        with pytest.raises(PoolExhausted):
            for t in range(3 * (W + bs)):
                small.update(*tokens(1, t))


def test_a_pool_of_exactly_the_bound_serves_one_sequence_forever():
    """A step may return one block and take another: the returned one must count as free (W = 5, bs = 4)."""
    W, bs = 5, 4
    pool = BlockPool(PagedKVCache.max_blocks(W, bs), bs)
    cache = PagedKVCache(pool, W)
    for t in range(50):
        cache.update(*tokens(1 + (t % 3 == 0) * 6, t))
        assert_pool_consistent(pool, [cache])


# ------------------------------------------------------------------ pool exhausted
def snapshot(pool, caches):
    return (
        list(pool._free), dict(pool._owner), None if pool.k is None else (pool.k.clone(), pool.v.clone()),
        [(c.block_table, c.seen, c.positions.clone(), c._first) for c in caches],
    )


def assert_same(a, b):
    assert a[0] == b[0] and a[1] == b[1]
    assert (a[2] is None) == (b[2] is None)
    if a[2] is not None:
        assert torch.equal(a[2][0], b[2][0]) and torch.equal(a[2][1], b[2][1])
    for (t1, s1, p1, f1), (t2, s2, p2, f2) in zip(a[3], b[3]):
        assert t1 == t2 and s1 == s2 and torch.equal(p1, p2) and f1 == f2


def test_an_empty_pool_raises_names_the_pool_and_the_holders_and_changes_nothing():
    pool = BlockPool(5, 2)
    a, b, c = PagedKVCache(pool, 4), PagedKVCache(pool, 4), PagedKVCache(pool, 4)
    a.update(*tokens(5, 0))  # 3 blocks
    b.update(*tokens(3, 1))  # 2 blocks
    before = snapshot(pool, [a, b, c])
    with pytest.raises(PoolExhausted) as info:
        c.update(*tokens(1, 2))
    msg = str(info.value)
    assert "num_blocks=5" in msg and "block_size=2" in msg
    assert "sequence 0 holds 3 blocks" in msg and "sequence 1 holds 2 blocks" in msg and "sequence 2" in msg
    assert_same(before, snapshot(pool, [a, b, c]))
    with pytest.raises(PoolExhausted):
        b.update(*tokens(2, 3))  # needs a third block
    assert_same(before, snapshot(pool, [a, b, c]))
    # the failed sequences still work once another finishes
    a.reset()
    c.update(*tokens(1, 2))
    b.update(*tokens(2, 3))
    assert_pool_consistent(pool, [a, b, c])


def test_an_empty_pool_before_any_write_allocates_nothing():
    pool = BlockPool(1, 2)
    hog, cache = PagedKVCache(pool, 2), PagedKVCache(pool, 2)
    hog.update(*tokens(1, 0))
    pool.k = pool.v = None  # as if never allocated: a failed first write must not allocate
    with pytest.raises(PoolExhausted):
        cache.update(*tokens(1, 1))
    assert pool.k is None and cache.seen == 0


# ------------------------------------------------------------------ reset, layouts, bad input
def test_reset_returns_every_block_and_a_free_pool_takes_a_new_layout():
    pool = BlockPool(6, 4)
    cache = PagedKVCache(pool, 8)
    cache.update(*tokens(11, 0))
    assert pool.used_blocks == 3 and cache.nbytes == 3 * 2 * 4 * H * D * 4
    cache.reset()
    assert pool.free_blocks == 6 and cache.nbytes == 0 and len(cache) == 0 and cache.seen == 0
    k, _ = cache.update(*tokens(2, 1, dtype=torch.float64, heads=1, dim=2))
    assert k.shape == (1, 1, 2, 2) and pool.k.dtype == torch.float64 and pool.k.shape == (6, 4, 1, 2)


def test_sequences_on_one_pool_must_share_its_layout():
    pool = BlockPool(6, 4)
    a, b = PagedKVCache(pool, 4), PagedKVCache(pool, 4)
    a.update(*tokens(1, 0))
    before = snapshot(pool, [a, b])
    with pytest.raises(ValueError, match="head_dim=4.*every sequence on one pool"):
        b.update(*tokens(1, 1, dim=6))
    with pytest.raises(ValueError, match="dtype torch.float64"):
        b.update(*tokens(1, 1, dtype=torch.float64))
    assert_same(before, snapshot(pool, [a, b]))


@pytest.mark.parametrize("make_bad,match", [
    (lambda k: k.expand(2, -1, -1, -1), "batch=2.*one sequence"),
    (lambda k: k[0], "has 3 dims"),
    (lambda k: k[:, :, :0], "holds no tokens"),
    (lambda k: k.to(torch.float64), "dtype torch.float64 .*cache holds"),
    (lambda k: k[:, :2], "heads=2,.*cache holds heads=3"),
    (lambda k: k.tolist(), "must be a torch.Tensor"),
])
def test_bad_updates_raise_naming_the_argument_and_change_nothing(make_bad, match):
    pool = BlockPool(8, 2)
    cache, other = PagedKVCache(pool, 3), PagedKVCache(pool, 3)
    cache.update(*tokens(4, 0))
    other.update(*tokens(2, 1))
    before = snapshot(pool, [cache, other])
    k, v = tokens(1, 2)
    with pytest.raises((ValueError, TypeError), match=match):
        cache.update(make_bad(k), make_bad(v))
    assert_same(before, snapshot(pool, [cache, other]))


@pytest.mark.parametrize("args,match", [
    ((0, 4), "num_blocks must be a positive int"),
    ((4, 0), "block_size must be a positive int"),
    ((4.0, 2), "num_blocks must be a positive int; got float"),
])
def test_bad_pools_are_refused(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        BlockPool(*args)


def test_bad_caches_and_double_frees_are_refused():
    with pytest.raises(TypeError, match="pool must be a BlockPool; got int"):
        PagedKVCache(16, 4)
    with pytest.raises(ValueError, match="window_size must be a positive int"):
        PagedKVCache(BlockPool(2, 2), 0)
    pool = BlockPool(2, 2)
    with pytest.raises(ValueError, match="block 0 is not held"):
        pool.give(0)
    assert pool.free_blocks == 2


def test_ordered_on_an_empty_cache_says_so():
    with pytest.raises(RuntimeError, match="empty"):
        PagedKVCache(BlockPool(1, 1), 1).ordered()


def test_inputs_are_not_aliased_or_written():
    pool = BlockPool(4, 2)
    cache = PagedKVCache(pool, 3)
    k, v = tokens(3, 0)
    k0, v0 = k.clone(), v.clone()
    rk, _ = cache.update(k, v)
    rk.add_(1.0)
    cache.update(*tokens(1, 1))
    assert torch.equal(k, k0) and torch.equal(v, v0)
    ok, _ = cache.ordered()
    assert torch.equal(ok[:, :, :2], k0[:, :, 1:]), "writing into a returned tensor must not change the cache"


# ------------------------------------------------------------------ the decoder drives it unchanged
@pytest.fixture(scope="module")
def pretrained():
    return sw.load_pretrained()


@pytest.mark.parametrize("chunk_size", [1, 5, 70])
def test_the_decoder_scores_through_the_paged_cache_as_through_the_ring(pretrained, chunk_size):
    decoder, tok = pretrained
    ids = torch.tensor([tok.encode("def paged(block, table):\n    return table[block // 16]\n" * 3)])
    ring = decoder.score(ids, cache="ring", chunk_size=chunk_size)
    paged = decoder.score(ids, cache="paged", chunk_size=chunk_size)
    assert ids.shape[1] > 2 * decoder.config.window_size
    torch.testing.assert_close(paged, ring, atol=5e-5, rtol=0)  # same keys; only the summation order differs
    assert torch.equal(paged.argmax(-1), ring.argmax(-1))


def test_two_sequences_share_one_pool_across_layers_in_the_decoder(pretrained):
    """Every layer of two interleaved sequences on one pool: the logits are each sequence's own."""
    decoder, tok = pretrained
    W, L = decoder.config.window_size, len(decoder.layers)
    pool = BlockPool(2 * L * PagedKVCache.max_blocks(W, 16), 16)
    texts = ["import os\nprint(os.getcwd())\n" * 4, "class A:\n    pass\n" * 6]
    seqs = [torch.tensor([tok.encode(t)]) for t in texts]
    caches = [[PagedKVCache(pool, W) for _ in range(L)] for _ in seqs]
    outs = [[], []]
    for s in range(0, max(x.shape[1] for x in seqs), 7):
        for i, ids in enumerate(seqs):
            if s < ids.shape[1]:
                outs[i].append(decoder.step(ids[:, s : s + 7], caches[i]))
    for i, ids in enumerate(seqs):
        torch.testing.assert_close(torch.cat(outs[i], 1), decoder.score(ids, cache="ring"), atol=5e-5, rtol=0)
    assert pool.used_blocks == sum(len(c.block_table) for cs in caches for c in cs)


def test_make_cache_gives_a_paged_cache_its_own_pool_just_big_enough():
    cache = make_cache("paged", 40)
    assert isinstance(cache, PagedKVCache) and cache.pool.num_blocks == 4 and cache.pool.block_size == 16
    for t in range(100):
        cache.update(*tokens(1 + 30 * (t == 50), t))
    assert cache.pool.free_blocks == 4 - len(cache.block_table)


def test_copies_of_a_cache_are_not_a_thing_to_rely_on():
    """A deepcopy copies the pool with it: the copy's blocks live in its own pool, never the original's."""
    pool = BlockPool(4, 2)
    cache = PagedKVCache(pool, 3)
    cache.update(*tokens(3, 0))
    twin = copy.deepcopy(cache)
    twin.reset()
    assert pool.used_blocks == 2 and twin.pool.free_blocks == 4


def test_the_pool_puts_a_saved_state_back_into_the_same_blocks_or_changes_nothing():
    """claim / reorder_free, what PagedKVCache.load_state_dict uses to restore blocks where they lay (hand-worked)."""
    pool = BlockPool(4, 2)
    assert [pool.take(0), pool.take(0)] == [0, 1]  # first in, first out
    assert pool.free_order() == [2, 3] and pool.is_held(1) and not pool.is_held(2) and not pool.is_held(9)
    assert not pool.claim([3, 1], owner=5)  # block 1 is held: nothing is claimed, not even 3
    assert pool.free_order() == [2, 3] and pool.holdings() == {0: [0, 1]}
    assert pool.claim([3], owner=5) and pool.holdings() == {0: [0, 1], 5: [3]} and pool.free_order() == [2]
    pool.give(0)
    pool.reorder_free([0, 2])
    assert pool.free_order() == [0, 2] and pool.take() == 0
    with pytest.raises(ValueError, match=r"must list exactly the free blocks \[2\]"):
        pool.reorder_free([2, 3])
    assert pool.free_order() == [2]


def test_give_refuses_a_block_no_sequence_holds():
    """Guards ``give``'s test that the block is held: a free block, a number past the pool and -1 (a freed table
    entry) are refused, and the free queue is unchanged (a block in it twice would be handed out twice)."""
    pool = BlockPool(3, 2)
    held = pool.take(0)
    before = pool.free_order()
    for bad in (before[0], 3, 99, -1):
        with pytest.raises(ValueError, match="not held by any sequence"):
            pool.give(bad)
    assert pool.free_order() == before
    pool.give(held)
    assert pool.free_order() == before + [held]


def test_a_pool_with_every_block_free_takes_the_next_writes_dtype():
    """Guards ``allocate_like``'s dtype test: once every block is back, a sequence of another dtype gets storage
    of its dtype (the docstring's "while every block is free, a write of another layout re-allocates")."""
    pool = BlockPool(4, 2)
    cache = PagedKVCache(pool, 3)
    cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))
    cache.reset()
    k = torch.randn(1, 2, 3, 4, dtype=torch.bfloat16)
    out_k, _ = cache.update(k, k)
    assert pool.k.dtype == torch.bfloat16 and out_k.dtype == torch.bfloat16 and torch.equal(out_k, k)


def test_write_to_blocks_puts_each_token_in_its_slot():
    """``write_to_blocks`` by hand: block_size 2, row 0's tokens to flat slots [5, 0], row 1's to [2, 3]; keys go to
    the keys' pool and values to the values' (token t of row b has key 10*b + t and value -(10*b + t))."""
    k_pool, v_pool = torch.zeros(3, 2, 1, 1), torch.zeros(3, 2, 1, 1)
    k = torch.tensor([[0.0, 1.0], [10.0, 11.0]]).view(2, 1, 2, 1)  # (batch, heads, tokens, head_dim)
    sw.caches.pool.write_to_blocks(k_pool, v_pool, torch.tensor([[5, 0], [2, 3]]), k, -k)
    assert k_pool.flatten().tolist() == [1.0, 0.0, 10.0, 11.0, 0.0, 0.0]
    assert v_pool.flatten().tolist() == [-1.0, 0.0, -10.0, -11.0, 0.0, -0.0]
