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
# # Lesson 5 — Eviction policies: LRU, the window, and attention sinks
#
# **Time:** about 80 minutes for the lesson, plus 20–35 for [exercise 06](../exercises/06_lru_cache.ipynb) and 25–45 for [exercise 07](../exercises/07_sink_cache.ipynb). **You need:** lessons 1–4 (the ring buffer, positions, the trained
# decoder and RoPE).
#
# **By the end you will be able to**
#
# * tell an LRU cache from a sliding window, and show exactly when they part ways;
# * find and fix the five bugs of a published attention demo, and explain each;
# * build attention sinks on a ring buffer and say what a sink's position means under RoPE;
# * judge an eviction policy the only reliable way: by measuring it on the model.
#
# A sliding window evicts by **age**: when token `p` arrives, token $p - W$ leaves, whatever
# happened to it. Other rules are possible, and two come up again and again:
#
# * **LRU** (least recently used), as in the blog post behind this course, "Hands-On Build Guide:
#   Sliding-Window Attention KV Cache with LRU Eviction", which builds its "sliding-window KV cache" on an
#   `OrderedDict`. It is a fine cache, and not a sliding window: it evicts by **use**.
# * **Attention sinks** (StreamingLLM, Xiao et al. 2023): keep the first few tokens forever, plus
#   the last `W`.
#
# This lesson fixes the blog's demo, shows exactly how LRU drifts away from sliding-window
# attention as soon as anything *reads* the cache, builds sinks, and tries sinks on the trained
# model of lesson 4, with an honest result.
#
# Window convention (`swkv_teach.masks`): query `i` attends key `j` when $i - W < j \le i$; with `S`
# sinks, also when $j < S$. Terms: [glossary](../docs/glossary.md); sources:
# [references](../docs/references.md).

# %%
# %matplotlib inline
import math

import numpy as np
import torch
import torch.nn.functional as F
import matplotlib.pyplot as plt
from IPython.display import display

import swkv_teach
from swkv_teach import (LRUKVCache, SinkKVCache, attention, attention_with_cache,
                        cached_attention, sliding_window_attention)
from swkv_teach.plots import plot_comparison
from swkv_teach.trace import record

torch.manual_seed(0)
# tiny tensors and a tiny model: one thread is as fast, and steadier
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
dev = swkv_teach.device()


def randn(*shape, seed):
    # drawn on the CPU from its own seed, then moved: the same numbers on every device
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dev)


# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. The blog's cache is an LRU cache
#
# The post's class is called `SlidingWindowKVCache`, but look at its two methods: `put(token_id,
# key, value)` inserts and evicts the least recently *used* entry; `get(token_id)` returns an entry
# and **promotes** it to most recently used. That is LRU. The library keeps it, with its API, as
# `swkv_teach.LRUKVCache`, and adds `peek`, a read that does *not* promote.

# %%
lru = LRUKVCache(3)
for i in range(3):
    lru.put(i, f"k{i}", f"v{i}")
print("after put 0, 1, 2:  ", lru.ids(), "(least recently used first)")
lru.get(0)
print("after get(0):       ", lru.ids(), "(0 promoted)")
lru.put(3, "k3", "v3")
print("after put(3):       ", lru.ids(), "(1 evicted, not 0)")
lru.peek(2)
print("after peek(2):      ", lru.ids(), "(peek changes nothing)")

# %% [markdown]
# With **only** `put` calls, the least recently used entry is the least recently *inserted*: LRU is
# FIFO, and FIFO with one token per step is exactly the sliding window. That is why the blog's
# sanity check (8 puts into a cache of 5, tokens 3–7 survive) passes. The trouble starts with `get`.
#
# ## 2. Five bugs in the blog's attention demo
#
# The post wires the cache into attention with `attention_with_cache(query, cache, max_window)`,
# on top of its own `scaled_dot_product_attention(query, keys, values, mask)`. Together they have
# five bugs; each is one line, and each teaches something.
#
# **Bug 1: `np.softmax` does not exist.** NumPy has no softmax, so the demo cannot have run:

