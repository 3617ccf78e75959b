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
# # Lesson 11 — A fused decode kernel: paged sliding-window attention in Triton
#
# **Time:** about 95 minutes for the lesson, plus 45–90 for [exercise 12](../exercises/12_paged_decode_kernel.ipynb), done where the lesson reaches it. **You need:** lesson 0's bandwidth floor, lesson 6, section 5
# (`flash_attn_with_kvcache` argument by argument) and lesson 7's block tables and `paged_attention`.
#
# **By the end you will be able to**
#
# * derive the online softmax (running max, running sum, rescaled accumulator) and check it on numbers;
# * read and write a small Triton kernel: programs and `tl.program_id`, blocks of `tl.arange`, pointer arithmetic,
#   masked `tl.load`/`tl.store`, `tl.where` and reductions (no Triton needed beforehand);
# * merge two partial softmaxes by log-sum-exp, and say why an empty part is where the NaNs come from;
# * read a split-KV ("flash-decoding") kernel: which program reads which block of which sequence, and why the
#   grid depends on the window, not on the sequence length;
# * show that a kernel reads nothing outside the window (a pool of NaN around it);
# * put a measured kernel on lesson 0's bandwidth floor (a roofline with a measured point), on a GPU.
#
# Lesson 7's `paged_attention` computes what a paged kernel computes, but the way PyTorch lets it: it
# *gathers* every row's window out of the pool into a new tensor, then calls SDPA on it. A fused kernel never
# writes the window out. It walks the block table and reads each block of keys and values in place, once,
# keeping the softmax in registers. This lesson builds that kernel in [Triton](https://triton-lang.org), the
# Python-embedded language vLLM's and FlashAttention's Triton backends are written in, from the one piece of
# arithmetic that makes it possible.
#
# **Where it runs.** With a CUDA GPU, Triton compiles the kernel. Without one, `import swkv_teach` sets
# `TRITON_INTERPRET=1` before Triton is imported, and Triton runs the same kernel in its *interpreter*: one
# program after another, in NumPy, on CPU tensors. That is exact, so everything below is checked against the
# reference, but it is thousands of times slower than a GPU: **times measured in the interpreter mean nothing**,
# and this notebook does not show them. On a GPU runtime section 5 times the kernel.

# %%
# %matplotlib inline
import inspect
import math
import time

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle

import swkv_teach  # first: without a GPU it sets TRITON_INTERPRET=1 before Triton is imported
from swkv_teach.attention import paged_attention
from swkv_teach.kernels import interpreted, paged_decode
from swkv_teach.kernels import decode as kd

torch.manual_seed(0)
torch.set_num_threads(1)
plt.rcParams.update({"font.size": 11, "axes.titlesize": 11, "legend.fontsize": 10})
DPI = 110
GPU = torch.cuda.is_available() and not interpreted()

# %%
# NBVAL_IGNORE_OUTPUT
import triton
import triton.language as tl

print("Triton", triton.__version__, "|", "compiled for", torch.cuda.get_device_name() if GPU else
      "nothing: Triton's interpreter runs the kernels on the CPU")

# %% [markdown]
# ## 1. The online softmax, on numbers
#
# One query, keys `k_j`, values `v_j`, scores `s_j = q · k_j / √d`. Attention is
#
# > `out = Σ_j exp(s_j) v_j / Σ_j exp(s_j)`, computed stably as `Σ_j exp(s_j − m) v_j / Σ_j exp(s_j − m)`
# > with `m = max_j s_j` (the `exp(−m)` cancels; without it `exp(90)` overflows float32).
#
# A kernel sees the keys a block at a time and cannot know `m` until it has seen them all. So it keeps three
# things for the keys seen so far: the running max `m`, the running sum `l = Σ exp(s_j − m)` and the
# accumulator `acc = Σ exp(s_j − m) v_j`. When a block arrives with a larger max `m'`, everything summed so far
# was relative to the old `m`; multiplying by `α = exp(m − m')` moves it to the new one (`exp(s − m) · exp(m − m') =
# exp(s − m')`). So, block by block:
#
# > `m' = max(m, max_block s)`, `α = exp(m − m')`, `p_j = exp(s_j − m')`,
# > `l' = α l + Σ_block p_j`, `acc' = α acc + Σ_block p_j v_j`; at the end `out = acc / l`.
#
# Milakov and Gimelshein (2018) derived it for softmax alone; Rabe and Staats (2021) and FlashAttention (Dao et
# al., 2022) applied it to attention. Triton's fused-attention tutorial writes exactly these lines
# (`_attn_fwd_inner`: `m_ij = max(m_i, rowmax)`, `alpha = exp2(m_i - m_ij)`, `l_i = l_i * alpha + l_ij`,
# `acc = acc * alpha`), and so will you, in Triton, in exercise 12 (section 2). Ten scores, one-dimensional values,
# blocks of four:

