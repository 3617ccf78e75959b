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
# # Lesson 3 — The rolling buffer cache: the same window without copying it
#
# **Time:** about 90 minutes for the lesson (RoPE included), plus 25–45 for [exercise 03](../exercises/03_ring_buffer.ipynb) and 20–35 for [exercise 04](../exercises/04_chunk_mask.ipynb), both done where the lesson reaches them. **You need:**
# lessons 0–2 (the convention, lesson 1's cache, slots in the explorer).
#
# **By the end you will be able to**
#
# 0. say what RoPE does to a key and why it makes a score depend on distance only;
# 1. measure what the cat-and-slice cache copies, and explain why a ring buffer copies nothing;
# 2. write a ring buffer (slot $p \bmod W$, positions in slot order) and state its invariants;
# 3. explain why slot order is harmless for one query, and build the position mask a chunk of queries needs;
# 4. keep `seen` and `len(cache)` apart, and check a cache against the full-sequence oracle.
#
# Lesson 1's cache is correct, and it is what most people write first. Its cost hides in one line:
# `torch.cat` allocates a new tensor and **copies the whole window** at every step. With
# $W = 4096$ that is thousands of tokens copied to add one.
#
# A **ring buffer** allocates `W` slots once and writes token `p` into slot $p \bmod W$, overwriting
# the token that just left the window. The Mistral 7B paper (§2) calls it a **rolling buffer cache**; in the
# words of Mistral's reference repository, "The cache has a fixed size of W, and we store the (key, value)
# for position i in cache position i % W." This lesson
#
# 0. teaches rotary positions (RoPE), which let a key sit in any slot,
# 1. measures the copy the naive cache makes,
# 2. walks through the slots step by step, with a short readable ring next to the library's,
# 3. shows why the slots' scrambled order does not matter for one query, and why a chunk of queries
#    needs a mask built from **positions** (the chunk contract),
# 4. separates `seen` (tokens ever written) from `len` (tokens stored),
# 5. checks that nothing is allocated once the buffer is full,
# 6. checks attention over the ring against the full-sequence oracle.
#
# The ring is the library's `swkv_teach.RingBufferKVCache`; a GPU helps the timings but is not needed.
# Terms: [glossary](../docs/glossary.md); invariants and the chunk contract: [cheat sheet](../docs/cheatsheet.md).

# %%
# %matplotlib inline
import time

import torch
import matplotlib.pyplot as plt

import swkv_teach
from swkv_teach import (RingBufferKVCache, SlidingWindowKVCache, attention,
                        cached_attention, sliding_window_attention, window_mask)

torch.manual_seed(0)
dev = swkv_teach.device()
plt.rcParams.update({"figure.dpi": 110, "font.size": 11})  # legible figures


def tok(x):
    # one token with a scalar key x and value 10x: (batch=1, heads=1, tokens=1,
    # head_dim=1)
    k = torch.tensor([[[[x]]]], device=dev)
    return k, 10 * k


def sync():
    # GPU work is asynchronous: wait for it before reading the clock
    if dev.type == "cuda":
        torch.cuda.synchronize()


# %%
# NBVAL_IGNORE_OUTPUT
print("running on", dev)

# %% [markdown]
# ## 0. Rotary positions (RoPE), the one thing a ring buffer relies on
#
# A ring buffer stores keys in whatever slot is free, so a key must say by itself where it came from. In
# Mistral, Llama, Gemma and this course's decoder it does, through **rotary position embeddings** (RoPE,
# Su et al. 2021, arXiv:2104.09864). RoPE cuts each query and key vector of `d` numbers into $d/2$ **pairs**
# and turns pair `t` of the vector at position `p` by the angle $p \cdot f_t$, with frequencies
# $f_t = \theta ^{-2t/d}$ running from 1 radian per position down to almost nothing ($\theta = 10000$). In the
# "halves" layout of Hugging Face and of `swkv_teach.model`, dims `t` and $t + d/2$ form pair `t`.
#
# Below, one key vector whose every pair starts at `(1, 0)`, rotated by the library's `rotary` and
# `apply_rotary` at positions 0 to 7, $d = 8$ (four pairs). Each panel is one pair; each arrow one position.

