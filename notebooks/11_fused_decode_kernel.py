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
# **Time:** about 140 minutes for the lesson (reading the kernel code it prints included), plus 45–90 for [exercise 12](../exercises/12_paged_decode_kernel.ipynb), done where the lesson reaches it. **You need:** lesson 0's bandwidth floor, lesson 6, section 5
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
# program after another, in NumPy, on CPU tensors. It is faithful to Triton's semantics (the same pointers, masks,
# loads and reductions), so everything below is checked against the reference; but it is sequential, so it shows
# nothing of what programs running at once do to each other, and its numerics are the CPU's (results agree with a
# GPU's to float32 rounding, not bit for bit). It is also thousands of times slower than a GPU: **times measured in
# the interpreter mean nothing**, and this notebook does not show them. On a GPU runtime section 5 times the kernel.

# %%
# %matplotlib inline
import inspect
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.patches import Rectangle

# first: without a GPU it sets TRITON_INTERPRET=1 before Triton is imported
import swkv_teach
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
from swkv_teach.kernels import require_triton

require_triton()  # Colab's CPU runtime has no Triton: there this installs it
import triton
import triton.language as tl

print(
    "Triton",
    triton.__version__,
    "|",
    "compiled for",
    (
        torch.cuda.get_device_name()
        if GPU
        else "nothing: Triton's interpreter runs the kernels on the CPU"
    ),
)

# %% [markdown]
# ## 1. The online softmax, on numbers
#
# One query, keys $k_j$, values $v_j$, scores $s_j = q \cdot k_j / \sqrt{d}$. Attention is
#
# $$\text{out} = \frac{\sum_j e^{s_j} v_j}{\sum_j e^{s_j}} = \frac{\sum_j e^{s_j - m} v_j}{\sum_j e^{s_j - m}},
# \qquad m = \max_j s_j,$$
#
# the second form being the stable one (the $e^{-m}$ cancels; without it $e^{90}$ overflows float32).
#
# A kernel sees the keys a block at a time and cannot know $m$ until it has seen them all. So it keeps three
# things for the keys seen so far: the running max $m$, the running sum $l = \sum_j e^{s_j - m}$ and the
# accumulator $\text{acc} = \sum_j e^{s_j - m} v_j$. When a block arrives with a larger max $m'$, everything summed
# so far was relative to the old $m$; multiplying by $\alpha = e^{m - m'}$ moves it to the new one
# ($e^{s - m} e^{m - m'} = e^{s - m'}$). So, block by block:
#
# $$m' = \max\bigl(m, \max_{j \in \text{block}} s_j\bigr), \quad \alpha = e^{m - m'}, \quad p_j = e^{s_j - m'},$$
# $$l' = \alpha\, l + \sum_{j \in \text{block}} p_j, \quad
# \text{acc}' = \alpha\, \text{acc} + \sum_{j \in \text{block}} p_j v_j, \qquad \text{at the end } \text{out} = \text{acc} / l.$$
#
# Milakov and Gimelshein (2018) derived it for softmax alone; Rabe and Staats (2021) and FlashAttention (Dao et
# al., 2022) applied it to attention. Triton's fused-attention tutorial writes exactly these lines
# (`_attn_fwd_inner`: `m_ij = max(m_i, rowmax)`, `alpha = exp2(m_i - m_ij)`, `l_i = l_i * alpha + l_ij`,
# `acc = acc * alpha`), and so will you, in Triton, in exercise 12 (section 2). Ten scores, one-dimensional values,
# blocks of four:

# %%
s = torch.tensor(
    [0.5, 2.0, -1.0, 0.3, 4.0, 1.0, -2.0, 3.5, 0.0, 5.0], dtype=torch.float64
)
v = torch.tensor(
    [1.0, -1.0, 2.0, 0.5, 3.0, -2.0, 1.5, 0.0, 4.0, -0.5], dtype=torch.float64
)
exact = (torch.softmax(s, 0) * v).sum()

