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
# # Lesson 0 — Why a KV cache, and why a *sliding-window* one
#
# **Time:** about 85 minutes for the lesson (the bandwidth section included), plus 10–20 for [exercise 01](../exercises/01_sliding_window_mask.ipynb), done where the lesson reaches it. **You need:**
# Python, PyTorch tensors and matrix products, and what attention computes, $\mathrm{softmax}(q K^\top / \sqrt{d}) V$ (Karpathy's
# "Let's build GPT" or d2l.ai's attention chapter is enough).
#
# **By the end you will be able to**
#
# 1. write down the cost of one decode step with and without a KV cache, and say which term dominates when;
# 2. compute a model's KV-cache bytes per token, and the memory of a hybrid local/global stack such as Gemma 3;
# 3. turn bytes into a floor on milliseconds per token on a given GPU, and say when the cache, not the
#    weights, sets the pace;
# 4. state the window convention $i - W < j \le i$, draw its band mask, and spot the off-by-one in Mistral's
#    reference code;
# 5. explain why a model trained with a window can forget older keys *exactly*.
#
# A decoder-only language model writes one token at a time. At every step the newest token's query looks
# back at the **keys** and **values** of earlier tokens. Everything here imports the course library
# `swkv_teach`; nothing from it is redefined. Unfamiliar term? See the [glossary](../docs/glossary.md); the
# formulas are on the [cheat sheet](../docs/cheatsheet.md), the sources in [references](../docs/references.md).

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
plt.rcParams.update({"figure.dpi": 110, "font.size": 11})  # legible figures

# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 1. Recomputing versus caching
#
# Take a tiny model: $L = 2$ attention layers of width `d`, one head each, with a residual connection
# (no MLP, to keep the count short). Layer `l` turns its input `X` into queries, keys and values,
# `Q = X W_q`, `K = X W_k`, `V = X W_v`, and each query attends to the keys at or before its position.
#
# **Without a cache**, generating token `t` means running the *whole model* over all $t + 1$ tokens again:
# layer 2's keys for earlier positions are computed from layer 1's outputs at those positions, so every
# layer recomputes every row, attention included. **With a cache**, each layer keeps the keys and values it
# has already computed (a token's key does not change: `W_k` is fixed and the model is causal), and a step
# computes only the new token's row.
#
# PyTorch's `FlopCounterMode` counts the floating-point operations of every matrix multiply, so the numbers
# below are exact and machine-independent.

# %%
d, L, steps = 64, 2, 48  # width, layers, tokens to decode
weights = [[torch.randn(d, d, device=dev) / d**0.5 for _ in range(3)] for _ in range(L)]
# stand-ins for the token embeddings
X = torch.randn(steps, d, device=dev)


def decode_no_cache(X):
    outs = []
    for t in range(len(X)):
        h = X[:t + 1]  # the whole prefix, every step
        causal = torch.ones(t + 1, t + 1, dtype=torch.bool, device=dev).tril()
        for W_q, W_k, W_v in weights:
            # (t + 1, d): every row again
            h = h + attention(h @ W_q, h @ W_k, h @ W_v, causal)
        outs.append(h[-1:])  # only the last row is new
    return torch.cat(outs)


def decode_cached(X):
    # empty (0, d) per layer
    outs, K, V = [], [X[:0] @ w[1] for w in weights], [X[:0] @ w[2] for w in weights]
    for t in range(len(X)):
        h = X[t:t + 1]  # only the new token
        for l, (W_q, W_k, W_v) in enumerate(weights):
            # append this token's key and value
            K[l] = torch.cat([K[l], h @ W_k])
            V[l] = torch.cat([V[l], h @ W_v])
            # (1, d): one query over t + 1 keys
            h = h + attention(h @ W_q, K[l], V[l])
        outs.append(h)
    return torch.cat(outs)


flops = {}
for name, fn in [("no cache", decode_no_cache), ("KV cache", decode_cached)]:
    with FlopCounterMode(display=False) as counter:
        fn(X)
    flops[name] = counter.get_total_flops()
    print(f"{name:>9}: {flops[name] / 1e6:7.2f} MFLOPs for {steps} tokens")

