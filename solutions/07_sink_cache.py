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
# # Exercise 07: attention sinks
#
# StreamingLLM (Xiao et al., 2023) noticed that models park a lot of attention on the very first tokens,
# whatever they say. Evict those and quality drops once the window slides past them. The fix: keep the first
# `num_sinks` tokens forever, plus the last `window_size`.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_sink_cache` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_sink_cache

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too


# %% [markdown]
# ## Exercise 07: `SinkCache`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 25 min · **Points:** 3
#
# `SinkCache(num_sinks, window_size)`, with `num_sinks >= 1` and `window_size >= 1`, one token per
# `update(k_new, v_new)`:
#
# * after `update`, the cache holds positions `0 .. num_sinks - 1` (the sinks, forever) and the last
#   `window_size` positions, nothing else, and `update` returns their keys and values as a tuple `(k, v)`;
# * `positions` (a property): a 1-D tensor of an **integer dtype** (`torch.long`, say) with the absolute
#   position of each key `update` returned, in the order returned (not floats, not a Python list: the
#   decoder's mask and `cache.positions.to(device)` need an integer tensor). Keep them in an integer dtype
#   throughout: `k_new.new_tensor(...)` takes the keys' dtype, and bfloat16 holds integers exactly only up to 256.
#
# Any order is accepted, as long as `positions` says which key is which (a chronological `torch.cat` cache,
# newest first, a ring with pinned slots, or separate sink and window tensors all pass). Example,
# `num_sinks=2, window_size=3`, after 7 tokens: positions `{0, 1, 4, 5, 6}`.
#
# The check holds the cache to what a model needs: any token shape (batch ≠ heads, batch 1, one head; no
# `squeeze()`), the tokens' dtype and device (float16 and bfloat16 too), runs of `4 (num_sinks + window_size) + 3`
# tokens, keys and values that are all zeros (ordinary tokens), several caches alive at once (all state on
# `self`), and bounded memory: everything the object keeps (any attribute, list or dict) stops growing once
# full; holding more than twice the sinks' and window's keys and values counts as not evicting.
#
# <details><summary>Hint 1</summary>
#
# Work an example by hand first: with `num_sinks=2, window_size=3`, which positions does the cache hold after
# 5, 6 and 7 tokens? Which position leaves at each step, and which never do?
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# A tensor does not know which position each of its tokens came from: keep that record yourself, next to the
# keys and values, and prune it exactly as you prune them.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# To keep a subset of tokens along dim 2, `index_select(2, idx)` with a long tensor `idx` on the keys' device;
# or preallocate `num_sinks + window_size` slots and write each token in place (sinks first, a ring behind).
#
# </details>

# %% swkv={"exercise": "07", "role": "answer"}
class SinkCache:
    """The first num_sinks tokens forever, plus the last window_size; chronological order."""

    def __init__(self, num_sinks: int, window_size: int):
        ### BEGIN SOLUTION
        self.num_sinks = num_sinks
        self.window_size = window_size
        self.k = self.v = None  # (B, H, stored, D)
        self.pos = []  # absolute position of each stored token
        self.seen = 0
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ### BEGIN SOLUTION
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)
        self.pos.append(self.seen)
        self.seen += 1
        keep = [i for i, p in enumerate(self.pos) if p < self.num_sinks or p >= self.seen - self.window_size]
        if len(keep) < len(self.pos):
            idx = torch.tensor(keep, device=self.k.device)
            self.k, self.v = self.k.index_select(2, idx), self.v.index_select(2, idx)
            self.pos = [self.pos[i] for i in keep]
        return self.k, self.v
        ### END SOLUTION

    @property
    def positions(self) -> torch.Tensor:
        ### BEGIN SOLUTION
        return torch.tensor(self.pos, dtype=torch.long)
        ### END SOLUTION


# %% swkv={"exercise": "07", "points": 3, "role": "check"}
check_sink_cache(SinkCache)

# %%
sinks = SinkCache(num_sinks=2, window_size=3)
for p in range(7):
    sinks.update(torch.randn(1, 1, 1, 4, device=DEVICE), torch.randn(1, 1, 1, 4, device=DEVICE))
print("after 7 tokens the cache holds positions", sinks.positions.tolist())

# %% [markdown]
# ### Interview follow-up
#
# The sink keys were rotated by RoPE at positions 0..3. At position 10 000, the query sees them 10 000 positions away, further than anything in training. StreamingLLM does something different; what, and what does it cost?
#
# <details><summary>One good answer</summary>
#
# StreamingLLM caches keys *before* RoPE and rotates them with their position *inside the cache* (0 .. S + W - 1) at every step, so distances never exceed the cache size. The model then sees a sequence that never existed, which changes its outputs (usually for the better at long lengths), and the cache must re-rotate all keys each step. This course caches keys after RoPE at their true positions: exactly sliding-window attention with sinks, cheap, but long distances to the sinks are out of distribution.
#
# </details>
