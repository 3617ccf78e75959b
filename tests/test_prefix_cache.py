"""Specification of ``swkv_teach.caches.prefix``: hash chain, LRU free queue, block bookkeeping, hit rule.

Expectations come from elsewhere: hashes recomputed here with ``hashlib`` from the documented recipe
(and checked in a second process), the free queue and the cache against a plain-list model under long
random operation sequences, and the sliding-window hit rule against a brute force over every
possible starting point plus the example in vLLM's own docstring.
"""

from __future__ import annotations

import hashlib
import random
import struct
import subprocess
import sys

import pytest

from swkv_teach.caches import PoolExhausted
from swkv_teach.caches.prefix import (
    ROOT_HASH, FreeBlockQueue, PrefixCache, block_hashes, find_longest_cache_hit, hash_block_tokens,
)


# ------------------------------------------------------------------ the hash chain
def test_hash_is_sha256_of_parent_and_ids():
    ids = [3, 0, 97, 5]
    expected = hashlib.sha256(ROOT_HASH + struct.pack("<4q", *ids)).digest()
    assert hash_block_tokens(None, ids) == expected
    second = hashlib.sha256(expected + struct.pack("<2q", 1, 2)).digest()
    assert hash_block_tokens(expected, [1, 2]) == second


def test_chain_depends_on_every_earlier_token_and_on_order():
    a = block_hashes([1, 2, 3, 4, 5, 6], 2)
    b = block_hashes([9, 2, 3, 4, 5, 6], 2)  # first token differs: every hash differs
    c = block_hashes([2, 1, 3, 4, 5, 6], 2)  # order inside the first block
    assert len(a) == 3 and all(x != y for x, y in zip(a, b)) and all(x != y for x, y in zip(a, c))
    assert a[1] == hash_block_tokens(a[0], [3, 4]) and a[2] == hash_block_tokens(a[1], [5, 6])
    assert hash_block_tokens(None, [3, 4]) != a[1], "a block's hash must depend on its parent"


@pytest.mark.parametrize("n, bs, full", [(0, 4, 0), (3, 4, 0), (4, 4, 1), (11, 4, 2), (12, 4, 3), (5, 1, 5)])
def test_one_hash_per_full_block(n, bs, full):
    assert len(block_hashes(list(range(n)), bs)) == full