# %%
print("np.softmax exists:", hasattr(np, "softmax"))

# %% [markdown]
# **Bug 2: the transpose.** Scores need `q @ kᵀ`, i.e. keys with their **last two axes swapped**.
# The demo writes `keys.transpose(*range(ndim - 2, ndim), *range(ndim - 2))`, which moves the last
# two axes to the front *without* swapping them. For the demo's 2-D keys `(W, head_dim)` that is the
# identity (no transpose at all, so `q @ k` fails unless `W == head_dim`, and then silently computes
# nonsense); for 4-D keys it scrambles the batch and head axes:

# %%
for shape in [(5, 8), (2, 3, 5, 8)]:
    keys = np.zeros(shape)
    blog = keys.transpose(*range(keys.ndim - 2, keys.ndim), *range(keys.ndim - 2)).shape
    print(f"keys {shape}: blog's transpose -> {blog}, wanted"
          f" {np.swapaxes(keys, -1, -2).shape}")

# %% [markdown]
# **Bug 3: no scaling.** The demo's comment says `scores = Q @ K^T / sqrt(dk)`; the line under it
# computes `query @ keys...` and never divides. Dot products of `d`-dimensional vectors with unit-
# variance entries have a standard deviation of about $\sqrt{d}$, so without the division the scores grow
# with the head size and the softmax piles the weight onto one key (in training, its gradients
# vanish).
# Dividing by $\sqrt{d}$ keeps the scores' spread near 1 whatever `d` is. With the transpose fixed, $d = 64$:

# %%
g = torch.Generator().manual_seed(0)
d = 64
q, keys, values = (torch.randn(d, generator=g), torch.randn(8, d, generator=g),
                   torch.randn(8, d, generator=g))
# what the demo's code computes
unscaled = torch.softmax(keys @ q, dim=-1)
scaled = torch.softmax(keys @ q / math.sqrt(d), dim=-1)  # what its comment says
print(f"score spread (std): unscaled {(keys @ q).std().item():.1f}, scaled"
      f" {(keys @ q / math.sqrt(d)).std().item():.1f}")
print(f"largest attention weight: unscaled {unscaled.max().item():.2f}, scaled"
      f" {scaled.max().item():.2f}")
print("scaled version == swkv_teach.attention (to 1e-6):",
      torch.allclose(scaled @ values,
                     attention(q[None], keys, values)[0], atol=1e-6))

# %% [markdown]
# **Bug 4: `range(max_window)` looks up the oldest ids.** The loop reads ids `0 .. max_window - 1`.
# Token ids here are positions, so those are the *first* tokens of the sequence, the very ones
# eviction removed. After 8 tokens in a cache of 5, only 3 and 4 are found; 5, 6, 7 (the newest)
# are never read.
#
# **Bug 5: `get` promotes what it reads.** Each lookup moves the id to the most-recent end. So the
# demo, just by *reading*, changes what the next `put` evicts: after it, token 5 is evicted next,
# not token 3.

# %%
lru = LRUKVCache(5)
for i in range(8):
    lru.put(i, f"k{i}", f"v{i}")
print("stored:              ", lru.ids())
# the blog's loop, lookups only
found = [i for i in range(5) if lru.get(i) is not None]
print("blog's loop finds:   ", found)
print("order after reading: ", lru.ids())
lru.put(8, "k8", "v8")
print("after put(8):        ", lru.ids(),
      "-> 5 was evicted; 3 and 4 outlive the window")

# %% [markdown]
# **The fix**: read every stored entry in the cache's own order with `peek` (no promotion), stack
# keys and values, swap the last two axes of the keys, scale, and use `torch.softmax`. Written out:

