"""KV caches behind one interface (:class:`KVCache`): pick one by name with :func:`make_cache`.

=============  ==========================  =====================================================
name           class                       policy
=============  ==========================  =====================================================
``"naive"``    :class:`SlidingWindowKVCache`  the problem statement's cat-and-slice (also ``"sliding"``)
``"ring"``     :class:`RingBufferKVCache`     same tokens, O(1) per step, slot order
``"sinks"``    :class:`SinkKVCache`           first ``num_sinks`` forever + last ``window_size``
``"lru"``      :class:`LRUKVCache`            least recently *used* evicted (not the window's rule)
=============  ==========================  =====================================================

Evicting by attention (built directly, not by name: they need ``observe``):
:class:`H2OKVCache` (recent window + heavy hitters) and :class:`TOVAKVCache`
(drop what the newest query attends to least), both on :class:`ScoredKVCache`.
"""

from swkv_teach.caches.base import KVCache
from swkv_teach.caches.h2o import H2OKVCache
from swkv_teach.caches.lru import LRUKVCache
from swkv_teach.caches.ring import RingBufferKVCache
from swkv_teach.caches.scored import ScoredKVCache
from swkv_teach.caches.sinks import SinkKVCache
from swkv_teach.caches.sliding import SlidingWindowKVCache
from swkv_teach.caches.tova import TOVAKVCache

CACHE_KINDS = ("naive", "sliding", "ring", "sinks", "lru")

__all__ = [
    "CACHE_KINDS",
    "H2OKVCache",
    "KVCache",
    "LRUKVCache",
    "RingBufferKVCache",
    "ScoredKVCache",
    "SinkKVCache",
    "SlidingWindowKVCache",
    "TOVAKVCache",
    "make_cache",
]


def make_cache(kind: str, window_size: int, num_sinks: int = 4) -> KVCache:
    """A fresh cache of ``kind`` (one of :data:`CACHE_KINDS`) holding ``window_size`` recent tokens.

    ``num_sinks`` is used by ``"sinks"`` only.
    """
    if kind in ("naive", "sliding"):
        return SlidingWindowKVCache(window_size)
    if kind == "ring":
        return RingBufferKVCache(window_size)
    if kind == "sinks":
        return SinkKVCache(num_sinks, window_size)
    if kind == "lru":
        return LRUKVCache(window_size)
    raise ValueError(f"cache kind must be one of {CACHE_KINDS}; got {kind!r}")