def test_stable_across_processes():
    """Python's hash() is salted per process; a store shared by two servers needs the same hash in both."""
    code = ("from swkv_teach.caches.prefix import block_hashes; "
            "print(block_hashes([5, 6, 7, 8, 9, 10, 11], 3)[-1].hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert other == block_hashes([5, 6, 7, 8, 9, 10, 11], 3)[-1].hex()


@pytest.mark.parametrize("parent, ids, error, words", [
    (b"short", [1], TypeError, "32-byte"),
    ("a" * 32, [1], TypeError, "parent_hash"),
    (None, [], ValueError, "token_ids"),
    (None, [1, -2], TypeError, "non-negative ints"),
    (None, [1, 2.0], TypeError, "non-negative ints"),
])
def test_bad_hash_input_is_named(parent, ids, error, words):
    with pytest.raises(error, match=words):
        hash_block_tokens(parent, ids)


# ------------------------------------------------------------------ the free queue
def test_free_queue_against_a_list_model():
    rng = random.Random(0)
    q, model = FreeBlockQueue(), []
    for _ in range(3000):
        op = rng.choice(["append", "remove", "popleft"])
        if op == "append":
            b = rng.randrange(40)
            if b in model:
                with pytest.raises(ValueError):
                    q.append(b)
            else:
                q.append(b)
                model.append(b)
        elif op == "remove" and model:
            b = rng.choice(model)
            q.remove(b)
            model.remove(b)
        elif op == "popleft":
            if model:
                assert q.popleft() == model.pop(0), "popleft must give the least recently appended"
            else:
                with pytest.raises(IndexError):
                    q.popleft()
        assert list(q) == model and len(q) == len(model)
        assert all(b in q for b in model) and (41 not in q)


# ------------------------------------------------------------------ the block bookkeeping
def test_lru_eviction_order_touch_and_tail_first_release():
    cache = PrefixCache(4)
    a = [cache.allocate() for _ in range(3)]
    assert a == [0, 1, 2], "never-used blocks first, in order"
    hs = block_hashes(list(range(6)), 2)
    for b, h in zip(a, hs):
        assert cache.cache(b, h)
    cache.release(a)  # freed tail first: 2, then 1, then 0 join the queue
    assert list(cache.free_queue) == [2, 1, 0]
    assert cache.allocate() == 3, "an empty block is used before any cached one is evicted"
    cache.acquire([1])  # a hit takes block 1 out of the queue: it may not be evicted now
    assert list(cache.free_queue) == [2, 0] and cache.ref_count(1) == 1
    assert cache.allocate() == 2 and cache.pop_evicted() == [(hs[2], 2)] and cache.get(hs[2]) is None
    assert cache.allocate() == 0 and cache.pop_evicted() == [(hs[0], 0)]
    with pytest.raises(PoolExhausted):
        cache.allocate()
    assert cache.evictions == 2 and cache.lookup(hs) == [] and cache.get(hs[1]) == 1


def test_prefix_cache_against_a_model_under_random_operations():
    """Never a held block evicted; counts, queue and lookups as a plain model says."""
    rng = random.Random(1)
    n = 6
    cache = PrefixCache(n)
    ref = [0] * n
    name: dict[int, bytes] = {}
    queue: list[int] = []  # cached, free: LRU first
    empty = list(range(n))
    held: list[int] = []  # one entry per reference
    for step in range(4000):
        op = rng.choice(["allocate", "allocate", "release", "cache", "acquire"])
        if op == "allocate":
            if not empty and not queue:
                with pytest.raises(PoolExhausted):
                    cache.allocate()
                continue
            expect = empty[0] if empty else queue[0]
            got = cache.allocate()
            assert got == expect, f"step {step}: allocate gave {got}, expected {expect}"
            assert ref[got] == 0, "allocate handed out a block in use"
            if empty:
                empty.pop(0)
            else:
                queue.pop(0)
                assert cache.pop_evicted() == [(name.pop(got), got)]
            ref[got] = 1
            held.append(got)
        elif op == "release" and held:
            group = rng.sample(held, min(len(held), rng.randint(1, 3)))
            if len(set(group)) < len(group):
                continue
            cache.release(group)
            for b in reversed(group):
                held.remove(b)
                ref[b] -= 1
                if ref[b] == 0:
                    (queue if b in name else empty).append(b)
        elif op == "cache" and held:
            b = rng.choice(held)
            h = hash_block_tokens(None, [rng.randrange(5)])
            if b in name:
                continue
            ok = cache.cache(b, h)
            assert ok == (h not in name.values())
            if ok:
                name[b] = h
        elif op == "acquire" and name:
            b = rng.choice(list(name))
            cache.acquire([b])
            if ref[b] == 0:
                queue.remove(b)
            ref[b] += 1
            held.append(b)
        assert list(cache.free_queue) == queue
        assert [cache.ref_count(b) for b in range(n)] == ref
        assert cache.free_blocks == len(queue) + len(empty)
        assert cache.cached_blocks == len(name)


def test_bookkeeping_errors_change_nothing():
    cache = PrefixCache(3)
    b = cache.allocate()
    with pytest.raises(ValueError, match="not held"):
        cache.release([b, 2])
    assert cache.ref_count(b) == 1
    with pytest.raises(ValueError, match="empty"):
        cache.acquire([1])
    with pytest.raises(ValueError, match="block must be a block number 0..2"):
        cache.acquire([3])
    with pytest.raises(ValueError, match="not held"):
        cache.cache(2, ROOT_HASH)
    assert cache.free_blocks == 2 and cache.cached_blocks == 0


# ------------------------------------------------------------------ the hit rule
class FakeCache:
    def __init__(self, cached):
        self.cached = cached

    def get(self, h):
        return h if h in self.cached else None

    def lookup(self, hashes):
        out = []
        for h in hashes:
            if h not in self.cached:
                break
            out.append(h)
        return out


def brute_force_hit(cached: list[bool], bs: int, W: int | None, max_tokens: int) -> int:
    """The largest k such that starting at position k * bs needs only cached blocks (k = 0 always works)."""
    for k in range(min(len(cached), max_tokens // bs), 0, -1):
        first_key = 0 if W is None else max(0, k * bs - W + 1)
        if all(cached[i] for i in range(first_key // bs, k)):
            return k
    return 0


def test_vllm_docstring_example():
    """vLLM's SlidingWindowManager trims [NULL, NULL, 8, 3, NULL, 9] to [NULL, NULL, 8, 3] with 2 blocks needed."""
    hashes = list(range(6))
    cache = FakeCache({2, 3, 5})
    # block_size 4, W 8: ceil(7 / 4) = 2 contiguous blocks needed
    assert find_longest_cache_hit(cache, hashes, 4, 8, max_tokens=100) == [None, None, 2, 3]


@pytest.mark.parametrize("seed", range(300))
def test_sliding_window_rule_against_brute_force(seed):
    """Whenever the cached run vLLM's rule finds ends at k, k is the longest feasible start (brute force)."""
    rng = random.Random(seed)
    bs, n = rng.choice([1, 2, 3, 4, 16]), rng.randint(0, 12)
    W = rng.choice([None, 1, 2, 3, bs, bs + 1, 2 * bs, 2 * bs + 1, 5 * bs])
    cached = [rng.random() < 0.6 for _ in range(n)]
    max_tokens = rng.randint(0, n * bs + 2)
    hit = find_longest_cache_hit(FakeCache({i for i in range(n) if cached[i]}), list(range(n)), bs, W, max_tokens)
    k = len(hit)
    if W == 1:  # vLLM's rule wants at least one cached block (its run of 0 needed blocks starts at a hit)
        return
    assert k == brute_force_hit(cached, bs, W, max_tokens), (cached, bs, W, max_tokens, hit)
    first_key = 0 if W is None else max(0, k * bs - W + 1)
    for i, b in enumerate(hit):
        if i >= first_key // bs:
            assert b == i, f"block {i} is read by the first computed query but is not held: {hit}"
        else:
            assert b is None, f"block {i} is never read again but is held: {hit}"
