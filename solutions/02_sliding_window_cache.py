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
# # Exercise 02: the sliding-window KV cache, in six steps
#
# Sliding-window attention never looks further back than `window_size` tokens, so a server has no reason to
# keep older keys and values. Here you build the cache from the problem statement: one method,
# `update(k_new, v_new)`, that appends this step's key and value (one token, shape
# `(batch, heads, 1, head_dim)`), evicts from the front once the cache holds more than `window_size` tokens,
# and returns the cached `(k, v)`, shape `(batch, heads, tokens, head_dim)`.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_sliding_window_cache` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_sliding_window_cache

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too


# %% [markdown]
# ## Exercise 02: `SlidingWindowKVCache`
#
# **Difficulty:** ★☆☆ (1/3) · **Time:** about 15 min · **Points:** 2
#
# Follow the six steps:
#
# 1. In `__init__`, store `window_size` and set `self.k` and `self.v` to `None`: nothing is cached yet.
# 2. On the first `update`, just keep `k_new` and `v_new`: there is nothing to concatenate onto.
# 3. Afterwards, append along the token axis (dim 2).
# 4. If the cache now holds more than `window_size` tokens, evict from the front: keep the last `window_size`.
# 5. Return the cached keys and values.
# 6. Check that the length never exceeds `window_size`, however long you run (the cell after the check).
#
# **What the check holds your cache to** (a cache in a real model meets all of these):
#
# * **Any token shape.** `batch`, `heads` and `head_dim` are whatever `k_new` says, 1 included: the check
#   feeds `(2, 3, 1, 4)`, `(1, 1, 1, 2)`, `(3, 1, 1, 5)`, `(1, 4, 1, 3)` and `(2, 2, 1, 3)` tokens. Do not assume
#   `batch == heads` (nor swap them when they are equal), and do not `squeeze()` (it drops a batch or head of
#   size 1).
# * **The tokens' dtype and device**, float16 and bfloat16 included: the returned `k` and `v` have `k_new`'s.
# * **Windows 1 to 8, runs of `4 W + 3` tokens**, so `W - 1`, `W`, `W + 1` and long after are all crossed.
# * **Keys and values that are all zeros** are ordinary tokens.
# * **Several caches alive at once** (a model keeps one per layer): keep all state on `self`.
# * **Bounded memory**: everything your object keeps (any attribute, list or dict) stops growing once the
#   window is full; holding more than twice the window's keys and values counts as not evicting.
# * The caller's `k_new` and `v_new` are never written to.
#
# <details><summary>Hint 1</summary>
#
# `torch.cat([self.k, k_new], dim=2)` appends one token: the layout is `(batch, heads, tokens, head_dim)`.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Negative slicing keeps the most recent entries: `self.k[:, :, -self.window_size:]`. Do the same to `self.v`, or keys and values stop matching.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# Return the *updated* tensors (after appending and evicting), as a tuple: `return self.k, self.v`.
#
# </details>

# %% swkv={"exercise": "02", "role": "answer"}
class SlidingWindowKVCache:
    """Keep the last `window_size` tokens' keys and values, shape (batch, heads, tokens, head_dim)."""

    def __init__(self, window_size: int):
        ### BEGIN SOLUTION
        self.window_size = window_size
        self.k = None
        self.v = None
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        if self.k is None:
            # first call: nothing to concatenate onto yet
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)  # (B, H, t, D) -> (B, H, t + 1, D)
            self.v = torch.cat([self.v, v_new], dim=2)
        if self.k.shape[2] > self.window_size:
            # evict from the front: the oldest token is the first along dim 2
            self.k = self.k[:, :, -self.window_size:, :]
            self.v = self.v[:, :, -self.window_size:, :]
        return self.k, self.v
        ### END SOLUTION


# %% swkv={"exercise": "02", "points": 2, "role": "check"}
check_sliding_window_cache(SlidingWindowKVCache)

# %% [markdown]
# Step 6: the memory ceiling. However long the run, the cache never holds more than `window_size` tokens.

# %%
cache = SlidingWindowKVCache(window_size=4)
sizes = []
for _ in range(100):
    k, v = cache.update(torch.randn(1, 2, 1, 8, device=DEVICE), torch.randn(1, 2, 1, 8, device=DEVICE))
    sizes.append(k.shape[2])
print("tokens held after steps 1..6:", sizes[:6], "| most ever held in 100 steps:", max(sizes))

# %% [markdown]
# ### Interview follow-up
#
# Your `update` copies the whole window with `torch.cat` at every step. What does that cost per generated token, and how would a production server avoid it?
#
# <details><summary>One good answer</summary>
#
# Each step allocates a new `(B, H, W + 1, D)` tensor, copies the `W` cached tokens and the new one into it, then slices the last `W` (a view of that `W + 1` tensor): O(W) time and memory traffic per token per layer, plus an allocation. A ring buffer (exercise 03) preallocates `W` slots and writes token `p` into slot `p % W`, O(1) per token; attention does not care that the slots are out of chronological order, because softmax over keys is a sum and RoPE already baked each key's position in.
#
# </details>
