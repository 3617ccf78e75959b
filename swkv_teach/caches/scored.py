"""What H2O and TOVA share: ``budget`` slots, a score per stored token, evict the lowest.

A sliding window evicts by *age*. The caches built on :class:`ScoredKVCache`
evict by *use*, measured with attention: after each :meth:`~ScoredKVCache.update`
the decoder hands the cache the attention probabilities of the new queries over
the keys that update returned, through :meth:`~ScoredKVCache.observe`; the
policy turns them into one score per stored token (TOVA: the newest query's
weight; H2O: the sum over every query so far), and the next update that needs
room evicts the lowest score.

One decision for all heads, and for the whole batch
----------------------------------------------------
The cache keeps one set of :attr:`positions` for its key/value heads, as every
cache here does, so a token is stored or evicted for all heads and all batch
rows at once. Its score is the attention it received **averaged over all query
heads and batch rows** (with grouped-query attention ``q_heads`` is a multiple
of the cache's key/value heads; averaging over query heads covers every group).
The published code differs: TOVA's ``TOVACache.reduce`` averages over heads but
decides per batch row (schwartz-lab-NLP/TOVA at 9c7d09b, ``src/tova_cache.py``
lines 44-47), and H2O's ``H2OKVCache_LayerWise`` sums over batch and queries but
keeps a score and a top-k *per head* (FMInference/H2O at ac75c2a,
``h2o_hf/utils_real_drop/modify_llama.py`` lines 271-285 and 317-326).

When eviction happens (equal memory with the ring buffer)
---------------------------------------------------------
A ring buffer of ``W`` slots writes the new token over the oldest *before*
attention, so every query attends over at most ``W`` keys and ``W`` are stored.
Here too: :meth:`update` evicts as many stored tokens as the new chunk needs
slots, using the scores of the last :meth:`observe`, writes the chunk into the
freed slots and returns the ``budget`` stored keys. So one query attends over
``budget`` keys and ``budget`` are stored, the same memory as a ring of that
size. The published caches attend first and evict after (the new token is
added, attention runs over ``budget + 1`` keys, then the lowest goes); H2O's
repository also has this evict-before-write order, ``evict_for_space`` (same
file, lines 289-315), used by ``h2o_hf/run_streaming.py``. With one token per
step, ``TOVAKVCache(B)`` here makes exactly the choices of the published
``TOVACache(B - 1)``.

A chunk longer than the budget (a long prompt) cannot fit even after evicting
everything, so :meth:`update` then returns every stored key plus the whole
chunk, and :meth:`observe` brings the cache back to ``budget`` with the chunk's
own attention (as the published caches do for a prompt). Until that
``observe``, the cache refuses another update.

Ties: among equal scores the *oldest* position goes first, so a cache whose
attention says nothing (all zeros) degrades to a sliding window.

Slots: tokens live in a preallocated ``(batch, heads, budget, head_dim)``
buffer in *slot* order (a new token takes the slot of the one it replaced, as
in :class:`~swkv_teach.caches.ring.RingBufferKVCache`); :attr:`positions` says
which absolute position each returned key holds. Window convention:
:mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_kv, check_positive_int
from swkv_teach.caches import _state
from swkv_teach.caches.base import KVCache

__all__ = ["ScoredKVCache", "eviction_order", "head_average"]


def head_average(weights: torch.Tensor) -> torch.Tensor:
    """Attention ``(batch, q_heads, queries, keys)`` -> ``(queries, keys)`` float32, averaged over batch and heads.

    The one score every head shares (see the module docstring).
    """
    return weights.detach().float().mean(dim=(0, 1))


def eviction_order(scores: torch.Tensor, positions: torch.Tensor, protected: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the evictable tokens, first to evict first: lowest score, ties oldest position first.

    Args:
        scores: ``(n,)`` one score per token.
        positions: ``(n,)`` their absolute positions (any order).
        protected: optional ``(n,)`` bool, True for tokens that may not be evicted (H2O's recent window).
    Returns:
        1-D long tensor of indices into ``scores``, protected ones left out.
    """
    order = torch.argsort(positions)  # oldest first ...
    order = order[torch.argsort(scores[order], stable=True)]  # ... then by score, keeping age among ties
    if protected is not None:
        order = order[~protected[order]]
    return order


