"""The one interface every cache implements.

A cache sits between the key/value projections and attention. Each decode
step (or prompt chunk) hands it the new tokens' keys and values and gets back
what those new queries attend over::

    k, v = cache.update(k_new, v_new)      # (batch, heads, tokens, head_dim) each
    mask = window_mask(q_positions, cache.positions, W)

Two counts are kept apart on purpose:

* ``seen``: tokens ever passed to ``update``. Rotary positions come from this.
* ``len(cache)``: tokens stored now, at most the cache's capacity.

A decoder that takes rotary positions from ``len`` instead of ``seen`` breaks
as soon as the window is full (``len`` stops growing, positions do not);
naming both keeps that bug out. Not to be confused with StreamingLLM (§3.2) and
Hugging Face's old ``SinkCache``, which re-rotated cached keys to positions
*within the cache* on purpose; that design had bugs of its own, reported in
transformers #33691 and #35350 (new keys kept their absolute rotation while
cached ones were shifted).

A cache is an inference structure: it stores values, not autograd history, so
``update`` detaches its inputs (a graph threaded through the cache would keep
every past step alive).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class KVCache(ABC):
    """Interface shared by :class:`SlidingWindowKVCache`, :class:`RingBufferKVCache`,
    :class:`SinkKVCache` and :class:`LRUKVCache`, so the decoder, the widgets and
    the lessons can swap one for another.

    Subclasses implement :meth:`update`, :meth:`reset` and the properties below.
    """

    # True when every key a one-token ``update`` returns is one that token may attend to under the
    # cache's own ``window_size`` and ``num_sinks`` (the convention of swkv_teach.masks), so its
    # attention needs no mask: the decoder then skips it (swkv_teach.model.needs_no_mask).
    # The ring, sinks and naive caches set it; tests/test_fast_path.py checks it at every step.
    one_token_in_window = False

    # A cache that evicts by attention (H2O, TOVA) sets this True; the decoder then
    # computes those layers' attention with an explicit softmax and hands the
    # probabilities to :meth:`observe`. Everything else keeps the fused SDPA path.
    wants_attention = False

    def observe(self, weights: torch.Tensor) -> None:
        """Attention ``(batch, q_heads, queries, keys)`` of the last update's queries over the keys it returned.

        Called only on caches whose ``wants_attention`` is True; the default ignores it.
        """

    @abstractmethod
    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add ``tokens`` new keys/values ``(batch, heads, tokens, head_dim)``.

        Returns the keys and values the new queries attend over, each
        ``(batch, heads, n, head_dim)``, in the order :attr:`positions` lists.
        A rejected update raises and leaves the cache exactly as it was.
        """

    @property
    @abstractmethod
    def positions(self) -> torch.Tensor:
        """1-D long tensor: the absolute position of each key the last ``update`` returned, in that order."""

    @property
    @abstractmethod
    def seen(self) -> int:
        """Tokens passed to ``update`` since construction or the last ``reset()``."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes held by the stored keys and values (both counted)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything, ready for a new sequence (shape, dtype and device may change)."""

    @abstractmethod
    def __len__(self) -> int:
        """Tokens stored now."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stored={len(self)}, seen={self.seen}, nbytes={self.nbytes})"
