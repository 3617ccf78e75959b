"""The slips a learner makes in exercise 10 (``h2o_keep``), each written as the answer it gives.

:func:`swkv_teach.grading.h2o.check_h2o_keep` runs them on the case an answer
failed and names the slip whose answer the learner's matches. Each is the
library's recipe (:func:`~swkv_teach.caches.scored.eviction_order`,
:func:`~swkv_teach.caches.scored.head_average`) with one thing changed.
"""

from __future__ import annotations

import torch

from swkv_teach.caches.scored import eviction_order, head_average

__all__ = ["SLIPS", "TIES_HINT", "avg", "keep_after", "recent_mask", "slot_order_on_ties"]


def keep_after(total, positions, budget, protected, order_fn=eviction_order, n_drop=None):
    """(kept positions, their totals) ascending, after dropping the first ``n_drop`` of ``order_fn``'s order."""
    drop = order_fn(total, positions, protected)[: max(0, len(positions) - budget) if n_drop is None else n_drop]
    keep = torch.ones(len(positions), dtype=torch.bool)
    keep[drop] = False
    order = torch.argsort(positions[keep])
    return positions[keep][order], total[keep][order]


def recent_mask(positions, recent):
    """Bool ``(keys,)``: the ``recent`` newest positions (any slot order)."""
    return positions > int(positions.max()) - recent


def _most_first(scores, positions, protected):
    order = eviction_order(-scores, positions, protected)
    return order


def slot_order_on_ties(scores, positions, protected):
    order = torch.argsort(scores, stable=True)  # ties left in slot order, which is not age order
    return order[~protected[order]]


def _newest_first_on_ties(scores, positions, protected):
    order = torch.argsort(-positions)
    order = order[torch.argsort(scores[order], stable=True)]
    return order[~protected[order]]


def _heavy_then_recent(total, positions, budget, recent):
    if len(positions) <= budget:
        return keep_after(total, positions, budget, None)
    heavy = eviction_order(-total, -positions)[: budget - recent]  # largest totals, newest first on ties
    keep = torch.zeros(len(positions), dtype=torch.bool)
    keep[heavy] = True
    keep |= recent_mask(positions, recent)
    order = torch.argsort(positions[keep])
    return positions[keep][order], total[keep][order]


def _old_scores_returned(scores, weights, positions, budget, recent):
    kept, _ = keep_after(scores + avg(weights).sum(0), positions, budget, recent_mask(positions, recent))
    old = dict(zip(positions.tolist(), scores.float().tolist()))
    return kept, torch.tensor([old[p] for p in kept.tolist()])


def _as_indices(total, positions, budget, recent):
    kept, sc = keep_after(total, positions, budget, recent_mask(positions, recent))
    index = {p: i for i, p in enumerate(positions.tolist())}
    return torch.tensor([index[p] for p in kept.tolist()], dtype=torch.long), sc


def _mixed_key(scores, positions, protected):
    order = torch.argsort(scores.double() * 1000 + positions.double() * 1e-3, stable=True)
    return order[~protected[order]]


def _eps_key(scores, positions, protected):
    order = torch.argsort(scores.double() + 1e-7 * positions.double(), stable=True)
    return order[~protected[order]]


def _last_k(total, positions, budget, recent):
    """Keep the k = budget - (recent kept) best candidates with ``cands[-k:]``: with k = 0 that is every one."""
    protected = recent_mask(positions, recent)
    if len(positions) > budget and budget - int(protected.sum()) == 0:
        return keep_after(total, positions, budget, protected, n_drop=0)
    return keep_after(total, positions, budget, protected)


def _in_weights_dtype(s, w):
    """The total computed in the weights' own dtype (bfloat16/float16), then widened."""
    return (s.to(w.dtype) + w.mean(dim=(0, 1)).sum(0)).float()


def avg(w):  # the right average, for the slips that change something else
    return head_average(w)


TIES_HINT = ("ties must be broken by age (position), not by slot: the keys come in slot order (a new token takes "
             "the slot of the one it replaced), so a key's index says nothing about its age, and argsort(total), "
             "stable or not, or topk leave ties in slot order. Sort by position first, then stable-sort by score "
             "(or sort by the pair (score, position)).")

