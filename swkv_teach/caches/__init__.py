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

Evicting by attention (:data:`ATTENTION_KINDS`, on :class:`ScoredKVCache`; the decoder feeds their
``observe`` with each step's attention):

=============  ==========================  =====================================================
``"h2o"``      :class:`H2OKVCache`            ``recent`` newest + heavy hitters (accumulated attention)
``"tova"``     :class:`TOVAKVCache`           drop what the newest query attends to least
=============  ==========================  =====================================================

``make_cache`` builds them (``window_size`` is their budget); ``Decoder.new_caches``,
``score`` and ``generate`` take :data:`CACHE_KINDS` only, because there the budget is also
the mask's window, while an attention-evicting cache keeps the model's own mask window (a kept
token older than it stays masked, as in training). Drive them with
``LayerCaches([make_cache("h2o", B) for _ in model.layers], model.config.window_size)``.
"""

from swkv_teach.caches.base import KVCache
from swkv_teach.caches.h2o import H2OKVCache
from swkv_teach.caches.int8 import Int8RingBufferKVCache
from swkv_teach.caches.lru import LRUKVCache
from swkv_teach.caches.paged import PagedKVCache
from swkv_teach.caches.pool import BlockPool, PoolExhausted
from swkv_teach.caches.ring import RingBufferKVCache
from swkv_teach.caches.scored import ScoredKVCache
from swkv_teach.caches.sinks import SinkKVCache
from swkv_teach.caches.sliding import SlidingWindowKVCache
from swkv_teach.caches.tova import TOVAKVCache

CACHE_KINDS = ("naive", "sliding", "ring", "sinks", "lru", "paged", "int8")
ATTENTION_KINDS = ("h2o", "tova")  # make_cache only: they evict by the attention Decoder.step hands observe()
PAGED_BLOCK_SIZE = 16  # make_cache("paged"): vLLM's default block size

__all__ = [
    "ATTENTION_KINDS",
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


def make_cache(kind: str, window_size: int, num_sinks: int = 4, recent: int | None = None) -> KVCache:
    """A fresh cache of ``kind`` (one of :data:`CACHE_KINDS` or :data:`ATTENTION_KINDS`) holding ``window_size`` tokens.

    ``num_sinks`` is used by ``"sinks"`` only. For ``"h2o"`` and ``"tova"`` ``window_size`` is the
    budget (``H2OKVCache(window_size, recent)``, ``TOVAKVCache(window_size)``); ``recent`` is H2O's
    protected recent window, default ``window_size // 2`` (the equal heavy/recent split of H2O's
    scripts, ``--heavy_ratio 0.1 --recent_ratio 0.1``), and refused for every other kind.
    ``"paged"`` gets a pool of its own, just big enough (``PagedKVCache.max_blocks`` blocks of
    :data:`PAGED_BLOCK_SIZE` tokens); share a pool by building :class:`PagedKVCache` directly.
    """
    if recent is not None and kind != "h2o":
        raise ValueError(f"recent is H2O's recent window, for kind 'h2o' only; got recent={recent!r} with kind {kind!r}")
    if kind == "h2o":
        return H2OKVCache(window_size, window_size // 2 if recent is None else recent)
    if kind == "tova":
        return TOVAKVCache(window_size)
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
    raise ValueError(f"cache kind must be one of {CACHE_KINDS + ATTENTION_KINDS}; got {kind!r}")
