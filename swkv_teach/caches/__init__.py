"""KV caches behind one interface (:class:`KVCache`): pick one by name with :func:`make_cache`.

=============  ==========================  =====================================================
name           class                       policy
=============  ==========================  =====================================================
``"naive"``    :class:`SlidingWindowKVCache`  the problem statement's cat-and-slice (also ``"sliding"``)
``"ring"``     :class:`RingBufferKVCache`     same tokens, O(1) per step, slot order
``"sinks"``    :class:`SinkKVCache`           first ``num_sinks`` forever + last ``window_size``
``"lru"``      :class:`LRUKVCache`            least recently *used* evicted (not the window's rule)
``"paged"``    :class:`PagedKVCache`          the window's tokens in blocks from a :class:`BlockPool` (batch 1)
``"int8"``     :class:`Int8RingBufferKVCache` the ring's tokens stored as int8, one scale per token and head
=============  ==========================  =====================================================

Evicting by attention (built directly, not by name: they need ``observe``):
:class:`H2OKVCache` (recent window + heavy hitters) and :class:`TOVAKVCache`
(drop what the newest query attends to least), both on :class:`ScoredKVCache`.
"""

from swkv_teach.caches.base import KVCache
from swkv_teach.caches.h2o import H2OKVCache
from swkv_teach.caches.int8 import Int8RingBufferKVCache
from swkv_teach.caches.lru import LRUKVCache
from swkv_teach.caches.paged import BlockPool, PagedKVCache, PoolExhausted
from swkv_teach.caches.ring import RingBufferKVCache
from swkv_teach.caches.scored import ScoredKVCache
from swkv_teach.caches.sinks import SinkKVCache
from swkv_teach.caches.sliding import SlidingWindowKVCache
from swkv_teach.caches.tova import TOVAKVCache

CACHE_KINDS = ("naive", "sliding", "ring", "sinks", "lru", "paged", "int8")
PAGED_BLOCK_SIZE = 16  # make_cache("paged"): vLLM's default block size

__all__ = [
    "CACHE_KINDS",
    "H2OKVCache",
    "BlockPool",
    "Int8RingBufferKVCache",
    "KVCache",
    "LRUKVCache",
    "PagedKVCache",
    "PoolExhausted",
    "RingBufferKVCache",
    "ScoredKVCache",
    "SinkKVCache",
    "SlidingWindowKVCache",
    "TOVAKVCache",
    "make_cache",
]


def make_cache(kind: str, window_size: int, num_sinks: int = 4) -> KVCache:
    """A fresh cache of ``kind`` (one of :data:`CACHE_KINDS`) holding ``window_size`` recent tokens.

    ``num_sinks`` is used by ``"sinks"`` only. ``"paged"`` gets a pool of its own, just big enough
    (``PagedKVCache.max_blocks`` blocks of :data:`PAGED_BLOCK_SIZE` tokens); share a pool by building
    :class:`PagedKVCache` directly.
    """
    if kind in ("naive", "sliding"):
        return SlidingWindowKVCache(window_size)
    if kind == "ring":
        return RingBufferKVCache(window_size)
    if kind == "sinks":
        return SinkKVCache(num_sinks, window_size)
    if kind == "lru":
        return LRUKVCache(window_size)
    if kind == "paged":
        blocks = PagedKVCache.max_blocks(window_size, PAGED_BLOCK_SIZE)
        return PagedKVCache(BlockPool(blocks, PAGED_BLOCK_SIZE), window_size)
    if kind == "int8":
        return Int8RingBufferKVCache(window_size)
    raise ValueError(f"cache kind must be one of {CACHE_KINDS}; got {kind!r}")