# %%
def attention_with_cache_fixed(query, cache):
    """One query (d,) over every entry of an LRU cache whose keys and values are (d,)
    tensors."""
    entries = [cache.peek(i) for i in cache.ids()]  # all stored ids, no promotion
    if not entries:
        return torch.zeros_like(query)
    keys = torch.stack([k for k, _ in entries])  # (n, d)
    values = torch.stack([v for _, v in entries])  # (n, d)
    weights = torch.softmax(keys @ query / math.sqrt(query.shape[-1]), dim=-1)  # (n,)
    return weights @ values  # (d,)


# %% [markdown]
# The library's `swkv_teach.attention_with_cache` is the same (it also accepts non-tensor entries).
# Checked against the full-sequence oracle, against the library's, and the read leaves the cache's
# order alone:

# %%
W, T, D = 5, 8, 4
Q, K, V = (randn(1, 1, T, D, seed=1), randn(1, 1, T, D,
                                            seed=2), randn(1, 1, T, D, seed=3))
lru = LRUKVCache(W)
for t in range(T):
    lru.put(t, K[0, 0, t], V[0, 0, t])
before = lru.ids()
# query T-1 over the cache
out = attention_with_cache_fixed(Q[0, 0, -1], lru)
# row T-1 of the no-cache oracle
oracle = sliding_window_attention(Q, K, V, W)[0, 0, -1]
print("fixed demo == oracle (to 1e-5):", torch.allclose(out, oracle, atol=1e-5))
print("fixed demo == swkv_teach.attention_with_cache (to 1e-6):",
      torch.allclose(out, attention_with_cache(Q[0, 0, -1], lru), atol=1e-6))
print("reading changed the order:", lru.ids() != before)

# %% [markdown]
# ## 3. Why promotion breaks sliding-window attention
#
# Fixing the demo does not make LRU a sliding window. Suppose anything reads an old token with
# `get` while decoding: a cache-hit counter, a debugging print, a "retrieval" feature, or the blog's
# own loop. Here token 0 is looked up once per step. Then
#
# * token 0 is promoted every step, so it **never leaves**, though the window moved past it long ago;
# * the cache still holds `W` entries, so to make room for 0 it evicts the oldest *other* token,
#   which the window says the query **must** see.
#
# Two errors at once: one key too many, one key missing. We decode 40 random tokens with $W = 6$
# through two LRU caches (one never read, one read with `get(0)` each step), attend each step's
# query over the cache with the fixed `attention_with_cache`, and compare with the oracle row.

# %%
W, T, D = 6, 40, 8
Q, K, V = (randn(1, 1, T, D, seed=4), randn(1, 1, T, D,
                                            seed=5), randn(1, 1, T, D, seed=6))
oracle = sliding_window_attention(Q, K, V, W)[0, 0]  # (T, D)

untouched, looked_up = LRUKVCache(W), LRUKVCache(W)
diff_untouched, diff_looked_up, outputs = [], [], []
for t in range(T):
    for cache in (untouched, looked_up):
        cache.put(t, K[0, 0, t], V[0, 0, t])
    # somebody reads token 0: it is promoted
    looked_up.get(0)
    a = attention_with_cache(Q[0, 0, t], untouched)
    b = attention_with_cache(Q[0, 0, t], looked_up)
    outputs.append(b)
    diff_untouched.append((a - oracle[t]).abs().max().item())
    diff_looked_up.append((b - oracle[t]).abs().max().item())

print("never read:   max |LRU - oracle| over all steps < 1e-5:"
      f" {max(diff_untouched) < 1e-5}")
print(
    f"get(0)/step:  steps 0..{W - 1} match (< 1e-5): {max(diff_looked_up[:W]) < 1e-5}")
print("              first divergent step:"
      f" {next(t for t, d in enumerate(diff_looked_up) if d > 1e-3)}")
print(
    f"              max |LRU - oracle| from step {W} on: {max(diff_looked_up[W:]):.2f}")
print(f"              every step from {W} on diverges (> 1e-3):"
      f" {min(diff_looked_up[W:]) > 1e-3}")
