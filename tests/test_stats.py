"""Observability: every cache's stats() against counts worked out by hand, at every step.

The specification (issue 23): integer ``tokens_seen``, ``tokens_stored`` (= ``len``),
``tokens_evicted`` (seen - stored for the window caches), ``bytes_held`` (= ``nbytes``), plus what
the policy adds (paged: blocks held and the pool's free blocks; LRU: hits and misses; H2O/TOVA:
evictions). ``LayerCaches.stats()`` sums over layers and keeps each layer's dict under ``layers``.
"""

from __future__ import annotations

import random

import pytest
import torch

from swkv_teach import BlockPool, Decoder, DecoderConfig, H2OKVCache, PagedKVCache, TOVAKVCache, make_cache
from swkv_teach.model import LayerCaches

BASE = {"tokens_seen", "tokens_stored", "tokens_evicted", "bytes_held"}


def kv(batch, heads, tokens, dim, dtype=torch.float32):
    return torch.randn(batch, heads, tokens, dim).to(dtype), torch.randn(batch, heads, tokens, dim).to(dtype)


def chunk_sizes(seed, total=40):
    rng = random.Random(seed)
    out = []
    while sum(out) < total:
        out.append(rng.choice([1, 1, 1, 2, 5, 9]))
    return out


def check_ints(stats: dict):
    for key, value in stats.items():
        if key != "layers":
            assert type(value) is int, f"stats[{key!r}] is {type(value).__name__} {value!r}; expected an int"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("kind", ("naive", "ring", "sinks", "int8"))
def test_window_caches_count_what_they_hold_at_every_step(kind, seed):
    """stored = min(seen, W (+ S)), evicted = seen - stored, bytes from the shapes, after every chunk."""
    rng = random.Random(seed)
    B, H, D, W, S = rng.choice([1, 2]), rng.choice([1, 3]), rng.choice([2, 8]), rng.choice([1, 4, 7]), 2
    dtype = rng.choice([torch.float32, torch.float16, torch.float64])
    cache = make_cache(kind, W, num_sinks=S)
    cap = W + (S if kind == "sinks" else 0)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    assert cache.stats()["tokens_seen"] == 0 and cache.stats()["bytes_held"] == 0
    seen = 0
    for c in chunk_sizes(seed):
        cache.update(*kv(B, H, c, D, dtype))
        seen += c
        stored = min(seen, cap)
        if kind == "naive":
            held = 2 * B * H * stored * D * itemsize  # the tensor is exactly the stored tokens
        elif kind == "int8":
            held = 2 * B * H * W * D * 1 + 2 * B * H * W * 1 * 4  # int8 data plus one float32 scale per token/head
        else:
            held = 2 * B * H * cap * D * itemsize  # preallocated: flat from the first token
        got = cache.stats()
        check_ints(got)
        want = {"tokens_seen": seen, "tokens_stored": stored, "tokens_evicted": seen - stored, "bytes_held": held}
        assert {k: got[k] for k in BASE} == want, f"after {seen} tokens (W={W}, chunks of {c})"
        assert got["tokens_stored"] == len(cache) and got["bytes_held"] == cache.nbytes
        if kind == "sinks":
            assert got["sinks_held"] == min(seen, S)
        if kind == "int8":
            assert got["scale_bytes"] == 2 * B * H * W * 4


def test_paged_blocks_follow_the_worked_example():
    """paged.py's table: W = 3, block_size = 2, one token a step; a pool of 4 blocks of 2 tokens of (2 heads, 4 dims)."""
    pool = BlockPool(4, 2)
    cache = PagedKVCache(pool, 3)
    per_block = 2 * 2 * 2 * 4 * 4  # keys and values, block_size tokens, heads, head_dim, float32
    blocks = [1, 1, 2, 2, 2, 2, 2, 2]  # seen 1..8: [0], [0], [0,1], [0,1], [1,2], [1,2], [2,3], [2,3]
    for seen, held in enumerate(blocks, start=1):
        cache.update(*kv(1, 2, 1, 4))
        got = cache.stats()
        check_ints(got)
        assert got == {"tokens_seen": seen, "tokens_stored": min(seen, 3), "tokens_evicted": max(0, seen - 3),
                       "bytes_held": held * per_block, "blocks_held": held, "pool_free_blocks": 4 - held,
                       "pool_blocks": 4}, f"after {seen} tokens"


@pytest.mark.parametrize("seed", range(4))
def test_paged_blocks_with_chunks_and_two_sequences_on_one_pool(seed):
    """Blocks held = the logical blocks of the last W tokens; the pool's free blocks = all minus both sequences'."""
    rng = random.Random(seed)
    W, bs = rng.choice([3, 5, 8]), rng.choice([2, 3, 4])
    per_seq = PagedKVCache.max_blocks(W, bs)
    pool = BlockPool(2 * per_seq, bs)
    a, b = PagedKVCache(pool, W), PagedKVCache(pool, W)
    seen = {id(a): 0, id(b): 0}

    def blocks(n):  # tokens max(0, n - W) .. n - 1 lie in logical blocks lo // bs .. (n - 1) // bs
        return 0 if n == 0 else (n - 1) // bs - max(0, n - W) // bs + 1

    for c in chunk_sizes(seed, 60):
        cache = rng.choice([a, b])
        cache.update(*kv(1, 1, c, 2))
        seen[id(cache)] += c
        for x in (a, b):
            n = seen[id(x)]
            got = x.stats()
            assert got["blocks_held"] == blocks(n), f"W={W}, block_size={bs}, after {n} tokens"
            assert got["pool_free_blocks"] == 2 * per_seq - blocks(seen[id(a)]) - blocks(seen[id(b)])
            assert got["tokens_evicted"] == n - min(n, W)


