"""TOVA (Oren et al. 2024, EMNLP, "Transformers are Multi-State RNNs"): drop the token the newest query attends to least.

Policy: once the cache holds ``budget`` tokens and a new one arrives, evict the
stored token with the lowest attention weight from the most recent query,
averaged over heads. No recent window, no sinks, no history: only the newest
query's attention counts. The published cache (schwartz-lab-NLP/TOVA at commit
9c7d09b, ``src/tova_cache.py``, ``TOVACache.reduce``, lines 31-51) averages the last
query row over heads (line 44: ``torch.mean(attn_weights[:, :, -1, :], dim=1)``)
and keeps the top ``cache_size`` per batch row (``torch.topk`` line 45); the
model calls ``reduce`` right after attention
(``src/convert_models/mistral_custom.py`` lines 90-91).

How this one differs, and why:

* **One decision for all heads and all batch rows.** The head average is the
  released code's rule (whether the paper also evaluates a per-head variant we
  could not re-read from here); the batch average is ours, because this cache
  keeps one set of positions (a batch of one, as the lessons use, decides exactly
  as the released cache does).
* **Evict before writing, not after attending** (see
  :mod:`swkv_teach.caches.scored`): a query attends over ``budget`` keys and
  ``budget`` are stored, the memory of a ring buffer of that size. With one token
  per step, ``TOVAKVCache(B)`` keeps exactly what ``TOVACache(B - 1)`` keeps.
* Ties go to the oldest token, so attention that says nothing degrades to a
  sliding window.

The chunk rule: a chunk is scored by its *last* query row (the newest query),
as ``reduce`` does with ``attn_weights[:, :, -1, :]``.

Example, ``budget = 3``, one token per step, the newest query's head-averaged
weights shown over the stored positions::

    stored [0, 1, 2]   weights [0.6, 0.1, 0.3]   token 3 arrives: evict 1 (0.1)
    stored [0, 3, 2]   (slot order: 3 took 1's slot)
"""

from __future__ import annotations

import torch

from swkv_teach.caches.scored import ScoredKVCache, eviction_order, head_average

__all__ = ["TOVAKVCache", "tova_keep"]


def tova_keep(weights: torch.Tensor, positions: torch.Tensor, budget: int) -> torch.Tensor:
    """TOVA's eviction step, the library's oracle for it: which positions stay.

    Args:
        weights: ``(batch, q_heads, queries, keys)`` attention probabilities of the
            last queries over the keys at ``positions``.
        positions: ``(keys,)`` absolute positions of those keys, any order.
        budget: how many may stay.
    Returns:
        The kept positions, ascending: all of them when ``keys <= budget``; else the
        ``budget`` with the largest head-averaged weight from the newest (last)
        query, the oldest evicted first among ties.
    """
    newest = head_average(weights)[-1]  # (keys,)
    drop = eviction_order(newest, positions)[: max(0, len(positions) - budget)]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[drop] = False
    return torch.sort(positions[keep]).values


class TOVAKVCache(ScoredKVCache):
    """At most ``budget`` tokens; a new token replaces the one the newest query attended to least.

    Shares :class:`~swkv_teach.caches.scored.ScoredKVCache`'s interface:
    ``update``, ``observe(weights)``, ``positions``, ``seen``, ``nbytes``,
    ``reset``, ``len``, plus ``stored_positions()`` and ``scores()``.
    """

    def _rescore(self, scores: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w[-1].clone()  # only the newest query counts; the old scores are forgotten

    def __repr__(self) -> str:
        return f"TOVAKVCache(budget={self.budget}, stored={len(self)}, seen={self.seen})"
