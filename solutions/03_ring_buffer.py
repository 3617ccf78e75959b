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
# # Exercise 03: a ring buffer cache
#
# The cache of exercise 02 copies the whole window at every step. A ring buffer allocates `W` slots once and
# writes token `p` into slot `p % W`, overwriting the token that just left the window: no copy, no allocation.
# The catch: its slots are not in chronological order, so it also reports each slot's absolute position.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_ring_buffer_cache` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_ring_buffer_cache

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too


# %% [markdown]
# ## Exercise 03: `RingBufferKVCache`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 25 min · **Points:** 3
#
# One token per `update`, shape `(batch, heads, 1, head_dim)`.
#
# * `update(k_new, v_new)` writes the token into slot `p % W` (`p` = tokens seen before it) and returns the
#   **filled** slots **in slot order**: before the buffer is full, only the first `p + 1` slots; once full, the
#   buffer itself, the same memory every step (no `torch.cat`, no `.clone()`).
# * `positions` (a property): a 1-D tensor of an **integer dtype** (`torch.long`, say) with the absolute
#   position of each key `update` returned, in that order. Not floats (`window_mask` and the decoder's
#   attention refuse them), not a Python list (the decoder calls `cache.positions.to(device)`). Keep any
#   per-slot record of positions in an integer dtype too: `k_new.new_zeros(W)` takes the keys' dtype, and
#   bfloat16 holds integers exactly only up to 256 (float32 up to 2**24).
# * `ordered()`: a chronological **copy** `(k, v)` of what is stored, oldest first: new memory, not a view
#   of your buffer (slicing or `permute` give views; `index_select` or `.clone()` copy), so the next update
#   cannot change what the caller holds.
#
# Allocate the buffers on the first update, with that token's batch, heads, head_dim, **dtype and device**.
# Worked example, `W = 3`: after 4 tokens the slots hold positions `[3, 1, 2]`.
#
# `update` and `ordered()` each return a tuple `(k, v)` (`return k, v`).
#
# The check holds the ring to what a model needs: any token shape (batch ≠ heads, batch == heads, batch 1, one
# head; no `squeeze()`), float32/float64/float16/bfloat16, windows 1 to 8 over runs of `4 W + 3` tokens, keys and
# values that are all zeros (ordinary tokens: count what you wrote, never look for zero slots), several rings
# alive at once (all state on `self`), and bounded memory: everything the object keeps (any attribute, list or
# dict) stops growing once the buffer is full; holding more than twice the window's keys and values counts as
# not evicting.
#
# <details><summary>Hint 1</summary>
#
# `k_new.new_zeros(B, H, W, D)` makes a buffer with `k_new`'s dtype and device. Write a token with `self.k_buf[:, :, slot] = k_new[:, :, 0]`.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Slot `s` holds the latest position `p < seen` with `p % W == s`, that is `s + W * ((seen - 1 - s) // W)`.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# For `ordered()`, sort the slots by their positions: `order = torch.argsort(self.positions)`, then `index_select(2, order)` (move `order` to the buffer's device).
#
# </details>

# %% swkv={"exercise": "03", "role": "answer"}
class RingBufferKVCache:
    """Sliding-window cache in a preallocated ring: token p lives in slot p % window_size."""

    def __init__(self, window_size: int):
        ### BEGIN SOLUTION
        self.window_size = window_size
        self.k_buf = self.v_buf = None  # (B, H, W, D), allocated on the first update
        self.seen = 0  # tokens written so far
        ### END SOLUTION

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token (B, H, 1, D) in; the filled slots out, in slot order."""
        ### BEGIN SOLUTION
        if self.k_buf is None:
            B, H, _, D = k_new.shape
            self.k_buf = k_new.new_zeros(B, H, self.window_size, D)
            self.v_buf = v_new.new_zeros(B, H, self.window_size, D)
        slot = self.seen % self.window_size
        self.k_buf[:, :, slot] = k_new[:, :, 0]  # in place: overwrites the token that left the window
        self.v_buf[:, :, slot] = v_new[:, :, 0]
        self.seen += 1
        filled = min(self.seen, self.window_size)
        return self.k_buf[:, :, :filled], self.v_buf[:, :, :filled]
        ### END SOLUTION

    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last update returned, in slot order."""
        ### BEGIN SOLUTION
        W = self.window_size
        slots = torch.arange(min(self.seen, W))
        return slots + W * torch.div(self.seen - 1 - slots, W, rounding_mode="floor")
        ### END SOLUTION

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A chronological copy (k, v) of the stored tokens, oldest first."""
        ### BEGIN SOLUTION
        order = torch.argsort(self.positions).to(self.k_buf.device)
        return self.k_buf.index_select(2, order), self.v_buf.index_select(2, order)
        ### END SOLUTION


# %% swkv={"exercise": "03", "points": 3, "role": "check"}
check_ring_buffer_cache(RingBufferKVCache)

# %%
ring = RingBufferKVCache(window_size=3)
for p in range(5):
    k, v = ring.update(torch.full((1, 1, 1, 1), float(p), device=DEVICE), torch.zeros(1, 1, 1, 1, device=DEVICE))
    print(f"after token {p}: slots hold positions {ring.positions.tolist()}")

# %% [markdown]
# ### Interview follow-up
#
# The ring returns keys out of chronological order. Why is single-token decoding still correct, and when does the order start to matter?
#
# <details><summary>One good answer</summary>
#
# Attention for one query is a softmax-weighted *sum* over keys, and a sum does not depend on order; each key already carries its position because RoPE was applied before caching. Order matters when something indexes keys by position: a mask for a multi-token chunk (use `positions` to build it), displaying the cache, or a kernel that assumes contiguous chronological keys (then unrotate, as mistral-inference does).
#
# </details>
