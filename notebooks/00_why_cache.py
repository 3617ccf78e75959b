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
# # Lesson 0 — Why a KV cache, and why a *sliding-window* one
#
# A decoder-only language model writes one token at a time. At every step the newest token's
# query looks back at the **keys** and **values** of all earlier tokens. This lesson answers three
# questions, each with a small experiment you can rerun and change:
#
# 1. **Why cache at all?** Recomputing every earlier key and value at each step is wasted work.
# 2. **Why is an ordinary cache a problem?** It grows by a fixed number of bytes per token, forever.
# 3. **What does sliding-window attention let us forget?** Everything older than the window, which
#    is what makes a *bounded* cache possible — the subject of the next lessons.
#
# Everything here imports the course library `swkv_teach`; nothing from it is redefined.

# %%
# %matplotlib inline
import torch
import matplotlib.pyplot as plt
from torch.utils.flop_counter import FlopCounterMode

import swkv_teach
from swkv_teach import attention, make_cache, sliding_window_mask
from swkv_teach.masks import allowed

torch.manual_seed(0)
dev = swkv_teach.device()  # cuda, then mps, then cpu

# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. Recomputing versus caching
#
# Take one attention layer with model width `d` and a single head (enough to see the idea). At decode
# step `t` the new token `x_t` needs
#
# * its query `q_t = x_t W_q`,
# * the keys `K = X_{\le t} W_k` and values `V = X_{\le t} W_v` of **all** `t + 1` tokens so far,
# * one row of attention: `softmax(q_t Kᵀ / √d) V`.
#
# Without a cache we recompute `K` and `V` for every earlier token at every step. But `W_k` and
# `W_v` do not change while we decode, and token 3's key is the same at step 10 as it was at step 3.
# So we compute each token's key and value **once**, keep them, and append one row per step.
# That store is the **KV cache**.
#
# Below, a tiny decoder layer runs both ways. PyTorch's `FlopCounterMode` counts the
# floating-point operations of every matrix multiply, so the numbers are exact and machine-independent.

# %%
d, steps = 64, 64                                  # model width, tokens to decode
W_q, W_k, W_v = (torch.randn(d, d, device=dev) / d**0.5 for _ in range(3))
X = torch.randn(steps, d, device=dev)              # stand-ins for the token embeddings


def decode_recompute(X):
    outs = []
    for t in range(len(X)):
        q = X[t : t + 1] @ W_q                     # (1, d)
        K, V = X[: t + 1] @ W_k, X[: t + 1] @ W_v  # (t + 1, d): every key and value again
        outs.append(attention(q, K, V))
    return torch.cat(outs)


def decode_cached(X):
    outs, K, V = [], X[:0] @ W_k, X[:0] @ W_v      # empty (0, d) caches
    for t in range(len(X)):
        x = X[t : t + 1]
        q = x @ W_q
        K = torch.cat([K, x @ W_k])                # only the new token's key and value
        V = torch.cat([V, x @ W_v])
        outs.append(attention(q, K, V))
    return torch.cat(outs)


flops = {}
for name, fn in [("recompute", decode_recompute), ("cached", decode_cached)]:
    with FlopCounterMode(display=False) as counter:
        out = fn(X)
    flops[name] = counter.get_total_flops()
    print(f"{name:>9}: {flops[name] / 1e6:6.2f} MFLOPs for {steps} tokens")

print("same outputs:", torch.allclose(decode_recompute(X), decode_cached(X), atol=1e-5))
print(f"the cache saves {flops['recompute'] / flops['cached']:.1f}x the work")


# %% [markdown]
# The same answer for a fraction of the work. Where does the difference come from? Per step, a
# matrix multiply of an `(n, d)` by a `(d, d)` matrix costs `2·n·d²` FLOPs:
#
# | at step `t` (t + 1 tokens so far) | recompute            | cached          |
# |-----------------------------------|----------------------|-----------------|
# | query projection                  | `2d²`                | `2d²`           |
# | key and value projections         | `2 · 2(t+1)d²`       | `2 · 2d²`       |
# | scores `q Kᵀ` and weighted sum    | `2 · 2(t+1)d`        | `2 · 2(t+1)d`   |
#
# Summed over `N` steps, recomputing costs `O(N² d²)` and caching `O(N d² + N² d)`. The
# attention term, `O(t·d)` per step, remains either way: every step still *reads* every cached key.
# The formula reproduces the counter exactly:

# %%
def step_flops(t, d, cached):
    n = 1 if cached else t + 1                     # tokens whose key/value we project
    return 2 * d * d + 2 * (2 * n * d * d) + 2 * (2 * (t + 1) * d)


for name, cached in [("recompute", False), ("cached", True)]:
    total = sum(step_flops(t, d, cached) for t in range(steps))
    print(f"{name:>9}: formula {total:,}  counter {flops[name]:,}  match: {total == flops[name]}")

# %%
# the per-step cost at a 7B-like width (d = 4096): a line against a flat floor
t = torch.arange(0, 8192, 64)
fig, ax = plt.subplots(figsize=(6, 3), dpi=90)
ax.plot(t, [step_flops(int(s), 4096, False) / 1e9 for s in t], label="recompute K, V every step")
ax.plot(t, [step_flops(int(s), 4096, True) / 1e9 for s in t], label="KV cache")
ax.set(xlabel="decode step t", ylabel="GFLOPs per step (one layer)", yscale="log")
ax.legend()
plt.show()
plt.close(fig)

# %% [markdown]
# ## 2. The price: a cache that grows by a fixed amount per token
#
# Caching trades compute for memory. Every token leaves behind one key and one value **in every
# layer** and **for every key/value head**. For Mistral 7B:
#
# * 32 layers,
# * 8 key/value heads (grouped-query attention: its 32 query heads share 8 KV heads),
# * head dimension 128,
# * fp16, 2 bytes per number.

