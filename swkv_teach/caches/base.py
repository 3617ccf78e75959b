"""The one interface every cache implements.

A cache sits between the key/value projections and attention. Each decode
step (or prompt chunk) hands it the new tokens' keys and values and gets back
what those new queries attend over::

    k, v = cache.update(k_new, v_new)      # (batch, heads, tokens, head_dim) each
    mask = window_mask(q_positions, cache.positions, W)

Two counts are kept apart on purpose:

* ``seen``: tokens ever passed to ``update``. Rotary positions come from this.
* ``len(cache)``: tokens stored now, at most the cache's capacity.

Besides the hot path every cache has the service verbs: ``stats()`` (counts for
monitoring), ``state_dict()`` and ``load_state_dict(sd)`` (persistence with
PyTorch's conventions; the shared checks are in :mod:`swkv_teach.caches._state`).
A cache that can take its last tokens back (the ring, and sinks, built with ``lookahead``
slots for speculative decoding) adds ``rollback(r)`` and ``rollback_limit``
(:mod:`swkv_teach.caches.ring`, :mod:`swkv_teach.speculative`).

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

from swkv_teach.caches import _state


class KVCache(ABC):
    """Interface shared by :class:`SlidingWindowKVCache`, :class:`RingBufferKVCache`,
    :class:`SinkKVCache` and :class:`LRUKVCache`, so the decoder, the widgets and
    the lessons can swap one for another.

    Subclasses implement :meth:`update`, :meth:`reset` and the properties below;
    for persistence, the hooks ``_config``, ``_state_layout``, ``_state``, ``_check_state``
    and ``_load_state`` (the checks they share live in :mod:`swkv_teach.caches._state`).
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

    # ------------------------------------------------ telemetry and persistence
    def stats(self) -> dict:
        """Integer counts for monitoring: ``tokens_seen``, ``tokens_stored`` (``len``), ``tokens_evicted``, ``bytes_held``.

        ``tokens_evicted`` is ``seen - stored`` for every cache that stores only tokens
        passed to ``update`` (all but the LRU cache's ``put``). A policy adds its own
        counts (:meth:`_stats_extra`): a paged cache its blocks, LRU its hits and misses.
        """
        seen, stored = self.seen, len(self)
        return {"tokens_seen": seen, "tokens_stored": stored, "tokens_evicted": seen - stored,
                "bytes_held": self.nbytes, **self._stats_extra()}

    def state_dict(self) -> dict:
        """Everything that decides the cache's future outputs, as plain tensors and Python values.

        ``torch.save`` writes it, ``torch.load(path, weights_only=True)`` reads it, and
        :meth:`load_state_dict` into a cache built with the same settings continues bit
        for bit. The tensors are copies (unlike ``nn.Module.state_dict``, whose tensors
        are the parameters themselves): a state taken now does not change as the cache
        goes on. Layout of the dict: :mod:`swkv_teach.caches._state`.
        """
        state = {"kind": type(self).__name__, **self._config(), "layout": self._state_layout(), **self._state()}
        return {k: v for k, v in state.items() if k not in self._optional or v != self._optional[k]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Become the cache that produced ``state_dict``; its tensors are copied in.

        Raises ``ValueError`` naming what differs (kind, settings, keys, shapes, a
        layout other than the one held; a fresh or reset cache takes the state's) and
        ``PoolExhausted`` when a paged cache's pool lacks the blocks, changing nothing.
        A cache holding a layout keeps its device; a fresh one takes the state's tensors'
        device (``torch.load(path, map_location=device, weights_only=True)`` chooses it).
        """
        _state.check_one(self, state_dict)
        _state.check_room([(self, state_dict)])
        self._load_state(state_dict)

    def _stats_extra(self) -> dict:
        """A policy's own counts for :meth:`stats` (none by default)."""
        return {}

    # what a subclass says about its state (see caches/_state.py)
    _state_keys: tuple[str, ...] = ()  # keys of _state(), checked strictly on load
    _optional: dict = {}  # entries left out of a state at their default (value); see caches/_state.py

    def _config(self) -> dict:
        """Constructor settings a state must match exactly (window, sinks, budget...)."""
        return {}

    def _state_layout(self) -> list | None:
        """``[batch, heads, head_dim, dtype]`` held now, None while empty."""
        return None

    def _state(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} has no state_dict() yet")

    def _check_state(self, state_dict: dict) -> None:
        """Class-specific checks of a state whose header already passed; raise ValueError, change nothing."""

    def _load_state(self, state_dict: dict) -> None:
        """Apply a state that passed every check."""
        raise NotImplementedError(f"{type(self).__name__} has no load_state_dict() yet")

    def _blocks_claim(self, state_dict: dict):
        """``(pool, blocks needed, blocks held now)`` for caches on a block pool; None for the others."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(stored={len(self)}, seen={self.seen}, nbytes={self.nbytes})"
