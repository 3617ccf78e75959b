# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
# ---

# %% [markdown]
# # Exercise 05: attention sinks
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
# ## Exercise 05: `SinkCache`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 25 min · **Points:** 3
#
# `SinkCache(num_sinks, window_size)`, one token per `update(k_new, v_new)`:
#
# * after `update`, the cache holds positions `0 .. num_sinks - 1` (the sinks, forever) and the last
#   `window_size` positions, nothing else, and `update` returns their keys and values;
# * `positions` (a property): the absolute position of each key `update` returned, in the order returned.
#
# Any order is accepted, as long as `positions` says which key is which (a chronological `torch.cat` cache or
# a ring with pinned slots both pass). Example, `num_sinks=2, window_size=3`, after 7 tokens:
# positions `{0, 1, 4, 5, 6}`.
#
# <details><summary>Hint 1</summary>
#
# Keep a Python list of the stored positions next to the tensors. After appending the new token, a stored position `p` survives if `p < num_sinks` or `p >= seen - window_size`.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Build an index tensor of the survivors and `index_select(2, idx)` keys and values with it (put the index on the tensors' device).
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# `positions` can simply be `torch.tensor(self.pos)`.
#
# </details>

# %% swkv={"exercise": "05", "role": "answer"}
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


# %% swkv={"exercise": "05", "points": 3, "role": "check"}
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
