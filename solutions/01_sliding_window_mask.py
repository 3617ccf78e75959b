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
# # Exercise 01: the sliding-window mask
#
# Before caching, sliding-window attention is just a mask on the scores: `mask[i, j]` is `True` where query `i`
# may attend to key `j`. You will build it for a whole sequence; the library's `window_mask` generalises it to
# absolute positions (which is how the caches use it).
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_sliding_window_mask` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_sliding_window_mask

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too


# %% [markdown]
# ## Exercise 01: `sliding_window_mask(seq_len, window_size)`
#
# **Difficulty:** ★☆☆ (1/3) · **Time:** about 10 min · **Points:** 2
#
# Return a `(seq_len, seq_len)` **bool** tensor with `mask[i, j] = True` exactly when `i - W < j <= i`.
# For `W = 3`, query 5 sees keys 3, 4 and 5; key 2 is just out. Rows are queries, columns are keys.
#
# The check compares every `seq_len` from 1 to 9 and 16, 20, 23, 24 with windows from 1 to beyond `seq_len`
# (`W >= seq_len` is plain causal attention): nothing fixed-size, and the band must slide with the query row.
#
# <details><summary>Hint 1</summary>
#
# Make a column of query indices and a row of key indices with `torch.arange`, then broadcast: `i = torch.arange(T)[:, None]`, `j = torch.arange(T)[None, :]`.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# Two conditions: causal (`j <= i`) and inside the window (`j > i - window_size`). Combine bool tensors with `&`.
#
# </details>

# %% swkv={"exercise": "01", "role": "answer"}
def sliding_window_mask(seq_len: int, window_size: int) -> torch.Tensor:
    """(seq_len, seq_len) bool: True where query i may attend to key j, i.e. i - W < j <= i."""
    ### BEGIN SOLUTION
    i = torch.arange(seq_len)[:, None]  # queries, one per row
    j = torch.arange(seq_len)[None, :]  # keys, one per column
    return (j <= i) & (j > i - window_size)
    ### END SOLUTION


# %% swkv={"exercise": "01", "points": 2, "role": "check"}
check_sliding_window_mask(sliding_window_mask)

# %%
print(sliding_window_mask(6, 3).int())

# %% [markdown]
# ### Interview follow-up
#
# With `L` layers and window `W`, how far back can information travel to the last token, even though each layer only looks `W - 1` tokens back?
#
# <details><summary>One good answer</summary>
#
# About `L × (W - 1)` tokens: each layer moves information up to `W - 1` positions forward, and layers stack, like the receptive field of stacked convolutions. Mistral 7B (W = 4096, 32 layers) reaches about 131k tokens in theory, though in practice information fades long before that.
#
# </details>
