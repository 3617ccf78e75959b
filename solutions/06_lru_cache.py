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
# # Exercise 06: an LRU cache keyed by token id
#
# A popular blog post builds its "sliding-window" cache as an LRU cache: `put(token_id, key, value)` inserts
# and evicts the least recently used entry once over `max_size`; `get(token_id)` returns `(key, value)` and
# *promotes* the entry. Build it correctly, then think about whether it is really a sliding window.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_lru_cache` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import torch

import swkv_teach
from swkv_teach.grading import check_lru_cache

torch.manual_seed(0)
DEVICE = swkv_teach.device()  # the GPU when there is one; the checks run there too

# %% [markdown]
# ## Exercise 06: `LRUCache`
#
# **Difficulty:** ★★☆ (2/3) · **Time:** about 20 min · **Points:** 2
#
# * `LRUCache(max_size)` raises `ValueError` when `max_size <= 0`.
# * `put(token_id, key, value)`: insert, or replace and refresh an existing id; it becomes the most recently
#   used, even when the key and value are the same as before (even the very same objects), and whether or not the
#   cache is full yet. A re-put of a stored id never evicts anything
#   (the cache does not grow). If the cache now holds more than `max_size` entries, evict the least recently used.
# * `get(token_id)`: the tuple `(key, value)`, in that order (a tuple, not a list), and the entry becomes the
#   most recently used, full cache or not;
#   `None` if absent (not `-1`). A `get` never changes how many entries the cache can hold.
# * Keys and values are whatever the caller hands in, falsy ones included (`0`, `''`, `False`, a zero tensor):
#   a stored entry is present whatever its key and value, so test presence with `token_id in ...`, never with
#   the truthiness of what is stored.
#
# Aim for O(1) per operation: an `OrderedDict` (`move_to_end`, `popitem(last=False)`) or a plain `dict`
# (insertion-ordered: pop and re-insert) gives it; a list of ids searched or `remove`d on every call is O(n).
# The check grades behaviour only, not speed (a timing would flake on a shared machine); a dict subclass or a
# linked list work as well. It runs scripted scenarios, long random sequences (gets and re-puts before the
# cache is full, misses, re-puts with new and with identical values, falsy keys and values) and compares your
# whole cache with a right one after every operation.
#
# <details><summary>Hint 1</summary>
#
# `collections.OrderedDict` keeps insertion order; `move_to_end(id)` makes an entry the most recent, `popitem(last=False)` removes the oldest.
#
# </details>
#
# <details><summary>Hint 2</summary>
#
# A re-`put` of an existing id must move it to the end as well: assigning `d[id] = ...` to an existing key keeps its old place.
#
# </details>
#
# <details><summary>Hint 3</summary>
#
# Validate in `__init__` before storing anything: `if max_size <= 0: raise ValueError(...)`.
#
# </details>

# %% swkv={"exercise": "06", "role": "answer"}
from collections import OrderedDict


class LRUCache:
    """At most max_size (key, value) entries by token id; the least recently used is evicted."""

    def __init__(self, max_size: int):
        ### BEGIN SOLUTION
        if max_size <= 0:
            raise ValueError(f"max_size must be a positive integer; got {max_size}")
        self.max_size = max_size
        self.cache = OrderedDict()  # least recently used first
        ### END SOLUTION

    def put(self, token_id, key, value) -> None:
        ### BEGIN SOLUTION
        if token_id in self.cache:
            self.cache.move_to_end(token_id)
        self.cache[token_id] = (key, value)
        while len(self.cache) > self.max_size:
            self.cache.popitem(last=False)
        ### END SOLUTION

    def get(self, token_id):
        ### BEGIN SOLUTION
        if token_id not in self.cache:
            return None
        self.cache.move_to_end(token_id)
        return self.cache[token_id]
        ### END SOLUTION


# %% swkv={"exercise": "06", "points": 2, "role": "check"}
check_lru_cache(LRUCache)

# %% [markdown]
# ### Interview follow-up
#
# Is an LRU cache of size `W` the same as a sliding window of `W` tokens? When do they differ, and which one does Mistral's attention need?
#
# <details><summary>One good answer</summary>
#
# Only while nobody calls `get`: then LRU evicts in insertion order, exactly like the window. As soon as something reads an old entry (a lookup, a debug print, an attention loop that calls `get`), it is promoted and survives although it is outside the window, and a newer token is evicted instead. Sliding-window attention evicts by *age*, not by use: a key more than `W - 1` positions back must never be attended again, so the cache must be FIFO by position (a ring buffer), and reads must not reorder it.
#
# </details>