m, l, acc = -math.inf, 0.0, 0.0
for start in range(0, len(s), 4):
    sb, vb = s[start : start + 4], v[start : start + 4]
    m_new = max(m, sb.max().item())
    alpha = math.exp(m - m_new)  # exp(-inf) = 0 before the first block
    p = torch.exp(sb - m_new)
    l, acc, m = alpha * l + p.sum().item(), alpha * acc + (p * vb).sum().item(), m_new
    print(
        f"keys {start}..{start + len(sb) - 1}: m = {m:4.1f}  alpha = {alpha:.4f}  l ="
        f" {l:.4f}  acc = {acc:+.4f}  acc / l = {acc / l:+.6f}"
    )
print(
    "softmax over all ten at once:                                        "
    f" {exact.item():+.6f}"
)

# %% [markdown]
# Each line's `acc / l` is the exact attention over the keys seen so far; the last one equals the full softmax.
# Two things break if a line is skipped. Without `α` on `acc` (or on `l`), the two are measured against
# different maxima and the ratio is wrong as soon as a later block raises the max (block 2 here: `m` goes
# from 2.0 to 4.0). Without carrying the max ($m' = \max_{\text{block}} s$ alone) the update is still algebraically
# right, until a later block's max is much *lower*: $\alpha = e^{m - m'}$ then overflows. With scores 200 apart,
# $\alpha = e^{200 - 0.5}$ is `inf` in float32, so `l` and `acc` both become `inf`, and `out = inf / inf` is `nan`:

# %%
for carried in (True, False):
    m, l, acc = -math.inf, 0.0, 0.0
    for sb, vb in (
        (torch.tensor([200.0, 199.0]), torch.tensor([1.0, 2.0])),
        (torch.tensor([0.5, 0.0]), torch.tensor([3.0, 4.0])),
    ):
        m_new = max(m, sb.max().item()) if carried else sb.max().item()
        # float32, as a kernel computes it
        alpha = torch.exp(torch.tensor(m - m_new, dtype=torch.float32))
        p = torch.exp(sb - m_new)
        l, acc, m = alpha * l + p.sum(), alpha * acc + (p * vb).sum(), m_new
    print(f"max carried: {carried!s:5}  out = {(acc / l).item():.6f}")

# %% [markdown]
# ### Merging two partial results: the combine
#
# Split the keys in two parts, run the online softmax on each, and keep per part its normalised output
# $o = \text{acc} / l$ and its **log-sum-exp** $\text{lse} = m + \log l = \log \sum_j e^{s_j}$. The whole is the
# weighted mean
#
# $$o = \frac{o_a\, e^{\text{lse}_a} + o_b\, e^{\text{lse}_b}}{e^{\text{lse}_a} + e^{\text{lse}_b}}, \qquad
# \text{lse} = \log\bigl(e^{\text{lse}_a} + e^{\text{lse}_b}\bigr),$$
#
# computed as before against the larger $\text{lse}$. This is FlashAttention's split-KV combine
# (`combine_attn_seqk_parallel` in `csrc/flash_attn/src/flash_fwd_kernel.h`, lines 1191–1204 at commit
# 0251105a) and vLLM's `_fwd_kernel_stage2`. The merge is associative: any grouping of the parts gives the same.
#
# An **empty** part (no key) has $l = 0$: $o = 0$ and `lse = −inf`. Merging two empty parts asks for
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
    return (m + math.log(total) if total > 0 else -math.inf), (o_a * wa + o_b * wb) / (
        total if total > 0 else 1.0
    )


empty = (-math.inf, 0.0)
parts = [part(s[i : i + 3], v[i : i + 3]) for i in range(0, 10, 3)]
whole = empty
for p_ in [empty, *parts, empty]:
    whole = merge(whole, tuple(float(x) for x in p_))