# %%
from swkv_teach.model import apply_rotary, rotary

d_rope, theta = 8, 10000.0
positions = torch.arange(8)
# (8 positions, d): angles p * f_t
cos, sin = rotary(positions, d_rope, theta, torch.float32)
# every pair (x_t, x_{t+d/2}) = (1, 0)
key = torch.cat([torch.ones(d_rope // 2), torch.zeros(d_rope // 2)])
rotated = apply_rotary(key.expand(1, 1, 8, d_rope), cos, sin)[0, 0]  # (8 positions, d)

fig, axes = plt.subplots(1, d_rope // 2, figsize=(9.6, 2.8))
colors = plt.get_cmap("viridis")(torch.linspace(0, 0.9, len(positions)).numpy())
for t, ax in enumerate(axes):
    for p in positions.tolist():
        x, y = rotated[p, t].item(), rotated[p, t + d_rope // 2].item()
        ax.annotate("", xy=(x, y), xytext=(0, 0),
                    arrowprops=dict(arrowstyle="->", color=colors[p], lw=1.6))
        ax.text(1.12 * x, 1.12 * y, str(p), fontsize=8, color=colors[p], ha="center",
                va="center")
    ax.set(
        xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xticks=[], yticks=[],
        title=(f"pair {t}: dims {t} & {t + d_rope // 2}\n{theta ** (-2 * t / d_rope):g}"
               " rad / position"))
fig.suptitle(
    "RoPE turns each pair by position × its own frequency (arrow label: position)",
    y=1.04)
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, pair 0 turns a full radian per position; pair 3 hardly moves in eight. Fast pairs tell near positions
# apart, slow pairs far ones. The property that matters: a rotation keeps lengths, and the dot product of
# two vectors turned by angles `a` and `b` depends only on $a - b$. So the score of a query rotated to
# position `i` with a key rotated to position `j` depends on **$i - j$ alone**. Check it: put one query and
# one key at every position `0..15`, score every pair, and compare the scores along each diagonal
# `i - j = constant`; then move both by 1000 positions.

# %%
g = torch.Generator().manual_seed(0)
# head_dim 24, as the decoder's
qv, kv = torch.randn(24, generator=g), torch.randn(24, generator=g)
P16 = torch.arange(16)


def rotate(v, pos):
    cos, sin = rotary(pos, v.shape[-1], theta, torch.float32)
    # (len(pos), d)
    return apply_rotary(v.expand(1, 1, len(pos), v.shape[-1]), cos, sin)[0, 0]


# scores[i, j]: query at i, key at j
scores = rotate(qv, P16) @ rotate(kv, P16).T
spread = max((scores.diagonal(o) - scores.diagonal(o)[0]).abs().max().item()
             for o in range(-15, 16))
print("scores equal along every diagonal i - j = const (to 1e-5, float32 rounding):",
      spread < 1e-5)
far = rotate(qv, P16 + 1000) @ rotate(kv, P16 + 1000).T
print("every score unchanged when both positions move by 1000 (to 1e-4):",
      torch.allclose(far, scores, atol=1e-4))

# %% [markdown]
# That is what makes a ring buffer possible:
#
# * each key is rotated **once**, by its own absolute position, *before* it is cached;
# * a query at position `p` is rotated by `p`, and its score with a cached key depends only on their distance,
#   so the key's slot, and the order in which the cache returns keys, do not matter (section 3 checks it);
# * when the window slides, nothing stored is touched: no key is ever re-rotated;
# * the position of a new token must be the number of tokens **seen**, never the number stored (section 4;
#   lesson 4 runs the bug on the trained model).

# %% [markdown]
# ## 1. What the naive cache copies
#
# Once full, each naive update runs `torch.cat([self.k, k_new], dim=2)`: a new tensor of $W + 1$
# tokens, every one of them written, then a view of the last `W`. Same for `v`. The ring writes one
# token into `k` and one into `v`. For a layer shaped `(batch 1, 8 heads, head_dim 64)` in fp32:

# %%
B, H, D, itemsize = 1, 8, 64, 4
# one token's key (or value) in one layer
token_bytes = B * H * D * itemsize
windows = [128, 512, 2048, 8192]
print(f"{'W':>6} {'naive writes/step':>18} {'ring writes/step':>17}")
for W in windows:
    print(f"{W:>6} {2 * (W + 1) * token_bytes / 2**20:>14.3f} MiB"
          f" {2 * token_bytes / 2**10:>13.1f} KiB")


# %% [markdown]
# Now the clock. We fill each cache with `W` tokens in one chunk, then time single-token updates
# and take the median. Your numbers will differ from anyone else's (the cell's output is not
# checked), but the shape should not: the naive line climbs with `W`, the ring stays flat.

# %%
# NBVAL_IGNORE_OUTPUT
def time_update(cache_cls, W, steps=20):
    cache = cache_cls(W)
    k0 = torch.randn(B, H, W, D, device=dev)
    cache.update(k0, torch.randn_like(k0))  # fill the window in one chunk
    k1, v1 = torch.randn(B, H, 1, D, device=dev), torch.randn(B, H, 1, D, device=dev)
    for _ in range(3):  # warm-up
        cache.update(k1, v1)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        cache.update(k1, v1)
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6  # median, microseconds


# one CPU thread: on a busy machine, hand-offs between threads would swamp the copy we
# want to see
threads = torch.get_num_threads()
torch.set_num_threads(1)
subjects = [("naive (cat + slice)", SlidingWindowKVCache),
            ("ring (slot p % W)", RingBufferKVCache)]
timings = {name: [time_update(cls, W) for W in windows] for name, cls in subjects}
torch.set_num_threads(threads)
for name, us in timings.items():
    print(f"{name}:\n   ", "  ".join(f"W={W}: {t:.1f} us" for W, t in zip(windows, us)))

# %%
# NBVAL_IGNORE_OUTPUT
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for name, us in timings.items():
    ax.plot(windows, us, marker="o", label=name)
ax.set(xscale="log", yscale="log", xlabel="window W (tokens)",
       ylabel="one update, µs (median)",
       title=f"one layer, {H} heads x head_dim {D}, fp32, {dev.type}")
ax.set_xticks(windows, [str(w) for w in windows], minor=False)
ax.minorticks_off()
ax.grid(alpha=0.3)
ax.legend()
plt.show()
plt.close(fig)

# %% [markdown]
# In the figure, the cat-and-slice update's time grows with the window, about in proportion once $W$ is
# large; the ring's stays flat.

# %% [markdown]
# ## 2. Writing into slot $p \bmod W$
#
# The ring keeps a preallocated buffer `k_buf` of shape `(batch, heads, W, head_dim)` (and the same
# for values). Token `p` goes into slot $p \bmod W$. While the buffer fills, slots are used in order;
# after that, each new token overwrites the slot of the token that just fell out of the window,
# which is exactly the token at position $p - W$.

# %% [markdown]
# Here is the picture to keep in mind, drawn for $W = 4$ just after token 6 was written. Top: the token
# stream; bottom: the buffer's four slots. Token `p` lives in slot $p \bmod W$; the write pointer (red) is the
# slot the next token takes, which always holds the oldest token, the one leaving the window.

# %% tags=["hide-input"]
from matplotlib.patches import FancyArrowPatch, Rectangle


def draw_ring(ax, W, last):
    """Token stream 0..last+1 over W slots; token p in slot p % W; the pointer at slot
    (last + 1) % W."""
    kept = range(max(0, last - W + 1), last + 1)
    for p in range(last + 2):
        color = "#2171b5" if p in kept else ("#fd8d3c" if p == last + 1 else "#d9d9d9")
        ax.add_patch(Rectangle((p, 2), 0.9, 0.9, color=color))
        ax.text(p + 0.45, 2.45, str(p), ha="center", va="center",
                color="white" if p in kept else "black")
    # centre the slots under the stream
    x0 = (last + 2 - W) / 2
    for s in range(W):
        # the position slot s holds
        p = max(q for q in kept if q % W == s)
        ax.add_patch(
            Rectangle((x0 + s, 0), 0.9, 0.9, facecolor="white", edgecolor="black"))
        ax.text(x0 + s + 0.45, 0.45, f"tok {p}", ha="center", va="center")
        ax.text(x0 + s + 0.45, -0.35, f"slot {s}", ha="center", va="center", fontsize=9,
                color="0.35")
        ax.add_patch(
            FancyArrowPatch((p + 0.45, 2), (x0 + s + 0.45, 0.9), arrowstyle="->",
                            color="#2171b5", mutation_scale=10, lw=1))
    nxt = (last + 1) % W
    ax.add_patch(
        FancyArrowPatch((last + 1.45, 2), (x0 + nxt + 0.6, 0.9), arrowstyle="->",
                        color="#d62728", mutation_scale=14, lw=2, linestyle="--"))
    ax.text(
        x0 + W + 0.2, 0.45,
        f"write pointer: token {last + 1}\ngoes to slot {nxt}, over token"
        f" {last + 1 - W}", va="center", color="#d62728")
    ax.text(-0.2, 2.45, "stream", ha="right", va="center")
    ax.text(x0 - 0.2, 0.45, "buffer", ha="right", va="center")
    ax.set(xlim=(-1.6, last + 6), ylim=(-0.8, 3.1), aspect="equal")
    ax.axis("off")


fig, ax = plt.subplots(figsize=(9.0, 2.9))
draw_ring(ax, W=4, last=6)
ax.set_title(
    "Ring buffer, W = 4, after token 6: blue = in the window, grey = evicted, orange ="
    " next", fontsize=10)
plt.show()
plt.close(fig)

# %% [markdown]
# > **Your turn, before you read on (25–45 minutes).** That paragraph and the picture are the whole algorithm. Write it in
# > [exercises/03_ring_buffer.ipynb](../exercises/03_ring_buffer.ipynb): `update`, `positions` (which
# > position each returned key holds) and `ordered()`, graded against the library on many shapes and
# > lengths. Then come back.
#
# Here is a short version written for reading; it keeps each slot's position in a plain list. (The
# library's `RingBufferKVCache` computes positions arithmetically and is tuned for speed; it also takes
# chunks and sinks.) Both must return the same tensors and positions at every step:

# %%
class TinyRing:
    """A rolling buffer cache for one token per update, written to be read."""

    def __init__(self, W):
        self.W, self.seen = W, 0
        # (B, H, W, D), allocated on the first update
        self.k = self.v = None
        self.slot_pos = []  # slot_pos[s]: the position slot s holds

    def update(self, k_new, v_new):  # (B, H, 1, D) each
        # shape, dtype and device from the first token
        if self.k is None:
            B, H, _, D = k_new.shape
            self.k, self.v = k_new.new_zeros(B, H, self.W,
                                             D), v_new.new_zeros(B, H, self.W, D)
        # once full: the slot of the token leaving the window
        s = self.seen % self.W
        self.k[:, :, s], self.v[:, :, s] = k_new[:, :, 0], v_new[:, :, 0]
        if s == len(self.slot_pos):
            self.slot_pos.append(self.seen)  # still filling
        else:
            self.slot_pos[s] = self.seen  # overwrite
        self.seen += 1
        n = len(self.slot_pos)  # filled slots, returned in slot order
        return self.k[:, :, :n], self.v[:, :, :n]

    @property
    def positions(self):
        return torch.tensor(self.slot_pos)


tiny, lib = TinyRing(4), RingBufferKVCache(4)
same = []
for p in range(11):
    k_new, v_new = torch.randn(2, 3, 1, 5,
                               device=dev), torch.randn(2, 3, 1, 5, device=dev)
    k1, v1 = tiny.update(k_new, v_new)
    k2, v2 = lib.update(k_new, v_new)
    same.append(
        torch.equal(k1, k2) and torch.equal(v1, v2)
        and tiny.positions.tolist() == lib.positions.tolist())
print("TinyRing == RingBufferKVCache at all 11 steps (keys, values, positions):",
      all(same))

# %% [markdown]
# Now watch the library's ring step by step. Scalar keys again: key `x` is the token at position $x - 1$;
# `-` marks an empty slot.

# %%
W = 4
ring = RingBufferKVCache(W)
print(f"{'p':>2} {'slot':>4}  {'slots 0..3':<14} {'returned keys':<14} positions")
for p in range(7):
    k, v = ring.update(*tok(p + 1.0))
    slots = ("[" + ", ".join(f"{x:g}" if s < len(ring) else "-"
                             for s, x in enumerate(ring.k_buf.flatten().tolist())) +
             "]")
    keys = "[" + ", ".join(f"{x:g}" for x in k.flatten().tolist()) + "]"
    print(f"{p:>2} {p % W:>4}  {slots:<14} {keys:<14} {ring.positions.tolist()}")

# %% [markdown]
# At $p = 4$ the key `5` lands in slot 0, where `1` (position 0) was: position 0 is exactly the
# key that query 4 may no longer see ($4 - 4 < 0$ is false). The returned keys are in **slot order**
# (`[5, 6, 7, 4]` at the end), not in time order; `ring.positions` tells which position each
# returned key holds. When you want time order, for display or tests, `ring.ordered()` makes a
# sorted copy.

# %%
k_sorted, v_sorted = ring.ordered()
print("chronological keys:",
      k_sorted.flatten().tolist(), "at positions",
      ring.stored_positions().tolist())

# %% [markdown]
# ## 3. Why slot order does not matter for one query
#
# Attention for one query is $\sum _j \mathrm{softmax}(q \cdot k_j/\sqrt{d})_j \cdot v_j$: a weighted **sum** over keys, and a
# sum does not care about order. Permute keys and values *together*, and the output is the same up
# to floating-point rounding:

# %%
q = torch.randn(1, 1, 1, 8, device=dev)
K, V = torch.randn(1, 1, 6, 8, device=dev), torch.randn(1, 1, 6, 8, device=dev)
# drawn on the CPU: the same on every machine
perm = torch.randperm(6).to(dev)
out, out_perm = attention(q, K, V), attention(q, K[:, :, perm], V[:, :, perm])
print("permutation:", perm.tolist())
print("same output (to 1e-6):", torch.allclose(out, out_perm, atol=1e-6))

# %% [markdown]
# The catch is in "to 1e-6": a different order changes the rounding, so ring and naive agree to
# floating-point tolerance rather than bit for bit.
#
# There is a condition, though: each key must already **carry its position**. That is section 0's
# RoPE: each key is rotated by its absolute position *before* it is cached, so a key means the same
# thing wherever it sits in the buffer. Nothing in attention reads the slot index.
#
# For a single decoding query nothing else is needed: every key the ring holds is inside that
# query's window, so there is nothing to mask.

# %%
p = ring.seen - 1  # the query that just ran
print("query", p, "may see every returned key:",
      window_mask([p], ring.positions, W).all().item())

# %% [markdown]
# **A chunk of queries is different.** During prefill (or speculative decoding) several new tokens
# arrive at once, and each of their queries has a *different* window. The **chunk contract**: `update`
# returns the stored keys the chunk's *first* query may still see (the last $W - 1$), followed by the
# chunk, and `cache.positions` lists their absolute positions. The mask must be built from those positions,
# not from the keys' index in the tensor.
#
# > **Your turn (20–35 minutes):** write that mask in
# > [exercises/04_chunk_mask.ipynb](../exercises/04_chunk_mask.ipynb), then come back.
#
# Here are short, readable versions of the two library functions this lesson has been calling,
# `window_mask` and `cached_attention` (the library's versions add argument checks, sinks, and PyTorch's fused SDPA):

# %%
def window_mask_readable(q_positions, k_positions, W):
    # (queries, 1): one row per query
    i = torch.as_tensor(q_positions)[:, None]
    # (1, keys): in the cache's order
    j = torch.as_tensor(k_positions, device=i.device)[None, :]
    return (j <= i) & (j > i - W)  # the convention, i - W < j <= i


def cached_attention_readable(q, k, v, q_positions, k_positions, W):
    return attention(q, k, v,
                     window_mask_readable(q_positions, k_positions, W).to(q.device))


# %% [markdown]
# Below: $W = 4$, six tokens decoded one at a time, then a chunk of three (positions 6, 7, 8).

# %%
W, D8 = 4, 8
T = 9
Q, K, V = (torch.randn(1, 1, T, D8, device=dev) for _ in range(3))

ring = RingBufferKVCache(W)
for p in range(6):
    ring.update(K[:, :, p:p + 1], V[:, :, p:p + 1])
k, v = ring.update(K[:, :, 6:9], V[:, :, 6:9])  # the chunk
q_pos = torch.arange(6, 9, device=dev)
mask = window_mask_readable(q_pos, ring.positions, W)
print("returned key positions:", ring.positions.tolist(),
      f"(the last W - 1 = {W - 1}, then the chunk)")
print("mask (rows: queries 6, 7, 8):")
print(mask.int().cpu())
print("same as the library's window_mask:",
      torch.equal(mask, window_mask(q_pos, ring.positions, W)))

oracle = sliding_window_attention(Q, K, V, W)[:, :, 6:9]
readable = cached_attention_readable(Q[:, :, 6:9], k, v, q_pos, ring.positions, W)
library = cached_attention(Q[:, :, 6:9], k, v, q_pos, ring.positions, W)  # fused SDPA
# every query sees every returned key
no_mask = attention(Q[:, :, 6:9], k, v)
print("readable, with the position mask == oracle:",
      torch.allclose(readable, oracle, atol=1e-5))
print("library (SDPA)                   == oracle:",
      torch.allclose(library, oracle, atol=1e-5))
print("without a mask                   == oracle:",
      torch.allclose(no_mask, oracle, atol=1e-5))

# %% [markdown]
# Query 6 must not see keys 7 and 8 (the future), and query 8 must not see keys 3 and 4 (they left
# its window). One rule, built from positions, handles both, in any key order.
#
# ## 4. `seen` and `len`: two counts, kept apart
#
# * `cache.seen`: tokens ever written. The next token's position is `seen`, and so is the
#   position its key is rotated by.
# * `len(cache)`: tokens stored now, never more than `W`.
#
# Mixing the two up is a classic bug: rotate a new key by `len(cache)` and after `W` tokens every
# new key gets the same position, `W`, so the model loses track of where it is. (Not to be confused with a
# deliberate design: StreamingLLM, §3.2, and Hugging Face's old `SinkCache` re-rotate cached keys to their
# positions *within the cache*, for models trained with full attention; lesson 5 and the
# [references](../docs/references.md).)

# %%
ring = RingBufferKVCache(4)
for p in range(10):
    ring.update(*tok(p + 1.0))
print("seen:", ring.seen, "| stored:", len(ring), "| capacity:", ring.capacity)
print("positions in slot order:   ", ring.positions.tolist())
print("positions in time order:   ", ring.stored_positions().tolist())

# %% [markdown]
# ## 5. Nothing is allocated once the buffer is full
#
# The ring allocates `k_buf` and `v_buf` on its first update, and from then on only writes into
# them. Check that the returned tensors always live at the buffer's address (`data_ptr`) and that
# `nbytes` never changes over a hundred steps. The naive cache, by contrast, gets new memory at
# every step.

# %%
W = 8
ring, naive = RingBufferKVCache(W), SlidingWindowKVCache(W)
k0 = torch.randn(1, 2, W, 4, device=dev)
ring.update(k0, k0.clone())
naive.update(k0, k0.clone())
buf_ptr, nbytes = ring.k_buf.data_ptr(), ring.nbytes

ring_same, naive_new = [], []
for _ in range(100):
    k_new, v_new = torch.randn(1, 2, 1, 4,
                               device=dev), torch.randn(1, 2, 1, 4, device=dev)
    k, v = ring.update(k_new, v_new)
    ring_same.append(k.data_ptr() == buf_ptr == ring.k_buf.data_ptr()
                     and ring.nbytes == nbytes)
    before = naive.k.untyped_storage().data_ptr()
    naive.update(k_new, v_new)
    naive_new.append(naive.k.untyped_storage().data_ptr() != before)
print(f"ring: same buffer and nbytes = {nbytes} at all 100 steps: {all(ring_same)}")
print(f"naive: fresh memory at all 100 steps: {all(naive_new)}")

# %% [markdown]
# ## 6. Attention over the ring equals the oracle
#
# The final check: decode a random sequence token by token through the ring, attend each new query
# over what `update` returned (slot order and all), and compare with row `t` of
# `sliding_window_attention`, the full-sequence oracle that never uses a cache. Along the way the
# ring's chronological contents must equal the naive cache's exactly.

# %%
W, T = 5, 24
Q, K, V = (torch.randn(1, 2, T, 8, device=dev) for _ in range(3))
oracle = sliding_window_attention(Q, K, V, W)  # (1, 2, T, 8)

ring, naive = RingBufferKVCache(W), SlidingWindowKVCache(W)
worst, same_contents = 0.0, True
for t in range(T):
    k, v = ring.update(K[:, :, t:t + 1], V[:, :, t:t + 1])
    # no mask: one query, every key in its window
    out = attention(Q[:, :, t:t + 1], k, v)
    worst = max(worst, (out - oracle[:, :, t:t + 1]).abs().max().item())
    naive.update(K[:, :, t:t + 1], V[:, :, t:t + 1])
    same_contents &= torch.equal(ring.ordered()[0], naive.k) and torch.equal(
        ring.ordered()[1], naive.v)
print(f"{T} steps: ring attention matches the oracle to 1e-5: {worst < 1e-5}")
print("ring contents (time order) == naive cache, bit for bit:", same_contents)

# %% [markdown]
# ## What to remember
#
# * Naive cat + slice: O(W) copy and a fresh allocation per token. Ring: two one-token writes, O(1).
# * Token `p` lives in slot $p \bmod W$; the returned keys are in slot order, with `positions` alongside.
# * Order does not matter for one query, because keys carry their positions (RoPE before caching).
#   A chunk of queries gets the last $W - 1$ stored keys followed by the chunk, and needs
#   `window_mask(q_positions, cache.positions, W)`.
# * `seen` is not `len`: positions come from `seen`.
# * The buffer's address and `nbytes` never change once it is full; the output matches the oracle.
#
# Not done yet? [exercises/03_ring_buffer.ipynb](../exercises/03_ring_buffer.ipynb) (the ring) and
# [exercises/04_chunk_mask.ipynb](../exercises/04_chunk_mask.ipynb) (the chunk mask).
#
# ## Going further
#
# * `TinyRing` returns keys in slot order. mistral-inference instead *unrotates* its cache into time order
#   when a chunk arrives (`unrotate` in `src/mistral_inference/cache.py`), so that xFormers' bottom-right
#   local mask, which assumes chronological keys, applies. What does that copy cost per chunk, and when is it
#   cheaper than building a position mask?
# * Extend `TinyRing` to chunks: what must `update` keep and return when $c > W$? Check your version against
#   `RingBufferKVCache` and the oracle for chunks of every length from 1 to $2W + 1$.