print("cache holds:", sorted(looked_up.ids()))
print(f"the window of query {T - 1} is", list(range(T - W, T)))

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.6, 3.4), dpi=DPI)
ax.axvspan(-0.5, W - 0.5, color="#EEEEEE", label="window not full yet")
ax.plot(diff_looked_up, marker=".", color="#D62728", label="LRU, get(0) every step")
ax.plot(diff_untouched, marker=".", color="#4C72B0", label="LRU, never read")
ax.set(xlabel="decode step (query position)", ylabel="max |output - oracle|",
       title=f"An LRU cache read at token 0 leaves the window (W={W})")
ax.legend(loc="upper left")
ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the read cache matches while the window is filling (token 0 is inside every window then) and
# diverges from step `W` on, at every step. It is not noise, and it has an exact description:
# the cache holds token 0 plus the last $W - 1$ tokens, so it computes sliding-window attention
# with window $W - 1$ **and one attention sink**. The oracle with those settings matches it:

# %%
accidental = sliding_window_attention(Q, K, V, W - 1, num_sinks=1)[0, 0]
print("LRU with get(0) == oracle with window W-1 and 1 sink (to 1e-5):",
      torch.allclose(torch.stack(outputs), accidental, atol=1e-5))

# %% [markdown]
# The same thing as pictures, from the library's recorder (`swkv_teach.trace.record`, which reads
# the real caches' contents after every step): rows are steps, columns tokens, blue = held. Red
# outlines mark cells that differ from the sliding window. The LRU cache read at token 0 and a sink
# cache with one sink and window $W - 1$ hold the same tokens at every step, so one picture of them
# suffices.

# %%
window6, lru_read = record("sliding", 6, 16), record("lru", 6, 16, access_pattern="0")
sinks5 = record("sinks", 5, 16, num_sinks=1)
same = all(set(lru_read[t].cached) == set(sinks5[t].cached) for t in range(16))
print("the LRU cache read at token 0 holds what a window of 5 with one sink holds,")
print("at every step:", same)
display(plot_comparison([window6, lru_read]))

# %% [markdown]
# The figure puts the window of 6 beside the LRU cache read at token 0, step by step: red outlines mark
# where they hold different tokens, from step 6 on, when LRU keeps token 0 and drops the oldest of the rest.
# What LRU holds instead is, at every step, a window of 5 plus one sink (printed above).

# %% [markdown]
# So an LRU cache is only a sliding window while nobody reads it. If you need lookups, read with
# `peek`, or drop LRU and evict by position: `RingBufferKVCache` cannot be talked out of its window.
#
# **Your turn:** [exercises/06_lru_cache.ipynb](../exercises/06_lru_cache.ipynb) has you build the
# LRU cache, promotion and all, and the grader checks the eviction order.
#
# ## 4. Attention sinks
#
# StreamingLLM (Xiao et al. 2023, arXiv:2309.17453) observed that trained models put a large share of attention on the **first few
# tokens**, whatever they say: softmax weights must sum to 1, and a head with nothing useful to
# look at parks the weight on tokens every query has always seen. Evict those and some heads lose
# their parking spot; quality drops sharply once the window slides past the start. The fix: keep
# the first `S` tokens forever (4 in the paper) plus the last `W`.
#
# `swkv_teach.SinkKVCache(num_sinks, window_size)` is the ring buffer with `S` slots pinned in front.
# Keys equal to their positions make its contents readable:

# %%
sinks = SinkKVCache(num_sinks=2, window_size=4)
for p in range(11):
    kv = torch.full((1, 1, 1, 1), float(p), device=dev)
    sinks.update(kv, kv)
print("slots (sinks first):", sinks.k_buf.flatten().int().tolist())
print("positions:          ", sinks.positions.tolist())
print("stored, in order:   ",
      sinks.stored_positions().tolist(), "| seen:", sinks.seen, "| capacity:",
      sinks.capacity)

