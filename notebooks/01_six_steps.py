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
# # Lesson 1 — A sliding-window KV cache in six steps
#
# **Time:** about 50 minutes for the lesson, plus 15–30 for [exercise 02](../exercises/02_sliding_window_cache.ipynb), which you do in the middle of the lesson, before you see step 4's code. **You need:** lesson 0 (why a window bounds the cache, the convention).
#
# **By the end you will be able to**
#
# 1. write `SlidingWindowKVCache.update` from memory, with the tensor layout `(batch, heads, tokens, head_dim)`;
# 2. say what `torch.cat` and the slice each cost (a copy of the window, and nothing), and prove it;
# 3. name the return-before-evicting bug and show which window rule it breaks;
# 4. check a cache against a reference implementation step by step.
#
# The task, as interviewers and textbooks pose it:
#
# > Write `SlidingWindowKVCache(window_size)` with one method, `update(k_new, v_new)`. Each call
# > brings one token's key and value, shaped `(batch, heads, 1, head_dim)`. Append them, evict from
# > the front once the cache holds more than `window_size` tokens, and return the cached `(k, v)`.
#
# We build it in six steps, one section each. Each section adds a few lines (marked `# NEW`) to
# the class and ends with a **checkpoint** that runs the partial class. Checkpoints use
# `head_dim = 1` and keys `1., 2., 3., …` (values are ten times the key), so every printed
# tensor is a short list of numbers you can read.
#
# At the end our class is compared with the library's `swkv_teach.SlidingWindowKVCache` on a random stream.

# %%
import torch

import swkv_teach
from swkv_teach.masks import allowed

torch.manual_seed(0)
dev = swkv_teach.device()


def tok(x):
    # one token with a scalar key x and value 10x: shapes (batch=1, heads=1, tokens=1,
    # head_dim=1)
    k = torch.tensor([[[[x]]]], device=dev)
    return k, 10 * k


def show(t):
    # a (1, 1, tokens, 1) cache tensor as a plain list, oldest token first
    return t.flatten().tolist()


# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)


# %% [markdown]
# ## Step 1 — Store the window and start empty
#
# The constructor only remembers `window_size`. The cache holds nothing yet, so `k` and `v` are
# `None`. Why not an empty tensor of shape `(batch, heads, 0, head_dim)`? Because we do not know
# the batch size, the number of heads, `head_dim`, the dtype or the device until the first token
# arrives. `None` says honestly that nothing is there yet.

# %%
class SlidingWindowKVCache:

    def __init__(self, window_size: int):
        self.window_size = window_size  # NEW
        # NEW: (batch, heads, tokens, head_dim) after the first update
        self.k = None
        self.v = None  # NEW


# %%
# checkpoint 1
cache = SlidingWindowKVCache(window_size=3)
print("window:", cache.window_size, "| k:", cache.k, "| v:", cache.v)


# %% [markdown]
# ## Step 2 — Assign on the first update
#
# On the first call there is nothing to concatenate onto, so the new token simply becomes the
# cache. The method returns what the cache holds.

# %%
class SlidingWindowKVCache:

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.k = None
        self.v = None

    def update(self, k_new, v_new):  # NEW
        # NEW: nothing to concatenate onto yet
        if self.k is None:
            self.k, self.v = k_new, v_new  # NEW
        return self.k, self.v  # NEW


# %%
# checkpoint 2
cache = SlidingWindowKVCache(window_size=3)
for x in [1.0, 2.0]:
    k, v = cache.update(*tok(x))
    print(f"update({x}) -> k {show(k)}  v {show(v)}")


# %% [markdown]
# The first token is stored. The second is silently **lost**: `update(2.0)` still returns `[1.0]`.
# The next step fixes that.

# %% [markdown]
# ## Step 3 — Append along the token axis
#
# Tensors are laid out `(batch, heads, tokens, head_dim)`, so tokens live on **dim 2**.
# `torch.cat` along that axis turns `(B, H, t, D)` plus `(B, H, 1, D)` into $(B, H, t + 1, D)$.

# %%
class SlidingWindowKVCache:

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.k = None
        self.v = None

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:  # NEW
            # NEW: (B, H, t, D) -> (B, H, t + 1, D)
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)  # NEW
        return self.k, self.v


# %%
# checkpoint 3
cache = SlidingWindowKVCache(window_size=3)
for x in [1.0, 2.0, 3.0, 4.0, 5.0]:
    k, v = cache.update(*tok(x))
    print(f"update({x}) -> k {show(k)}  shape {tuple(k.shape)}")