# %%
s = torch.tensor([0.5, 2.0, -1.0, 0.3, 4.0, 1.0, -2.0, 3.5, 0.0, 5.0], dtype=torch.float64)
v = torch.tensor([1.0, -1.0, 2.0, 0.5, 3.0, -2.0, 1.5, 0.0, 4.0, -0.5], dtype=torch.float64)
exact = (torch.softmax(s, 0) * v).sum()

m, l, acc = -math.inf, 0.0, 0.0
for start in range(0, len(s), 4):
    sb, vb = s[start : start + 4], v[start : start + 4]
    m_new = max(m, sb.max().item())
    alpha = math.exp(m - m_new)  # exp(-inf) = 0 before the first block
    p = torch.exp(sb - m_new)
    l, acc, m = alpha * l + p.sum().item(), alpha * acc + (p * vb).sum().item(), m_new
    print(f"keys {start}..{start + len(sb) - 1}: m = {m:4.1f}  alpha = {alpha:.4f}  l = {l:.4f}  acc = {acc:+.4f}"
          f"  acc / l = {acc / l:+.6f}")
print(f"softmax over all ten at once:                                         {exact.item():+.6f}")

# %% [markdown]
# Each line's `acc / l` is the exact attention over the keys seen so far; the last one equals the full softmax.
# Two things break if a line is skipped. Without `α` on `acc` (or on `l`), the two are measured against
# different maxima and the ratio is wrong as soon as a later block raises the max (block 2 here: `m` goes
# from 2.0 to 4.0). Without carrying the max (`m' = max_block s` alone) the update is still algebraically
# right, until a later block's max is much *lower*: `α = exp(m − m')` then overflows. With scores 200 apart,
`α = exp(200 − 0.5)` is `inf` in float32, so `l` and `acc` both become `inf`, and `out = inf / inf` is `nan`:

# %%
for carried in (True, False):
    m, l, acc = -math.inf, 0.0, 0.0
    for sb, vb in ((torch.tensor([200.0, 199.0]), torch.tensor([1.0, 2.0])), (torch.tensor([0.5, 0.0]),
                                                                                torch.tensor([3.0, 4.0]))):
        m_new = max(m, sb.max().item()) if carried else sb.max().item()
        alpha = torch.exp(torch.tensor(m - m_new, dtype=torch.float32))  # float32, as a kernel computes it
        p = torch.exp(sb - m_new)
        l, acc, m = alpha * l + p.sum(), alpha * acc + (p * vb).sum(), m_new
    print(f"max carried: {carried!s:5}  out = {(acc / l).item():.6f}")

# %% [markdown]
# ### Merging two partial results: the combine
#
# Split the keys in two parts, run the online softmax on each, and keep per part its normalised output
# `o = acc / l` and its **log-sum-exp** `lse = m + log l = log Σ exp(s_j)`. The whole is the weighted mean
# `o = (o_a e^{lse_a} + o_b e^{lse_b}) / (e^{lse_a} + e^{lse_b})`, with `lse = log(e^{lse_a} + e^{lse_b})`,
# computed as before against the larger `lse`. This is FlashAttention's split-KV combine
# (`combine_attn_seqk_parallel` in `csrc/flash_attn/src/flash_fwd_kernel.h`, lines 1191–1204 at commit
# 0251105a) and vLLM's `_fwd_kernel_stage2`. The merge is associative: any grouping of the parts gives the same.
#
# An **empty** part (no key) has `l = 0`: `o = 0` and `lse = −inf`. Merging two empty parts asks for
# `exp(lse_a − max) = exp(−inf − −inf) = exp(NaN)`. FlashAttention guards exactly that
# (`lse_max == -INFINITY ? 0.0f : lse_max`, line 1196), vLLM's unified kernel too
# (`m_j = tl.where(m_j > float("-inf"), m_j, 0.0)`). In a split kernel empty parts are common, as section 3 shows.