print("same outputs:", torch.allclose(decode_no_cache(X), decode_cached(X), atol=1e-4))
print(f"the cache saves {flops['no cache'] / flops['KV cache']:.0f}x the work")


# %% [markdown]
# Same answer, a fraction of the work. Where does the difference come from? A matrix product of an `(m, n)`
# by an `(n, p)` matrix costs $2 \cdot m \cdot n \cdot p$ FLOPs. At step `t` (so $t + 1$ tokens), per layer, with `n` the
# number of rows computed ($t + 1$ without a cache, `1` with one):
#
# | per layer, step `t`          | no cache ($n = t + 1$) | KV cache ($n = 1$) |
# |------------------------------|------------------------|--------------------|
# | projections `Q, K, V`        | $3 \cdot 2(t+1)d^2$         | $3 \cdot 2d^2$          |
# | scores `Q Kᵀ`, weighted sum  | $2 \cdot 2(t+1)^2d$         | $2 \cdot 2(t+1)d$      |
#
# Our toy computes the full $(t+1) \times (t+1)$ score matrix and masks half of it, as a plain masked matmul does;
# a causal kernel skips the masked half, $2(t+1)^2d$ instead of $4(t+1)^2d$. The formula reproduces the counter:

# %%
def step_flops(t, d, L, cached):
    n = 1 if cached else t + 1  # rows computed per layer
    return L * (3 * 2 * n * d * d + 2 * 2 * n * (t + 1) * d)


for name, cached in [("no cache", False), ("KV cache", True)]:
    total = sum(step_flops(t, d, L, cached) for t in range(steps))
    print(f"{name:>9}: formula {total:,}  counter {flops[name]:,}  match:"
          f" {total == flops[name]}")

# %% [markdown]
# ### The complete cost, and which term dominates when
#
# A real layer also has an output projection and an MLP. Call `P` its parameter count; every token that
# passes through it costs `2P` FLOPs of dense work. Attention costs $4 \cdot d$ FLOPs per (query, key) pair. Per
# layer, at step `t`:
#
# * **no cache**: $2P \cdot (t+1)$ dense plus $\approx 2 \cdot (t+1)^2 \cdot d$ attention (causal). Quadratic in `t` per step; summed
#   over `N` generated tokens, $O(N^2 \cdot P + N^3 \cdot d)$.
# * **KV cache**: `2P` dense plus $4 \cdot (t+1) \cdot d$ attention. Linear in `t` per step: the attention term *grows*.
# * **KV cache with a window `W`**: `2P` plus $4 \cdot \min(t+1, W) \cdot d$. Flat once $t \ge W$.
#
# For Mistral 7B ($d = 4096$, MLP width 14336) one layer holds $P \approx 218\,\text{M}$ parameters. Its attention uses
# **grouped-query attention** (GQA): the 32 query heads of 128 dimensions come in 8 groups of 4, and each
# group shares one key head and one value head. So `W_q` and `W_o` are $d \times d$, but `W_k` and `W_v` are only
# $d \times (8 \cdot 128)$, and (section 2) a token leaves 8 heads' keys and values behind, not 32:

# %%
d7, d_kv7, mlp7, W_mistral = 4096, 8 * 128, 14336, 4096
# W_q, W_k and W_v, W_o, SwiGLU MLP
P = d7 * d7 + 2 * d7 * d_kv7 + d7 * d7 + 3 * d7 * mlp7
print(
    f"P = {P / 1e6:.0f} M parameters per layer; 2P = {2 * P / 1e6:.0f} MFLOPs per token"
    " per layer\n")


def per_layer(t, mode):
    """(dense, attention) FLOPs of one layer at decode step t."""
    n = t + 1
    if mode == "no cache":
        # causal attention over the whole prefix
        return 2 * P * n, 2 * n * n * d7
    keys = n if mode == "KV cache" else min(n, W_mistral)
    return 2 * P, 4 * keys * d7