# %% [markdown]
# Positions 0 and 1 stay in slots 0 and 1; positions 2, 3, … cycle through slots 2–5 (position `p` in
# slot $2 + (p - 2) \bmod 4$), so position 10 has just overwritten position 6 in slot 2.
#
# **Your turn:** [exercises/07_sink_cache.ipynb](../exercises/07_sink_cache.ipynb) has you build
# the sink cache on top of a ring buffer; the grader replays long streams against the oracle.
#
# Decode attention over this cache must equal the oracle with the rule
# `j <= i and (j < S or i - W < j)`. It is lesson 4's `attend_readable` with one more term in the mask; `cached_attention`
# (the library's, on PyTorch's fused kernel) takes `num_sinks` for it. Written out, for one head
# group:

# %%
def attend_with_sinks(q, k, v, q_pos, k_pos, W, S):
    """q (B, H, c, d); k, v (B, H, n, d) in any order; q_pos (c,), k_pos (n,) absolute
    positions."""
    i, j = q_pos[:, None], k_pos[None, :]
    allowed = (j <= i) & ((j < S) | (i - W < j))  # sinks, or inside the window
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(
        ~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v


S, W, T, D = 2, 4, 20, 8
Q, K, V = (randn(1, 2, T, D, seed=7), randn(1, 2, T, D,
                                            seed=8), randn(1, 2, T, D, seed=9))
oracle = sliding_window_attention(Q, K, V, W, num_sinks=S)
cache, worst = SinkKVCache(S, W), 0.0
for t in range(T):
    k, v = cache.update(K[:, :, t:t + 1], V[:, :, t:t + 1])
    q_pos = torch.tensor([t], device=dev)
    out = attend_with_sinks(Q[:, :, t:t + 1], k, v, q_pos, cache.positions.to(dev), W,
                            S)
    lib = cached_attention(Q[:, :, t:t + 1], k, v, q_pos, cache.positions, W, S)
    worst = max(worst, (out - oracle[:, :, t:t + 1]).abs().max().item(),
                (lib - out).abs().max().item())
print(f"sink cache == oracle with {S} sinks over {T} steps, written out and the")
print("library's (to 1e-5):", worst < 1e-5)

# %% [markdown]
# ### Keys after RoPE: what a sink's position means
#
# In this package keys are cached **after** rotary embedding, each rotated by its true absolute
# position. A sink keeps the rotation of position 0, so the query at position 10 000 sees it at
# distance 10 000. That is the exact rule `j < S or i - W < j`, and it is cheap: nothing is
# rotated twice.
#
# StreamingLLM does something else (Xiao et al. 2023, arXiv:2309.17453, §3.2): it assigns positions
# *inside the cache* ($0 \dots S + W - 1$), so keys are cached **before** RoPE and rotated on every
# step. Then the sink sits at distance at
# most $S + W - 1$ from any query, a distance the model knows from training. That changes the
# model's outputs (it is no longer plain sliding-window attention with sinks) and needs a cache
# that re-rotates keys each step.
#
# The difference matters for a model trained with a sliding window, like ours: during training no
# query past position 63 ever saw token 0, and no query ever saw any key at a distance of 64 or
# more.
#
# ## 5. Do sinks help our trained model?
#
# The experiment: the trained checkpoint of lesson 4 ($W = 64$), held-out text, and a cache too
# small for it, 16 tokens. Three ways to spend memory:
#
# * ring cache, window 16 (16 slots per layer),
# * sinks cache, 4 sinks + window 16 (20 slots),
# * sinks cache, 4 sinks + window 60 (64 slots, the memory of the trained window),
#
# against the ring cache with the trained window 64. Same loss as in lesson 4: next-character
# cross-entropy on 8 held-out pieces of 256 characters.

# %%
from swkv_teach.pretrained import load_pretrained
from swkv_teach.train import HELDOUT_FILES, read_stdlib

model, tok = load_pretrained(dev)
heldout, _ = read_stdlib(HELDOUT_FILES)
T, N = 256, 8
data = torch.tensor(tok.encode(heldout[:N * T + 1]), device=dev)
x, y = data[:-1].view(N, T), data[1:].view(N, T)


def loss_of(logits):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


settings = {
    "ring, W=64 (trained)": dict(cache="ring", window_size=64),
    "ring, W=16": dict(cache="ring", window_size=16),
    "sinks, S=4 + W=16": dict(cache="sinks", num_sinks=4, window_size=16),
    "sinks, S=4 + W=60": dict(cache="sinks", num_sinks=4, window_size=60)
}
losses = {
    name: loss_of(model.score(x, chunk_size=64, **kw))
    for name, kw in settings.items()
}

# %%
# NBVAL_IGNORE_OUTPUT
for name, value in losses.items():
    print(f"{name:<22} loss {value:.3f} nats/char")

# %%
print("sinks beat the plain small window:", losses["sinks, S=4 + W=16"]
      < losses["ring, W=16"])
print("sinks + W=60 beat the trained window at equal memory:",
      losses["sinks, S=4 + W=60"] < losses["ring, W=64 (trained)"])

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.6, 2.9), dpi=DPI)
names = list(losses)
ax.barh(names, [losses[n] for n in names],
        color=["#4C72B0", "#8DA0CB", "#DD8452", "#F4B183"])
