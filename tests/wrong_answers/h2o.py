"""Wrong answers to exercise 10, h2o_keep(scores, weights, positions, budget, recent) -> (positions, scores).

Each is the answer a learner writes with one slip, in a learner's style (loops,
sorted(), topk), not a patch of the library's code.
"""

import torch

from tests.wrong_answers import wrong


def _choose(total, positions, budget, candidates, key=None, n_drop=None):
    """Drop the first n_drop candidates by key (default: lowest total, oldest first); return kept pairs."""
    key = key or (lambda i: (float(total[i]), int(positions[i])))
    n_drop = max(0, len(positions) - budget) if n_drop is None else n_drop
    drop = set(sorted(candidates, key=key)[:n_drop])
    keep = [i for i in range(len(positions)) if i not in drop]
    return positions[keep], total[keep]


def _total(scores, weights):
    return scores + weights.float().mean(dim=(0, 1)).sum(dim=0)


def _outside_recent(positions, recent):
    newest = int(positions.max())
    return [i for i in range(len(positions)) if int(positions[i]) <= newest - recent]


@wrong("check_h2o_keep", "most-attended")
def evicts_most_attended(scores, weights, positions, budget, recent):
    """Sorts descending: evicts the heavy hitters H2O is named after."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent),
                   key=lambda i: (-float(total[i]), int(positions[i])))


@wrong("check_h2o_keep", "evicted from the recent window")
def evicts_from_recent_window(scores, weights, positions, budget, recent):
    """Every token is a candidate: a new token with little attention yet is evicted at once."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, range(len(positions)))


@wrong("check_h2o_keep", "by index")
def recent_window_by_index(scores, weights, positions, budget, recent):
    """Protects the last `recent` slots, as if slot order were chronological."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, range(len(positions) - recent))


@wrong("check_h2o_keep", "too wide")
def recent_window_off_by_one(scores, weights, positions, budget, recent):
    """positions >= newest - recent: recent + 1 tokens protected."""
    total = _total(scores, weights)
    newest = int(positions.max())
    return _choose(total, positions, budget, [i for i in range(len(positions)) if positions[i] < newest - recent])


@wrong("check_h2o_keep", "head 0")
def first_head_only(scores, weights, positions, budget, recent):
    """weights[0, 0]: one head's attention decides for all of them."""
    total = scores + weights[0, 0].float().sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "max over heads")
def max_over_heads(scores, weights, positions, budget, recent):
    """A token counts as used if any head uses it: amax over heads."""
    total = scores + weights.float().mean(dim=0).amax(dim=0).sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "summed over heads")
def sums_over_heads(scores, weights, positions, budget, recent):
    """H2O's own code sums; here the given scores are averages, so this step counts q_heads times."""
    total = scores + weights.float().mean(dim=0).sum(dim=(0, 1))
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "batch row 0")
def first_batch_row(scores, weights, positions, budget, recent):
    """weights[0]: the first sequence decides for the batch."""
    total = scores + weights[0].float().mean(dim=0).sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "summed over the batch")
def sums_over_batch(scores, weights, positions, budget, recent):
    """H2O's code does .sum(0) over the batch; with batch 2 this step counts double."""
    total = scores + weights.float().sum(dim=0).mean(dim=0).sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "summed over batch and heads")
def sums_over_batch_and_heads(scores, weights, positions, budget, recent):
    """weights.sum(dim=(0, 1)): with batch 2 and 4 heads this step counts 8 times (0.23 becomes 1.84)."""
    total = scores + weights.float().sum(dim=(0, 1)).sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "tova")
def newest_query_only(scores, weights, positions, budget, recent):
    """weights[..., -1, :]: only the last query of a chunk is added (TOVA's rule)."""
    total = scores + weights[:, :, -1].float().mean(dim=(0, 1))
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "averaged over queries", "masked")
def mean_over_queries(scores, weights, positions, budget, recent):
    """mean over the queries: divides by queries the causal mask kept from the key."""
    total = scores + weights.float().mean(dim=(0, 1)).mean(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "did not accumulate")