# %% [markdown]
# Every token is kept now, but the cache ignores its window and grows forever: this is the
# ordinary cache of lesson 0. Time to evict.
#
# > **Your turn, before you read on (15–30 minutes).** What is left is eviction: once the cache holds
# > more than `window_size` tokens, drop the oldest, and return what the cache holds *after* dropping.
# > Which end of the token axis holds the oldest token, and which one line of indexing keeps only the
# > newest `window_size`? Work it out yourself in
# > [exercises/02_sliding_window_cache.ipynb](../exercises/02_sliding_window_cache.ipynb): write the whole
# > class and run its check cell, which grades your cache against the library's on many shapes, dtypes and
# > lengths. Then come back and compare with step 4; step 5 shows what goes wrong if you return before
# > evicting.

# %% [markdown]
# ## Step 4 — Evict from the front by slicing
#
# After appending, if the cache holds more than `window_size` tokens, keep only the **last**
# `window_size`: `self.k[:, :, -window_size:]`. The oldest token sits at the front of the token
# axis, so it is the one that falls off. No index bookkeeping is needed: the slice *is* the
# eviction policy.

# %%
class SlidingWindowKVCache:

    def __init__(self, window_size: int):
        self.window_size = window_size
        self.k = None
        self.v = None

    def update(self, k_new, v_new):
        if self.k is None:
            self.k, self.v = k_new, v_new
        else:
            self.k = torch.cat([self.k, k_new], dim=2)
            self.v = torch.cat([self.v, v_new], dim=2)
        if self.k.shape[2] > self.window_size:  # NEW
            # NEW: keep the last W tokens
            self.k = self.k[:, :, -self.window_size:]
            self.v = self.v[:, :, -self.window_size:]  # NEW
        return self.k, self.v


# %%
# checkpoint 4
cache = SlidingWindowKVCache(window_size=3)
for x in [1.0, 2.0, 3.0, 4.0, 5.0]:
    k, v = cache.update(*tok(x))
    print(f"update({x}) -> k {show(k)}  v {show(v)}")

# %% [markdown]
# From the fourth token on, the cache holds exactly three tokens, and the oldest one leaves first.
#
# **A subtlety worth knowing (and worth saying in an interview): the slice does not copy.**
# `self.k[:, :, -W:]` is a *view*: a new tensor header pointing into the memory that `torch.cat`
# just allocated for $W + 1$ tokens, starting one token in. Slicing is O(1). The O(W) cost is the
# `torch.cat`, which allocates a new tensor and copies all stored tokens plus the new one into it,
# **at every step**. Lesson 3 measures that cost and removes it with a ring buffer.

# %%
k = cache.k
# head_dim = 1: one number per token
storage_tokens = k.untyped_storage().nbytes() // k.element_size()
print("tokens visible in cache.k:      ", k.shape[2])
print("tokens in the memory behind it: ", storage_tokens)
print("cache.k starts at element       ", k.storage_offset(), "of that memory")

# %% [markdown]
# You may meet a comment on this line claiming that the slice "is O(window_size) to copy but keeps
# the cache tensor contiguous". Neither half holds. The slice copies nothing, as just shown. And
# with more than one head it is *not* contiguous: each head's rows skip over the evicted token. It
# is the **next** `torch.cat` that copies the whole window into a fresh tensor of $W + 1$ tokens,
# which is then sliced again.

# %%
two_heads = SlidingWindowKVCache(window_size=3)
for x in [1.0, 2.0, 3.0, 4.0]:
    # 2 heads, same scalar key in both
    k_new = torch.full((1, 2, 1, 1), x, device=dev)
    two_heads.update(k_new, 10 * k_new)
print("2 heads, keys of head 0:", show(two_heads.k[:, :1]), "| contiguous?",
      two_heads.k.is_contiguous())
print("strides (batch, heads, tokens, head_dim):", two_heads.k.stride(),
      "- a head is 4 tokens apart, not 3")


# %% [markdown]
# ## Step 5 — Return what the cache holds
#
# `update` returns `self.k, self.v` **after** eviction. The caller attends the new token's query
# over exactly these keys, so returning anything else changes the model. A tempting mistake is to
# return the concatenated tensor before evicting it. Here is that mistake as a sibling class: the
# query at position 3 (key `4.0`) would then see the key at position 0, which the window rule
# $i - W < j \le i$ forbids.

# %%
class EvictsAfterReturning(SlidingWindowKVCache):
    # the bug: hand the caller the appended tensors, evict only for next time
    def update(self, k_new, v_new):
        if self.k is None:
            k, v = k_new, v_new
        else:
            k, v = torch.cat([self.k, k_new], dim=2), torch.cat([self.v, v_new], dim=2)
        self.k, self.v = k[:, :, -self.window_size:], v[:, :, -self.window_size:]
        return k, v


