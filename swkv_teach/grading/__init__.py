"""Graded exercises: the checks a notebook calls, and the list of exercises they grade.

Each ``check_*`` takes the learner's class or function, returns None and
prints one line starting with ✅ when it is right; otherwise it raises
:class:`ExerciseFailed` (an AssertionError) naming the first failing case,
expected vs got, and a hint. Expected answers always come from the library's
own caches, masks and decoder, never from a second copy.

``swkv-teach make-exercises`` (:mod:`.exercises`) writes ``exercises/`` from
``solutions/``; ``swkv-teach grade`` (:mod:`.grade`) grades submissions.
"""

from __future__ import annotations

from dataclasses import dataclass

from swkv_teach.grading._report import ExerciseFailed
from swkv_teach.grading.caches import check_ring_buffer_cache, check_sink_cache, check_sliding_window_cache
from swkv_teach.grading.chunk import check_chunk_mask
from swkv_teach.grading.decode import check_cached_decode
from swkv_teach.grading.h2o import check_h2o_keep
from swkv_teach.grading.hf_layer import check_hf_cache_layer
from swkv_teach.grading.int8 import check_int8_quantize
from swkv_teach.grading.lru import check_lru_cache
from swkv_teach.grading.masks import check_sliding_window_mask
from swkv_teach.grading.paged import check_paged_window
from swkv_teach.grading.prefix import check_prefix_cache_lru
from swkv_teach.grading.speculative import check_speculative_accept, check_speculative_decoding
from swkv_teach.grading.split_kv import check_paged_decode_kernel


@dataclass(frozen=True)
class Exercise:
    """One graded exercise: its number, notebook slug, check function, the learner's object it checks, points."""

    id: str
    slug: str
    check: str
    target: str
    points: int

    @property
    def call(self) -> str:
        """The check as a notebook line, e.g. ``check_lru_cache(LRUCache)``."""
        return f"{self.check}({self.target})"


# Numbered in the order the lessons reach them (lesson 0 links 01, lesson 1 links 02, ...).
EXERCISES = {
    e.id: e
    for e in (
        Exercise("01", "sliding_window_mask", "check_sliding_window_mask", "sliding_window_mask", 2),
        Exercise("02", "sliding_window_cache", "check_sliding_window_cache", "SlidingWindowKVCache", 2),
        Exercise("03", "ring_buffer", "check_ring_buffer_cache", "RingBufferKVCache", 3),
        Exercise("04", "chunk_mask", "check_chunk_mask", "chunk_mask", 2),
        Exercise("05", "cached_decode", "check_cached_decode", "decode_step", 3),
        Exercise("06", "lru_cache", "check_lru_cache", "LRUCache", 2),
        Exercise("07", "sink_cache", "check_sink_cache", "SinkCache", 3),
        Exercise("08", "paged_cache", "check_paged_window", "PagedWindow", 3),
        Exercise("09", "int8_kv", "check_int8_quantize", "quantize, dequantize", 2),
        Exercise("10", "h2o_eviction", "check_h2o_keep", "h2o_keep", 3),
        Exercise("11", "hf_cache_layer", "check_hf_cache_layer", "RingLayer, ring_cache", 3),
        Exercise("12", "paged_decode_kernel", "check_paged_decode_kernel", "attend_block, merge", 3),
        Exercise("13", "prefix_cache_lru", "check_prefix_cache_lru", "hash_block_tokens, block_hashes, PrefixCache", 3),
        Exercise("14", "speculative_verify", "check_speculative_decoding", "accept, speculative_caches, verify", 3),
    )
}

__all__ = [
    "EXERCISES",
    "Exercise",
    "ExerciseFailed",
    "check_cached_decode",
    "check_h2o_keep",
    "check_hf_cache_layer",
    "check_int8_quantize",
    "check_chunk_mask",
    "check_lru_cache",
    "check_paged_decode_kernel",
    "check_paged_window",
    "check_prefix_cache_lru",
    "check_ring_buffer_cache",
    "check_sink_cache",
    "check_sliding_window_cache",
    "check_sliding_window_mask",
    "check_speculative_accept",
    "check_speculative_decoding",
]