print(f"{'t':>7} | {'no cache':>24} | {'KV cache':>24} | {'KV cache, W = 4096':>24}")
for t in (1024, 4096, 32768, 131072):
    row = []
    for mode in ("no cache", "KV cache", "window"):
        dense, attn = per_layer(t, mode)
        row.append(
            f"{(dense + attn) / 1e9:9.1f} GF, {'attn' if attn > dense else 'dense':>5}"
            f" {max(dense, attn) / (dense + attn):4.0%}")
    print(f"{t:>7} | " + " | ".join(row))

# %% [markdown]
# Read the table as "GFLOPs per layer per token, and the term that dominates with its share":
#
# * Without a cache the dense recompute dominates until $t \approx P / d \approx 53\text{k}$ tokens, then attention's quadratic
#   term takes over. Either way a step costs roughly `t` times a cached one (1 000× at 1k tokens, 24 000× at 32k).
# * With a cache the dense `2P` dominates until $4 \cdot (t+1) \cdot d = 2P$, about 27k tokens; beyond that attention
#   does, and the step keeps getting dearer: 2.6 GFLOPs at 128k, six times the cost of the first step. The
#   cached cost is **not** flat.
# * With a window the attention term stops at $4 \cdot W \cdot d$, 15 % of the dense cost: the step cost is flat for ever.
#
# FLOPs are only half the story: a decode step must also *read* every cached key and value from memory, and
# on a GPU that read, not the arithmetic, usually sets the speed. Which brings us to bytes.
#
# ## 2. The price: a cache that grows by a fixed amount per token
#
# Caching trades compute for memory. Every token leaves behind one key and one value **in every layer** and
# **for every key/value head**. For Mistral 7B: 32 layers, 8 key/value heads (GQA, section 1: its
# 32 query heads share 8 KV heads), head dimension 128, fp16 (2 bytes per number).

# %%
layers, kv_heads, head_dim, bytes_per_value = 32, 8, 128, 2  # Mistral 7B in fp16
# 2: one key and one value
per_token = 2 * layers * kv_heads * head_dim * bytes_per_value
print(f"{per_token:,} bytes per token = {per_token / 1024:.0f} KiB")

# %% [markdown]
# **128 KiB per token.** Let the library confirm the arithmetic for one layer: feed a cache
# (`make_cache("naive", W)`, the plain sliding-window cache we build in lesson 1) ten tokens of Mistral's
# shape `(batch=1, kv_heads=8, tokens=1, head_dim=128)` in fp16 and ask for its `nbytes`.

# %%
W_small = 4
cache = make_cache("naive", W_small)
for _ in range(10):
    k = torch.randn(1, kv_heads, 1, head_dim, dtype=torch.float16, device=dev)
    cache.update(k, torch.randn_like(k))
print("tokens stored:", len(cache), " tokens seen:", cache.seen)
per_layer_token = cache.nbytes // len(cache)
print(f"bytes per token per layer: {per_layer_token:,}; times {layers} layers ="
      f" {per_layer_token * layers:,}")

# %% [markdown]
# An ordinary (unbounded) cache holds every token it has seen, so its size is $\text{tokens} \times 128\,\text{KiB}$: 1 GiB at
# 8k tokens, 4 GiB at 32k, **per sequence**. Serve 32 sequences at once and multiply by 32. A sliding-window
# cache with Mistral's window $W = 4096$ stops growing at $4096 \times 128\,\text{KiB} = 512\,\text{MiB}$.

# %%
tokens = torch.arange(0, 32_769, 256)
fig, ax = plt.subplots(figsize=(6.5, 3.4))
ax.plot(tokens, tokens * per_token / 2**30, label="ordinary cache (keeps everything)")
ax.plot(tokens,
        tokens.clamp(max=W_mistral) * per_token / 2**30,
        label=f"sliding window, W = {W_mistral}")
ax.set(xlabel="tokens generated", ylabel="KV cache, GiB per sequence", ylim=(0, None),
       title="Mistral 7B shape, fp16: 128 KiB per token")
ax.grid(alpha=0.3)
ax.legend()
plt.show()
plt.close(fig)

for n in (4096, 8192, 32768):
    print(f"{n:>6} tokens: ordinary {n * per_token / 2**30:5.2f} GiB,"
          f" windowed {min(n, W_mistral) * per_token / 2**30:5.2f} GiB")