# %%
def part(sb, vb):
    """(lse, o) of one part: its log-sum-exp and its normalised output."""
    return torch.logsumexp(sb, 0), (torch.softmax(sb, 0) * vb).sum()


def merge(a, b):
    lse_a, o_a = a
    lse_b, o_b = b
    m = max(lse_a, lse_b)
    m = 0.0 if m == -math.inf else m  # two empty parts: subtract 0, not -inf
    wa, wb = math.exp(lse_a - m), math.exp(lse_b - m)
    total = wa + wb
    return (m + math.log(total) if total > 0 else -math.inf), (o_a * wa + o_b * wb) / (total if total > 0 else 1.0)


empty = (-math.inf, 0.0)
parts = [part(s[i : i + 3], v[i : i + 3]) for i in range(0, 10, 3)]
whole = empty
for p_ in [empty, *parts, empty]:
    whole = merge(whole, tuple(float(x) for x in p_))
print(f"merged over 4 parts and 2 empty ones: lse = {whole[0]:.6f}, out = {whole[1]:+.6f}")
print(f"all ten at once:                      lse = {torch.logsumexp(s, 0).item():.6f}, out = {exact.item():+.6f}")
print("two empty parts merge to", merge(empty, empty))

# %% [markdown]
# ## 2. The kernel, built up
#
# ### Triton in one page
#
# Exercise 12 is written in Triton, so here is all of it that the kernel uses. A Triton kernel is a Python
# function under `@triton.jit` that describes **one program**; `kernel[grid](args)` launches one program per
# point of `grid`, and each asks `tl.program_id(axis)` which one it is (on a GPU, programs run in parallel; in
# the interpreter, one after another). A program works on **blocks**: `tl.arange(0, BLOCK)` is the vector
# `0, 1, ..., BLOCK − 1`, and `BLOCK` must be a `tl.constexpr` (known when the kernel is compiled) and a power of
# two. A tensor argument arrives as a **pointer** to its first element; `X + row * stride + cols` is a block of
# pointers, the offsets in elements, computed by hand from the strides. `tl.load(ptrs, mask=m, other=x)` reads
# each pointer where `m` is true and gives `x` elsewhere; `tl.store(ptrs, values, mask=m)` writes only where `m`
# is true. `tl.where(c, a, b)` picks lane by lane; `tl.sum(x, axis)` and `tl.max(x, axis)` reduce a block;
# `tl.exp`, `tl.log`, `tl.maximum` work lane by lane.
#
# **Why masks.** A row of 10 numbers read with a block of 16 has 6 lanes past its end. Their pointers point at
# whatever follows in memory (the next row, another tensor, or an unmapped page: a crash), and nothing checks:
# an unmasked load there reads garbage, an unmasked store corrupts memory. So every load and store past a length
# that is not a multiple of the block carries a mask, and the lanes it leaves out get a value (`other`, then
# `tl.where`) that cannot change the result. A row softmax over rows of 10, in blocks of 16, one program per row,
# checked against `torch.softmax`:

# %%
@triton.jit
def row_softmax(X, Y, n_cols, stride_row, BLOCK: tl.constexpr, MASK_SCORES: tl.constexpr):
    row = tl.program_id(0)  # one program per row
    cols = tl.arange(0, BLOCK)  # 0 .. BLOCK-1, BLOCK a power of two >= n_cols
    inside = cols < n_cols  # lanes past the row's end are left out
    x = tl.load(X + row * stride_row + cols, mask=inside, other=0.0)  # never read past the end
    if MASK_SCORES:
        x = tl.where(inside, x, float("-inf"))  # padding lanes: exp(-inf) = 0, they weigh nothing
    e = tl.exp(x - tl.max(x, 0))
    tl.store(Y + row * stride_row + cols, e / tl.sum(e, 0), mask=inside)  # never write past the end


xs = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
for mask_scores in (True, False):
    ys = torch.empty_like(xs)
    row_softmax[(xs.shape[0],)](xs, ys, xs.shape[1], xs.stride(0), BLOCK=16, MASK_SCORES=mask_scores)
    print(f"padding lanes scored -inf: {mask_scores!s:5}  max |kernel - torch.softmax| < 1e-6: "
          f"{bool((ys - torch.softmax(xs, 1)).abs().max() < 1e-6)}, row 0 sums to {ys[0].sum().item():.3f}")

