"""H2O (Zhang et al. 2023, NeurIPS, "Heavy-Hitter Oracle"): keep a recent window plus the heavy hitters.

Policy: keep the ``recent`` newest tokens, and for the other ``budget - recent``
slots the older tokens with the largest *accumulated* attention: every query
the cache is shown adds the attention it paid to each stored key (summed over
queries), so a token that many queries used ("heavy hitter") survives long
after it left the recent window. A token's score starts when it enters the
cache and is dropped with it.

The published cache (FMInference/H2O at commit ac75c2a, ``h2o_hf/utils_real_drop/modify_llama.py``,
class ``H2OKVCache_LayerWise``, lines 242-329): ``_update_hh_score`` (lines
317-326) sums the attention over batch and queries (``.sum(0).sum(1)``) and
adds the old scores; ``__call__`` (lines 258-287) keeps the top ``hh_size`` of
the tokens before the recent window plus the last ``recent_size``; the model
calls it right after attention (line 509). ``evict_for_space`` (lines 289-315)
is the evict-before-write variant used for streaming.

How this one differs, and why:

* **One score for all heads and all batch rows** (attention averaged over query
  heads and batch): the published cache keeps a score and a top-k *per head*
  (the ``(num_heads, keys)`` ``hh_score`` and the per-row ``topk``). This cache
  keeps one set of positions for its heads (see :mod:`swkv_teach.caches.scored`);
  a mean instead of a sum over heads ranks tokens the same.
* **Evict before writing** (as ``evict_for_space``): a query attends over
  ``budget`` keys, ``budget`` are stored. ``H2OKVCache(B, r)`` is the published
  ``hh_size = B - r``, ``recent_size = r`` with ``evict_for_space`` before each token.
* Ties go to the oldest token.

``recent = budget`` is a sliding window of ``budget``; ``recent = 0`` keeps
heavy hitters only (the newest token must still earn its place: it is scored
by its own query before the next eviction).

Example, ``budget = 4, recent = 2``, accumulated scores shown::

    stored [0, 1, 2, 3]  scores [2.1, 0.3, 0.4, 0.2]  token 4 arrives:
      recent after it = {3, 4}: 3 is protected; evict the lowest of {0, 1, 2} -> 1
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_nonnegative_int
from swkv_teach.caches.scored import ScoredKVCache, eviction_order, head_average

__all__ = ["H2OKVCache", "h2o_keep"]


def h2o_keep(
    scores: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor, budget: int, recent: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """H2O's accumulate-and-evict step, the library's oracle for it.

    Args:
        scores: ``(keys,)`` accumulated scores of the keys so far (0 for tokens new in this step).
        weights: ``(batch, q_heads, queries, keys)`` attention of this step's queries over the keys.
        positions: ``(keys,)`` absolute positions of the keys, any order; the newest is ``positions.max()``.
        budget, recent: at most ``budget`` stay, always including the ``recent`` newest.
    Returns:
        ``(kept_positions, kept_scores)``, ascending by position; the scores are the
        accumulated ones (old + head-averaged attention summed over this step's queries).
    """
    total = scores.float() + head_average(weights).sum(dim=0)
    newest = int(positions.max()) if len(positions) else -1
    protected = positions > newest - recent
    drop = eviction_order(total, positions, protected)[: max(0, len(positions) - budget)]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[drop] = False
    order = torch.argsort(positions[keep])
    return positions[keep][order], total[keep][order]


class H2OKVCache(ScoredKVCache):
    """At most ``budget`` tokens: the ``recent`` newest plus the heaviest hitters by accumulated attention.

    Shares :class:`~swkv_teach.caches.scored.ScoredKVCache`'s interface:
    ``update``, ``observe(weights)``, ``positions``, ``seen``, ``nbytes``,
    ``reset``, ``len``, plus ``stored_positions()`` and ``scores()``.
    """

    def __init__(self, budget: int, recent: int):
        check_nonnegative_int("recent", recent)
        super().__init__(budget)
        if recent > budget:
            raise ValueError(f"recent must be <= budget (it is part of it); got recent={recent}, budget={budget}")
        self.recent = recent

    def _rescore(self, scores: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return scores + w.sum(dim=0)  # every query shown adds what it paid each key

    def _protected(self, positions: torch.Tensor, seen: int) -> torch.Tensor:
        return positions >= seen - self.recent

    def _config(self) -> dict:
        return {**super()._config(), "recent": self.recent}  # a state's scores meant this recent window

    def __repr__(self) -> str:
        return f"H2OKVCache(budget={self.budget}, recent={self.recent}, stored={len(self)}, seen={self.seen})"