# checkpoint 5
W = 3
for cls in [SlidingWindowKVCache, EvictsAfterReturning]:
    cache = cls(window_size=W)
    for x in [1.0, 2.0, 3.0, 4.0]:
        k, v = cache.update(*tok(x))
    # key x. is the token at position x - 1
    positions = [int(x) - 1 for x in show(k)]
    ok = [bool(allowed(3, j, W)) for j in positions]
    print(f"{cls.__name__:>21}: query 3 attends positions {positions},")
    print(f"{'':>23}allowed: {ok}")


# %% [markdown]
# ## Step 6 — Check the ceiling for any number of steps
#
# The whole point is a **flat memory ceiling**: however long generation runs, the cache never
# holds more than `window_size` tokens. We check it over a thousand steps of realistic shape
# (batch 2, 4 heads, `head_dim` 16), next to the unbounded cache of step 3.

# %%
class Unbounded(SlidingWindowKVCache):
    # step 3's cache: append, never evict
    def update(self, k_new, v_new):
        self.k = k_new if self.k is None else torch.cat([self.k, k_new], dim=2)
        self.v = v_new if self.v is None else torch.cat([self.v, v_new], dim=2)
        return self.k, self.v


W, steps = 64, 1000
windowed, unbounded = SlidingWindowKVCache(W), Unbounded(W)
lengths = {"windowed": [], "unbounded": []}
for _ in range(steps):
    k_new = torch.randn(2, 4, 1, 16, device=dev)
    v_new = torch.randn(2, 4, 1, 16, device=dev)
    lengths["windowed"].append(windowed.update(k_new, v_new)[0].shape[2])
    lengths["unbounded"].append(unbounded.update(k_new, v_new)[0].shape[2])

for name, n in lengths.items():
    print(f"{name:>9}: length after 10, 100, 1000 updates = {n[9]}, {n[99]}, {n[999]};"
          f" longest {max(n)}")
print(f"ceiling W = {W} holds at every step:", all(n <= W for n in lengths["windowed"]))
print("equals min(t, W) at every step:",
      lengths["windowed"] == [min(t, W) for t in range(1, steps + 1)])


# %% [markdown]
# ## A check against the library
#
# Our class is step 4's (steps 5 and 6 only added siblings). The library's `swkv_teach.SlidingWindowKVCache` has the same API and, for one-token updates, the
# same behaviour; it adds argument checks, prompt chunks, and the shared cache interface
# (`positions`, `seen`, `nbytes`, `reset`) that later lessons use. On a random stream both must
# return identical tensors at every step (`torch.equal`: same shape, bit for bit).

# %%
W, steps = 5, 40
ours, theirs = SlidingWindowKVCache(W), swkv_teach.SlidingWindowKVCache(W)
equal = []
for _ in range(steps):
    k_new = torch.randn(2, 3, 1, 4, device=dev)
    v_new = torch.randn(2, 3, 1, 4, device=dev)
    k1, v1 = ours.update(k_new, v_new)
    k2, v2 = theirs.update(k_new, v_new)
    equal.append(torch.equal(k1, k2) and torch.equal(v1, v2))
print(f"{steps} steps compared, identical at every step: {all(equal)}")
print("library cache:", theirs)

# %% [markdown]
# ## What to remember
#
# * Tokens live on dim 2 of `(batch, heads, tokens, head_dim)`; append with `torch.cat(dim=2)`.
# * `None` until the first update: the shape, dtype and device come from the first token.
# * Evict by slicing the last `W`; return what the cache holds *after* evicting.
# * The slice is a free view; the `torch.cat` copies the whole window at every step: O(W) time and
#   a fresh allocation per token (lesson 3).
#
# If you skipped it, do [exercises/02_sliding_window_cache.ipynb](../exercises/02_sliding_window_cache.ipynb)
# now: its checks try shapes, dtypes and lengths this lesson did not.
#
# ## Going further
#
# * Prefill hands the cache a whole chunk of `c` tokens at once. What must `update` return so that the
#   chunk's *first* query still sees its $W - 1$ predecessors, and what should it keep afterwards? Write it,
#   then compare with the chunk contract on the [cheat sheet](../docs/cheatsheet.md) (lesson 3 uses it).
# * The cat allocates a fresh $W + 1$-token tensor every step. Design a cache that preallocates `2W` slots
#   and copies only once every `W` steps. What is its amortised cost per token, and what does it return?
#   Lesson 3's ring buffer takes the idea to its end.