# %% [markdown]
# The load's mask keeps the program from reading past the row; `other=0.0` gives the 6 padding lanes a value,
# but 0 is a score too: without the `tl.where`, each adds `exp(0 − max)` to the sum, and the 10 real outputs
# sum to less than 1. Exercise 12 meets exactly this twice: a block of 16 slots of which only some are in the
# window, and a tile padded to a power of two. Triton's [tutorials](https://triton-lang.org/main/getting-started/tutorials/index.html)
# go further (vector add, fused softmax, matrix multiply), and its
# [fused-attention tutorial](https://triton-lang.org/main/getting-started/tutorials/06-fused-attention.html)
# (`python/tutorials/06-fused-attention.py`, [references](../docs/references.md)) is the online softmax of
# section 1 in Triton.
#
# ### The decode kernel
#
# `swkv_teach.kernels.paged_decode(q, k_cache, v_cache, cache_seqlens, block_table, window_size, softmax_scale,
# num_splits)` takes what `paged_attention` takes, with one query per sequence (`q` is `(batch, 1, nheads,
# headdim)`), and returns the same. It is two Triton kernels:
#
# * **pass 1**, one program per (row `b`, query head `h`, split `s`): load `q`, walk the logical blocks of the
#   split that overlap the row's window, look each up in `block_table`, and call `attend_block`, the online
#   update of section 1 on one block of keys read straight from the pool; store the split's `(lse, o)`;
# * **pass 2**, one program per (row, head): fold the splits' `(lse, o)` together with `merge`, store `out`.
#
# Here is pass 1's program, the skeleton. The query sits at `p = hi − 1` with `hi = cache_seqlens[b]`, and sees
# keys `lo ≤ j < hi` with `lo = max(hi − W, 0)` (the window convention `p − W < j ≤ p`):

# %%
print(inspect.getsource(kd._split_kernel.fn))

# %% [markdown]
# `attend_block` and `merge` are the two functions **you write in [exercise 12](../exercises/12_paged_decode_kernel.ipynb)**,
# in Triton, with the masks a real kernel needs (the window, the end of the row, a tile padded to a power of two);
# its check runs them inside this very skeleton. Do it now, then come back: the library's versions are shown
# below. The combine, pass 2:

# %%
print(inspect.getsource(kd._combine_kernel.fn))

# %% [markdown]
# ### One block, one split, several splits
#
# Build it up on a batch of three rows (lengths 5, 37 and 70), 4 query heads sharing 2 key/value heads (GQA),
# blocks of 16, a window of 24, every block at a random place in the pool. First a window that fits in **one
# block** (W = 4 on rows that do not cross a block edge), then **one split** walking two or three blocks, then
# **several splits** merged by pass 2. Each is compared with `paged_attention`:

# %%
g = torch.Generator().manual_seed(0)
B, H, Hk, D, bs = 3, 4, 2, 16, 16
seqlens = torch.tensor([5, 37, 70])
width = 5  # table columns: 70 tokens need 5 blocks of 16
pool_k = torch.randn(B * width, bs, Hk, D, generator=g)
pool_v = torch.randn(B * width, bs, Hk, D, generator=g)
table = torch.randperm(B * width, generator=g).view(B, width)
q = torch.randn(B, 1, H, D, generator=g)
for title, W, splits in (("one block ", 4, 1), ("one split ", 24, 1), ("3 splits  ", 24, 3), ("8 splits  ", 24, 8)):
    out = paged_decode(q, pool_k, pool_v, seqlens, table, window_size=W, num_splits=splits)
    ref = paged_attention(q, pool_k, pool_v, seqlens, table, window_size=W)
    print(f"{title} W = {W:2}, num_splits = {splits}: max |kernel - paged_attention| < 1e-6: "
          f"{bool((out - ref).abs().max() < 1e-6)}")
reads8 = kd.split_blocks(seqlens, 24, bs, 8, width)  # (row, split) -> [first, end) logical blocks it reads
empty8 = (reads8[..., 1] <= reads8[..., 0]).sum(1).tolist()
print("8 splits, W = 24: splits holding no block, per row:",
      ", ".join(f"row {b} (length {n}): {e} of 8" for b, (n, e) in enumerate(zip(seqlens.tolist(), empty8))))

