"""Attention sinks (StreamingLLM, Xiao et al. 2023): keep the first few tokens forever.

Models put a surprising share of attention on the very first tokens whatever
they say, as a place to park probability mass. Evicting them makes a plain
sliding-window cache degrade once the first window slides past; keeping
``num_sinks`` of them (4 in the paper) plus the last ``window_size`` fixes it.

Layout: a :class:`~swkv_teach.caches.ring.RingBufferKVCache` with
``num_sinks`` slots pinned in front::

    num_sinks = 2, window_size = 3, after 7 tokens:
    slots     [ 0 ,  1 | 2 ,  3 ,  4 ]
    position  [ p0,  p1| p5,  p6,  p4]    window slot 2 + (p - 2) % 3

Keys before or after RoPE? This package caches keys *after* rotary
embedding, each rotated by its true absolute position (taken from ``seen``),
and :attr:`positions` reports those true positions, so
``window_mask(q, positions, W, num_sinks)`` is the exact rule
``j < S or i - W < j``. StreamingLLM instead caches keys *before* RoPE and
re-rotates them with positions *within the cache* (0 .. S + W - 1), so the
model never sees a distance longer than it was trained on; that changes the
model's outputs and needs a cache that can re-rotate. Here a sink's key keeps
its original rotation: the query at position 10 000 sees it at distance
10 000, which is what sliding-window attention with sinks computes.

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

from swkv_teach._validate import check_positive_int
from swkv_teach.caches.ring import RingBufferKVCache


class SinkKVCache(RingBufferKVCache):
    """The first ``num_sinks`` tokens forever, plus the last ``window_size``.

    Same interface as the ring buffer: ``update`` returns filled slots in slot
    order for one token (sinks first), ``positions`` their absolute positions,
    ``ordered()`` a chronological copy, ``seen`` tokens seen; ``lookahead`` and
    ``rollback`` as the ring's (sinks are never overwritten, so never lost to a rollback).
    """

    def __init__(self, num_sinks: int, window_size: int, lookahead: int = 0):
        self.num_sinks = check_positive_int("num_sinks", num_sinks)
        super().__init__(window_size, lookahead)