print(
    f"merged over 4 parts and 2 empty ones: lse = {whole[0]:.6f}, out = {whole[1]:+.6f}"
)
print(
    f"all ten at once:                      lse = {torch.logsumexp(s, 0).item():.6f},"
    f" out = {exact.item():+.6f}"
)
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
def row_softmax(
    X, Y, n_cols, stride_row, BLOCK: tl.constexpr, MASK_SCORES: tl.constexpr
):
    row = tl.program_id(0)  # one program per row
    cols = tl.arange(0, BLOCK)  # 0 .. BLOCK-1, BLOCK a power of two >= n_cols
    inside = cols < n_cols  # lanes past the row's end are left out
    # never read past the end
    x = tl.load(X + row * stride_row + cols, mask=inside, other=0.0)
    if MASK_SCORES:
        # padding lanes: exp(-inf) = 0, they weigh nothing
        x = tl.where(inside, x, float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    # never write past the end
    tl.store(Y + row * stride_row + cols, e / tl.sum(e, 0), mask=inside)


xs = torch.randn(3, 10, generator=torch.Generator().manual_seed(0))
for mask_scores in (True, False):
    ys = torch.empty_like(xs)
    row_softmax[(xs.shape[0],)](
        xs, ys, xs.shape[1], xs.stride(0), BLOCK=16, MASK_SCORES=mask_scores
    )
    print(
        f"padding lanes scored -inf: {mask_scores!s:5}  max |kernel - torch.softmax| <"
        f" 1e-6: {bool((ys - torch.softmax(xs, 1)).abs().max() < 1e-6)},\n  row 0 sums"
        f" to {ys[0].sum().item():.3f}"
    )

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
# **A 2-D tile.** Attention needs one more step: a block of keys is a *matrix*, `BLOCK_N` key rows of `head_dim`
# numbers each. Two `tl.arange`s give the row and column offsets, and broadcasting them, `rows[:, None]` against
# `cols[None, :]`, makes a `(BLOCK_N, BLOCK_D)` block of pointers. Both axes may be padded (10 keys in a tile of
# 16 rows, a `head_dim` of 24 in 32 columns), so the mask is two masks broadcast the same way and joined by `&`.
# One query's scores against every key of the tile are then a lane-by-lane product with the query broadcast along
# the rows, summed along the columns, `tl.sum(..., axis=1)`: one number per key row.


# %%
@triton.jit
def tile_scores(
    Q, K, S, n_keys, head_dim, stride_key, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
):
    rows = tl.arange(0, BLOCK_N)  # (BLOCK_N,) key rows, padded past n_keys
    cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,) head_dim columns, padded past head_dim
    q = tl.load(Q + cols, mask=cols < head_dim, other=0.0)  # (BLOCK_D,)
    # (BLOCK_N, BLOCK_D) pointer block
    ptrs = K + rows[:, None] * stride_key + cols[None, :]
    # a mask on both axes
    inside = (rows < n_keys)[:, None] & (cols < head_dim)[None, :]
    k = tl.load(ptrs, mask=inside, other=0.0)  # (BLOCK_N, BLOCK_D); padding lanes are 0
    s = tl.sum(q[None, :] * k, axis=1)  # (BLOCK_N,): one dot product per key row
    tl.store(S + rows, s, mask=rows < n_keys)


keys = torch.randn(10, 24, generator=torch.Generator().manual_seed(1))
query = torch.randn(24, generator=torch.Generator().manual_seed(2))
scores = torch.empty(10)
tile_scores[(1,)](query, keys, scores, 10, 24, keys.stride(0), BLOCK_N=16, BLOCK_D=32)
print(
    "10 keys of head_dim 24 in a (16, 32) tile: max |kernel - keys @ query| < 1e-5: "
    f"{bool((scores - keys @ query).abs().max() < 1e-5)}"
)