# %% [markdown]
# (They differ by about 1e-7, float32 rounding: the kernel sums in another order.) With 8 splits and a window
# of 24, which overlaps at most 3 blocks of 16, at least five of the eight splits of every row hold no block (the
# last line: row 0's five keys fill one block, so seven of its splits are empty). An empty split stores
# `lse = −inf, o = 0`, and the combine starts from an empty part, so `merge` meets `−inf − −inf` on every row.
#
# Now the library's two functions (you have done exercise 12, haven't you?):

# %%
print(inspect.getsource(kd.attend_block.fn))
print(inspect.getsource(kd.merge.fn))

# %% [markdown]
# ## 3. The grid, and what each program reads
#
# A window of `W` keys starting anywhere in a block overlaps at most `span = ⌈(W − 1) / bs⌉ + 1` blocks. The
# kernel divides that span among `num_splits` programs per row and head, `⌈span / num_splits⌉` blocks each,
# counted back from the row's newest block. `kd.split_blocks` is the same index arithmetic in Python; here it is
# for the three rows, W = 24, 3 splits (one grid column per (row, split); the head axis repeats it `nheads` times):

# %%
W, S = 24, 3
reads = kd.split_blocks(seqlens, W, bs, S, width)
print(f"span = {kd.window_span(W, bs, width)} blocks, grid = (batch, nheads, num_splits) = ({B}, {H}, {S})")
for b in range(B):
    lo, hi = max(int(seqlens[b]) - W, 0), int(seqlens[b])
    cells = []
    for s_ in range(S):
        begin, end = reads[b, s_].tolist()
        cells.append(f"split {s_}: " + (f"blocks {list(range(begin, end))}" if end > begin else "nothing").ljust(18))
    print(f"row {b} (keys {lo}..{hi - 1}): " + "  ".join(cells))


# %%
def draw_grid(ax, seqlens, W, bs, S, width):
    """Each row's logical blocks; the window's keys; which split program reads which block."""
    reads = kd.split_blocks(seqlens, W, bs, S, width)
    colors = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]
    for b, n in enumerate(seqlens.tolist()):
        y = len(seqlens) - 1 - b
        lo = max(n - W, 0)
        for lb in range(width):
            split = next((s_ for s_ in range(S) if reads[b, s_, 0] <= lb < reads[b, s_, 1]), None)
            face = "white" if split is None else colors[split]
            ax.add_patch(Rectangle((lb * bs, y), bs, 0.8, facecolor=face, alpha=0.35, edgecolor="black"))
            if split is not None:
                ax.text(lb * bs + bs / 2, y + 0.62, f"split {split}", ha="center", fontsize=8)
            else:
                ax.text(lb * bs + bs / 2, y + 0.62, "never read", ha="center", fontsize=8, color="grey")
        ax.add_patch(Rectangle((lo, y + 0.1), n - lo, 0.3, facecolor="black"))
        ax.plot([n, n], [y, y + 0.8], color="red", lw=2)
        ax.text(-2, y + 0.4, f"row {b}\nlen {n}", ha="right", va="center", fontsize=9)
    ax.set(xlim=(-14, width * bs + 2), ylim=(-0.2, len(seqlens)), yticks=[], xlabel="key position",
           title=f"W = {W}, blocks of {bs}, {S} split programs per row and head: black = the window's keys, "
                 "red = cache_seqlens")


fig, ax = plt.subplots(figsize=(10, 3.2), dpi=DPI)
draw_grid(ax, seqlens, W, bs, S, width)
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# Every program reads only blocks the window overlaps, and inside them only the window's slots: the masks in
# `attend_block` keep a load away from key positions before `lo` and from slots past `cache_seqlens` (the last
# block is partly written). Row 0's window reaches back only to key 0, so its early splits are empty. The white
# blocks are never read, nor are their table entries: a freed block (−1 in the table) can sit there.
#
# That is a claim a test can check. Poison everything the window does not cover: every pool slot outside the
# windows becomes NaN, and every table entry of a block outside them −1 or 2⁴⁰. One NaN read anywhere would turn
# an output into NaN:

