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
# # Lesson 7 — Serving-scale memory: paged blocks, continuous batching and 8-bit keys
#
# **Time:** about 200 minutes for the lesson, plus 25–45 for [exercise 08](../exercises/08_paged_cache.ipynb) and 15–30 for [exercise 09](../exercises/09_int8_kv.ipynb). **You need:** lessons 3 (the ring buffer) and 4 (the decoder); lesson 0's
# memory arithmetic and lesson 6, section 5 (`flash_attn_with_kvcache` argument by argument for a contiguous cache) help.
#
# **By the end you will be able to**
#
# * draw a block table: which pool blocks each sequence holds, and when a sliding window hands one back;
# * bound what a sequence holds, `ceil((W - 1) / block_size) + 1` blocks, and say what the block size trades;
# * explain how a pool far smaller than the tokens it serves keeps many sequences decoding;
# * say what a paged attention kernel reads (`paged_attention`, FlashAttention's `flash_attn_with_kvcache`
#   with a `block_table`) and run it on a ragged batch;
# * decode rows of different lengths in one forward, each at its own positions, with no padding
#   (`Decoder.step_paged`);
# * tell step-by-step scheduling from continuous batching, serve a queue with one forward per step, and read
#   its pool occupancy and its throughput against the batch size;
# * run vLLM v1's way of filling a step, one token budget: decode rows and prompt chunks in one varlen
#   forward (`Scheduler(token_budget=N)`), a preemption forced on a small pool with the same tokens as
#   generating alone, and say when promising each request its peak beats preempting;
# * size an int8 cache (data plus scales) against float32 and float16, and measure what it costs in quality
#   and in decode speed on a trained model;
# * put hybrid local/global stacks (Gemma 2, Gemma 3) into the same arithmetic.
#
# A ring buffer per sequence (lesson 3) is perfect for one sequence. A server decodes hundreds at once, of
# lengths it cannot know in advance, and its memory is one big budget. Two ideas from serving engines make
# that budget go further:
#
# 1. **Paging** (vLLM's PagedAttention, Kwon et al., SOSP 2023, section 4): cut every sequence's cache into
#    blocks of `block_size` tokens taken from one shared pool; a *block table* per sequence says which pool
#    block holds its logical block `p // block_size`. Nothing is reserved for tokens not yet produced. With a
#    sliding window a sequence also *returns* a block as soon as all of its tokens have left the window.
# 2. **Quantisation**: store keys and values in 8 bits, with one scale per token and head, and dequantise
#    when attention reads them.
#
# The library has both: `swkv_teach.BlockPool` and `PagedKVCache` (`swkv_teach/caches/paged.py`), and
# `Int8RingBufferKVCache` (`swkv_teach/caches/int8.py`). Both return exactly what the ring returns (the int8
# cache within half a quantisation step), so the decoder drives them unchanged. Paging also lets an engine
# serve many requests in **one** forward, each reading its own blocks of the shared pool: that is continuous
# batching, and `swkv_teach.serving.Scheduler` runs it on the course's decoder (section 5).

# %%
# %matplotlib inline
import math
import textwrap

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import Patch

import swkv_teach
from swkv_teach import BlockPool, Int8RingBufferKVCache, PagedKVCache, RingBufferKVCache
from swkv_teach.train import HELDOUT_FILES, read_stdlib

torch.manual_seed(0)
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
COLORS = {"A": "#4C72B0", "B": "#DD8452", "C": "#55A868", "D": "#C44E52"}

# %% [markdown]
# ## 1. The block table, step by step
#
# Three sequences share a pool of 9 blocks of 4 tokens; the window is $W = 6$. They decode one token each
# per step, round robin, and have different lengths: **A** stops after 9 tokens, **B** after 15, **C** after
# 22. When a sequence finishes, `reset()` returns its blocks; when A does, a fourth sequence **D** (10 tokens)
# starts on them. Every state
# below is read from the real caches (`cache.block_table`, `pool.holdings()`), with each token's key set to
# its position so we can see which tokens sit where.

# %% [markdown]
# First the picture, drawn by hand for one sequence ($W = 6$, blocks of 4 tokens) after 11 tokens: token `p`
# belongs to logical block $\lfloor p / 4 \rfloor$; the block table says which pool block holds each logical block the
# sequence still needs. Logical block 0 (tokens 0–3) has left the window, so its pool block went back to the
# pool; the other pool blocks belong to other sequences or are free.

# %% tags=["hide-input"]
from matplotlib.patches import FancyArrowPatch, Rectangle