# %% [markdown]
# The padded columns are 0 in both `q` and `k`, so they add nothing to a dot product; the padded rows are never
# stored. In attention they would still be scores, `0`, and need the `tl.where(..., float("-inf"))` of the row
# softmax before any `exp`: exercise 12's `attend_block` is this tile plus that, plus the online update.
#
# ### Why split the keys: decode has too few rows
#
# During decode every sequence brings **one** query per head. A kernel that gives each (row, head) one program,
# as FlashAttention's forward does, launches $\text{batch} \times \text{heads}$ programs: 32 at batch 1 for a model with 32 query
# heads, on a GPU with 132 streaming multiprocessors (an H100 SXM), each program walking the whole window alone.
# Most of the GPU idles, and the time grows with the window. Flash-decoding (Dao, Haziza, Massa and Sizov, 2023,
# [references](../docs/references.md#papers)) splits each row's keys among several programs, each running the
# online softmax over its part, and merges the parts by log-sum-exp (section 1). At a large batch,
# $\text{batch} \times \text{heads}$ programs fill the GPU on their own, and one split is best: the library's
# `kd.default_num_splits` asks for about two programs per multiprocessor and gives 1 split once
# $\text{batch} \times \text{heads}$ reaches that.
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
# keys $\text{lo} \le j < \text{hi}$ with $\text{lo} = \max(\text{hi} - W, 0)$ (the window convention
# $p - W < j \le p$):

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
# block** ($W = 4$ on rows that do not cross a block edge), then **one split** walking two or three blocks, then
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
for title, W, splits in (
    ("one block ", 4, 1),
    ("one split ", 24, 1),
    ("3 splits  ", 24, 3),
    ("8 splits  ", 24, 8),
):
    out = paged_decode(
        q, pool_k, pool_v, seqlens, table, window_size=W, num_splits=splits
    )
    ref = paged_attention(q, pool_k, pool_v, seqlens, table, window_size=W)
    print(
        f"{title} W = {W:2}, num_splits = {splits}: max |kernel - paged_attention| <"
        f" 1e-6: {bool((out - ref).abs().max() < 1e-6)}"
    )
# (row, split) -> [first, end) logical blocks it reads
reads8 = kd.split_blocks(seqlens, 24, bs, 8, width)
empty8 = (reads8[..., 1] <= reads8[..., 0]).sum(1).tolist()
print(
    "8 splits, W = 24: splits holding no block, per row:\n ",
    ", ".join(
        f"row {b} (length {n}): {e} of 8"
        for b, (n, e) in enumerate(zip(seqlens.tolist(), empty8))
    ),
)

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
# A window of `W` keys starting anywhere in a block overlaps at most $\text{span} = \lceil (W - 1) / \text{bs} \rceil + 1$ blocks. The
# kernel divides that span among `num_splits` programs per row and head, $\lceil \text{span} / \text{num\_splits} \rceil$ blocks each,
# counted back from the row's newest block. `kd.split_blocks` is the same index arithmetic in Python; here it is
# for the three rows, $W = 24$, 3 splits (one grid column per (row, split); the head axis repeats it `nheads` times):

# %%
W, S = 24, 3
reads = kd.split_blocks(seqlens, W, bs, S, width)
print(
    f"span = {kd.window_span(W, bs, width)} blocks, grid = (batch, nheads, num_splits)"
    f" = ({B}, {H}, {S})"
)
for b in range(B):
    lo, hi = max(int(seqlens[b]) - W, 0), int(seqlens[b])
    cells = []
    for s_ in range(S):
        begin, end = reads[b, s_].tolist()
        cells.append(
            f"split {s_}: "
            + (f"blocks {list(range(begin, end))}" if end > begin else "nothing").ljust(
                18
            )
        )
    print(f"row {b} (keys {lo}..{hi - 1}):\n  " + "  ".join(cells).rstrip())


# %% tags=["hide-input"]
def draw_grid(ax, seqlens, W, bs, S, width):
    """Each row's logical blocks, the window's keys, which split reads which block."""
    reads = kd.split_blocks(seqlens, W, bs, S, width)
    colors = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]
    for b, n in enumerate(seqlens.tolist()):
        y = len(seqlens) - 1 - b
        lo = max(n - W, 0)
        for lb in range(width):
            split = next(
                (s_ for s_ in range(S) if reads[b, s_, 0] <= lb < reads[b, s_, 1]), None
            )
            face = "white" if split is None else colors[split]
            ax.add_patch(
                Rectangle(
                    (lb * bs, y), bs, 0.8, facecolor=face, alpha=0.35, edgecolor="black"
                )
            )
            if split is not None:
                ax.text(
                    lb * bs + bs / 2,
                    y + 0.62,
                    f"split {split}",
                    ha="center",
                    fontsize=8,
                )
            else:
                ax.text(
                    lb * bs + bs / 2,
                    y + 0.62,
                    "never read",
                    ha="center",
                    fontsize=8,
                    color="grey",
                )
        ax.add_patch(Rectangle((lo, y + 0.1), n - lo, 0.3, facecolor="black"))
        ax.plot([n, n], [y, y + 0.8], color="red", lw=2)
        ax.text(-2, y + 0.4, f"row {b}\nlen {n}", ha="right", va="center", fontsize=9)
    ax.set(
        xlim=(-14, width * bs + 2),
        ylim=(-0.2, len(seqlens)),
        yticks=[],
        xlabel="key position",
        title=(
            f"W = {W}, blocks of {bs}, {S} split programs per row and head: black = the"
            " window's keys, red = cache_seqlens"
        ),
    )