class ScoredKVCache(KVCache):
    """``budget`` slots; evict the stored token with the lowest score when a new one needs room.

    Subclasses say how attention becomes a score (:meth:`_rescore`) and which
    tokens may not be evicted (:meth:`_protected`). See the module docstring
    for when eviction happens and how a chunk longer than the budget is handled.
    """

    wants_attention = True  # the decoder passes attention weights to observe()

    def __init__(self, budget: int):
        self.budget = check_positive_int("budget", budget)
        self.reset()

    # ------------------------------------------------------------ policy hooks
    def _rescore(self, scores: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """New scores ``(keys,)`` from the old ``(keys,)`` (0 for new tokens) and ``w`` ``(queries, keys)``."""
        raise NotImplementedError

    def _protected(self, positions: torch.Tensor, seen: int) -> torch.Tensor | None:
        """Bool ``(n,)``: tokens that may not be evicted once ``seen`` tokens have arrived (None: none)."""
        return None

    # ------------------------------------------------------------ update
    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``(batch, heads, tokens, head_dim)`` new keys/values; return ``(k, v)`` to attend over.

        Evicts the lowest-scored stored tokens to make room (scores from the
        last :meth:`observe`); returns the stored keys in slot order, or, for a
        chunk longer than ``budget``, the stored keys followed by the whole chunk.
        """
        if self._pending is not None:
            raise RuntimeError(
                f"{type(self).__name__}: the last update returned {self._pending[0].shape[2]} keys, more than "
                f"budget={self.budget}; call observe(weights) with their attention before the next update"
            )
        check_kv(k_new, v_new, self.k_buf)
        k_new, v_new = k_new.detach(), v_new.detach()  # values, not autograd history (see base.py)
        if self.k_buf is None:
            self._allocate(k_new)
        n, c, B = self._n, k_new.shape[2], self.budget
        new_pos = torch.arange(self._seen, self._seen + c, device=self.k_buf.device)
        self._seen += c
        self._expect = c

        if c > B:  # even an empty cache cannot hold this chunk: observe() will choose
            k = torch.cat([self.k_buf[:, :, :n], k_new], dim=2)
            v = torch.cat([self.v_buf[:, :, :n], v_new], dim=2)
            self._positions = torch.cat([self.pos_buf[:n], new_pos])
            self._pending = (k, v, torch.cat([self.score_buf[:n], self.score_buf.new_zeros(c)]))
            return k, v

        free = B - n
        slots = torch.arange(n, n + min(c, free), device=self.k_buf.device)
        if c > free:
            held = self.pos_buf[:n]
            victims = eviction_order(self.score_buf[:n], held, self._protected(held, self._seen))[: c - free]
            slots = torch.cat([torch.sort(victims).values, slots])
            self.evictions += len(victims)
        self.k_buf.index_copy_(2, slots, k_new)
        self.v_buf.index_copy_(2, slots, v_new)
        self.pos_buf[slots] = new_pos
        self.score_buf[slots] = 0.0
        self._n = n = min(B, n + c)
        self._positions = self.pos_buf[:n].clone()  # a snapshot: the buffer changes at the next update
        return self.k_buf[:, :, :n], self.v_buf[:, :, :n]

    def _allocate(self, like: torch.Tensor) -> None:
        B, H, _, D = like.shape
        self.k_buf = torch.zeros(B, H, self.budget, D, dtype=like.dtype, device=like.device)
        self.v_buf = torch.zeros_like(self.k_buf)
        self.pos_buf = torch.full((self.budget,), -1, dtype=torch.long, device=like.device)
        self.score_buf = torch.zeros(self.budget, dtype=torch.float32, device=like.device)

    # ------------------------------------------------------------ observe
    def observe(self, weights: torch.Tensor) -> None:
        """Take the attention of the last update's queries: ``(batch, q_heads, queries, keys)``.

        ``keys`` are the keys that update returned, in its order
        (:attr:`positions`); ``q_heads`` a multiple of the cache's heads. Called
        once per update. After an update longer than ``budget``, this is where
        the cache comes back within budget.
        """
        self._check_weights(weights)
        w = head_average(weights)  # (queries, keys)
        self._expect = None
        if self._pending is None:
            n = self._n
            self.score_buf[:n] = self._rescore(self.score_buf[:n], w)
            return
        k, v, scores = self._pending
        self._pending = None
        positions = self._positions
        scores = self._rescore(scores, w)
        drop = eviction_order(scores, positions, self._protected(positions, self._seen))[: len(positions) - self.budget]
        keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
        keep[drop] = False
        self.evictions += len(drop)
        keep = torch.nonzero(keep).flatten()  # in the order returned (slot order, then the chunk), which pos_buf follows too
        B = self.budget
        self.k_buf[:, :, :B] = k.index_select(2, keep)
        self.v_buf[:, :, :B] = v.index_select(2, keep)
        self.pos_buf[:B] = positions[keep]
        self.score_buf[:B] = scores[keep]
        self._n = B

    def _check_weights(self, weights) -> None:
        name = f"{type(self).__name__}.observe"
        if self._expect is None:
            raise RuntimeError(f"{name}: no update to observe; call update() first, then observe() once with its attention")
        if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
            got = weights.dtype if isinstance(weights, torch.Tensor) else type(weights).__name__
            raise TypeError(f"{name}: weights must be a floating-point tensor (batch, q_heads, queries, keys); got {got}")
        batch, heads = self.k_buf.shape[:2]
        want = (batch, None, self._expect, len(self._positions))
        shape = tuple(weights.shape)
        if (
            weights.dim() != 4
            or shape[0] != batch
            or shape[1] < 1
            or shape[1] % heads
            or shape[2] != want[2]
            or shape[3] != want[3]
        ):
            raise ValueError(
                f"{name}: weights must be (batch={batch}, q_heads=a multiple of {heads}, queries={want[2]}, "
                f"keys={want[3]}): the last update's queries over the keys it returned; got shape {shape}"
            )

    # ------------------------------------------------------------ interface
    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last ``update`` returned, in the order returned."""
        return self._positions

    @property
    def seen(self) -> int:
        return self._seen

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated key/value buffers, ``2 * B * H * budget * D * itemsize`` (flat)."""
        if self.k_buf is None:
            return 0
        return 2 * self.k_buf.numel() * self.k_buf.element_size()

    def stored_positions(self) -> torch.Tensor:
        """Absolute positions of the stored tokens, chronologically (for display and tests)."""
        return torch.sort(self.pos_buf[: self._n]).values

    def scores(self) -> torch.Tensor:
        """``(len(self),)`` the stored tokens' scores, in the order of :meth:`stored_positions`."""
        order = torch.argsort(self.pos_buf[: self._n])
        return self.score_buf[: self._n][order].clone()

    def reset(self) -> None:
        self.k_buf = self.v_buf = None
        self.pos_buf = torch.zeros(0, dtype=torch.long)
        self.score_buf = torch.zeros(0)
        self._positions = torch.zeros(0, dtype=torch.long)
        self._n = self._seen = 0
        self._expect = None  # queries the next observe() must cover
        self._pending = None  # (k, v, scores) of an update longer than the budget
        self.evictions = 0  # tokens evicted by score since the last reset

    def __len__(self) -> int:
        return self._n if self._pending is None else len(self._positions)

    # ------------------------------------------------ telemetry and persistence (caches/_state.py)
    def _stats_extra(self) -> dict:
        """``evictions`` (counted as tokens are chosen to go) and ``kept_beyond_window``: stored
        tokens a sliding window of ``budget`` would already have dropped (the policy's keepers)."""
        old = int((self.pos_buf[: self._n] < self._seen - self.budget).sum()) if self._n else 0
        return {"evictions": self.evictions, "kept_beyond_window": old}

    # the buffers in slot order with each slot's position and score: the scores decide the next eviction
    _state_keys = ("seen", "n", "k", "v", "pos", "scores", "positions", "expect", "evictions")

    def _config(self) -> dict:
        return {"budget": self.budget}

    def _state_layout(self) -> list | None:
        return _state.layout(self.k_buf)

    def _state(self) -> dict:
        if self._pending is not None:
            raise RuntimeError(
                f"{type(self).__name__}: the last update returned more than budget={self.budget} keys and waits for "
                "observe(weights) to choose which stay; call it before state_dict()"
            )
        return {"seen": self._seen, "n": self._n, "k": _state.copy(self.k_buf), "v": _state.copy(self.v_buf),
                "pos": _state.copy(self.pos_buf) if self.k_buf is not None else None,
                "scores": _state.copy(self.score_buf) if self.k_buf is not None else None,
                "positions": _state.copy(self._positions), "expect": self._expect, "evictions": self.evictions}

    def _check_state(self, sd: dict) -> None:
        name, seen, B = type(self).__name__, sd["seen"], self.budget
        n = _state.expect_int(name, "n", sd["n"], 0, min(seen, B))
        _state.expect_int(name, "evictions", sd["evictions"])
        if sd["expect"] is not None:
            _state.expect_int(name, "expect", sd["expect"], 1, B)
        if sd["layout"] is None:
            if seen or any(sd[key] is not None for key in ("k", "v", "pos", "scores")):
                raise ValueError(f"{name}: a state without a layout has seen=0 and no buffers; got seen={seen}")
            return
        bs, hs, ds, dt = sd["layout"]
        for key in ("k", "v"):
            _state.expect_tensor(name, key, sd[key], (bs, hs, B, ds), _state.dtype_from_name(dt))
        _state.expect_tensor(name, "pos", sd["pos"], (B,), torch.long)
        _state.expect_tensor(name, "scores", sd["scores"], (B,), torch.float32)
        if n != min(seen, B):
            raise ValueError(f"{name}: a state after seen={seen} tokens stores min(seen, budget)={min(seen, B)}; got n={n}")

    def _load_state(self, sd: dict) -> None:
        device = self.k_buf.device if self.k_buf is not None else None
        self.reset()
        if sd["k"] is not None:
            self.k_buf, self.v_buf = _state.copy(sd["k"], device), _state.copy(sd["v"], device)
            self.pos_buf, self.score_buf = _state.copy(sd["pos"], self.k_buf.device), _state.copy(sd["scores"], self.k_buf.device)
        self._n, self._seen, self._expect, self.evictions = sd["n"], sd["seen"], sd["expect"], sd["evictions"]
        self._positions = _state.copy(sd["positions"], device)