def test_lru_counts_hits_misses_and_evictions_by_hand():
    cache = make_cache("lru", 3)
    for _ in range(3):
        cache.update(*kv(1, 1, 1, 2))  # ids 0, 1, 2
    assert cache.get(0) is not None and cache.get(7) is None and cache.get(2) is not None and cache.get(9) is None
    cache.update(*kv(1, 1, 2, 2))  # ids 3, 4 evict 1 then 0 (recency order after the gets: 1, 0, 2)
    cache.put("extra", 1.0, 2.0)  # the seed's API evicts too: 2 goes; seen does not move
    got = cache.stats()
    check_ints(got)
    assert cache.ids() == [3, 4, "extra"]
    assert got == {"tokens_seen": 5, "tokens_stored": 3, "tokens_evicted": 3, "bytes_held": 2 * 2 * 4 * 2,
                   "hits": 2, "misses": 2}
    cache.reset()
    assert cache.stats() == {"tokens_seen": 0, "tokens_stored": 0, "tokens_evicted": 0, "bytes_held": 0,
                             "hits": 0, "misses": 0}


def test_tova_evictions_and_keepers_by_hand():
    """budget 3; the newest query always looks at position 0, so 0 survives and the others slide."""
    cache = TOVAKVCache(3)
    for seen in range(1, 8):
        cache.update(*kv(1, 1, 1, 2))
        w = torch.zeros(1, 2, 1, len(cache.positions))
        w[..., list(cache.positions).index(0)] = 1.0
        cache.observe(w)
        got = cache.stats()
        check_ints(got)
        # kept beyond a window of 3: position 0 once seen > 3 (a window would hold seen-3 .. seen-1)
        assert got == {"tokens_seen": seen, "tokens_stored": min(seen, 3), "tokens_evicted": max(0, seen - 3),
                       "bytes_held": 2 * 3 * 2 * 4, "evictions": max(0, seen - 3), "kept_beyond_window": int(seen > 3)}


def test_h2o_counts_a_prompt_longer_than_its_budget():
    """A 7-token chunk into budget 4: nothing is evicted until observe() chooses, then 3 at once."""
    cache = H2OKVCache(4, 2)
    cache.update(*kv(1, 1, 7, 2))
    got = cache.stats()
    assert (got["tokens_stored"], got["tokens_evicted"], got["evictions"]) == (7, 0, 0)
    w = torch.softmax(torch.randn(1, 1, 7, 7), -1)
    cache.observe(w)
    got = cache.stats()
    assert (got["tokens_stored"], got["tokens_evicted"], got["evictions"]) == (4, 3, 3)
    assert got["bytes_held"] == 2 * 4 * 2 * 4


def tiny(layers=3, window=5):
    torch.manual_seed(0)
    return Decoder(DecoderConfig(vocab_size=30, dim=16, n_layers=layers, n_heads=2, n_kv_heads=1, head_dim=8,
                                 hidden_dim=16, window_size=window)).eval()


@pytest.mark.parametrize("kind", ("ring", "paged", "lru"))
def test_layer_caches_sum_over_layers_and_keep_each_layer(kind):
    model = tiny()
    caches = model.new_caches(kind)
    model.step(torch.randint(0, 30, (1, 9)), caches)
    got = caches.stats()
    assert got["layers"] == [c.stats() for c in caches]
    for key, value in got["layers"][0].items():
        assert got[key] == 3 * value, key  # three identical layers
    assert got["tokens_seen"] == 27 and got["tokens_stored"] == 15 and got["tokens_evicted"] == 12


def test_mixed_layers_sum_the_counts_they_share():
    caches = LayerCaches([make_cache("ring", 4), make_cache("lru", 2)], 4)
    for cache in caches:
        cache.update(*kv(1, 1, 3, 2))
    got = caches.stats()
    assert got["tokens_seen"] == 6 and got["tokens_stored"] == 5 and got["tokens_evicted"] == 1
    assert "hits" not in got and got["layers"][1]["hits"] == 0


def test_over_a_generation_memory_is_flat_and_evictions_grow_by_one_a_step():
    """The lesson's chart as a specification: after the window fills, bytes stay put and evictions climb by n_layers."""
    model = tiny(layers=2, window=6)
    caches = model.new_caches("ring")
    ids = torch.randint(0, 30, (1, 4))
    model.step(ids, caches)
    history = [caches.stats()]
    for _ in range(12):
        model.step(torch.randint(0, 30, (1, 1)), caches)
        history.append(caches.stats())
    bytes_held = {s["bytes_held"] for s in history}
    assert bytes_held == {2 * 2 * 1 * 6 * 8 * 4}  # two layers, k and v, 1 head, W = 6, head_dim 8, float32
    assert [s["tokens_evicted"] for s in history] == [2 * max(0, 4 + t - 6) for t in range(13)]
