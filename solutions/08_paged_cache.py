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
# # Exercise 08: a paged window's block table
#
# A serving engine keeps the keys and values of many sequences in one pool of fixed-size blocks (vLLM's
# PagedAttention, Kwon et al., SOSP 2023). Each sequence has a *block table*: the pool blocks it holds, in
# order. With a sliding window a sequence can hand a block back as soon as all of its tokens have left the
# window, so its memory stays flat while the pool serves other sequences. This exercise is that bookkeeping,
# without the tensors: which blocks a sequence holds after each token. Lesson 7 draws it.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_paged_window` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import swkv_teach
from swkv_teach.grading import check_paged_window

# %% [markdown]
# ## Exercise 08: `PagedWindow`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 25 min · **Points:** 3
#
# A `swkv_teach.BlockPool(num_blocks, block_size)` hands out block ids with `pool.take()` and takes them back
# with `pool.give(block)`; `pool.block_size` is the number of tokens a block holds. Token `p` of a sequence
# lives in its *logical* block `p // block_size`, at offset `p % block_size`.
#
# * `PagedWindow(pool, window_size)`: one sequence on the shared pool, no tokens yet.
# * `append()`: one new token arrives. Afterwards the sequence holds **exactly** the blocks that hold one of
#   the last `W` tokens: give back every block whose tokens have all left the window, and take a block when
#   the new token is the first of its logical block. Return `(block, offset)`: where the new token is written,
#   `block` being the pool's id (what `pool.take()` gave you), not the logical number `p // block_size`.
#   **Give back before you take**: the pool may hold just enough blocks for the windows.
# * `block_table` (a property): the pool blocks held, **oldest first**, as a new list each time (a copy,
#   `list(...)`, or a tuple): whoever reads the table may keep or change what it got, and that must not change
#   your sequence.
# * `positions` (a property): the stored positions, the last `W` tokens, oldest first.
# * `reset()`: give every block back; the sequence starts again at token 0, as if just created (every
#   counter `__init__` sets is set again).
#
# The library's `swkv_teach.PagedKVCache` does this bookkeeping (for tensors too) and is the check's answer
# key: handing it in, subclassing it or keeping one to do the work is refused.
#
# Worked example, `W = 3`, `block_size = 2`, a fresh pool of 8 blocks:
#
# | tokens seen | last W | logical blocks held | `block_table` |
# |---|---|---|---|
# | 3 | 0, 1, 2 | 0, 1 | `[0, 1]` |
# | 4 | 1, 2, 3 | 0, 1 | `[0, 1]` (token 1 still needs block 0) |
# | 5 | 2, 3, 4 | 1, 2 | `[1, 2]` (block 0 back to the pool) |
#
# <details><summary>Hint 1</summary>
#
# After `seen` tokens the window is `max(0, seen - W) .. seen - 1`, so the oldest logical block you need is
# `max(0, seen - W) // block_size`. Keep the logical number of `block_table[0]` in an attribute.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# The new token `p` opens a block when `p % block_size == 0`. Only then `pool.take()`.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# Free with a `while` loop, not an `if`: with `block_size = 1` or a long window nothing changes, but a loop
# says what you mean: "while the oldest block is older than the oldest one needed".
#
# </details>

# %% swkv={"exercise": "08", "role": "answer"}
class PagedWindow:
    """One sequence's block table on a shared BlockPool: the blocks of its last window_size tokens, oldest first."""

    def __init__(self, pool, window_size: int):
        ### BEGIN SOLUTION
        self.pool = pool
        self.window_size = window_size
        self.table = []  # pool blocks, oldest first
        self.first = 0  # logical block held in table[0]
        self.seen = 0  # tokens appended so far
        ### END SOLUTION

    def append(self) -> tuple[int, int]:
        """One new token; returns (block, offset) where it is written."""
        ### BEGIN SOLUTION
        bs = self.pool.block_size
        p = self.seen
        self.seen += 1
        oldest_needed = max(0, self.seen - self.window_size) // bs
        while self.table and self.first < oldest_needed:  # every token of table[0] has left the window
            self.pool.give(self.table.pop(0))
            self.first += 1
        if p % bs == 0:  # token p opens a new logical block (after the give: the pool may be tight)
            self.table.append(self.pool.take())
        return self.table[-1], p % bs
        ### END SOLUTION

    @property
    def block_table(self) -> list[int]:
        """Pool blocks held, oldest first."""
        ### BEGIN SOLUTION
        return list(self.table)
        ### END SOLUTION

    @property
    def positions(self) -> list[int]:
        """The stored positions: the last window_size tokens, oldest first."""
        ### BEGIN SOLUTION
        return list(range(max(0, self.seen - self.window_size), self.seen))
        ### END SOLUTION

    def reset(self) -> None:
        """Give every block back; start a new sequence."""
        ### BEGIN SOLUTION
        for block in self.table:
            self.pool.give(block)
        self.table, self.first, self.seen = [], 0, 0
        ### END SOLUTION


# %% swkv={"exercise": "08", "points": 3, "role": "check"}
check_paged_window(PagedWindow)

# %%
pool = swkv_teach.BlockPool(num_blocks=8, block_size=2)
seq = PagedWindow(pool, window_size=3)
for t in range(7):
    block, offset = seq.append()
    print(f"token {t} -> block {block} offset {offset};  block_table {seq.block_table}, free blocks {pool.free_blocks}")

# %% [markdown]
# ### Interview follow-up
#
# Your engine serves 64 sequences of a model with window 4096, block size 16. How many blocks must the pool
# hold so that no sequence ever waits, and how much of that is wasted? What changes with block size 256?
#
# <details><summary>One good answer</summary>
#
# Each sequence holds at most `ceil((W - 1) / 16) + 1 = 257` blocks, so `64 * 257 = 16448` blocks (a sequence
# needs one more only momentarily if it takes before it gives). The window is 4096 tokens; 257 blocks hold
# 4112 slots, so at most 16 slots per sequence are not in the window (0.4 %): the partly stale first block and
# the partly unwritten last one. With block size 256 a sequence holds up to 17 blocks = 4352 slots (6 %
# waste), but the block table is 16x shorter and each attention read is a longer contiguous run, which
# kernels like. vLLM defaults to 16, the size its paper's ablation (section 7) found large enough to keep
# the GPU busy and small enough to waste little: small blocks waste less, large blocks read faster. Real engines also free against the *next*
# query's `W - 1` predecessors (vLLM's `remove_skipped_blocks`), one token earlier than we do.
#
# </details>