for i, n in enumerate(names):
    ax.text(losses[n] + 0.03, i, f"{losses[n]:.3f}", va="center")
ax.set_xlim(0, max(losses.values()) * 1.18)
ax.invert_yaxis()
ax.set(xlabel="held-out loss (nats/char, lower is better)",
       title="On the W=64 model, sinks cost loss")
fig.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# The bars give the held-out loss of the $W = 64$ model through each cache, lower is better.

# %% [markdown]
# **Sinks do not help this model; they hurt it**, even with the full 64 slots (exact numbers above;
# they vary a little with your Python version's standard library). The reasons are in how the model
# was trained, and they are worth saying in an interview:
#
# * **It was trained with a sliding window and no sinks.** Past position 63, no query ever attended
#   to token 0 during training, so no head learnt to park weight there. A sink is an extra key
#   the model never learnt to ignore, and it takes softmax weight from the keys that matter.
# * **Positions are absolute.** The sink keys carry the rotation of positions 0–3, so a query at
#   position 200 meets them at distance ~200. The model never saw a distance over 63, and lesson 4
#   measured what keys well past the trained distances do to it: they raise the loss.
# * **It is a character model.** The first characters of a 256-character piece are rarely
#   informative about the 200th, and the small model had no reason to develop the
#   "attention sink" heads that large models grow.
#
# StreamingLLM's sinks help models trained with *full* attention, where every query saw the first
# tokens, and it re-rotates keys with cache positions to keep distances familiar. The general
# lesson: an eviction policy changes what the model sees, so measure it on the model, as here,
# rather than assuming a published trick transfers.
#
# ## What to remember
#
# * LRU evicts by use, the window by age. With no reads they coincide; one `get` on an old token
#   and LRU silently computes a different attention (here: window $W - 1$ plus a sink).
# * Read caches with `peek` when reading must not change eviction, and prefer eviction by position.
# * The blog demo's five bugs: `np.softmax`, a transpose that does not swap the last two axes, no
#   $1/\sqrt{d}$ scaling, lookups of the oldest ids, and promotion on read.
# * Sinks keep `S` first tokens plus the last `W`; with keys cached after RoPE they sit at their true
#   distance. Whether they help depends on how the model was trained: measure.
#
# ## Going further
#
# * StreamingLLM's position rule: cache keys *before* RoPE in a sink cache and rotate them with
#   their slot positions at every step (`rope` from lesson 4). Does the trained model's loss with
#   sinks improve? Why might a model trained with a window still not benefit?
# * Eviction by attention rather than by age: H2O (Zhang et al. 2023, arXiv:2306.14048) keeps the
#   keys with the largest accumulated attention. Sketch what the cache needs from the decoder to do
#   that, and why fused attention kernels make it awkward; then compare with
#   [lesson 8](08_which_tokens_to_keep.ipynb), which builds it.
#
# Next: [lesson 6](06_measuring.ipynb) measures time and memory.