# %% [markdown]
# In the figure, the ordinary cache grows by 128 KiB with every token, without end; the windowed cache stops
# growing at $W = 4096$ tokens, half a GiB per sequence.

# %% [markdown]
# ### Bytes into time: a floor on milliseconds per token
#
# Now the bytes a decode step must **read**. To produce one token per sequence, the GPU reads every weight
# once (shared by all `b` sequences of the batch) and every sequence's cached keys and values. At batch 1 a
# step does 2 FLOPs per weight it reads, far below what a GPU can compute per byte, so decode is
# **memory-bound**: the step cannot be faster than
#
# > $(\text{weight bytes} + b \times \text{KV bytes per sequence}) / \text{memory bandwidth}$.
#
# That is a floor, not a prediction: real kernels reach only part of the peak bandwidth (measure yours),
# and at large batches the arithmetic catches up with the reading. Mistral 7B in fp16 reads 14.2 GB of weights per step: every layer's, the output head's, and one row of the
# input embedding per token (a lookup, not a read of the 32,000-row table; the whole model is 14.5 GB). Bandwidths are the
# vendors' data-sheet peaks ([references](../docs/references.md#gpus-memory-bandwidth)):

# %%
vocab7 = 32_000
# 32 layers, the output head, one embedding row (b rows at batch b: 8 KiB each, left
# out), fp16
weight_bytes = (layers * P + vocab7 * d7 + d7) * bytes_per_value
gpus = {
    "T4": (320e9, 16e9),
    "A100 80GB": (2039e9, 80e9),
    "H100 SXM": (3350e9, 80e9),
    "H200": (4800e9, 141e9)
}


def step_ms(gpu, context, batch, window=None):
    """Memory-bound floor (ms per decode step) and whether weights + caches fit in the
    GPU's memory."""
    bandwidth, capacity = gpus[gpu]
    kv = batch * per_token * (context if window is None else min(context, window))
    return (weight_bytes + kv) / bandwidth * 1e3, weight_bytes + kv <= capacity


print(f"weights: {weight_bytes / 1e9:.1f} GB; KV cache: {per_token / 1024:.0f} KiB per"
      " token per sequence\n")
print(f"{'':>9} {'':>8} {'context':>8} |" + "".join(f" {g:>11}" for g in gpus))
for batch in (1, 32):
    for context in (1_024, 32_768, 131_072):
        for label, window in (("full", None), ("W=4096", W_mistral)):
            if window is not None and context <= window:
                # the window changes nothing below W tokens
                continue
            cells = []
            for g in gpus:
                ms, fits = step_ms(g, context, batch, window)
                cells.append(f"{ms:>8.1f} ms" + ("*" if not fits else " "))
            print(f"batch {batch:>3} {label:>8} {context:>8} | " + " ".join(cells))

# %% [markdown]
# Read it row by row (ms per step; each step gives every sequence of the batch one token; a `*` after a
# time means weights plus caches exceed the GPU's memory, so that cell is arithmetic, not a runnable
# setting):
#
# * At batch 1 and short contexts the weights are everything: about 3 ms a token on an H200, 45 on a T4.
# * The KV cache takes over when $b \times \text{tokens} \times 128\,\text{KiB}$ passes the weights' 14.2 GB, at $b \times \text{tokens} \approx 108\text{k}$:
#   one sequence at 128k tokens, or 32 sequences at 3.5k each.
# * Past that point the window saves **time**, not only memory: at batch 32 and 32k tokens a full cache
#   makes every step read 137 GB more than the weights, the window reads 17 GB; the floor falls about 5x
#   on every GPU, and the same batch fits on one 80 GB GPU.

# %%
contexts = torch.arange(1_024, 131_073, 1_024)
fig, ax = plt.subplots(figsize=(6.8, 3.6))
for batch, style in ((1, "-"), (8, "--")):
    for label, window, color in (("full cache", None, "#d62728"),
                                 (f"window W = {W_mistral}", W_mistral, "#2171b5")):
        ms = [step_ms("H100 SXM", int(c), batch, window)[0] for c in contexts]
        ax.plot(contexts / 1024, ms, style, color=color,
                label=f"batch {batch}, {label}")