def draw_block_table(ax, seen=11, W=6, bs=4, table=(5, 2), first_logical=1,
                     pool_owner="BBA  AB  "):
    """Tokens -> logical blocks -> block table -> pool blocks, for sequence "A"."""
    kept = range(seen - W, seen)
    # the token stream, in logical blocks
    for p in range((seen // bs + 1) * bs):
        color = "#4C72B0" if p in kept else ("#d9d9d9" if p < seen else "white")
        ax.add_patch(
            Rectangle((p + 0.15 * (p // bs), 3), 0.9, 0.8, facecolor=color,
                      edgecolor="0.6"))
        if p < seen:
            ax.text(p + 0.15 * (p // bs) + 0.45, 3.4, str(p), ha="center", va="center",
                    fontsize=9, color="white" if p in kept else "black")
    for lb in range(seen // bs + 1):
        x = lb * bs * 1.0 + 0.15 * lb + bs / 2
        ax.text(x, 4.15, f"logical block {lb}", ha="center", fontsize=9)
    # the block table, one entry per held block
    for i, block in enumerate(table):
        ax.add_patch(
            Rectangle((2 + 1.2 * i, 1.5), 1.0, 0.8, facecolor="#fdd49e",
                      edgecolor="black"))
        ax.text(2.5 + 1.2 * i, 1.9, str(block), ha="center", va="center")
        lb = first_logical + i
        ax.add_patch(
            FancyArrowPatch((lb * bs + 0.15 * lb + bs / 2, 3), (2.5 + 1.2 * i, 2.3),
                            arrowstyle="->", color="0.3", mutation_scale=10))
        ax.add_patch(
            FancyArrowPatch((2.5 + 1.2 * i, 1.5), (block * 1.6 + 0.7, 0.8),
                            arrowstyle="->", color="#D62728", mutation_scale=12,
                            lw=1.5))
    ax.text(1.8, 1.9, "block table of A", ha="right", va="center", fontsize=9)
    owner_colors = {"A": "#4C72B0", "B": "#DD8452", " ": "white"}
    for b, who in enumerate(pool_owner):  # the shared pool
        ax.add_patch(
            Rectangle((b * 1.6, 0), 1.4, 0.8, facecolor=owner_colors[who],
                      edgecolor="black"))
        ax.text(b * 1.6 + 0.7, 0.4, f"{b}" + (f" ({who})" if who != " " else " free"),
                ha="center", va="center", fontsize=9,
                color="white" if who != " " else "black")
    ax.text(-0.3, 0.4, "pool", ha="right", va="center", fontsize=9)
    ax.set(xlim=(-2.2, 15), ylim=(-0.3, 4.5), aspect="equal")
    ax.axis("off")


fig, ax = plt.subplots(figsize=(9.4, 3.4), dpi=DPI)
draw_block_table(ax)
ax.set_title(
    "Token p -> logical block p // 4 -> block table -> pool block (blue: A's window,"
    " grey: left it)", fontsize=10)
plt.show()
plt.close(fig)

# %% [markdown]
# In the drawing, token $p$ goes to logical block $\lfloor p/4 \rfloor$, whose block-table entry names the
# pool block that holds it; blue tokens are A's window, grey ones have left it. Two lookups, and both are
# arithmetic: the logical block is `p // block_size`, the offset inside it
# `p % block_size`. A paged attention kernel follows the red arrows for every block a query may read
# (section 3 maps FlashAttention's `block_table` argument onto this picture).
#
# **Your turn, before reading on:** [exercise 08](../exercises/08_paged_cache.ipynb) has you write this
# bookkeeping, which blocks a sequence holds after each token, taking and returning blocks as its window
# slides; the grader replays long streams on a shared pool. The cells below are the library doing the same.
#
# Now the real thing.

# %%
W, BS = 6, 4
pool = BlockPool(num_blocks=9, block_size=BS)
print("a sequence holds at most ceil((W - 1) / block_size) + 1 ="
      f" {PagedKVCache.max_blocks(W, BS)} blocks; three of them need"
      f" {3 * PagedKVCache.max_blocks(W, BS)}")

lengths = {"A": 9, "B": 15, "C": 22, "D": 10}
caches = {name: PagedKVCache(pool, W) for name in "ABC"}
done = set()
history = []  # one snapshot per step: {pool block: (sequence, first token, last token)}


def token(p):
    """A one-token key/value whose numbers are its position."""
    return torch.full((1, 1, 1, 1), float(p)), torch.full((1, 1, 1, 1), float(p))


def snapshot():
    held = {}
    for name, c in caches.items():
        if name in done or not c.seen:
            continue
        first_logical = c.stored_positions()[0].item() // BS
        for i, block in enumerate(c.block_table):
            lo = (first_logical + i) * BS
            held[block] = (name, lo, min(lo + BS, c.seen) - 1)
    return held


step = 0
while any(name not in done for name in caches):
    step += 1
    for name in list(caches):
        c = caches[name]
        if name in done:
            continue
        c.update(*token(c.seen))
        # the sequence is finished: all its blocks go back to the pool
        if c.seen == lengths[name]:
            print(f"step {step:>2}: {name} is done; reset() returns its blocks"
                  f" {c.block_table}")
            c.reset()
            done.add(name)
            if name == "A":
                caches["D"] = PagedKVCache(pool, W)  # D starts on the blocks A returned
    history.append(snapshot())
    if step in (3, 6, 10, 14):
        tables = ", ".join(f"{n}: {caches[n].block_table}" for n in caches
                           if n not in done)
        print(f"step {step:>2}: {tables}   free {pool.free_blocks}")
print(f"after the last step: {pool.free_blocks} of {pool.num_blocks} blocks free")

# %% [markdown]
# Each row of the figure is the pool after one step; each cell is a pool block, coloured by the sequence
# holding it and labelled with the tokens of the logical block it holds. Follow a colour down: a sequence
# writes into its newest block, takes a new block when a token opens one, and hands its oldest block back
# the step that block's last token leaves the window. The blocks returned are reused by whoever needs one
# next (the pool hands out the block free the longest, as vLLM does: `FreeKVCacheBlockQueue`,
# `vllm/v1/core/kv_cache_utils.py`; lesson 12 takes that queue apart).

# %%
fig, ax = plt.subplots(figsize=(8.4, 6.2), dpi=DPI)
for row, held in enumerate(history):
    for block in range(pool.num_blocks):
        if block in held:
            name, lo, hi = held[block]
            ax.add_patch(
                plt.Rectangle((block, row), 0.94, 0.9, color=COLORS[name], alpha=0.85))
            ax.text(block + 0.47, row + 0.45, f"{name} {lo}–{hi}", ha="center",
                    va="center", fontsize=10, color="white")
        else:
            ax.add_patch(
                plt.Rectangle((block, row), 0.94, 0.9, facecolor="white",
                              edgecolor="0.8"))
ax.set(
    xlim=(0, pool.num_blocks), ylim=(len(history), 0), xlabel="pool block",
    ylabel="step",
    title=(f"Pool of {pool.num_blocks} blocks x {BS} tokens, window {W}: who holds what"
           " after each step"))
ax.set_xticks([b + 0.47 for b in range(pool.num_blocks)], range(pool.num_blocks))
ax.set_yticks([r + 0.45 for r in range(0, len(history), 2)],
              range(1,
                    len(history) + 1, 2))
ax.legend(handles=[Patch(color=c, label=n) for n, c in COLORS.items()],
          loc="upper left", bbox_to_anchor=(1.01, 1.0), title="sequence")
fig.tight_layout()
plt.show()

# %% [markdown]
# In the figure each row is a step and each square a pool block, coloured by the sequence that holds it and
# labelled with the positions it holds; a white square is free.

# %% [markdown]
# Beside the ring: for one sequence the ring stores the same tokens in `W` slots $p \bmod W$, while the paged
# cache stores them in whole blocks, oldest first. The stored keys are identical:

# %%
ring, paged = RingBufferKVCache(W), PagedKVCache(BlockPool(3, BS), W)
for p in range(11):
    ring.update(*token(p))
    paged.update(*token(p))
print("ring  slots hold positions  ", ring.positions.tolist(), " (slot order)")
print("paged block table", paged.block_table, "holds",
      paged.stored_positions().tolist(), "(oldest first)")
print("same keys:", torch.equal(ring.ordered()[0], paged.ordered()[0]))

# %% [markdown]
# ## 2. Fragmentation: what the block size trades
#
# The last `W` tokens of a sequence straddle at most `ceil((W - 1) / block_size) + 1` blocks: the first may
# still hold tokens that left the window, the last may be partly unwritten. So a sequence holds up to
# `block_size * (ceil((W - 1) / block_size) + 1)` token slots for `W` tokens. Without a window only the last
# block wastes room, which is the paper's point (section 4.3: the waste of a sequence stays within one
# block). Small blocks waste little but make long block tables (more entries to look up, shorter
# contiguous reads); big blocks do the reverse. The paper's ablation of the block size (section 7.2, "Impact
# of Block Size") settles on 16, large enough to keep the GPU busy and small enough to waste little: "vLLM sets
# its default block size as 16" (today's vLLM chooses its default per platform; we have not checked each).
#
# The worst case, and the average measured on a real `PagedKVCache` over 500 tokens, for the checkpoint's
# window (64) and Mistral 7B's (4096):

# %%
def worst_slots(w, bs):
    return bs * PagedKVCache.max_blocks(w, bs)


def measured_slots(w, bs, steps=500):
    cache, held = PagedKVCache(BlockPool(PagedKVCache.max_blocks(w, bs), bs), w), []
    for p in range(steps):
        cache.update(*token(p))
        if p >= w:
            held.append(len(cache.block_table) * bs)
    return sum(held) / len(held)


sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
print(f"{'block size':>10} | {'W = 64: worst':>13} {'mean':>6} {'table':>6} |"
      f" {'W = 4096: worst':>15} {'table':>6}")
rows = []
for bs in sizes:
    w64, m64, w4k = worst_slots(64, bs), measured_slots(64, bs), worst_slots(4096, bs)
    rows.append((bs, w64, m64, w4k))
    print(f"{bs:>10} | {w64:>8} ({w64 / 64 - 1:>4.0%}) {m64:>6.1f}"
          f" {PagedKVCache.max_blocks(64, bs):>6} | {w4k:>8} ({w4k / 4096 - 1:>5.1%})"
          f" {PagedKVCache.max_blocks(4096, bs):>6}")

# %%
fig, ax = plt.subplots(figsize=(6.8, 3.6), dpi=DPI)
ax.plot(sizes, [r[1] / 64 for r in rows], "o-", label="W = 64, worst case")
ax.plot(sizes, [r[2] / 64 for r in rows], "s--",
        label="W = 64, mean over 500 tokens (measured)")
ax.plot(sizes, [r[3] / 4096 for r in rows], "^-", label="W = 4096, worst case")
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set(xlabel="block size (tokens)", ylabel="token slots held / W",
       title="Slots a paged window holds, against the block size")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# The figure plots the slots a window holds, as a multiple of $W$, against the block size: the waste grows
# with the block size, and fastest for a small window.

# %% [markdown]
# At `block_size = 16` a 4096-token window holds at most 4112 slots, 0.4 % more than a ring; even at 256 it
# is 6 %. For the checkpoint's tiny window a block of 64 doubles the memory: block size should be small
# next to the window. The measured mean sits just under the worst case: when the block size divides `W`, the
# window lines up with the blocks only one step in `block_size` and straddles the extra block the rest of the
# time (blocks larger than the window are the exception: one or two of them, depending on alignment).
#
# ## 3. What a paged kernel reads: `paged_attention`
#
# An engine does not copy a sequence's window out of the pool before attention: its attention kernel takes
# the whole pool and the block tables and reads each block where it lies. FlashAttention's
# `flash_attn_with_kvcache` does this when it is given a `block_table` (lesson 6, section 5 maps its
# arguments onto a contiguous cache; here are the paged ones). `swkv_teach.attention.paged_attention`
# computes the same thing in plain PyTorch, with the same layout and meaning, so it runs on a CPU and can be
# held against the dense oracle. Line numbers are those of `flash_attn/flash_attn_interface.py` in
# Dao-AILab/flash-attention at commit `0251105a`:
#
# | `paged_attention(...)` | `flash_attn_with_kvcache(...)` (docstring line) | meaning |
# |---|---|---|
# | `q` `(batch, seqlen_q, nheads, headdim)` | `q` (1549) | the new queries of each sequence |
# | `k_cache`, `v_cache` `(num_blocks, block_size, nheads_k, headdim)` | the same shape "if there's a block_table (i.e. paged KV cache)" (1550–1554) | the pool; query head `h` reads KV head `h // (nheads // nheads_k)` (1525–1528) |
# | `cache_seqlens` `(batch,)` | `cache_seqlens` (1561–1562) | tokens of each sequence in the pool, the new queries' own keys included |
# | `block_table` `(batch, max_blocks_per_seq)` | `block_table`, int32 (1568) | logical block `i` of row `b` (tokens `i * block_size` onwards) is pool block `block_table[b, i]` |
# | `window_size=W` | `window_size=(W - 1, 0)` with `causal=True` (1542–1544) | the query at position `p = cache_seqlens[b] - seqlen_q + i` reads keys $p - W < j \le p$ |
# | `softmax_scale=None` | `softmax_scale`, default `1 / sqrt(headdim)` (1569–1570, 1597) | |
#
# Two differences that are not about what is computed: that FlashAttention build asks for a
# `page_block_size` that is a multiple of 256 (line 1552; ours takes any size), and it can write the new
# keys into the cache itself (`k`, `v`, lines 1555–1557), where `paged_attention` expects them written
# already (FlashAttention's `k=v=None`). Passing `k`, `v` changes what `cache_seqlens` means: the length
# *before* the new tokens, where the kernel starts writing them (lines 1555–1556; `flash_api.cpp` reads up to
# `seqlens_k[b] + seqlen_knew` keys, lines 1434–1435). It is also the only way to have the kernel apply RoPE:
# rotary tables are "Only applicable if k and v are passed in" (1558–1559), and `flash_api.cpp` refuses them
# without a new `k` (1462–1463).
#
# Below, a ragged batch: three sequences of 11, 5 and 2 tokens in a pool of 10 blocks of 4, $W = 6$, 4
# query heads over 2 KV heads, one new query each. The pool starts as random numbers (garbage) and each
# sequence's keys are written into the blocks its table names. Row 0's first block has left the window, so
# its entry is -1, a freed block; entries past a row's last block are -1 too.

# %%
from swkv_teach.attention import paged_attention, paged_plan, sliding_window_attention

W3, BS3, H3, HK3, D3 = 6, 4, 4, 2, 8
# cache_seqlens: tokens of each sequence
lens = [11, 5, 2]
# row 0: tokens 4-7 in block 7, 8-10 in block 2
block_table = torch.tensor(
    [
        [-1, 7, 2],
        # row 1: tokens 0-3 in block 4, token 4 in block 9
        [4, 9, -1],
        # row 2: tokens 0-1 in block 0
        [0, -1, -1]
    ],
    dtype=torch.int32)
k_pool, v_pool = torch.randn(10, BS3, HK3, D3), torch.randn(10, BS3, HK3, D3)
# each sequence's keys and values, in order
keys = [torch.randn(n, HK3, D3) for n in lens]
vals = [torch.randn(n, HK3, D3) for n in lens]
for b, n in enumerate(lens):
    for j in range(n):
        block = int(block_table[b, j // BS3])
        # tokens of a freed block are not in the pool
        if block >= 0:
            k_pool[block, j % BS3], v_pool[block, j % BS3] = keys[b][j], vals[b][j]
q = torch.randn(3, 1, H3, D3)
out = paged_attention(q, k_pool, v_pool, torch.tensor(lens), block_table,
                      window_size=W3)

# the oracle: each sequence's keys laid out densely, every query of it, keep the last
# one
for b, n in enumerate(lens):
    # (1, H, n, D): head h reads h // 2
    kk = keys[b].repeat_interleave(H3 // HK3, dim=1).transpose(0, 1)[None]
    vv = vals[b].repeat_interleave(H3 // HK3, dim=1).transpose(0, 1)[None]
    qq = torch.zeros(1, H3, n, D3)
    qq[0, :, -1] = q[b, 0]
    dense = sliding_window_attention(qq, kk, vv, W3)[0, :, -1]
    print(f"row {b}: {n:>2} tokens, max |paged - dense| ="
          f" {(out[b, 0] - dense).abs().max():.0e}")

scrambled = block_table.clone()
# not even a block of the pool
scrambled[scrambled < 0] = 12345
same = torch.equal(
    out,
    paged_attention(q, k_pool, v_pool, torch.tensor(lens), scrambled, window_size=W3))
print("entries that no query reads never matter:", same)

# %% [markdown]
# Where does each query read? `paged_plan` is the bookkeeping half of `paged_attention`: for each row, the
# flat pool slot (`block * block_size + offset`) of every key some query may see, and a mask of which query
# sees which.

# %%
plan = paged_plan(torch.tensor(lens), block_table, 1, BS3, 10, W3)
for b, n in enumerate(lens):
    # (L,): which of the row's L slots the query sees
    seen = plan.mask[b, 0, 0]
    positions = [n - plan.slots.shape[1] + i for i in range(plan.slots.shape[1])]
    read = [(p, int(s) // BS3, int(s) % BS3)
            for p, s, m in zip(positions, plan.slots[b], seen) if m]
    print(f"row {b}: query at position {n - 1} reads (position, block, offset):")
    print("   ", read)

# %% [markdown]
# Row 0's query at position 10 reads positions 5 to 10: the last three slots of block 7 and the first three
# of block 2; block table entry 0 is never looked at. Row 2 reads only the two tokens it has.
#
# ### From a `PagedKVCache` to the kernel's arguments
#
# The library's `PagedKVCache.block_table` lists only the blocks a sequence still holds. The kernel's
# `block_table` is indexed by logical block `p // block_size` from 0, so its row is ours shifted right, with
# any block id where the window has moved on. `cache_seqlens` is `seen`, the tokens seen: in a paged pool a
# key's logical index is its position (a ring's slots are not, lesson 6, section 5). Build the kernel's
# arguments from a `PagedKVCache` and check that reading keys through the table, as the kernel does with
# `window_size=(W - 1, 0)`, gives exactly the window the cache holds:

# %%
W_k, BS_k = 6, 4
pool_k = BlockPool(num_blocks=8, block_size=BS_k)
paged_k = PagedKVCache(pool_k, W_k)
# key p: every number equals p
for p in range(15):
    paged_k.update(torch.full((1, 1, 1, 2), float(p)), torch.full((1, 1, 1, 2),
                                                                  float(p)))
# cache_seqlens: tokens seen
seqlen = paged_k.seen
# logical block of the oldest stored key
first_block = int(paged_k.stored_positions()[0]) // BS_k
# the kernel's row: logical block -> pool block
row = [-1] * first_block + paged_k.block_table
print("cache_seqlens:", seqlen, "| our block_table:", paged_k.block_table,
      "| kernel's row:", row)

# what the kernel reads for the query at position seqlen - 1 with window_size = (W - 1,
# 0)
last = seqlen - 1
read_keys = []
# the docstring's range, seqlen_q = 1
for j in range(last - (W_k - 1), last + 1):
    block, offset = row[j // BS_k], j % BS_k
    # pool layout (num_blocks, block_size, heads, dim)
    read_keys.append(int(pool_k.k[block, offset, 0, 0]))
print("keys read through the table:", read_keys)
print("== the positions the cache holds (its last W):",
      read_keys == paged_k.stored_positions().tolist())

# %% [markdown]
# The `-1` entries are blocks the window has left: the kernel never reads them, because `window_size`
# stops it first. Any block id would do; this is the memory a sliding window hands back.
#
# What a fused kernel does differently is *how*, not *what*. FlashAttention's paged path
# (`compute_attn_1rowblock_splitkv` in `csrc/flash_attn/src/flash_fwd_kernel.h`, same commit) first bounds the
# tiles of keys it will visit by `cache_seqlens` and the window (lines 536–543), addresses the first tile
# through the table, `block_table[block_table_idx] * params.k_batch_stride` plus the offset inside the block
# (lines 591–601), and moves from tile to tile by the difference of consecutive table entries (lines 875 and
# 914): keys are loaded from where they lie, tile by tile, into on-chip memory, and the window is never
# written out. Entries outside the visited tiles are simply never touched. This reference gathers every row's window through `plan.slots` into a fresh
# `(batch, seqlen_q + W - 1, nheads_k, headdim)` tensor (`attend_paged`) and calls one masked
# `scaled_dot_product_attention` over the batch: one pass of batched tensor ops, no Python loop over rows or
# blocks, plus the copy a kernel never makes. The plan depends only on `cache_seqlens` and the block table, so
# the decoder makes it once per forward and every layer reuses it (section 5).
#
# ## 4. Step-by-step scheduling: a small pool serving far more tokens than it holds
#
# Now the real decoder, serving a queue of five requests with room for three at a time: **step-by-step
# scheduling on a shared pool**. (It is not yet continuous batching: an engine that batches continuously
# runs *one* forward over all the running requests at each step; here each running request gets its own
# batch-1 `step`, one after the other. What it shares with continuous batching is the scheduling: requests
# join and leave between steps, and blocks go back to the pool the step a request finishes. Section 5 batches
# for real.) Each request is a prompt of its own length from the held-out files and a number of
# tokens to generate greedily; the running ones decode one token each per step, interleaved, and when one
# finishes, `reset()` returns its blocks and the next request starts on them. Each of the 3 layers has its
# own pool (engines size their KV memory per layer too; vLLM's hybrid allocator can also let layers of
# different kinds share one tensor, which we leave out), sized for exactly three windows of 64 tokens in blocks
# of 16: 5 blocks a sequence, 15 a layer, 240 token slots.

# %%
model, tok = swkv_teach.load_pretrained()
heldout, files = read_stdlib(HELDOUT_FILES)
start = heldout.find("def glob(")
requests = [
    (heldout[start + 7 * r:start + 7 * r + n], gen)
    for r, (n, gen) in enumerate([(20, 150), (45, 250), (90, 120), (30, 200), (60,
                                                                               160)])
]
L, Wm, BSm = len(model.layers), model.config.window_size, 16
pools = [BlockPool(3 * PagedKVCache.max_blocks(Wm, BSm), BSm) for _ in range(L)]
# 3 running at most
lanes = [[PagedKVCache(pools[layer], Wm) for layer in range(L)] for _ in range(3)]
running = {}  # lane -> [request number, prompt ids, tokens to go, logits, generated]
queue, finished, held, fed = list(range(len(requests))), {}, [], [0]
while queue or running:
    for lane in range(3):
        # a free lane: the next request starts, its prompt as one chunk
        if lane not in running and queue:
            r = queue.pop(0)
            ids = torch.tensor([tok.encode(requests[r][0])])
            running[lane] = [
                r, ids, requests[r][1],
                model.step(ids, lanes[lane])[:, -1], []
            ]
            fed[-1] += ids.shape[1]
    for lane, job in list(running.items()):
        nxt = job[3].argmax(-1, keepdim=True)  # greedy
        job[4].append(nxt.item())
        job[2] -= 1
        if job[2] == 0:  # done: every layer's blocks go back to its pool
            finished[job[0]] = (job[1], job[4])
            for cache in lanes[lane]:
                cache.reset()
            del running[lane]
        else:
            job[3] = model.step(nxt, lanes[lane])[:, -1]
            fed[-1] += 1
    assert all(c[0].block_table == c[layer].block_table for c in lanes
               for layer in range(L))
    held.append({
        lane: (job[0], len(lanes[lane][0].block_table) * BSm)
        for lane, job in running.items()
    })
    fed.append(fed[-1])

same = [
    out == model.generate(ids, len(out), cache="ring")[0, ids.shape[1]:].tolist()
    for ids, out in (finished[r] for r in range(len(requests)))
]
print(
    f"pool per layer: {pools[0].num_blocks} blocks = {pools[0].num_blocks * BSm} token"
    f" slots; free after the queue: {[p.free_blocks for p in pools]}")
print(f"tokens through each layer: {fed[-1]}"
      f" ({fed[-1] / (pools[0].num_blocks * BSm):.1f}x the pool), in {len(held)} steps")
print("greedy text identical to the ring's, request by request:", same)
print("block tables identical across layers at every step: True (asserted)")

# %%
fig, ax = plt.subplots(figsize=(7.4, 4.4), dpi=DPI)
steps_ = torch.arange(1, len(held) + 1)
palette = plt.get_cmap("tab10").colors
base = torch.zeros(len(held))
for lane in range(3):  # one band per lane, coloured by the request running in it
    slots = torch.tensor([float(h[lane][1]) if lane in h else 0.0 for h in held])
    who = [h[lane][0] if lane in h else -1 for h in held]
    for r in range(len(requests)):
        mask = torch.tensor([w == r for w in who])
        if mask.any():
            ax.fill_between(steps_, base, base + slots, where=mask, color=palette[r],
                            alpha=0.85, lw=0, label=f"request {r + 1}", step="mid")
    base += slots
ax.axhline(pools[0].num_blocks * BSm, color="0.2", lw=1.2)
ax.text(8, pools[0].num_blocks * BSm + 8, "pool capacity (one layer)", fontsize=10)
ax.set(xlabel="decode step", ylabel="token slots held (one layer)", ylim=(0, 300),
       title="Five requests, three at a time, through a pool that holds three windows")
ax2 = ax.twinx()
ax2.plot(steps_, fed[1:], "k--", label="tokens fed so far (right axis)")
ax2.set_ylabel("tokens fed so far")
ax2.set_ylim(0, 1.05 * fed[-1])
h1, l1 = ax.get_legend_handles_labels()
h2, l2 = ax2.get_legend_handles_labels()
order = sorted(range(len(l1)), key=l1.__getitem__)
ax.legend([h1[i] for i in order] + h2, [l1[i] for i in order] + l2, loc="upper center",
          bbox_to_anchor=(0.5, -0.16), ncol=3)
fig.tight_layout()
plt.show()

# %% [markdown]
# In the figure each coloured band is one request's share of one layer's pool, stacked; the dashed line
# (right axis) counts the tokens fed so far, several times what the pool holds.

# %% [markdown]
# Each request's share saturates at 64 to 80 slots (4 or 5 blocks) however long it runs; when it finishes
# its blocks go back, and the next request grows into them. Two things to notice in the numbers above. The block tables
# are the same in every layer, because every layer takes and returns blocks in the same order: that is why
# an engine can keep one block table per sequence for all layers that share an attention type. vLLM v1 keeps
# one per *KV cache group* (`MultiGroupBlockTable` in `vllm/v1/worker/block_table.py`), and its groups are
# not "the sliding layers" and "the global layers": `_get_kv_cache_groups_uniform_page_size` in
# `vllm/v1/core/kv_cache_utils.py` splits the layers into groups of the *same number of layers*, so that
# every group's blocks have the same page size. Its docstring's example: "a model with 10 full attention
# layers and 20 sliding window attention layers ... there are 3 kv_cache_groups, each of which represents
# 10 layers" (one full, two sliding), each with its own block table. The group size is the smaller count,
# the "1" of an n : 1 pattern (its comment names Gemma 3's 5 : 1): Gemma 3 27B, 10 global and 52 sliding
# layers, gets seven groups of 10, one global and six sliding (the last padded). Only a model whose two
# counts are close (1 : 1, as Gemma 2, or within 1.5x of each other) gets two. And
# the greedy text is token for token the ring's: paging changes where the keys live, not what attention
# computes.
#
# Real engines free slightly earlier than we do. In vLLM v1 (`vllm/v1/core/single_type_kv_cache_manager.py`
# at commit 129ab7c) `SingleTypeKVCacheManager.remove_skipped_blocks` frees, before each step, the blocks
# wholly before the tokens a layer may still need, and `SlidingWindowManager.get_num_skipped_tokens` says how
# many that is for a window: `max(0, num_computed_tokens - sliding_window + 1)`, so the next query keeps its
# $W - 1$ predecessors; a null block takes the freed block's place in the table (older releases had
# `remove_skipped_blocks` on `SlidingWindowManager` itself). Ours keeps the last `W` so that its stored tokens match the ring's.
#
# ## 5. Continuous batching: one forward over every running request
#
# Section 4's loop shares a pool but not a forward: each running request gets its own batch-1 `step`.
#
# ### One forward, rows at their own positions
#
# Lesson 4 (section 8) batched two texts of 100 and 70 characters with left padding, and needed a pad mask and
# one position numbering per row to get each row right. With paging there is no padding at all. The decoder's
# batched step, `Decoder.step_paged(ids, start, kv, block_table)`, takes per layer one `(k, v)` pool of
# blocks and one block-table row per sequence: row `b`'s new tokens sit at positions `start[b], start[b] + 1,
# ...` (its own RoPE angles), its keys go into its own blocks, and it attends through its own table row.
# Prefill each prompt alone (its own length), then decode both rows in one forward per token, and compare
# each row with its text decoded alone:

# %%
# lesson 4's two texts: 100 and 70 characters
texts = [heldout[:100], heldout[300:370]]
lens2 = [len(t) for t in texts]
# 24 more tokens each
cont = torch.randint(1, tok.vocab_size, (2, 24),
                     generator=torch.Generator().manual_seed(3))
cfg = model.config
with torch.no_grad():
    alone_rows = [
        model(torch.cat([torch.tensor([tok.encode(t)]), cont[b:b + 1]],
                        1))[0, lens2[b] - 1:]
        # the oracle, one text at a time: (25, vocab)
        for b, t in enumerate(texts)
    ]
    # blocks each row needs: [8, 6]
    need = [-(-(n + 24) // BSm) for n in lens2]
    # -1: no block (never read)
    table2 = torch.full((2, max(need)), -1)
    table2[0, :need[0]] = torch.arange(need[0])
    table2[1, :need[1]] = torch.arange(need[0], need[0] + need[1])
    kv = [
        tuple(
            torch.zeros(sum(need), BSm, cfg.n_kv_heads, cfg.head_dim) for _ in range(2))
        # one (k, v) pool per layer
        for _ in model.layers
    ]
    first = [
        model.step_paged(torch.tensor([tok.encode(t)]), torch.tensor([0]), kv,
                         table2[b:b + 1])[0, -1]
        # each prompt alone, from position 0
        for b, t in enumerate(texts)
    ]
    out = [torch.stack(first)]
    # both rows in one forward, each at its own position
    for s in range(24):
        out.append(
            model.step_paged(cont[:, s:s + 1],
                             torch.tensor(lens2) + s, kv, table2)[:, -1])
logits = torch.stack(out, 1)  # (2, 25, vocab)
print("block table:", table2.tolist())
for b in range(2):
    err = (logits[b] - alone_rows[b]).abs().max().item()
    print(f"row {b} ({lens2[b]} characters): max |step_paged - alone| < 1e-4:"
          f" {err < 1e-4}")

# %% [markdown]
# Both rows exact, with no pad stored and no pad mask. A server needs one more thing: rows that join and
# leave between steps, and blocks taken from and returned to one pool while they do.
#
# `swkv_teach.serving.Scheduler` batches continuously, on that forward. It has two ways to fill a step; by
# default (`token_budget=None`) each of its steps
#
# 1. **admits** waiting requests, first come first served, while the batch has room (`max_running`) and the
#    pool can promise each request its peak number of blocks;
# 2. **prefills** each newcomer in its own forward, in chunks of `prefill_chunk` prompt tokens;
# 3. runs **one** forward, `Decoder.step_paged`, over every running request: row `b` feeds its last token at
#    its *own* position $p_b$ (its own RoPE angles), writes that token's key into its own block of the
#    shared pool, and attends through its row of the block table with `paged_attention`, whose
#    `cache_seqlens` is $p_b + 1$;
# 4. **retires** finished requests and returns their blocks; after every forward, each request also returns
#    the blocks wholly before the next query's window (vLLM's rule from section 4, keeping $W - 1$
#    predecessors).
#
# The pool holds keys and values for every layer, `(num_blocks, block_size, n_kv_heads, head_dim)` each,
# indexed by the same block numbers, so one block table serves all layers. The same five requests as in
# section 4, at most three at a time, prompts read 16 tokens per chunk: a forward of `c` new tokens at
# position `n` needs keys $n - W + 1 \dots n + c - 1$, so with $W = 64$ a request holds at most
# `ceil((64 + 16 - 2) / 16) + 1 = 6` blocks at once (5 while decoding), and 18 blocks admit three.

# %%
from IPython.display import display

from swkv_teach.serving import Scheduler

sched = Scheduler(model, num_blocks=18, block_size=16, max_running=3, prefill_chunk=16)
for text, gen in requests:
    ids = tok.encode(text)
    rid = sched.submit(ids, gen)
    print(f"request {rid}: prompt {len(ids):>2} tokens, {gen} new, "
          f"peak {sched.blocks_needed(len(ids), gen)} blocks promised")

# %% [markdown]
# Three steps by hand. The first admits and prefills three requests; from then on each step is one forward
# whose rows sit at different positions, with block-table rows of different lengths (padded with -1, never
# read):

# %%
for _ in range(3):
    batch = [r for r in sched.running if not r.done]
    if batch:
        print("  the decode forward gets, per row: request,")
        print("  position of its token -> cache_seqlens, block-table row")
        for b, r in enumerate(batch):
            print(
                f"    row {b}: request {r.id}, position {r.written} -> {r.written + 1},"
                f" {r.table}")
    rec = sched.step()
    print(f"step {rec['step']}: {rec['prefilled']} prefilled, one forward over"
          f" {rec['decoded']} rows;")
    print(f"  blocks in use {rec['used_blocks']}, promised {rec['reserved_blocks']};"
          f" running {rec['running']}, waiting {rec['waiting']}")

# %% [markdown]
# Request 2's prompt (90 tokens) was read in six chunks, and its first block went back to the pool during
# prefill: table entry 0 is -1 already. Now run the queue to the end and compare every request with
# generating it alone (`Decoder.generate`, batch 1, the ring cache):

# %%
served = sched.run()
alone = [
    model.generate(torch.tensor([tok.encode(text)]), gen)[0].tolist()
    for text, gen in requests
]
print("each request's tokens identical to generating it alone:",
      [served[i] == alone[i] for i in range(5)])
decode_forwards = sum(1 for t in sched.trace if t["decoded"])
print(f"decode forwards: {sum(gen - 1 for _, gen in requests)} in section 4 (one per"
      " token),")
print(f"{decode_forwards} here (one per step, up to 3 rows each)")
print(f"most blocks in use at once: {max(t['used_blocks'] for t in sched.trace)} of"
      f" {sched.pool.num_blocks}; free at the end: {sched.pool.free_blocks}")
try:
    Scheduler(model, num_blocks=4, block_size=16).submit(tok.encode(heldout[:200]), 10)
except ValueError as err:
    print("a request that can never fit is refused when submitted:")
    print(textwrap.fill(str(err), 86, initial_indent="  ", subsequent_indent="  "))

# %% [markdown]
# Rows of one forward at different positions, in different blocks, and the same tokens as running each
# request alone: that is what continuous batching needs from attention, and `paged_attention` gives it.
# The trace the scheduler keeps, one entry per step, draws the pool's occupancy over time:

# %%
from swkv_teach.plots import plot_pool_occupancy, plot_throughput

display(plot_pool_occupancy(sched.trace, sched.pool.num_blocks))

# %% [markdown]
# Read the figure top to bottom. The dashed line is what admission **promised**: each running request's peak,
# reserved when it is admitted, so a running request never waits for a block and nothing is ever preempted.
# The solid line is what is **in use**: 10 blocks once the first three prompts are read, growing as their
# windows fill, then stepping down by one block each time a block leaves a window and up by one each time a
# token opens a new block; a decoding request with a full window holds 4 or 5 blocks. The gap between the lines is the price of promising the peak. When a request finishes (the
# steps where "running" dips) its blocks return and the next waiting request is admitted in the same step.
#
# That is one way to share a pool: **promise the peak** (the scheduler's default, `token_budget=None`). It has
# two costs. Room is promised and not yet used (the gap between the two lines), and running requests wait
# while a newcomer's prompt has a forward of its own.
#
# ### One token budget: prompt chunks and decode rows in one forward
#
# vLLM v1's scheduler pays neither (it pays another way, by preempting: below). `Scheduler.schedule` opens
# with a note on the algorithm: "There's no
# "decoding phase" nor "prefill phase" in the scheduler. Each request just has the num_computed_tokens and
# num_tokens_with_spec. [...] At each step, the scheduler tries to assign tokens to the requests so that each
# request's num_computed_tokens can catch up its num_tokens_with_spec" (`vllm/v1/core/sched/scheduler.py`,
# lines 718–727 of vLLM 0.34.0). A step starts with `token_budget = self.max_num_scheduled_tokens` (line 735,
# the engine's `max_num_batched_tokens`), spends it on the running requests first ("First, schedule the
# RUNNING requests", line 809), then on waiting ones (line 1065), and runs one forward over whatever it
# scheduled: rows of one token (decoding) beside rows of many (a prompt's chunk).
#
# `Scheduler(..., token_budget=N)` does the same on the course's decoder. At each step it
#
# 1. gives every decoding request its one token, then spends what is left of the $N$ tokens on chunks of the
#    prompts being read, then on waiting requests, first come first served;
# 2. takes blocks as they are needed and promises none; when the pool has none left, it **preempts** the
#    newest running request (below);
# 3. runs **one** forward over all of it. Rows of different lengths do not fit one `(batch, seqlen_q)`
#    tensor without padding, so their tokens are packed one after another, `(total_q,)`, and
#    `cu_seqlens_q` says where each row starts: FlashAttention's varlen layout (`flash_attn_varlen_func`),
#    which `paged_attention(..., cu_seqlens_q=..., max_seqlen_q=...)` takes too
#    (`swkv_teach.serving.forward.step_varlen` runs the decoder on it). Logits are computed only for a row
#    whose chunk ends on its last token, where a new token is picked.
#
# The same five requests, on the same 18 blocks, with a budget of 24 tokens a step. Each line below is **one**
# forward; the rows are listed in the order the scheduler packs them:

# %%
def fed_this_step(scheduler):
    """Step once; return the step's record and its rows: (request, tokens, decoding?)"""
    queued = list(scheduler.running) + list(scheduler.waiting)
    before = {r.id: (r.written, r.written >= r.prefill_end > 0) for r in queued}
    rec = scheduler.step()
    rows = [(r.id, r.written - before[r.id][0], before[r.id][1])
            for r in queued if r.written > before[r.id][0]]
    rows.sort(key=lambda row: not row[2])  # decode rows first, as the scheduler does
    return rec, rows


budget = Scheduler(model, num_blocks=18, block_size=16, max_running=3, token_budget=24)
for text, gen in requests:
    budget.submit(tok.encode(text), gen)
for _ in range(5):
    rec, rows = fed_this_step(budget)
    cu = [0]
    for _, n, _ in rows:
        cu.append(cu[-1] + n)
    what = ", ".join(f"request {i}: {n} {'decode' if dec else 'prompt'}"
                     for i, n, dec in rows)
    tokens = rec["decode_tokens"] + rec["prefill_tokens"]
    print(f"step {rec['step']}: {tokens:>2} tokens ({what})")
    print(f"        cu_seqlens_q = {cu}, blocks in use {rec['used_blocks']}")
served_budget = budget.run()
print("each request's tokens identical to generating it alone:",
      [served_budget[i] == alone[i] for i in range(5)])

# %% [markdown]
# From the second step on, request 0 decodes in the same forward that reads request 1's prompt: nobody
# waits for a prefill. Rows at different positions with different numbers of queries, one forward, and
# still token for token what `generate` produces alone.
#
# ### Preemption, forced
#
# Taking blocks as they are needed means a step can find the pool empty. vLLM then preempts: when
# `allocate_slots` returns nothing for a running request, it picks `self.running[-1]` (line 954, the newest
# under first-come-first-served) and `self.running.pop()`s it (line 986); `_preempt_request` (lines
# 1853–1897) frees its blocks, sets `request.num_computed_tokens = 0` (line 1876) and puts it back at the
# front of the queue (`self.waiting.prepend_request(request)`, line 1896). It keeps its tokens, prompt and
# output, and computes them all again, as a prefill, when it is scheduled again; no waiting request is admitted
# in a step that preempted (`if not preempted_reqs`, line 1066). The library does the same. A pool of 12
# blocks cannot hold three of these requests' windows at once (up to 5 blocks each while decoding), so the
# budget scheduler must preempt:

# %%
tight = Scheduler(model, num_blocks=12, block_size=16, max_running=3, token_budget=24)
for text, gen in requests:
    tight.submit(tok.encode(text), gen)
while not tight.step()["preempted"]:
    pass
rec = tight.trace[-1]
victim = tight.waiting[0]
print(f"step {rec['step']}: the pool ran dry; request {victim.id} (the newest running)"
      " was preempted:")
print(f"  its blocks freed ({rec['used_blocks']} of 12 in use after the step);")
print(f"  {victim.num_tokens} tokens to compute again, first in the queue")
served_tight = tight.run()
print("each request's tokens identical to generating it alone:",
      [served_tight[i] == alone[i] for i in range(5)])
st = tight.stats()
print(f"preemptions over the run: {st['preemptions']}")
print(f"prompt tokens computed: {st['prefill_tokens_computed']} for"
      f" {sum(len(tok.encode(t)) for t, _ in requests)} prompt tokens submitted")

# %% [markdown]
# A preempted request loses nothing a learner could see: its tokens and its sampling state are kept, and
# the recomputed keys are the ones it had. What it loses is work: every token it had computed is computed
# again.
#
# ### When promising the peak beats preempting
#
# The two policies on pools of several sizes, the same five requests, at most three running. "Forwards" is
# the number of decoder forwards (with promised peaks, one per prompt plus one per decode step); "prompt
# tokens computed" counts what preemption computes again:

# %%
def serve_with(num_blocks, token_budget):
    s = Scheduler(model, num_blocks=num_blocks, block_size=16, max_running=3,
                  token_budget=token_budget)
    try:
        for text, gen in requests:
            s.submit(tok.encode(text), gen)
    except ValueError:
        return None  # a request whose peak can never be promised on this pool
    out = s.run()
    forwards = sum(t["prefilled"] + (t["decoded"] > 0) if token_budget is None else 1
                   for t in s.trace)
    same = all(out[i] == alone[i] for i in range(5))
    return (forwards, s.stats()["prefill_tokens_computed"], s.stats()["preemptions"],
            same)


print(f"{'pool':>5} | {'promise the peak':^26} | {'token budget 24, preempt':^34}")
print(f"{'':>5} | {'forwards':>9} {'prompt tokens':>14}  | {'forwards':>9}"
      f" {'prompt tokens':>14} {'preempted':>9}")
policies = {}
for blocks in (10, 12, 18, 30):
    policies[blocks] = {"peak": serve_with(blocks, None),
                        "budget": serve_with(blocks, 24)}
    p, b = policies[blocks]["peak"], policies[blocks]["budget"]
    left = f"{p[0]:>9} {p[1]:>14} " if p else f"{'refused: peak > pool':>25}"
    print(f"{blocks:>5} | {left} | {b[0]:>9} {b[1]:>14} {b[2]:>9}")
print("every run's tokens identical to generating alone:",
      all(r[3] for pair in policies.values() for r in pair.values() if r))

# %% [markdown]
# Read the table row by row:
#
# * **A pool that fits every peak (30 blocks)**: the two policies run about the same number of forwards and
#   compute each prompt token once. Promising costs nothing when the room is there.
# * **A pool that fits the requests' use but not three peaks (18 blocks)**: promising the peak admits fewer
#   requests at once and gives every prompt a forward of its own, so it needs many more forwards; the
#   budget runs three requests in far fewer forwards without a single preemption, because the peaks it did
#   not promise were never all reached at once.
# * **A tight pool (12 blocks)**: promising the peak runs one request at a time, slowly but computing every
#   token once; the budget keeps three running and preempts again and again, computing the prompts many
#   times over. Fewer forwards, far more arithmetic: on a GPU a recomputed prefill is compute-bound work,
#   and which policy finishes first depends on the model's size and the hardware.
# * **A pool below one request's peak (10 blocks)**: promising refuses the request outright; the budget
#   serves it by preempting.
#
# So reserving peaks wins when the pool is short against what the requests really use, and when a request's
# peak is known and reached (a fixed number of new tokens, as here); preempting wins when requests use far
# less than they could (a real request stops at its end-of-sequence token, well before its `max_tokens`),
# which is why vLLM promises nothing and preempts. Its tuning guide (`docs/configuration/optimization.md`,
# "Preemption", lines 65–85 of vLLM 0.34.0) says what to do when preemptions are frequent: more memory for the
# cache (`gpu_memory_utilization`, more GPUs), or fewer requests at once (lower `max_num_seqs` or
# `max_num_batched_tokens`).
#
# ## 6. Throughput against the batch size
#
# Does one forward over many requests pay? `serving_throughput` (`swkv_teach/bench/serving.py`) serves one
# queue of 16 requests (prompts of 5 to ~130 characters, 16 to 96 new tokens) one by one with
# `Decoder.generate`, then with the scheduler at most 1, 2, 4, 8 and 16 requests per forward; tokens/s for the
# whole queue, prefills included, one thread, the median of three runs taken in turn (your numbers will
# differ; nbval does not compare them).

# %%
# NBVAL_IGNORE_OUTPUT
from swkv_teach.bench.serving import serving_throughput, table

result = serving_throughput(model, concurrency=(1, 2, 4, 8, 16), repeats=3)
for line in table(result).splitlines():  # long lines wrapped to the page
    print(textwrap.fill(line, 88, subsequent_indent="    ", drop_whitespace=False))
fastest = result["one_by_one"]["tokens_per_s"]["max"]
print("fastest runs (the least disturbed by other work), x one by one's fastest:")
print({
    r["concurrency"]: round(r["tokens_per_s"]["max"] / fastest, 2)
    for r in result["rows"]
})

# %%
print("same tokens as one by one, at every batch size:",
      all(r["same_as_solo"] for r in result["rows"]))
print("scheduler steps:", {r["concurrency"]: r["steps"] for r in result["rows"]})
print("peak blocks in use:",
      {r["concurrency"]: r["peak_used_blocks"]
       for r in result["rows"]})

# %%
# NBVAL_IGNORE_OUTPUT
display(plot_throughput(result))

# %% [markdown]
# The figure plots tokens per second for the whole queue against the most requests per forward (median,
# with the fastest and slowest runs), each point labelled with its ratio to one by one, dashed.

# %% [markdown]
# The steps are deterministic: 791 new tokens take 791 steps one row at a time and 84 with up to 16 rows.
# The time is not: it depends on the machine and on its load while the cell ran (the fastest runs, printed
# as ratios above, are the least disturbed). With at most one request per forward the
# scheduler is *slower* than `generate` (the printed ratio at 1 says by how much here): every forward
# builds a plan and gathers the window through the table, where `generate` reads its ring with no mask at
# all (lesson 6, section 5). From two to four rows on, batching wins, and at 16 rows it serves several times the
# tokens per second (this run's ratio is the last printed): a forward of this tiny model costs mostly its fixed overhead (Python, one call per
# operation, reading every weight), and a forward over 16 rows pays it once for 16 tokens. On a GPU the same
# curve has a sharper reason: a decode step is bound by reading the weights from memory (lesson 0's floor),
# and a batch of `B` requests reads them once for `B` tokens.
#
# ## 7. The int8 cache: memory against the window
#
# **Your turn, before reading on:** [exercise 09](../exercises/09_int8_kv.ipynb) has you write the
# quantise and dequantise functions of this section; the grader holds them to the error bound below on
# many shapes and values, zeros included.
#
# `Int8RingBufferKVCache` stores keys and values as int8 with one float32 scale per token and head
# (`scale = max |x| / 127`, `q = round(x / scale)`), so each element comes back within `max |x| / 254`.
# Per token and head that is `head_dim + 4` bytes against `4 * head_dim` (float32) or `2 * head_dim`
# (float16), for keys and again for values. Measured `nbytes` of one layer's cache with the checkpoint's
# shape (2 KV heads, `head_dim` 24):

# %%
H, D = model.config.n_kv_heads, model.config.head_dim
windows = [16, 64, 256, 1024, 4096]
mem = {"float32 ring": [], "float16 ring": [], "int8 + scales": []}
for w in windows:
    for label, cache, dtype in (("float32 ring", RingBufferKVCache(w), torch.float32),
                                ("float16 ring", RingBufferKVCache(w), torch.float16),
                                ("int8 + scales", Int8RingBufferKVCache(w),
                                 torch.float32)):
        k = torch.randn(1, H, w, D).to(dtype)
        cache.update(k, k)
        mem[label].append(cache.nbytes)
print(f"{'window':>7} " + " ".join(f"{k:>14}" for k in mem))
for i, w in enumerate(windows):
    print(f"{w:>7} " + " ".join(f"{mem[k][i]:>14,}" for k in mem))
print("int8 / float32 = (D + 4) / (4 D) ="
      f" {mem['int8 + scales'][0] / mem['float32 ring'][0]:.3f}; int8 / float16 ="
      f" {mem['int8 + scales'][0] / mem['float16 ring'][0]:.3f}")
print(f"at head_dim 128 (Mistral 7B): int8 / float16 = {(128 + 4) / (2 * 128):.3f}")

# %%
fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=DPI)
for (label, ys), marker in zip(mem.items(), "os^"):
    ax.plot(windows, ys, marker + "-", label=label)
ax.set_xscale("log", base=2)
ax.set_yscale("log", base=2)
ax.set(xlabel="window W (tokens)", ylabel="bytes held (one layer, keys + values)",
       title="Memory grows with W; int8 shifts the line down")
ax.grid(alpha=0.3)
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# In the figure the three lines are parallel: int8 with its scales saves the same factor at every window.

# %% [markdown]
# ## 8. What int8 costs on the trained checkpoint
#
# Same model, same windows; only the cache changes. The held-out loss over 8 pieces of 256 characters of
# files the model never saw, through the float32 ring and through the int8 cache (chunks of 64), then greedy
# text from the same prompt. The exact numbers depend on your Python's standard library (the held-out files
# differ between versions), so nbval does not compare them.

# %%
T, N = 256, 8
data = torch.tensor(tok.encode(heldout[:N * T + 1]))
x, y = data[:-1].view(N, T), data[1:].view(N, T)
loss = {
    kind: (F.cross_entropy(
        model.score(x, cache=kind, chunk_size=64).flatten(0, 1), y.flatten()).item())
    for kind in ("ring", "int8")
}
lf, li = model.score(x, cache="ring",
                     chunk_size=64), model.score(x, cache="int8", chunk_size=64)
agree = (lf.argmax(-1) == li.argmax(-1)).float().mean().item()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"held-out files: {files}")
print(f"held-out loss, float32 ring: {loss['ring']:.4f} nats/char")
print(f"held-out loss, int8 cache  : {loss['int8']:.4f} nats/char "
      f" ({loss['int8'] - loss['ring']:+.4f})")
print(f"largest logit difference: {(lf - li).abs().max().item():.3f};  same top-1"
      f" prediction at {agree:.2%} of positions")

# %%
# NBVAL_IGNORE_OUTPUT
prompt = torch.tensor([tok.encode(heldout[start:start + 120])])
texts = {
    kind: model.generate(prompt, 200, cache=kind)[0, prompt.shape[1]:].tolist()
    for kind in ("ring", "int8")
}
first = next(
    (i for i, (a, b) in enumerate(zip(texts["ring"], texts["int8"])) if a != b), None)
for kind, ids_ in texts.items():
    print(f"--- {kind} ---")
    print(textwrap.fill(repr(tok.decode(ids_)), 88))
print(f"the two continuations agree for the first {first if first is not None else 200}"
      " characters")

# %% [markdown]
# The loss barely moves (a few ten-thousandths of a nat per character here), and nearly every top-1
# prediction is the same. The greedy texts agree for a while and then part: greedy decoding amplifies a tiny
# logit difference the first time two candidates are nearly tied, and from then on the model conditions on
# different text. Neither continuation is worse; they are different samples of the same model (measured here,
# on this small model only). Fewer bits need more care (KIVI, Liu et al. 2024, quantises keys per
# channel because a few channels carry large values for every token, and values per token). Hugging Face's
# `QuantizedCache` (transformers `cache_utils.py`) borrows the idea but quantises keys *and* values per
# channel, "in contrast to what was described in the paper" (its own docstring): groups of
# `q_group_size=64`, 4 bits by default, and the most recent tokens (fewer than `residual_length=128`) kept in
# full precision, re-quantised together each time that buffer fills.
#
# ## 9. Decode speed: paged and int8 beside the ring
#
# Memory is half the story; each cache also costs time per decoded token. The bench's
# `cache_decode_rows` (`swkv_teach/bench/decode.py`) decodes greedily with the ring, the paged and the int8
# cache on one random Mistral-shaped decoder (hidden 128, 2 layers, 4 query and 2 KV heads, `head_dim` 32),
# after a prompt of `W` tokens so that every timed step has a full window; one thread, repeats taken in
# turn. Here a short run, 64 tokens and 9 repeats (the bench runs 128 tokens, 15 repeats). On a machine
# busy with other work, a short run's ratios swing by tens of per cent, sometimes past 1: read the bench's
# figures below the table, not this run's, for the comparison.

# %%
# NBVAL_IGNORE_OUTPUT
from swkv_teach.bench.decode import cache_decode_rows

speed = cache_decode_rows(windows=(64, 1024), new_tokens=64, repeats=9)
print(f"{'W':>5}  {'cache':<6}{'tokens/s':>9}{'x ring, median':>16}"
      f"{'x ring, fastest':>17}  same tokens as ring")
for r in speed:
    print(f"{r['window']:>5}  {r['cache']:<6}{r['tokens_per_s']['median']:>9.0f}"
          f"{r['ratio_to_ring']:>16.2f}{r['ratio_to_ring_best']:>17.2f}"
          f"  {r['same_tokens_as_ring']}")

# %% [markdown]
# What each does per decoded token, per layer:
#
# * **ring**: writes the new key and value into slot $p \bmod W$ and attends over its `W` slots, no mask (the
#   fast path of lesson 6, section 5).
# * **paged** (`PagedKVCache.update_in_place`): writes into the current block and hands attention the whole
#   pool as a view, nothing copied, with an additive bias of 0 on the window's slots and `-inf` elsewhere;
#   a step flips two entries of the bias, and a block is taken or returned every `block_size` steps. It
#   reads every slot of its pool, which pays only because the pool is this sequence's own; a pool shared by
#   many requests is read through `paged_attention` instead (section 5).
# * **int8**: keeps keys and values in one int8 buffer (and their scales in one float32 buffer), quantises the
#   new key and value together (one scale per token and head) straight into their slot, and dequantises the
#   window once, in one pass, for attention.
#
# The course's bench (`python -m swkv_teach.bench`) sets itself targets: paged at least 0.85 of the ring's
# tokens/s and int8 at least 0.75, at $W = 64$ and $W = 1024$, judged on one thread by the fastest repeats;
# run it on a quiet machine to see how yours meets them (the README quotes one run). A short run like the one
# above depends on the machine and on what else it was doing while the cell ran, and swings more on a busy
# machine, sometimes past 1; its "same tokens" column can read False for int8: 8-bit keys change a logit
# slightly, and once a near-tie flips, greedy decoding follows another path. What int8 pays beyond the ring
# is arithmetic it cannot skip here: quantising the new token (a handful of small operations a layer) and
# dequantising `W` keys and values every step (work that grows with `W`); a fused kernel dequantises inside
# attention instead. On a GPU, where decode is bound by memory
# traffic, int8's smaller reads can make it the faster cache; on a CPU with a window this small, they do not.
#
# ## 10. Hybrid stacks in the same arithmetic
#
# Lesson 0 showed why Gemma 3 went to 5 local layers for every global one: once most layers are local, the
# global layers set the memory. The two savings of this lesson apply to the layers differently. Paging helps
# both kinds (no reservation for the maximum length), but only local layers *return* blocks; int8 halves
# every layer against bf16. KV bytes per sequence for the 27B models' shapes (Gemma 2 27B: 46 layers
# alternating local $W = 4096$ / global, 16 KV heads, `head_dim` 128; Gemma 3 27B: 62 layers, 52 local
# $W = 1024$ and 10 global, 16 KV heads, `head_dim` 128; google-deepmind/gemma `gemma/gm/nn/_gemma.py`,
# `Gemma2_27B` and `Gemma3_27B`), with blocks of 16 tokens:

# %%
def kv_bytes(layers_local, layers_global, window, context, kv_heads=16, head_dim=128,
             per_elem=2.0, extra=0.0, block=16):
    """Bytes of one sequence's KV cache at `context` tokens: paged blocks, `per_elem`
    bytes an element plus
    `extra` bytes per token and head (int8's scale), keys and values."""

    # token slots held in blocks for n stored tokens (local layers also straddle one
    # more)
    def slots(n):
        return block * math.ceil(n / block)

    local = slots(min(context, window)) + (block if context > window else 0)
    per_slot = 2 * kv_heads * (head_dim * per_elem + extra)
    return (layers_local * local + layers_global * slots(context)) * per_slot


GIB = 2**30
models = {
    "Gemma 2 27B (1:1, W 4096)": (23, 23, 4096),
    "Gemma 3 27B (5:1, W 1024)": (52, 10, 1024),
    "all 62 layers global": (0, 62, 0)
}
budget = 40 * GIB
print(f"{'':<28}{'context':>8} {'bf16 GiB':>9} {'int8 GiB':>9}"
      f" {'seqs in 40 GiB (bf16 / int8)':>30}")
for name, (loc, glo, w) in models.items():
    for ctx in (8192, 32768, 131072):
        bf16 = kv_bytes(loc, glo, w, ctx)
        i8 = kv_bytes(loc, glo, w, ctx, per_elem=1.0, extra=4.0)
        print(f"{name:<28}{ctx:>8} {bf16 / GIB:>9.2f} {i8 / GIB:>9.2f}"
              f" {int(budget // bf16):>14} / {int(budget // i8):<6}")
share = kv_bytes(0, 10, 0, 131072) / kv_bytes(52, 10, 1024, 131072)
print(
    f"\nGemma 3 27B at 128K tokens: its 10 global layers hold {share:.0%} of the cache,"
    f" the 52 local {1 - share:.0%}")

# %% [markdown]
# (Gemma 2 was trained for 8K tokens; its longer rows only extend the arithmetic.) Read the Gemma 3 rows: at
# 128K tokens its ten global layers hold almost all of the sequence's cache (the last line printed), so int8
# on the global layers alone would buy almost all of the saving, and paging's early return only ever helps
# the local layers' small share. The
# local layers' paged cost is fixed, `ceil(1023 / 16) + 1 = 65` blocks each, whatever the context. A server
# with a 40 GiB KV budget fits about twice as many 128K-token Gemma 3 sequences in int8 as in bf16.
#
# ## What to remember
#
# * A block table maps a sequence's logical blocks `p // block_size` to pool blocks; blocks are taken on
#   demand and, with a sliding window, returned the step their last token leaves the window.
# * Between updates a sequence holds at most `ceil((W - 1) / block_size) + 1` blocks: at most about one
#   block per sequence more than the window itself. Small blocks waste less; large blocks read faster.
# * The block tables of layers of one attention type coincide, so engines keep one per sequence for each
#   group of layers. vLLM v1's groups hold equal numbers of layers: 10 full + 20 sliding layers make 3
#   groups, Gemma 3 27B's 10 + 52 make seven; only a 1 : 1 model (or nearly) gets two.
# * int8 with a float32 absmax scale per token and head: `(head_dim + 4) / (2 * head_dim)` of float16, every
#   element within `max |x| / 254`, and on the checkpoint a held-out loss change in the fourth decimal.
# * In hybrid stacks the global layers dominate long-context memory: quantise them first.
# * A paged kernel (`flash_attn_with_kvcache` with a `block_table`, `paged_attention` here) reads each row's
#   window through its block table, at the row's own `cache_seqlens`; entries outside every window are never
#   read.
# * Step-by-step scheduling shares a pool; **continuous batching** also shares the forward: one forward per
#   step over every running request, each at its own position in its own blocks, requests joining and
#   leaving between steps. Reserving each request's peak means no preemption, at the price of promised but
#   unused blocks; vLLM allocates on demand and preempts (recomputes) instead.
# * Batching pays once a forward carries a few rows, and grows with the batch, every request's tokens
#   identical to generating it alone (section 6 prints this run's ratios); paged and int8 decode a little
#   slower than the ring on a CPU (section 9; the bench's targets: 0.85 and 0.75 of the ring's tokens/s).
#   Timings depend on the machine and its load: compare ratios within one run, or run the bench.
#
# Practise: [exercise 08](../exercises/08_paged_cache.ipynb) writes the block bookkeeping of section 1, and
# [exercise 09](../exercises/09_int8_kv.ipynb) the quantise/dequantise of section 7.
#
# ## Going further
#
# * Prefix sharing: vLLM lets sequences with a common prompt share its blocks (a reference count per
#   block, copy-on-write for the last partial block). With a sliding window, when can a shared prefix block
#   be freed, and by whom? Sketch the reference counts for two sequences sharing a 40-token prompt, $W = 32$,
#   blocks of 16.
# * Quantise keys per channel instead of per token (one scale per `head_dim` dimension over a block of
#   tokens, as KIVI does) in a copy of `Int8RingBufferKVCache`, and compare the held-out loss at 4 bits
#   (`QMAX = 7`) with per-token scales. Which matters more at 4 bits, and why?