def forgets_old_scores(scores, weights, positions, budget, recent):
    """Scores only this step's attention: a heavy hitter of the past is forgotten."""
    total = weights.float().mean(dim=(0, 1)).sum(dim=0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "ties", "oldest")
def ties_evict_newest(scores, weights, positions, budget, recent):
    """Sorts by (score, -position): on a tie the newest candidate goes."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent),
                   key=lambda i: (float(total[i]), -int(positions[i])))


@wrong("check_h2o_keep", "only one")
def evicts_only_one(scores, weights, positions, budget, recent):
    """if len > budget: evict the argmin, once (a chunk leaves it over budget)."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent),
                   n_drop=1 if len(positions) > budget else 0)


@wrong("check_h2o_keep", "one token more than the budget")
def keeps_budget_plus_one(scores, weights, positions, budget, recent):
    """Evicts len - budget - 1: the slot for the next token counted twice."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent),
                   n_drop=max(0, len(positions) - budget - 1))


@wrong("check_h2o_keep", "sliding window")
def evicts_oldest(scores, weights, positions, budget, recent):
    """Drops the oldest candidates: the accumulated scores are computed, then ignored."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent), key=lambda i: int(positions[i]))


@wrong("check_h2o_keep", "recent ones included")
def heavy_hitters_then_recent(scores, weights, positions, budget, recent):
    """topk(budget - recent) over all tokens, then the recent ones added: overlap keeps fewer than budget."""
    total = _total(scores, weights)
    if len(positions) <= budget:
        return positions, total
    heavy = set(torch.topk(total, budget - recent).indices.tolist()) if budget > recent else set()
    newest = int(positions.max())
    keep = [i for i in range(len(positions)) if i in heavy or int(positions[i]) > newest - recent]
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "indices")
def returns_indices(scores, weights, positions, budget, recent):
    """Returns where the kept tokens sit in the arguments, not their positions."""
    total = _total(scores, weights)
    kept, kept_scores = _choose(total, positions, budget, _outside_recent(positions, recent))
    where = {int(p): i for i, p in enumerate(positions)}
    return torch.tensor([where[int(p)] for p in kept]), kept_scores


@wrong("check_h2o_keep", "scores you were given", "accumulated")
def returns_old_scores(scores, weights, positions, budget, recent):
    """Decides with the totals but returns the scores it was given."""
    total = _total(scores, weights)
    kept, _ = _choose(total, positions, budget, _outside_recent(positions, recent))
    where = {int(p): i for i, p in enumerate(positions)}
    return kept, scores[[where[int(p)] for p in kept]]


@wrong("check_h2o_keep", "in place")
def updates_scores_in_place(scores, weights, positions, budget, recent):
    """scores += ...: the caller's tensor changes under it."""
    scores += weights.float().mean(dim=(0, 1)).sum(dim=0)
    return _choose(scores, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "pair")
def returns_positions_only(scores, weights, positions, budget, recent):
    """Forgets to return the scores the next step needs."""
    return _choose(_total(scores, weights), positions, budget, _outside_recent(positions, recent))[0]


# ------------------------------------------------------------------ ties: slot order is not age order
@wrong("check_h2o_keep", "ties must be broken by age (position), not by slot")
def ties_by_slot_stable_argsort(scores, weights, positions, budget, recent):
    """argsort(total, stable=True): ties stay in slot order, which after a wrap is not the order of age."""
    total = _total(scores, weights)
    order = torch.argsort(total, stable=True)
    protected = positions > positions.max() - recent
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "ties", "position")
def ties_by_plain_argsort(scores, weights, positions, budget, recent):
    """argsort(total) (not stable): ties come out in whatever order the sort leaves them."""
    total = _total(scores, weights)
    protected = positions > positions.max() - recent
    order = torch.argsort(total)
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "ties", "position")
def ties_by_topk(scores, weights, positions, budget, recent):
    """topk keeps the heaviest candidates: which of several equal ones it keeps is up to topk."""
    total = _total(scores, weights)
    if len(positions) <= budget:
        return positions, total
    protected = positions > positions.max() - recent
    candidates = torch.nonzero(~protected).flatten()
    keep = protected.clone()
    keep[candidates[torch.topk(total[candidates], budget - int(protected.sum())).indices]] = True
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "not by slot")
def ties_by_slot_index_in_python(scores, weights, positions, budget, recent):
    """sorted(candidates, key=(total, index)): the index is the slot, not the age."""
    total = _total(scores, weights)
    return _choose(total, positions, budget, _outside_recent(positions, recent), key=lambda i: (float(total[i]), i))