fig, ax = plt.subplots(figsize=(10, 3.2), dpi=DPI)
draw_grid(ax, seqlens, W, bs, S, width)
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# *The figure:* one bar per row, one box per logical block of 16 key positions; a box's colour says which split
# program reads it, white boxes are never read, the black strip is the window's keys and the red line the row's
# `cache_seqlens`.
#
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
out = paged_decode(
    q, poisoned_k, poisoned_v, seqlens, poisoned_table, window_size=W, num_splits=3
)
ref = paged_attention(q, pool_k, pool_v, seqlens, table, window_size=W)
print(
    f"NaN slots in the pool: {int(poisoned_k.isnan().sum()) // (Hk * D)} of"
    f" {B * width * bs}; table entries -1 or 2**40:"
    f" {int(((poisoned_table < 0) | (poisoned_table >= B * width)).sum())}"
)
print(
    f"output finite: {bool(out.isfinite().all())}, max |kernel - paged_attention on the"
    f" clean pool| < 1e-6: {bool((out - ref).abs().max() < 1e-6)}"
)

# %% [markdown]
# ### The window bounds the work
#
# The grid is `(batch, nheads, num_splits)` and each program reads at most $\lceil \text{span} / \text{num\_splits} \rceil$ blocks, where
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
per_window = [
    int((kd.split_blocks([n], W, bs_, S, n // bs_ + 1).diff(dim=-1).clamp(min=0)).max())
    for n in lengths
]
# splits cut from the whole sequence (seqlen_k / num_splits): the busiest split's
# window blocks
per_seq = []
for n in lengths:
    per, first = -(-(-(-n // bs_)) // S), max(n - W, 0) // bs_
    per_seq.append(
        max(
            max(0, min((s_ + 1) * per, -(-n // bs_)) - max(s_ * per, first))
            for s_ in range(S)
        )
    )
fig, ax = plt.subplots(figsize=(7, 3.4), dpi=DPI)
ax.plot(lengths, per_window, "o-", label="splits of the window (this kernel)")
ax.plot(lengths, per_seq, "s--", label="splits of the sequence, clipped by the window")
ax.axhline(-(-kd.window_span(W, bs_, 10**9) // S), color="grey", lw=0.8)
ax.set(
    xscale="log",
    xlabel="tokens in the sequence",
    ylabel="blocks the busiest program reads",
    title=f"W = {W}, blocks of {bs_}, {S} splits per row and head",
)
ax.legend()
ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# *The figure:* for sequences of 32 to a million tokens (log scale), the most blocks any one program must read:
# flat at 33 when the window is split (circles), climbing with the sequence when the sequence is split (squares).
#
# Once the sequence is longer than the window, a split of the sequence holds more and more positions, the window
# falls inside one or two of them, and those programs read the whole window while the others do nothing: the
# parallelism the split was for is gone. Splitting the window keeps $\lceil \text{span} / S \rceil = 33$ blocks per program at any
# length (the grey line is that bound). FlashAttention's own choice of `num_splits` does not correct for the window:
# `flash_attn_with_kvcache` sizes its splits from the cache's **capacity**, `seqlen_k = kcache.size(1)` or, paged,
# the block table's width times the block size (`flash_api.cpp` line 1306, commit 0251105a), handed to
# `set_params_splitkv` (lines 1498–1500), whose `num_n_blocks` counts blocks of that length (line 324); the window
# never enters. And `num_splits_heuristic` returns 1 whenever $\text{batch} \cdot \text{heads} \cdot m_{\text{blocks}} \ge 0.8 \cdot \text{its SM count}$
# (line 283), which it is given as $2 \times \text{SMs}$ (line 335): at batch 32 with 32 heads, $32 \cdot 32 \cdot 1 = 1024 \ge 0.8 \cdot 2 \cdot \text{SMs}$,
# that is one split on any GPU with at most 640 SMs, however long the window.
#
# ## 4. Bytes, and lesson 0's floor
#
# Decode attention reads each key and value once and does two multiply-adds with it per query head that shares
# it: $4 W D H$ FLOPs for $2 W D H_k \cdot \text{itemsize}$ bytes per row. Its **arithmetic intensity** is
# $2H / (H_k \cdot \text{itemsize})$ FLOP per byte: 4 for bfloat16 with 4 query heads per key/value head. An H100 SXM's
# tensor cores do 989 dense bf16 TFLOPS and its memory delivers 3.35 TB/s ([references](../docs/references.md#gpus-memory-bandwidth)),
# a ridge point of 295 FLOP/byte: decode attention sits about 70 times left of it, so it is
# **memory-bound**, and lesson 0's floor, bytes divided by bandwidth, is the right yardstick. A good decode kernel
# is one whose bytes per second come close to the memory's.

# %%
# Data-sheet peaks (docs/references.md, "GPUs: memory bandwidth"), in bytes/s. One name
# covers boards with different memories: Colab's A100 is the 40 GB SXM4 (1,555 GB/s),
# an H100 PCIe has 2.0 TB/s, an SXM 3.35.
# (words the device name contains, its memory in GiB from .. to, peak bytes/s, board)
DATA_SHEETS = [
    (("T4",), 14, 16.5, 320e9, "T4"),
    (("A100",), 38, 41, 1555e9, "A100 40GB"),
    (("A100", "PCIE"), 76, 81, 1935e9, "A100 80GB PCIe"),
    (("A100", "SXM"), 76, 81, 2039e9, "A100 80GB SXM"),
    (("H100", "PCIE"), 76, 81, 2000e9, "H100 PCIe"),
    (("H100", "HBM3"), 76, 81, 3350e9, "H100 SXM"),
    (("H200",), 130, 145, 4800e9, "H200"),
]


def data_sheet_peak(device_name, memory_gib):
    """(peak bytes/s, board): the first data sheet whose words and memory match.

    (None, None) when no listed board matches.
    """
    name = device_name.upper()
    for words, low, high, peak, board in DATA_SHEETS:
        if all(w in name for w in words) and low <= memory_gib <= high:
            return peak, board
    return None, None


for device, gib in (
    ("NVIDIA A100-SXM4-40GB", 39.4),
    ("NVIDIA A100-SXM4-80GB", 79.2),
    ("NVIDIA H100 PCIe", 79.2),
    ("NVIDIA H100 80GB HBM3", 79.1),
    ("NVIDIA H100 NVL", 93.1),
):
    peak, board = data_sheet_peak(device, gib)
    print(
        f"{device:22} {gib:5.1f} GiB -> "
        + (f"{board}: {peak / 1e9:,.0f} GB/s" if peak else "not listed: measure")
    )

# %%
GPUS = {board: peak for _, _, _, peak, board in DATA_SHEETS}


def window_bytes(seqlens, W, Hk, D, itemsize):
    """Bytes a decode step must read at least: every row's window of keys and values."""
    return int(seqlens.clamp(max=W).sum()) * 2 * Hk * D * itemsize


def intensity(H, Hk, itemsize):
    return 2 * H / (Hk * itemsize)


fig, ax = plt.subplots(figsize=(7.5, 4), dpi=DPI)
x = torch.logspace(-1, 3, 100)
for name, bw in GPUS.items():
    # data-sheet peaks
    ax.plot(x, x * bw / 1e12, lw=1.2, label=f"{name}: {bw / 1e12:.2f} TB/s")
ax.axvspan(intensity(1, 1, 2), intensity(8, 1, 2), color="grey", alpha=0.2)
ax.text(
    1.1, 0.13, "decode attention, bf16,\n1 to 8 query heads\nper kv head", fontsize=9
)
ax.axvline(989e12 / 3.35e12, color="black", ls="--", lw=1)
ax.text(
    989e12 / 3.35e12 / 1.1,
    1500,
    "H100 SXM ridge point:\n989 TFLOPS / 3.35 TB/s",
    ha="right",
    va="top",
    fontsize=9,
)
ax.set(
    xscale="log",
    yscale="log",
    xlabel="arithmetic intensity (FLOP per byte read)",
    ylabel="TFLOP/s the memory can feed",
    ylim=(0.1, 5000),
    title=(
        "Memory roofs (lesson 0's data-sheet bandwidths): decode attention sits far"
        " left"
    ),
)
ax.legend(fontsize=8, loc="upper left")
ax.grid(alpha=0.3, which="both")
plt.tight_layout()
plt.show()
plt.close(fig)

# %% [markdown]
# *The figure:* each line is a GPU's memory roof, the FLOP/s its bandwidth can feed at a given intensity; the grey
# band, where decode attention lives, lies far left of the dashed H100 SXM ridge point, so its roof is the memory's.
#
# ## 5. On a GPU: time it, and put it on the roof
#
# On a GPU runtime this cell times one decode step's attention for rows of 8,192 tokens, $W = 4{,}096$, 32 query
# heads over 8 key/value heads, headdim 128, bfloat16, blocks of 16, at **batch 1 and batch 32**:
#
# * `paged_decode`'s kernels (`kd.decode_launch`, the checks left out as `attend_paged` leaves them out), once
#   with `num_splits = 1` and once with the default (`kd.default_num_splits`): at batch 1 the split is what fills
#   the GPU, at batch 32 the default is one split already;
# * `paged_attention`'s hot path (`attend_paged` with a plan made once): a gather of every window, then SDPA;
# * SDPA on the windows already laid out densely: the best case for a library kernel, without any paging.
#
# and turns each time into bytes per second against lesson 0's floor, using the device's data-sheet peak (looked
# up by its full name and memory size) beside a device-to-device copy measured here. Without a GPU it says so and
# stops: the interpreter's times would measure NumPy, not the kernel.


# %%
# NBVAL_IGNORE_OUTPUT
def cuda_ms(fn, repeats=20):
    """Median milliseconds of fn() by CUDA events, after a warm-up that compiles."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


measured = {}  # (name, batch) -> (ms, bytes/s)
if GPU:
    from swkv_teach.attention import attend_paged, paged_plan

    dev, dt = torch.device("cuda"), torch.bfloat16
    Hg, Hkg, Dg, bsg, Wg, ng = 32, 8, 128, 16, 4096, 8192
    wg, scale = ng // bsg, 1 / math.sqrt(Dg)
    props = torch.cuda.get_device_properties(dev)
    for Bg in (1, 32):
        kg = torch.randn(Bg * wg, bsg, Hkg, Dg, device=dev, dtype=dt)
        vg = torch.randn_like(kg)
        tg = torch.randperm(Bg * wg, device=dev).view(Bg, wg).int()
        sg = torch.full((Bg,), ng, device=dev, dtype=torch.int32)
        qg = torch.randn(Bg, 1, Hg, Dg, device=dev, dtype=dt)
        splits = kd.default_num_splits(Bg * Hg, kd.window_span(Wg, bsg, wg), dev)
        plan = paged_plan(sg, tg, 1, bsg, kg.shape[0], Wg, dev)
        # every window laid out densely once, (B, Hk, W, D): SDPA's best case
        dense_k = kg.reshape(-1, Hkg, Dg)[plan.slots].transpose(1, 2).contiguous()
        dense_v = vg.reshape(-1, Hkg, Dg)[plan.slots].transpose(1, 2).contiguous()
        qt = qg.transpose(1, 2)

        def launch(num_splits):
            return kd.decode_launch(qg, kg, vg, sg, tg, Wg, scale, num_splits)

        ref = attend_paged(qg, kg, vg, plan, scale).float()
        err = (launch(splits).float() - ref).abs().max().item()
        sms = props.multi_processor_count
        print(
            f"batch {Bg}: {Bg * Hg} (row, head) pairs, {sms} SMs, default num_splits "
            f"{splits}; max |kernel - paged_attention| = {err:.1e}"
        )
        runs = {
            "paged_decode, 1 split": lambda: launch(1),
            f"paged_decode, default ({splits})": lambda: launch(splits),
            "paged_attention (gather + SDPA)": (
                lambda: attend_paged(qg, kg, vg, plan, scale)
            ),
            "SDPA on dense windows": lambda: F.scaled_dot_product_attention(
                qt, dense_k, dense_v, scale=scale, enable_gqa=True
            ),
        }
        nbytes = window_bytes(sg.cpu().long(), Wg, Hkg, Dg, 2)
        for name, fn in runs.items():
            ms = cuda_ms(fn)
            measured[name, Bg] = (ms, nbytes / (ms / 1e3))
            print(
                f"  {name:32} {ms * 1e3:8.1f} us   {measured[name, Bg][1] / 1e9:7.0f}"
                " GB/s"
            )
        del kg, vg, dense_k, dense_v
    # the roof: this exact board's data sheet, if listed, beside a device-to-device copy
    sheet, board = data_sheet_peak(
        torch.cuda.get_device_name(), props.total_memory / 2**30
    )
    buf = torch.empty(2**28, device=dev, dtype=torch.uint8)
    copy = 2 * buf.numel() / (cuda_ms(lambda: buf.clone()) / 1e3)  # read + write
    peak = sheet or copy
    listed = f"{sheet / 1e9:,.0f} GB/s ({board})" if sheet else "not listed"
    print(
        f"data sheet: {listed}; measured device-to-device copy: "
        f"{copy / 1e9:,.0f} GB/s"
    )
    print(
        f"floor at batch 32: {nbytes / 1e6:.0f} MB / {peak / 1e9:,.0f} GB/s ="
        f" {nbytes / peak * 1e6:.1f} us"
    )
else:
    print(
        "No GPU: Triton runs in its interpreter here, and its times measure NumPy,\n"
        "not a kernel; nothing is timed."
    )

# %%
if measured:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=DPI)
    ai = intensity(Hg, Hkg, 2)
    x = torch.logspace(-1, 3, 100)
    ax.plot(
        x,
        x * peak / 1e12,
        color="black",
        lw=1,
        label=f"memory roof, {peak / 1e12:.2f} TB/s",
    )
    for ((name, b), (ms, bps)), marker in zip(measured.items(), "o^sDv<p>"):
        ax.plot(
            [ai],
            [bps * ai / 1e12],
            marker,
            ms=8,
            label=f"{name}, batch {b}: {bps / peak:.0%} of the roof",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="arithmetic intensity (FLOP per byte)",
        ylabel="TFLOP/s",
        title=(
            f"Decode attention on {torch.cuda.get_device_name()}: measured points under"
            " the roof"
        ),
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    plt.tight_layout()
    plt.show()
    plt.close(fig)

# %% [markdown]
# *The figure (GPU runs only):* each point is one measured way, at batch 1 or 32, placed at decode attention's
# intensity: the closer to the black roof, the closer to the bandwidth the board can give.
#
# What to look for on a GPU: at batch 1, one split leaves most multiprocessors idle and the default's splits
# should beat it; at batch 32 the two are the same call. The gather in `paged_attention` writes every window out and reads it back (in
# float32, as `attend_paged` converts it), several times the bytes of the kernel, so it lands well below the roof; SDPA on dense windows is the ceiling for a
# kernel that reads contiguous memory; the Triton kernel reads the window once, in place, through the block table.
# This teaching kernel computes each score with a multiply and a sum on the CUDA cores, one query head per
# program; vLLM's grouped kernel (`_fwd_grouped_kernel_stage1`) puts the query heads of one key/value head in one
# program so each block is loaded once for all of them, and uses `tl.dot`, which is where the next factor lies.
#
# ## What you learned
#
# * The online softmax keeps `(m, l, acc)` and rescales by $\alpha = e^{m - m'}$ whenever the max rises; the max must
#   be carried, or a falling max overflows.
# * Partial results merge exactly by log-sum-exp; an empty part is `(−inf, 0)`, and two of them make `−inf − −inf`,
#   the NaN every split kernel guards against.
# * A split-KV decode kernel runs `(batch, heads, splits)` programs; with a sliding window, splitting the window
#   (not the sequence) makes the grid and each program's work independent of the sequence length.
# * It reads nothing outside the window: a pool of NaN around it, and −1 in the table, change nothing.
# * Decode attention does about $2H / (H_k \cdot \text{itemsize})$ FLOP per byte, far below any GPU's ridge point: it is
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