SLIPS = [  # (name, hint, answer(scores, weights, positions, budget, recent))
    ("kept every candidate when none may stay (cands[-k:] with k = 0)",
     "with budget == recent no heavy hitter stays: k = budget - recent is 0, and cands[-k:] is then cands[-0:] = "
     "cands[0:], every candidate. Slice from the front, cands[len(cands) - k:], or evict cands[:len(cands) - k].",
     lambda s, w, p, b, r: _last_k(s + avg(w).sum(0), p, b, r)),
    ("evicted the most-attended token",
     "H2O keeps the heavy hitters: evict the tokens with the LOWEST accumulated score (argsort ascending, or "
     "topk(..., largest=False)), not the highest.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), _most_first)),
    ("evicted from the recent window",
     "the `recent` newest positions are never evicted, whatever their score: leave them out of the candidates "
     "before choosing the lowest.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, torch.zeros(len(p), dtype=torch.bool))),
    ("took the recent window by index, not by position",
     "the keys come in slot order (a token takes the slot of the one it replaced), so the last `recent` indices "
     "are not the newest tokens: protect positions > positions.max() - recent.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, torch.arange(len(p)) >= len(p) - r)),
    ("took the recent window from the number of keys, not from the newest position",
     "positions are absolute (a long conversation is far past len(positions)): the recent window is "
     "positions > positions.max() - recent, not positions >= len(positions) - recent.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, p >= len(p) - r)),
    ("recent window one token too wide",
     "the recent window is the `recent` newest positions: positions > newest - recent (recent of them), "
     "not >= (recent + 1).",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r + 1))),
    ("recent window one token too narrow",
     "the recent window is the `recent` newest positions: positions > newest - recent, which holds recent of them.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r - 1))),
    ("did not average over heads: used head 0 only",
     "the cache keeps one set of positions for every head, so score a token by its attention averaged over "
     "ALL query heads (weights.mean(dim=1)), not one head's.",
     lambda s, w, p, b, r: keep_after(s + w[:, :1].float().mean(dim=(0, 1)).sum(0), p, b, recent_mask(p, r))),
    ("did not average over heads: took the max over heads",
     "score a token by its attention averaged over all query heads (mean over dim 1), not the largest head.",
     lambda s, w, p, b, r: keep_after(s + w.float().mean(0).amax(0).sum(0), p, b, recent_mask(p, r))),
    ("summed over heads instead of averaging",
     "the scores you are given were averaged over heads; adding a sum over heads makes this step count "
     "q_heads times more than the past ones. Use weights.mean(dim=1) (and mean over the batch, dim 0).",
     lambda s, w, p, b, r: keep_after(s + w.float().mean(0).sum(0).sum(0), p, b, recent_mask(p, r))),
    ("used batch row 0 only",
     "one decision serves the whole batch: average over the batch dimension too (weights.mean(dim=(0, 1))).",
     lambda s, w, p, b, r: keep_after(s + w[:1].float().mean(dim=(0, 1)).sum(0), p, b, recent_mask(p, r))),
    ("summed over the batch instead of averaging",
     "average over the batch (dim 0) as over heads: a sum makes a batch of 2 count twice.",
     lambda s, w, p, b, r: keep_after(s + w.float().sum(0).mean(0).sum(0), p, b, recent_mask(p, r))),
    ("summed over batch and heads instead of averaging",
     "the scores you are given were averaged over batch and heads; a sum over both makes this step count "
     "batch * q_heads times more than the past ones. Average instead: weights.mean(dim=(0, 1)), then sum over "
     "the queries (dim 2).",
     lambda s, w, p, b, r: keep_after(s + w.float().sum(dim=(0, 1)).sum(0), p, b, recent_mask(p, r))),
    ("only the newest query counted (that is TOVA's rule, not H2O's)",
     "H2O accumulates over EVERY query it is shown: add weights summed over the queries dimension (dim 2), "
     "not just the last row.",
     lambda s, w, p, b, r: keep_after(s + avg(w)[-1], p, b, recent_mask(p, r))),
    ("averaged over queries instead of summing (so queries that were masked from a key count against it)",
     "accumulate = sum over the queries (dim 2). A mean divides by every query in the chunk, including those "
     "the causal mask kept from the key, and a chunk would count less than the same tokens one by one.",
     lambda s, w, p, b, r: keep_after(s + avg(w).mean(0), p, b, recent_mask(p, r))),
    ("forgot the old scores (did not accumulate)",
     "add this step's attention to the scores you were given: the heavy hitter is the token with the largest "
     "total over all the queries so far.",
     lambda s, w, p, b, r: keep_after(avg(w).sum(0), p, b, recent_mask(p, r))),
    ("broke ties by slot (the order the keys come in), not by age",
     TIES_HINT,
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), slot_order_on_ties)),
    ("ties evicted the newest token first",
     "among equal scores evict the OLDEST position first (so attention that says nothing degrades to a sliding "
     "window): sort by position, then stable-sort by score.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), _newest_first_on_ties)),
    ("ranked the tokens by the scores you were given, before adding this step's attention",
     "add this step's attention first (total = scores + weights averaged over batch and heads, summed over "
     "queries), then evict the lowest TOTALS: a token this step's queries used heavily must survive.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r),
                                 lambda t, q, pr: eviction_order(s.float(), q, pr))),
    ("evicted the oldest tokens (a sliding window), ignoring the scores",
     "H2O evicts by accumulated attention, not by age: choose the lowest total among the tokens outside the "
     "recent window.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r),
                                 lambda t, q, pr: eviction_order(torch.zeros_like(t), q, pr))),
    ("chose the heavy hitters among all tokens, recent ones included, then added the recent window",
     "pick the budget - recent heavy hitters among the tokens OUTSIDE the recent window; a recent token that is "
     "also heavy would otherwise take two places and the cache would keep fewer than `budget`.",
     lambda s, w, p, b, r: _heavy_then_recent(s + avg(w).sum(0), p, b, r)),
    ("returned the scores you were given, not the accumulated ones",
     "return each kept token's NEW score (old score plus this step's attention): the next step starts from it.",
     _old_scores_returned),
    ("returned indices into `positions`, not the positions themselves",
     "the keys come in slot order: return positions[kept], the absolute positions, not their indices.",
     lambda s, w, p, b, r: _as_indices(s + avg(w).sum(0), p, b, r)),
    ("kept one token more than the budget",
     "after this step at most `budget` tokens stay: evict len(positions) - budget of them.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b + 1, recent_mask(p, r))),
    ("kept one token fewer than the budget",
     "after this step `budget` tokens stay (when there are that many): evict len(positions) - budget of them, not "
     "one more. The cache makes room for the next token itself, before it arrives.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b - 1, recent_mask(p, r))),
    ("summed over the keys (the last dim) instead of the queries",
     "weights is (batch, heads, queries, keys): a key's share of attention is summed over the QUERIES, dim 2 (dim 0 "
     "after averaging batch and heads). Summed over the keys, each query's row adds up to 1 and every key gets the "
     "same constant, so the old scores alone decide.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(-1), p, b, recent_mask(p, r))),
    ("added up in the weights' half-precision dtype",
     "bfloat16 keeps 8 significant bits (float16 11): scores 0.3024 and 0.3020, or a sum 0.25 + 2**-10, come out "
     "equal there and the order of the tokens is lost. Compute the totals in float32 (weights.float(), "
     "scores.float()) before adding, averaging and summing.",
     lambda s, w, p, b, r: keep_after(_in_weights_dtype(s, w), p, b, recent_mask(p, r))),
    ("ranked the tokens by one number mixing score and position",
     "a sort key like score * 1000 + position * 1e-3 lets a later position outweigh a real score difference "
     "(positions grow without end). Break ties by age with two sorts: by position first, then a stable sort by "
     "score.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), _mixed_key)),
    ("broke ties with total + a small multiple of the position (an 'epsilon' tie-break)",
     "eps * position grows with the conversation: at position 5,000,000, 1e-7 * position is 0.5, more than real "
     "differences between scores, so a newer token with a lower score outranks an older one. Break ties by age "
     "with two sorts: by position first, then a stable sort by score (or sort by the pair (score, position)).",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), _eps_key)),
    ("evicted only one token",
     "a chunk can put the cache over budget by more than one: evict len(positions) - budget tokens.",
     lambda s, w, p, b, r: keep_after(s + avg(w).sum(0), p, b, recent_mask(p, r), n_drop=min(1, max(0, len(p) - b)))),
]
