"""transformers' own ``SyntheticCacheTest`` sliding-window cases, ported to the course's ring buffer.

Source: huggingface/transformers at commit 00b1f96ad09c1137cfe75e453c4b2bc1dd2abe1e,
``tests/utils/test_cache_utils.py``, class ``SyntheticCacheTest``: the sliding layers of
``test_sliding_window_cache``, ``test_hybrid_cache_sliding_mode``, ``test_hybrid_cache`` and
``test_hybrid_chunked_cache``. One head, ``head_dim`` 1, the key of each token its value, so a
cache's keys read as the tokens it holds; the literals below are upstream's.

How the two read: upstream asserts ``layer.keys`` (the layer's storage, chronological) and what
``update`` returned. The ring stores token ``p`` in slot ``p % W``, so its storage is in slot
order; :meth:`~swkv_teach.caches.RingBufferKVCache.ordered` is its chronological view, which must
equal upstream's storage literal. What ``update`` returned must equal upstream's as a chronological
list (sorted by the ring's ``positions``; for a chunk the ring returns them chronologically already).

Left out: ``test_sliding_window_cache``'s and ``test_hybrid_cache_sliding_mode``'s scenario 1. At
this commit they prefill ``[1, 2, 0, 0]`` at positions 0-3 and then write 3.0 at position 2 again:
rewriting a past position, which a cache of consecutive tokens has no way to express.

At this commit a sliding layer stores ``sliding_window`` tokens, as the ring does; later transformers
(``DynamicSlidingWindowLayer`` in 5.x, docs/references.md) keep ``W - 1`` between steps, the new
query bringing its own key, so their literals are one token shorter.
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach.caches import RingBufferKVCache


def tokens(*values):
    return torch.tensor(values, dtype=torch.float32)[None, None, :, None]  # (1, 1, T, 1), upstream's layout


class Ring:
    """The ring driven like upstream's layer: ``update`` returns the keys as a chronological list."""

    def __init__(self, window):
        self.cache = RingBufferKVCache(window)

    def update(self, *values):
        k, v = self.cache.update(tokens(*values), tokens(*values))
        assert torch.equal(k, v)
        order = torch.argsort(self.cache.positions)
        return k[0, 0, order, 0].tolist()

    @property
    def keys(self):
        return self.cache.ordered()[0][0, 0, :, 0].tolist()


@pytest.mark.parametrize("name", ["test_sliding_window_cache", "test_hybrid_cache_sliding_mode"])
def test_window_4_slides(name):
    """Scenario 2 (a full window, one more token), 3 (one more again, hybrid only) and the long prompt."""
    ring = Ring(4)  # upstream: window_size = max_cache_len = 4
    ring.update(1.0, 2.0, 3.0, 4.0)
    ring.update(5.0)
    assert ring.keys == [2.0, 3.0, 4.0, 5.0], f"{name} Scenario 2"
    if name == "test_hybrid_cache_sliding_mode":
        ring.update(6.0)
        assert ring.keys == [3.0, 4.0, 5.0, 6.0], f"{name} Scenario 3"
    long = Ring(4)
    returned = long.update(1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    assert long.keys == [3.0, 4.0, 5.0, 6.0], f"{name} long prompt: keeps the last window_size tokens"
    assert returned == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # a prompt's queries need every key (upstream: returned whole)


def test_hybrid_cache_sliding_layer():
    """``test_hybrid_cache``, layer 1 (sliding_window 2): a prompt longer than the window, then one token."""
    ring = Ring(2)
    assert ring.update(10.0, 20.0, 30.0) == [10.0, 20.0, 30.0], "Sliding layer did not return the correct value."
    assert ring.keys == [20.0, 30.0], "Initial sliding layer state is wrong"
    ring.update(50.0)
    assert ring.keys == [30.0, 50.0], "Sliding layer did not slide as expected."


def test_hybrid_chunked_cache_sliding_layer():
    """``test_hybrid_chunked_cache``, layer 1 (sliding_window 2): prefill, one token, then two tokens at once."""
    ring = Ring(2)
    assert ring.update(10.0, 20.0, 30.0) == [10.0, 20.0, 30.0]
    assert ring.keys == [20.0, 30.0]
    assert ring.update(50.0) == [30.0, 50.0]
    assert ring.keys == [30.0, 50.0]
    assert ring.update(60.0, 70.0) == [50.0, 60.0, 70.0]  # the stored keys the chunk's first query sees, then it
    assert ring.keys == [60.0, 70.0]


def test_slot_order_is_the_only_difference():
    """What the ring holds differs from upstream's literal only by rotation: after 5 tokens in a window of 4,
    slots hold [5, 2, 3, 4] (token p in slot p % 4), which ``ordered()`` turns into upstream's [2, 3, 4, 5]."""
    ring = Ring(4)
    ring.update(1.0, 2.0, 3.0, 4.0)
    ring.update(5.0)
    assert ring.cache.k_buf[0, 0, :, 0].tolist() == [5.0, 2.0, 3.0, 4.0]
    assert ring.keys == [2.0, 3.0, 4.0, 5.0]