# ------------------------------------------------------------------ what comes back
@wrong("check_h2o_keep", "bfloat16", "float32")
def scores_back_in_the_weights_dtype(scores, weights, positions, budget, recent):
    """Right choice, but the kept scores are cast back to the weights' dtype (bfloat16 keeps 3 digits)."""
    total = _total(scores, weights)
    kept, kept_scores = _choose(total, positions, budget, _outside_recent(positions, recent))
    return kept, kept_scores.to(weights.dtype)


@wrong("check_h2o_keep", "not paired with their positions")
def sorts_positions_not_scores(scores, weights, positions, budget, recent):
    """Sorts the kept positions for tidiness and leaves the scores in slot order."""
    total = _total(scores, weights)
    kept, kept_scores = _choose(total, positions, budget, _outside_recent(positions, recent))
    return kept.sort().values, kept_scores


@wrong("check_h2o_keep", "before adding this step's attention")
def ranks_by_the_old_scores(scores, weights, positions, budget, recent):
    """Chooses with the scores it was given, then returns the new totals: this step's attention came too late."""
    total = _total(scores, weights)
    kept, _ = _choose(scores, positions, budget, _outside_recent(positions, recent))
    where = {int(p): i for i, p in enumerate(positions)}
    return kept, total[[where[int(p)] for p in kept]]


# ---------------------------------------------------------------- issue 18: holes and true diagnoses
def _h2o(scores, weights, positions, budget, recent, total=None, keep_n=None):
    """The solution, with the total and the number kept open to a slip."""
    if total is None:
        total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)
    protected = positions > positions.max() - recent
    order = torch.argsort(positions)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[order[: max(0, len(positions) - (budget if keep_n is None else keep_n))]] = False
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "one token fewer than the budget")
def h2o_budget_minus_one(scores, weights, positions, budget, recent):
    """Keeps budget - 1 tokens ('leave room for the next token')."""
    return _h2o(scores, weights, positions, budget, recent, keep_n=budget - 1)


@wrong("check_h2o_keep", "summed over the keys", "dim 2")
def h2o_sum_over_keys(scores, weights, positions, budget, recent):
    """weights.mean(dim=(0, 1)).sum(dim=1): sums each query's row over the keys (dim 1 of (queries, keys))."""
    return _h2o(scores, weights, positions, budget, recent,
                total=scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=1))


@wrong("check_h2o_keep", "scores differ", "averaged over batch and heads, summed over queries")
def h2o_mean_over_queries_sum_over_heads(scores, weights, positions, budget, recent):
    """weights.mean(dim=(0, 2)).sum(0): averages over batch and queries, sums over heads (the axes mixed up)."""
    return _h2o(scores, weights, positions, budget, recent,
                total=scores.float() + weights.float().mean(dim=(0, 2)).sum(0))


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


@wrong("check_h2o_keep", "from the number of keys", "positions.max() - recent")
def h2o_recent_from_count(scores, weights, positions, budget, recent):
    """Protects positions >= len(positions) - recent (a count, not the newest position)."""
    total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)
    protected = positions >= len(positions) - recent
    order = torch.argsort(positions)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "kept other positions", "expected", "got")
