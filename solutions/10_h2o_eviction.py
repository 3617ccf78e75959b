# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Exercise 10: eviction that listens to attention (H2O's accumulate-and-evict step)
#
# A sliding window evicts the *oldest* token. H2O (Zhang et al. 2023, "Heavy-Hitter Oracle") evicts the token
# that attention has used *least*: every query adds the attention it paid to each stored key to that key's
# score, and when the cache is over budget the lowest total goes, except for the `recent` newest tokens,
# which are always kept. TOVA (Oren et al. 2024) is the same idea with no memory: only the newest query's
# attention counts. Lesson 8 ([notebooks/08_which_tokens_to_keep.ipynb](../notebooks/08_which_tokens_to_keep.ipynb))
# measures both on the trained model; here you write the step that `swkv_teach.H2OKVCache` takes after each
# attention.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_h2o_keep` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_h2o_keep

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too

# %% [markdown]
# ## What the cache hands you
#
# After a decode step (or a prompt chunk) the decoder gives the cache the attention probabilities of the step's
# queries over the keys the cache returned, shaped `(batch, q_heads, queries, keys)`. The keys come in *slot*
# order (a new token takes the slot of the one it replaced), so their absolute `positions` are not sorted.
# One cache keeps one set of positions for all heads and the whole batch, so one decision serves them all:
# a token's share of this step is its attention **averaged over batch and heads, summed over the queries**.
# Here is one step on a toy cache, with the library's `H2OKVCache` doing it:

# %%
cache = swkv_teach.H2OKVCache(budget=4, recent=1)
keys = torch.randn(1, 2, 6, 8)                       # (batch, kv_heads, tokens, head_dim): a 6-token prompt
cache.update(keys, keys)
weights = torch.softmax(torch.randn(1, 2, 6, 6).masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf")), -1)
cache.observe(weights)                               # (batch, q_heads, queries, keys): over budget, so it evicts
print("kept positions:", cache.stored_positions().tolist())
print("their scores:  ", [round(x, 3) for x in cache.scores().tolist()])

# %% [markdown]
# ## Exercise 10: `h2o_keep`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 25 min · **Points:** 3
#
# `h2o_keep(scores, weights, positions, budget, recent)` returns `(kept_positions, kept_scores)`:
#
# * `scores` `(keys,)`: each key's accumulated score so far (0 for tokens that arrived this step).
# * `weights` `(batch, q_heads, queries, keys)`: this step's attention over the same keys (any float dtype;
#   compute in float32 or float64). Entries the causal mask hid are 0.
# * `positions` `(keys,)`: the keys' absolute positions, an integer tensor (`int64`, as the library's caches give
#   them), in slot order (not sorted), and as large as a long conversation makes them (millions and more: a
#   tie-break that adds `eps * position` to a score outgrows real score differences). The newest is
#   `positions.max()`. Return the kept positions themselves (not their indices) as integers; only the scores
#   are float. No input is necessarily contiguous.
# * New scores: `scores + weights averaged over batch and heads, summed over queries`.
# * Never evict the `recent` newest positions. If more than `budget` keys remain, evict the lowest new scores,
#   the **oldest** first among equal scores, until `budget` remain (`0 <= recent <= budget`). Oldest means the
#   smallest *position*, not the first slot: after the ring wraps, slot order is not age order.
# * Return the kept positions (integer) and their new scores in float32 (float64 is accepted too; half precision is not),
#   as a tensor or a list; any order, each score with its position. Do not change the tensors you were given.
# * Write it yourself: the check compares with the library's `swkv_teach.caches.h2o.h2o_keep`, so it refuses that
#   function.
#
# <details><summary>Hint 1</summary>
#
# `weights.float().mean(dim=(0, 1))` is `(queries, keys)`; `.sum(dim=0)` adds up the queries.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# The recent window is `positions > positions.max() - recent`, a mask over the keys, not "the last `recent`
# entries": slot order is not age order.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# Lowest score first with ties broken by age: `order = torch.argsort(positions)`, then
# `order = order[torch.argsort(total[order], stable=True)]`; drop the protected ones from `order` and evict
# its first `len(positions) - budget`.
#
# </details>

# %% swkv={"exercise": "10", "role": "answer"}
def h2o_keep(scores, weights, positions, budget, recent):
    """H2O's step: accumulate this step's attention, then keep the recent tokens plus the heaviest hitters."""
    ### BEGIN SOLUTION
    total = scores.float() + weights.float().mean(dim=(0, 1)).sum(dim=0)  # (keys,)
    protected = positions > positions.max() - recent
    order = torch.argsort(positions)                                     # oldest first ...
    order = order[torch.argsort(total[order], stable=True)]              # ... then lowest score first
    order = order[~protected[order]]
    keep = torch.ones(len(positions), dtype=torch.bool, device=positions.device)
    keep[order[: max(0, len(positions) - budget)]] = False
    return positions[keep], total[keep]
    ### END SOLUTION


# %% swkv={"exercise": "10", "points": 3, "role": "check"}
check_h2o_keep(h2o_keep)

# %% [markdown]
# ### Interview follow-up
#
# H2O's published code keeps a score and a top-k *per head*; this cache shares one decision across heads.
# What does each choice cost, and why might a per-head cache be hard to serve?
#
# <details><summary>One good answer</summary>
#
# Per head, every head keeps its own set of positions, so the keys of one layer no longer line up: attention
# needs a per-head index (a gather, or a mask over a larger buffer), paged and ring layouts stop being one
# table per layer, and batching different sequences gets harder. In exchange each head keeps exactly the tokens
# *it* uses, which matters when heads specialise (one head tracks brackets, another the previous token).
# Averaging over heads keeps one layout and one index per layer, at the price of a token that only one head
# needs being evicted when the other heads ignore it. TOVA's authors average the heads of a layer in their
# released cache; H2O's keeps heads apart.
#
# </details>