# %%
layers, kv_heads, head_dim, bytes_per_value = 32, 8, 128, 2   # Mistral 7B in fp16
per_token = 2 * layers * kv_heads * head_dim * bytes_per_value  # 2: one key and one value
print(f"{per_token:,} bytes per token = {per_token / 1024:.0f} KiB")

# %% [markdown]
# **128 KiB per token.** Let the library confirm the arithmetic for one layer: feed a cache
# (`make_cache("naive", W)`, the plain sliding-window cache we build in lesson 1) ten tokens of
# Mistral's shape `(batch=1, kv_heads=8, tokens=1, head_dim=128)` in fp16 and ask for its `nbytes`.

# %%
W_small = 4
cache = make_cache("naive", W_small)
for _ in range(10):
    k = torch.randn(1, kv_heads, 1, head_dim, dtype=torch.float16, device=dev)
    cache.update(k, torch.randn_like(k))
print("tokens stored:", len(cache), " tokens seen:", cache.seen)
per_layer_token = cache.nbytes // len(cache)
print(f"bytes per token per layer: {per_layer_token:,}; times {layers} layers = {per_layer_token * layers:,}")

# %% [markdown]
# An ordinary (unbounded) cache holds every token it has seen, so its size is
# `tokens × 128 KiB`: 1 GiB at 8k tokens, 4 GiB at 32k, **per sequence**. Serve 32 sequences at
# once and multiply by 32. A sliding-window cache with Mistral's window `W = 4096` stops growing at
# `4096 × 128 KiB = 512 MiB`.

# %%
W_mistral = 4096
tokens = torch.arange(0, 32_769, 256)
unbounded = tokens * per_token / 2**30
windowed = tokens.clamp(max=W_mistral) * per_token / 2**30

fig, ax = plt.subplots(figsize=(6, 3), dpi=90)
ax.plot(tokens, unbounded, label="ordinary cache (keeps everything)")
ax.plot(tokens, windowed, label=f"sliding window, W = {W_mistral}")
ax.set(xlabel="tokens generated", ylabel="KV cache, GiB per sequence",
       title="Mistral 7B shape, fp16: 128 KiB per token")
ax.legend()
plt.show()
plt.close(fig)

for n in (4096, 8192, 32768):
    print(f"{n:>6} tokens: ordinary {n * per_token / 2**30:5.2f} GiB,"
          f" windowed {min(n, W_mistral) * per_token / 2**30:5.2f} GiB")

# %% [markdown]
# ## 3. What sliding-window attention lets us forget
#
# In **sliding-window attention** (SWA) the query at position `i` attends only to the last `W`
# keys, itself included. The course uses one convention everywhere, written once in
# `swkv_teach.masks`:
#
# > query `i` attends key `j` exactly when `i - W < j <= i`.
#
# For `W = 3`, query 5 sees keys 3, 4 and 5; key 2 is out (`5 - 3 < 2` is false). The library's
# `sliding_window_mask(T, W)` turns the rule into a `(T, T)` boolean matrix, True where attention is
# allowed. Rows are queries and columns are keys:

# %%
print(sliding_window_mask(6, 3).int())
print("query 5 sees key 3:", bool(allowed(5, 3, 3)), "| key 2:", bool(allowed(5, 2, 3)))

# %% [markdown]
# Next to ordinary causal attention, the sliding window is a **band** of width `W` along the
# diagonal. Mistral uses `W = 4096`; here `W = 4` on 16 tokens so you can count the squares.

# %%
T, W = 16, 4
causal = torch.ones(T, T, dtype=torch.bool).tril()
band = sliding_window_mask(T, W)

fig, axes = plt.subplots(1, 2, figsize=(7, 3.4), dpi=90)
for ax, m, title in [(axes[0], causal, "causal: all earlier keys"), (axes[1], band, f"sliding window, W = {W}")]:
    ax.imshow(m, cmap="Blues", vmin=0, vmax=1.3)
    ax.set(title=title, xlabel="key position j", ylabel="query position i")
plt.tight_layout()
plt.show()
plt.close(fig)

print("keys per query, causal:", causal.sum(1).tolist())
print("keys per query, window:", band.sum(1).tolist())

# %% [markdown]
# Read the band by **columns**. Key `j` is needed by queries `j, j + 1, …, j + W - 1` and by
# nobody after that. Once the model has produced the query at position `j + W - 1`, key `j` is
# dead for good. At any moment only the **last `W` keys** can ever be looked at again, so a cache
# may keep those and throw the rest away. The mask proves it column by column:

# %%
last_reader = [int(band[:, j].nonzero().max()) for j in range(T - W + 1)]
print("last query that reads key j:", last_reader)
print("equals j + W - 1 for every j:", last_reader == [j + W - 1 for j in range(T - W + 1)])

# %% [markdown]
# Two remarks, both good interview material:
#
# * **Forgetting is exact, not an approximation.** A model *trained* with a window never uses
#   keys outside it, so a cache that drops them changes nothing. (Dropping keys from a model
#   trained with full attention *is* an approximation; lesson 5's attention sinks exist because of
#   that.)
# * **Information still travels further than `W`.** Layer 2's key at position `j` already mixes
#   layer 1's values from `j - W + 1 … j`. After `L` layers a token can be influenced by roughly
#   `L × W` earlier tokens: 32 × 4096 ≈ 131k for Mistral 7B.
#
# **Next:** lesson 1 builds the bounded cache, `SlidingWindowKVCache`, one step at a time.