ax.set(xlabel="context (k tokens)", ylabel="floor, ms per decode step", ylim=(0, None),
       title="Mistral 7B fp16 on an H100 SXM (3.35 TB/s): reading bytes sets the pace")
ax.grid(alpha=0.3)
ax.legend(fontsize=9)
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the floor of a full cache climbs with the context, eight times as steeply at batch 8 (eight
# caches read per step); with a window every line turns flat once the context passes $W$.

# %% [markdown]
# ## 3. Sliding windows in current practice: hybrid stacks
#
# Mistral 7B v0.1 used a window of 4096 in **every** layer. Its successors did not: the model card of
# Mistral 7B v0.2 lists "No Sliding-Window Attention", and its `config.json` says `"sliding_window": null`
# (32k context instead). Current open models mostly **mix** layer types ([references](../docs/references.md)):
#
# * **Gemma 2** alternates a local sliding-window layer ($W = 4096$) with a global layer, 1 : 1.
# * **Gemma 3** uses 5 local layers ($W = 1024$; 512 in the 1B model) for every global one, to cut KV memory
#   at 128k context.
#
# A local layer's cache stops at `W` tokens; a global layer's grows with the context. So the memory of a
# stack is $(L_{\text{global}} \cdot T + L_{\text{local}} \cdot \min(T, W)) \cdot 2 \cdot H_{kv} \cdot D \cdot \text{bytes}$. Gemma 3 27B has 62 layers,
# 16 KV heads of 128, bf16; at $T = 128\text{k}$:

# %%
def stack_bytes(T, n_global, n_local, W, kv_heads=16, head_dim=128, nbytes=2):
    per_token_layer = 2 * kv_heads * head_dim * nbytes
    return (n_global * T + n_local * min(T, W)) * per_token_layer


T, L_g3 = 131_072, 62
# (global layers, local layers, window)
stacks = {
    "all global": (L_g3, 0, 0),
    "1 : 1, W = 4096\n(Gemma 2's ratio)": (L_g3 // 2, L_g3 - L_g3 // 2, 4096),
    "5 : 1, W = 1024\n(Gemma 3)": (L_g3 // 6, L_g3 - L_g3 // 6, 1024),
    "all local\nW = 1024": (0, L_g3, 1024)
}
gib = {name: stack_bytes(T, *cfg) / 2**30 for name, cfg in stacks.items()}
for name, g in gib.items():
    print(f"{name.replace(chr(10), ' '):>34}: {g:6.2f} GiB per sequence")

fig, ax = plt.subplots(figsize=(7.5, 3.6))
bars = ax.bar(list(gib), list(gib.values()),
              color=["#999999", "#6baed6", "#2171b5", "#08306b"])
ax.bar_label(bars, fmt="%.1f GiB")
ax.set(ylabel="KV cache, GiB per sequence", ylim=(0, max(gib.values()) * 1.15),
       title="Gemma 3 27B shape, bf16, 128k tokens")
plt.show()
plt.close(fig)

# %% [markdown]
# The bars give the KV cache of one 128k-token sequence for each stack: the more layers are local, the lower
# the bar, and what is left is mostly the global layers'.

# %% [markdown]
# The ten global layers hold 10 of Gemma 3's 10.4 GiB: once most layers are local, the **global** layers set
# the memory, and the window's size hardly matters. That is why Gemma 3 raised the ratio of local layers
# rather than only shrinking `W`. The local layers are where this course's cache lives: each of them needs
# exactly the bounded, sliding-window cache built in lessons 1 and 3. Lesson 7 puts such stacks into a
# server's memory budget, with paged blocks and 8-bit keys.
#
# ## 4. What sliding-window attention lets us forget
#
# In **sliding-window attention** (SWA) the query at position `i` attends only to the last `W` keys, itself
# included. The course uses one convention everywhere, written once in `swkv_teach.masks`:
#
# > query `i` attends key `j` exactly when $i - W < j \le i$.
#
# For $W = 3$, query 5 sees keys 3, 4 and 5; key 2 is out ($5 - 3 < 2$ is false). The library's
# `sliding_window_mask(T, W)` turns the rule into a `(T, T)` boolean matrix, True where attention is
# allowed. Rows are queries and columns are keys:

# %%
print(sliding_window_mask(6, 3).int())
print("query 5 sees key 3:", bool(allowed(5, 3, 3)), "| key 2:", bool(allowed(5, 2, 3)))

# %% [markdown]
# Next to ordinary causal attention, the window is a **band** `W` squares wide along the diagonal. Below,
# $W = 4$ on 16 tokens: dark squares are attended, pale ones are causal keys the window drops. Count the
# squares in any row.

# %%
T_small, W = 16, 4
causal = torch.ones(T_small, T_small, dtype=torch.bool).tril()
band = sliding_window_mask(T_small, W)
print("keys per query, causal:", causal.sum(1).tolist())
print("keys per query, window:", band.sum(1).tolist())


# %% tags=["hide-input"]
def draw_mask(ax, cells, title):
    # cells: (T, T) ints, 0 empty, 1 pale, 2 dark, 3 highlight; grid lines between
    # squares
    from matplotlib.colors import ListedColormap

    ax.imshow(cells, cmap=ListedColormap(["white", "#c6dbef", "#2171b5", "#fd8d3c"]),
              vmin=0, vmax=3)
    n = cells.shape[0]
    ax.set_xticks(torch.arange(-0.5, n, 1), minor=True)
    ax.set_yticks(torch.arange(-0.5, n, 1), minor=True)
    ax.grid(which="minor", color="#888888", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    ax.set(title=title, xlabel="key position j", ylabel="query position i",
           xticks=range(0, n, 2), yticks=range(0, n, 2))


# %%
fig, ax = plt.subplots(figsize=(4.6, 4.6))
draw_mask(ax, causal.int() + band.int(), f"W = {W}: attended (dark), dropped (pale)")
plt.show()
plt.close(fig)

# %% [markdown]
# In the drawing each row is a query $i$: the dark squares are the keys it attends, $i - W < j \le i$, a
# band $W$ squares wide once the window is full; the pale squares to their left are causal keys the window
# drops.

# %% [markdown]
# **Your turn (10 minutes):** build this mask yourself in
# [exercises/01_sliding_window_mask.ipynb](../exercises/01_sliding_window_mask.ipynb). Then come back: the
# next cell shows a mask that is off by one, in code you may meet.
#
# ### Whose `W`? The off-by-one in Mistral's reference code
#
# "Window `W`" is ambiguous: `W` keys, or `W` keys *before* the query plus its own? Hugging Face
# (`kv_idx > q_idx - W`), flash-attention (`window_size=(W - 1, 0)`) and xFormers (used by mistral-inference)
# all count `W` keys, like us. Mistral's one-file reference implementation, `one_file_ref.py`, builds its
# prefill mask like this (line 261 of its first commit):
#
# ```python
# mask = torch.tril(torch.ones(seqlen, seqlen), diagonal=0)
# mask = torch.triu(mask, diagonal=-self.args.sliding_window)
# ```
#
# `triu(x, diagonal=-W)` keeps keys with $j \ge i - W$: one more than ours. Build it and compare:

# %%
# one_file_ref.py's band
reference = torch.triu(torch.ones(T_small, T_small).tril(), diagonal=-W).bool()
extra = reference & ~band
print("keys per query, reference:", reference.sum(1).tolist())
print("extra key of query i is at j = i - W:",
      all(int(extra[i].nonzero()) == i - W for i in range(W, T_small)))

fig, ax = plt.subplots(figsize=(4.6, 4.6))
draw_mask(ax,
          band.int() * 2 + extra.int() * 3,
          f"ours (dark) and the reference's extra key (orange)")
plt.show()
plt.close(fig)

# %% [markdown]
# In the drawing, each row's orange square is the one key the reference adds, at $j = i - W$, just left of
# our band.

# %% [markdown]
# The reference lets query `i` also see key $i - W$: **$W + 1$** keys. The Mistral 7B paper (arXiv:2310.06825)
# contradicts itself in the same way. §2's wording reads as $W + 1$: the hidden state at position `i`
# "attends to all hidden states from the previous layer with positions between i − W and i". Its Figure 1
# caption says `W`: "each token can attend to at most W tokens from the previous layer (here, W = 3)", and
# its rolling buffer cache (§2) "has a fixed size of W", so decoding can only ever see `W` keys. Neither
# place is one-sided: the same caption goes on "information can move forward by W tokens … after k attention
# layers, information can move forward by up to k × W tokens", and §2 says a hidden state can reach tokens
# "at a distance of up to W × k". A reach of `W` per layer is the $W + 1$ reading: with `W` keys (the
# query's own included) information moves $W - 1$ positions per layer (the drill's Q13). The same
# file decodes through that rolling buffer of `W` slots, so at decode time each query sees only `W` keys:
# the reference is not even consistent with itself. Hugging Face's flash-attention path had
# the same off-by-one (`window_size=(W, W)`) until v4.56.0 (issue #39408, PR #40163).
#
# Does one key matter? For a model served with exactly the window it was trained with, the cache is exact.
# Served with one key fewer (or more), every query past the window sees a slightly different set: small,
# but no longer exact, and exactly the kind of bug that tests must pin at $W - 1$, `W` and $W + 1$.
#
# ### Forgetting
#
# Read the band by **columns**. Key `j` is needed by queries $j, j + 1, \dots , j + W - 1$ and by nobody after
# that. Once the model has produced the query at position $j + W - 1$, key `j` is dead for good. At any moment
# only the **last `W` keys** can ever be looked at again, so a cache may keep those and throw the rest away.
# The mask proves it column by column:

# %%
last_reader = [int(band[:, j].nonzero().max()) for j in range(T_small - W + 1)]
print("last query that reads key j:", last_reader)
print("equals j + W - 1 for every j:",
      last_reader == [j + W - 1 for j in range(T_small - W + 1)])

# %% [markdown]
# Two remarks, both good interview material:
#
# * **Forgetting is exact, not an approximation.** A model *trained* with a window never uses keys outside
#   it, so a cache that drops them changes nothing. (Dropping keys from a model trained with full attention
#   *is* an approximation; lesson 5's attention sinks exist because of that.)
# * **Information still travels further than `W`.** Layer 2's key at position `j` already mixes layer 1's
#   values from $j - W + 1 \dots j$. After `L` layers a token can be influenced by up to $L \times (W - 1)$ earlier
#   tokens: about 131k for Mistral 7B ($32 \times 4095$).
#
# ## What to remember
#
# * Without a cache every step reruns the model over the prefix: $O(t \cdot P + t^2 \cdot d)$ per layer. With a cache:
#   $O(P + t \cdot d)$, still growing. With a window: $O(P + W \cdot d)$, flat.
# * KV bytes per token: $2 \cdot L \cdot H_{kv} \cdot D \cdot \text{bytes}$ (128 KiB for Mistral 7B). A hybrid stack's memory is set
#   by its global layers.
# * Decode is memory-bound: a step takes at least $(\text{weights} + b \times \text{KV bytes}) / \text{bandwidth}$. The cache dominates
#   past $b \times \text{tokens} \approx \text{weights} / 128\,\text{KiB}$ (108k tokens for Mistral 7B in fp16); there a window saves time too.
# * The convention: $i - W < j \le i$, `W` keys. Mistral's `one_file_ref.py` prefill mask admits $W + 1$.
#
# ## Going further
#
# * Redo the table of section 1 for a model you use (Llama 3 8B: $d = 4096$, 8 KV heads of 128, MLP 14336).
#   Past what context does attention dominate a cached step? How does that change if the model were
#   served in int8 and you counted bytes read per step instead of FLOPs?
# * Gemma 3 could have kept 1 : 1 and shrunk `W` instead. Tabulate KV memory at 32k and 128k for ratios
#   1 : 1 … 7 : 1 and windows 512 … 4096. Which knob matters at which context length, and what might a
#   larger ratio cost in quality?
#
# **Next:** lesson 1 builds the bounded cache, `SlidingWindowKVCache`, one step at a time.