# %%
poisoned_k = torch.full_like(pool_k, float("nan"))
poisoned_v = torch.full_like(pool_v, float("nan"))
poisoned_table = table.clone()
for b in range(B):
    lo, hi = max(int(seqlens[b]) - W, 0), int(seqlens[b])
    for lb in range(width):
        if not (lo // bs <= lb <= (hi - 1) // bs):
            poisoned_table[b, lb] = -1 if lb % 2 else 2**40
    j = torch.arange(lo, hi)
    poisoned_k[table[b, j // bs], j % bs] = pool_k[table[b, j // bs], j % bs]
    poisoned_v[table[b, j // bs], j % bs] = pool_v[table[b, j // bs], j % bs]
out = paged_decode(q, poisoned_k, poisoned_v, seqlens, poisoned_table, window_size=W, num_splits=3)
ref = paged_attention(q, pool_k, pool_v, seqlens, table, window_size=W)
print(f"NaN slots in the pool: {int(poisoned_k.isnan().sum()) // (Hk * D)} of {B * width * bs}; "
      f"table entries -1 or 2**40: {int(((poisoned_table < 0) | (poisoned_table >= B * width)).sum())}")
print(f"output finite: {bool(out.isfinite().all())}, max |kernel - paged_attention on the clean pool| < 1e-6: "
      f"{bool((out - ref).abs().max() < 1e-6)}")

# %% [markdown]
# ### The window bounds the work
#
# The grid is `(batch, nheads, num_splits)` and each program reads at most `⌈span / num_splits⌉` blocks, where
# `span` depends on `W` and the block size only. A row of a million tokens costs exactly what a row of a hundred
# costs once both are longer than the window. That is not how the split kernels we read cut the work:
# FlashAttention's `compute_attn_1rowblock_splitkv` sizes its splits from the whole `seqlen_k` (line 535) and lets
# the local window clip each one (lines 536–544), so with a long sequence most of its splits exit at once; vLLM's
# Triton decode kernel `_fwd_kernel_stage1` has no window at all and divides `seq_len` by `NUM_KV_SPLITS`, and its
# unified kernel prunes tiles outside the window (`kernel_unified_attention_2d`, "sliding-window tile pruning")
# but sizes the segments of its split version from `seq_len` (`kernel_unified_attention_3d`,
# `tiles_per_segment = cdiv_fn(seq_len, num_segments * TILE_SIZE)`). Cut from the sequence, the blocks each split
# reads, and so how evenly the work spreads, follow the sequence length:

# %%
lengths = [2**k for k in range(5, 21)]
W, S, bs_ = 4096, 8, 16
per_window = [int((kd.split_blocks([n], W, bs_, S, n // bs_ + 1).diff(dim=-1).clamp(min=0)).max()) for n in lengths]
per_seq = []  # splits cut from the whole sequence, as seqlen_k / num_splits: the busiest split's window blocks
for n in lengths:
    per, first = -(-(-(-n // bs_)) // S), max(n - W, 0) // bs_
    per_seq.append(max(max(0, min((s_ + 1) * per, -(-n // bs_)) - max(s_ * per, first)) for s_ in range(S)))
fig, ax = plt.subplots(figsize=(7, 3.4), dpi=DPI)
ax.plot(lengths, per_window, "o-", label="splits of the window (this kernel)")
ax.plot(lengths, per_seq, "s--", label="splits of the sequence, clipped by the window")
ax.axhline(-(-kd.window_span(W, bs_, 10**9) // S), color="grey", lw=0.8)
ax.set(xscale="log", xlabel="tokens in the sequence", ylabel="blocks the busiest program reads",
       title=f"W = {W}, blocks of {bs_}, {S} splits per row and head")
ax.legend()
ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# Once the sequence is longer than the window, a split of the sequence holds more and more positions, the window
# falls inside one or two of them, and those programs read the whole window while the others do nothing: the
# parallelism the split was for is gone. Splitting the window keeps `⌈span / S⌉ = 33` blocks per program at any
# length. (FlashAttention chooses `num_splits` from the number of blocks too, `num_splits_heuristic` in
# `flash_api.cpp`, which softens this; the grey line is the bound.)
#
# ## 4. Bytes, and lesson 0's floor
#
# Decode attention reads each key and value once and does two multiply-adds with it per query head that shares
# it: `4 · W · D · H` FLOPs for `2 · W · D · Hk · itemsize` bytes per row. Its **arithmetic intensity** is
# `2 H / (Hk · itemsize)` FLOP per byte: 4 for bfloat16 with 4 query heads per key/value head. An H100's tensor
# cores do 989 dense bf16 TFLOPS and its memory delivers 3.35 TB/s ([references](../docs/references.md#gpus-memory-bandwidth)),
# a ridge point of 295 FLOP/byte: decode attention sits about 70 times left of it, so it is
# **memory-bound**, and lesson 0's floor, bytes divided by bandwidth, is the right yardstick. A good decode kernel
# is one whose bytes per second come close to the memory's.

# %%
GPUS = {"T4": 320e9, "A100": 2039e9, "H100": 3350e9, "H200": 4800e9}  # lesson 0's data-sheet peaks, bytes/s


def window_bytes(seqlens, W, Hk, D, itemsize):
    """Bytes a decode step must read at least: every row's window of keys and values, every kv head."""
    return int(seqlens.clamp(max=W).sum()) * 2 * Hk * D * itemsize


def intensity(H, Hk, itemsize):
    return 2 * H / (Hk * itemsize)


fig, ax = plt.subplots(figsize=(7.5, 4), dpi=DPI)
x = torch.logspace(-1, 3, 100)
for name, bw in GPUS.items():
    ax.plot(x, x * bw / 1e12, lw=1.2, label=f"{name}: {bw / 1e12:.2f} TB/s")
ax.axvspan(intensity(1, 1, 2), intensity(8, 1, 2), color="grey", alpha=0.2)
ax.text(1.1, 0.13, "decode attention, bf16,\n1 to 8 query heads\nper kv head", fontsize=9)
ax.axvline(989e12 / 3.35e12, color="black", ls="--", lw=1)
ax.text(989e12 / 3.35e12 / 1.1, 1500, "H100 ridge point:\n989 TFLOPS / 3.35 TB/s", ha="right", va="top", fontsize=9)
ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte read)",
       ylabel="TFLOP/s the memory can feed", ylim=(0.1, 5000),
       title="Memory roofs (lesson 0's data-sheet bandwidths): decode attention sits far left")
ax.legend(fontsize=8, loc="upper left")
ax.grid(alpha=0.3, which="both")
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# ## 5. On a GPU: time it, and put it on the roof
#
# On a GPU runtime this cell times three ways to do one decode step's attention for a batch of 32 rows of 8,192
# tokens, W = 4,096, 32 query heads over 8 key/value heads, headdim 128, bfloat16, blocks of 16:
#
# * `paged_decode`'s kernels (`kd.decode_launch`, the checks left out as `attend_paged` leaves them out);
# * `paged_attention`'s hot path (`attend_paged` with a plan made once): a gather of every window, then SDPA;
# * SDPA on the windows already laid out densely: the best case for a library kernel, without any paging.
#
# and turns each time into bytes per second against lesson 0's floor. Without a GPU it says so and stops: the
# interpreter's times would measure NumPy, not the kernel.

# %%
# NBVAL_IGNORE_OUTPUT
def cuda_ms(fn, repeats=20):
    """Median milliseconds of fn() by CUDA events, after a warm-up that also compiles."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


measured = {}
if GPU:
    from swkv_teach.attention import attend_paged, paged_plan

    dev, dt = torch.device("cuda"), torch.bfloat16
    Bg, Hg, Hkg, Dg, bsg, Wg, ng = 32, 32, 8, 128, 16, 4096, 8192
    wg = ng // bsg
    kg = torch.randn(Bg * wg, bsg, Hkg, Dg, device=dev, dtype=dt)
    vg = torch.randn_like(kg)
    tg = torch.randperm(Bg * wg, device=dev).view(Bg, wg).int()
    sg = torch.full((Bg,), ng, device=dev, dtype=torch.int32)
    qg = torch.randn(Bg, 1, Hg, Dg, device=dev, dtype=dt)
    scale = 1 / math.sqrt(Dg)
    splits = kd.default_num_splits(Bg * Hg, kd.window_span(Wg, bsg, wg), dev)
    plan = paged_plan(sg, tg, 1, bsg, kg.shape[0], Wg, dev)
    dense_k = kg.reshape(-1, Hkg, Dg)[plan.slots].transpose(1, 2).contiguous()  # (B, Hk, W, D), laid out once
    dense_v = vg.reshape(-1, Hkg, Dg)[plan.slots].transpose(1, 2).contiguous()
    qt = qg.transpose(1, 2)
    err = (kd.decode_launch(qg, kg, vg, sg, tg, Wg, scale, splits).float()
           - attend_paged(qg, kg, vg, plan, scale).float()).abs().max().item()
    print(f"{torch.cuda.get_device_name()}: num_splits = {splits}, max |kernel - paged_attention| = {err:.1e}")
    runs = {
        "paged_decode (Triton)": lambda: kd.decode_launch(qg, kg, vg, sg, tg, Wg, scale, splits),
        "paged_attention (gather + SDPA)": lambda: attend_paged(qg, kg, vg, plan, scale),
        "SDPA on dense windows": lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, dense_k, dense_v, scale=scale, enable_gqa=True),
    }
    nbytes = window_bytes(sg.cpu().long(), Wg, Hkg, Dg, 2)
    for name, fn in runs.items():
        ms = cuda_ms(fn)
        measured[name] = (ms, nbytes / (ms / 1e3))
        print(f"{name:32} {ms * 1e3:8.1f} us   {measured[name][1] / 1e9:7.0f} GB/s")
    # the floor: the data-sheet peak of this GPU if lesson 0 lists it, else a device-to-device copy measured here
    peak = next((bw for n, bw in GPUS.items() if n in torch.cuda.get_device_name()), None)
    if peak is None:
        buf = torch.empty(2**28, device=dev, dtype=torch.uint8)
        peak = 2 * buf.numel() / (cuda_ms(lambda: buf.clone()) / 1e3)
    print(f"floor: {nbytes / 1e6:.0f} MB / {peak / 1e9:.0f} GB/s = {nbytes / peak * 1e6:.1f} us")
else:
    print("No GPU: Triton runs in its interpreter here, and its times measure NumPy, not a kernel; nothing is timed.")

# %%
if measured:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    ai = intensity(Hg, Hkg, 2)
    x = torch.logspace(-1, 3, 100)
    ax.plot(x, x * peak / 1e12, color="black", lw=1, label=f"memory roof, {peak / 1e12:.2f} TB/s")
    for (name, (ms, bps)), marker in zip(measured.items(), "o^s"):
        ax.plot([ai], [bps * ai / 1e12], marker, ms=9, label=f"{name}: {bps / peak:.0%} of the roof")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP per byte)", ylabel="TFLOP/s",
           title=f"Decode attention on {torch.cuda.get_device_name()}: measured points under the roof")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    plt.tight_layout()
    plt.show()
    plt.close(fig)

# %% [markdown]
# What to look for on a GPU: the gather in `paged_attention` writes every window out and reads it back (in
# float32, as `attend_paged` converts it), several times the bytes of the kernel, so it lands well below the roof; SDPA on dense windows is the ceiling for a
# kernel that reads contiguous memory; the Triton kernel reads the window once, in place, through the block table.
# This teaching kernel computes each score with a multiply and a sum on the CUDA cores, one query head per
# program; vLLM's grouped kernel (`_fwd_grouped_kernel_stage1`) puts the query heads of one key/value head in one
# program so each block is loaded once for all of them, and uses `tl.dot`, which is where the next factor lies.
#
# ## What you learned
#
# * The online softmax keeps `(m, l, acc)` and rescales by `α = exp(m − m')` whenever the max rises; the max must
#   be carried, or a falling max overflows.
# * Partial results merge exactly by log-sum-exp; an empty part is `(−inf, 0)`, and two of them make `−inf − −inf`,
#   the NaN every split kernel guards against.
# * A split-KV decode kernel runs `(batch, heads, splits)` programs; with a sliding window, splitting the window
#   (not the sequence) makes the grid and each program's work independent of the sequence length.
# * It reads nothing outside the window: a pool of NaN around it, and −1 in the table, change nothing.
# * Decode attention does about `2 H / (Hk · itemsize)` FLOP per byte, far below any GPU's ridge point: it is
#   judged by bytes per second against the memory's.
#
# ## Going further
#
# 1. Put the `GROUP` query heads of one key/value head in one program (a `(GROUP, BLOCK_D)` query tile) so each
#    block is read once per group; how many bytes does a step read then, and what does the interpreter say about
#    equality?
# 2. An int8 pool (lesson 7) with one scale per token and head: where in `attend_block` does the dequantisation
#    go, and what does it do to the arithmetic intensity?
# 3. Lesson 0's floor adds the weights' bytes to the cache's. At which batch and window does attention's share of
#    a decode step's bytes pass one half for Mistral 7B?