def h2o_protect_by_truthiness(scores, weights, positions, budget, recent):
    """Skips tokens with a zero total when choosing what to evict (`if total[i]:` treats 0 as 'no score yet')."""
    total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)
    protected = positions > positions.max() - recent
    order = sorted((i for i in range(len(positions)) if not protected[i] and total[i]),
                   key=lambda i: (float(total[i]), int(positions[i])))
    keep = torch.ones(len(positions), dtype=torch.bool)
    for i in order[: max(0, len(positions) - budget)]:
        keep[i] = False
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "half-precision dtype", "float32")
def adds_up_in_bfloat16(scores, weights, positions, budget, recent):
    """Everything in the weights' dtype, "to save memory": bfloat16 merges scores 4e-4 apart."""
    total = (scores.to(weights.dtype) + weights.mean(dim=(0, 1)).sum(dim=0)).float()
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "mixing score and position", "two sorts")
def one_sort_key_for_score_and_age(scores, weights, positions, budget, recent):
    """Ranks by `score * 1000 + position * 1e-3`, one argsort for "lowest, oldest first": late positions outweigh scores."""
    total = _total(scores, weights)
    key = lambda i: float(total[i]) * 1000 + int(positions[i]) * 1e-3  # noqa: E731
    return _choose(total, positions, budget, _outside_recent(positions, recent), key=key)


@wrong("check_h2o_keep", "epsilon", "position")
def epsilon_tie_break(scores, weights, positions, budget, recent):
    """Breaks ties with one sort key, total + 1e-7 * position: at position 5,000,000 the 'epsilon' is 0.5 and
    outweighs real score differences."""
    total = _total(scores, weights)
    key = total.double() + 1e-7 * positions.double()
    return _choose(total, positions, budget, _outside_recent(positions, recent), key=lambda i: float(key[i]))


@wrong("check_h2o_keep", "epsilon", "position")
def tiny_epsilon_tie_break(scores, weights, positions, budget, recent):
    """The same with a smaller epsilon, 1e-10 * position, through topk over -key: harmless at 10**6, wrong at position
    2 * 10**9, where it adds 0.2."""
    total = _total(scores, weights)
    key = total.double() + 1e-10 * positions.double()
    cands = torch.tensor(_outside_recent(positions, recent), dtype=torch.long)
    n_drop = max(0, len(positions) - budget)
    drop = set(cands[torch.topk(-key[cands], n_drop).indices].tolist()) if n_drop else set()
    keep = [i for i in range(len(positions)) if i not in drop]
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "cands[-k:]", "k = 0")
def keeps_last_k_candidates(scores, weights, positions, budget, recent):
    """Keeps the recent tokens plus cands[-k:], k = budget - recent, of the candidates sorted best last: with
    budget == recent, k = 0 and cands[-0:] is every candidate."""
    total = _total(scores, weights)
    newest = int(positions.max())
    rec = [i for i in range(len(positions)) if int(positions[i]) > newest - recent]
    if len(positions) <= budget:
        return positions, total
    cands = sorted(_outside_recent(positions, recent), key=lambda i: (float(total[i]), int(positions[i])))
    keep = sorted(rec + cands[-(budget - len(rec)):])
    return positions[keep], total[keep]


@wrong("check_h2o_keep", "not contiguous", "transposed", ".reshape()")
def flattens_heads_with_view(scores, weights, positions, budget, recent):
    """Averages batch and heads through weights.view(B * H, Q, K).mean(0): right on contiguous attention, raises on
    weights laid out as a model makes them (a transposed view)."""
    B, H, Q, K = weights.shape
    total = scores + weights.float().view(B * H, Q, K).mean(0).sum(0)
    return _choose(total, positions, budget, _outside_recent(positions, recent))


@wrong("check_h2o_keep", "equal totals, at positions in the millions", "positions.float()")
def ages_compared_in_float32(scores, weights, positions, budget, recent):
    """Sorts by position in float32 first (positions.float(), 'to sort them with the scores'), then stable by
    total: right until positions pass 2**24, where float32 merges neighbours and ties fall back to slot order."""
    total = _total(scores, weights)
    protected = positions > positions.max() - recent
    order = torch.argsort(positions.float(), stable=True)
    order = order[torch.argsort(total[order], stable=True)]
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]
