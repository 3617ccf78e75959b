"""swkv_teach: a course on the sliding-window KV cache, and the library its lessons import.

Window convention (one rule, everywhere; details in :mod:`swkv_teach.masks`):
with window ``W`` the query at position ``i`` attends to keys ``i - W < j <= i``.
"""

from swkv_teach import kernels  # noqa: F401  first: without a GPU it sets TRITON_INTERPRET before triton loads
from swkv_teach.attention import attention, attention_with_cache, cached_attention, sliding_window_attention
from swkv_teach.caches import (
    CACHE_KINDS,
    H2OKVCache,
    BlockPool,
    Int8RingBufferKVCache,
    KVCache,
    LRUKVCache,
    PagedKVCache,
    RingBufferKVCache,
    SinkKVCache,
    SlidingWindowKVCache,
    TOVAKVCache,
    make_cache,
)
from swkv_teach.device import available_devices, device
from swkv_teach.masks import sliding_window_mask, window_mask
from swkv_teach.model import Decoder, DecoderConfig
from swkv_teach.pretrained import CharTokenizer, load_pretrained

__version__ = "0.1.0"

__all__ = [
    "BlockPool",
    "CACHE_KINDS",
    "CharTokenizer",
    "Decoder",
    "DecoderConfig",
    "H2OKVCache",
    "Int8RingBufferKVCache",
    "KVCache",
    "LRUKVCache",
    "PagedKVCache",
    "RingBufferKVCache",
    "SinkKVCache",
    "SlidingWindowKVCache",
    "TOVAKVCache",
    "attention",
    "attention_with_cache",
    "available_devices",
    "cached_attention",
    "device",
    "load_pretrained",
    "make_cache",
    "sliding_window_attention",
    "sliding_window_mask",
    "window_mask",
]
