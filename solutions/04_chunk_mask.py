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
# # Exercise 04: the chunk contract
#
# A long prompt goes into the cache in chunks (chunked prefill, Mistral 7B paper §2 "Pre-fill and Chunking"),
# so `update` often receives `c` tokens at once, at positions `n .. n+c-1`. It returns what those `c` queries
# need: the stored keys the chunk's *first* query can still see (the last `W - 1`) followed by the chunk, in
# the cache's own order, and `cache.positions` gives the absolute position of each returned key. Unlike one
# decoding token, the chunk's queries do not all see the same keys, so attention needs a mask, and the only
# thing that mask may rely on is positions. This is the
# [chunk contract](../docs/cheatsheet.md#the-chunk-contract); here you write its mask.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_chunk_mask` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_chunk_mask

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too


# %% [markdown]
# ## Exercise 04: `chunk_mask(q_positions, k_positions, window_size)`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 20 min · **Points:** 2
#
# * `q_positions`: 1-D integer tensor, the absolute position of each query (the chunk's tokens).
# * `k_positions`: 1-D integer tensor, the absolute position of each key, in the order the cache returned
#   them: a ring's slot order, not sorted, possibly with gaps or with keys too old for every query.
# * Return a **bool** tensor of shape `(len(q_positions), len(k_positions))`: `mask[a, b]` is `True` exactly
#   when the query at `p = q_positions[a]` may attend to the key at `s = k_positions[b]`, i.e. `p - W < s <= p`.
#
# Take every position from the two tensors: no sorting, no `len()`, no column index standing in for a
# position, no assumption that the queries are consecutive. The positions are `int32` or `int64` (not
# necessarily the same), on the course's device: return the mask on that device. Positions can be large (a
# long conversation, past `2**31` in `int64`, up to `2**31 - 1` in `int32`), so compare them as the integers
# they are: a cast to `bfloat16`, `float16`, `float32` or a narrower integer merges neighbouring positions, and
# in `int32` adding to a position can overflow (`s + W` wraps around near `2**31 - 1`; `p - W` cannot, since
# positions are `>= 0`). Leave both inputs
# unchanged, even for a moment: after a cache's update the chunk's positions are the last keys, so
# `q_positions` may be a view of `k_positions` (`k_positions[-c:]`) and writing into one writes into the
# other. There are no attention sinks in this exercise (`num_sinks = 0`; see the follow-up). The library's
# `swkv_teach.window_mask` is the check's answer key: passing it in is refused; write your own.
#
# Return the bool mask itself (`True` = may attend), as `swkv_teach.window_mask` does. The check rejects the
# additive form (`0.` where visible, `-inf` where masked) and 0/1 numbers: attention turns the bool mask into
# `-inf` scores itself, and a 0/1 float mask handed to `scaled_dot_product_attention` would be *added* to the
# scores and mask nothing.
#
# Worked example, `W = 4`: a ring buffer of 4 slots has seen 10 tokens, so its slots hold positions
# `[8, 9, 6, 7]`; a chunk of 3 arrives at positions `10, 11, 12`. Here the keys are all four slots followed by
# the chunk, `[8, 9, 6, 7, 10, 11, 12]`: one more than the last `W - 1`, and on purpose, since key 6 is too old
# for every query and your mask must hide it (a cache written by someone else may return such keys). The
# library's ring returns only the last `W - 1` there, oldest first: keys at `[7, 8, 9, 10, 11, 12]`. Query 10
# sees `7, 8, 9, 10`; query 12 sees `9, 10, 11, 12`; no query sees key 6, and query 10 must not see keys 11
# and 12, the chunk's own later tokens.
#
# <details><summary>Hint 1</summary>
#
# Broadcast a column of query positions against a row of key positions: `q_positions[:, None]` has shape
# `(queries, 1)`, `k_positions[None, :]` has shape `(1, keys)`; any comparison of the two is `(queries, keys)`.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Two conditions, combined with `&`: causal (`s <= p`: the chunk's later tokens are keys too) and inside the
# window (`s > p - window_size`). Exercise 01's mask compared indices; here compare positions, so key order
# does not matter.
#
# </details>

# %% swkv={"exercise": "04", "role": "answer"}
def chunk_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, window_size: int) -> torch.Tensor:
    """(queries, keys) bool: True where the query at q_positions[a] may see the key at k_positions[b]."""
    ### BEGIN SOLUTION
    p = q_positions[:, None]  # (queries, 1)
    s = k_positions[None, :]  # (1, keys), in the cache's order
    return (s <= p) & (s > p - window_size)
    ### END SOLUTION


# %% swkv={"exercise": "04", "points": 2, "role": "check"}
check_chunk_mask(chunk_mask)

# %% [markdown]
# The worked example, keys in slot order (`.` = masked):

# %%
q = torch.tensor([10, 11, 12], device=DEVICE)
k = torch.tensor([8, 9, 6, 7, 10, 11, 12], device=DEVICE)
mask = chunk_mask(q, k, window_size=4)
print("keys at    ", " ".join(f"{s:>2}" for s in k.tolist()))
for p, row in zip(q.tolist(), mask.tolist()):
    print(f"query {p:>2}:  ", " ".join(" 1" if x else " ." for x in row))
print("same as swkv_teach.window_mask:", torch.equal(mask, swkv_teach.window_mask(q, k, 4)))

# %% [markdown]
# ### Your mask at work
#
# A 22-token sequence goes through the library's ring buffer in chunks of 5, 1, 3, 4, 1 and 8 tokens. Each
# chunk's queries attend over what `update` returned, masked with your `chunk_mask` and `cache.positions`;
# the result must equal the oracle, sliding-window attention over the whole sequence at once.

# %%
W, T, D = 4, 22, 8
q_all, k_all, v_all = (torch.randn(1, 2, T, D, device=DEVICE) for _ in range(3))
oracle = swkv_teach.sliding_window_attention(q_all, k_all, v_all, W)

cache, n, worst = swkv_teach.RingBufferKVCache(W), 0, 0.0
for c in (5, 1, 3, 4, 1, 8):
    k, v = cache.update(k_all[:, :, n : n + c], v_all[:, :, n : n + c])
    q_pos = torch.arange(n, n + c, device=DEVICE)
    out = swkv_teach.attention(q_all[:, :, n : n + c], k, v, chunk_mask(q_pos, cache.positions.to(DEVICE), W))
    worst = max(worst, (out - oracle[:, :, n : n + c]).abs().max().item())
    print(f"chunk {n:>2}..{n + c - 1:<2}  {k.shape[2]:>2} keys at {cache.positions.tolist()}")
    n += c
print("every chunk matches the oracle (float32, difference < 1e-5):", worst < 1e-5)

# %% [markdown]
# ### Interview follow-up
#
# Your server adds attention sinks (StreamingLLM): the first `S` positions stay visible to every later query.
# What changes in the mask, and how many keys must `update` now return for a chunk of `c` tokens?
#
# <details><summary>One good answer</summary>
#
# One more way in: `(s <= p) & ((s > p - W) | (s < S))`, which is `window_mask(q, k, W, num_sinks=S)`. The
# update returns the sinks, the last `W - 1` stored keys and the chunk: up to `S + W - 1 + c` keys, and the
# mask still needs nothing but positions, so the sinks may sit anywhere among them (the library keeps them in
# the first slots).
#
# </details>
