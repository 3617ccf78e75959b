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
# # Exercise 12: the inner loop and the combine of a paged decode kernel
#
# Lesson 11 built a split-KV ("flash-decoding") Triton kernel for one decode step over a paged sliding-window
# cache. Its skeleton (the launch, the grid, the walk over the block table, the stores) is the library's; here
# you write the two functions it calls: **`attend_block`**, which folds one pool block into a running softmax,
# and **`merge`**, which combines two partial results by log-sum-exp. The check runs your two functions inside
# that skeleton: compiled on a CUDA GPU, in Triton's interpreter on the CPU otherwise (slow, but exact), and
# compares every output with `swkv_teach.attention.paged_attention`.
#
# **How this notebook works.** Write your code where it says `# YOUR CODE HERE` (delete the `raise NotImplementedError` line), run the cell, then run the check cell below it. `check_paged_decode_kernel` prints one line starting with ✅ when your answer is right; otherwise it stops with an `ExerciseFailed` message naming the first case that went wrong, what was expected, what you returned, and a hint. Run it as often as you like.
#
# Window convention, used everywhere in this course: with window `W`, query `i` attends to keys `i - W < j <= i` (W keys, itself included).

# %%
import math

import torch

import swkv_teach  # first: without a GPU it sets TRITON_INTERPRET=1, which Triton reads when it is imported
from swkv_teach.kernels import interpreted, require_triton

require_triton()  # Colab's CPU runtime has no Triton: there this installs it; elsewhere it says what is missing

import triton
import triton.language as tl
from swkv_teach.attention import paged_attention
from swkv_teach.grading import check_paged_decode_kernel
from swkv_teach.kernels.decode import decode_launch

# %%
# NBVAL_IGNORE_OUTPUT
print("Triton", triton.__version__, "|", "interpreter on the CPU" if interpreted() else "compiled for the GPU")

# %% [markdown]
# ## Exercise 12: `attend_block` and `merge`
#
# **Difficulty:** ★★★ (3/3) · **Time:** about 45 min · **Points:** 3
#
# The skeleton runs one program per (row `b`, query head `head`, split `s`). The query sits at position
# `p = cache_seqlens[b] - 1` and sees keys `lo <= pos < hi` with `hi = cache_seqlens[b]` and `lo = max(hi - W, 0)`.
# The program starts from `m_i = -inf`, `l_i = 0`, `acc = 0` and calls your `attend_block` once for each logical
# block of its split that overlaps the window, oldest first, passing:
#
# * `q`: `(BLOCK_D,)` float32, the query already multiplied by `softmax_scale`, zero past `HEAD_DIM`;
# * `m_i`, `l_i`: float32 scalars, the running max of the scores and the running sum `sum_j exp(s_j - m_i)`;
#   `acc`: `(BLOCK_D,)` float32, the accumulator `sum_j exp(s_j - m_i) v_j`. Keep `m_i` in the scores' own
#   units (natural exponentials): the skeleton stores `lse = m_i + log(l_i)`;
# * `K`, `V`: the pools' base pointers, laid out `(num_blocks, block_size, nheads_k, headdim)`: slot `i` of pool
#   block `block_id`, key/value head `kvh`, lane `d` is at `K + block_id * stride_block + i * stride_slot +
#   kvh * stride_head + d` (the same offsets for `V`);
# * `start`: the position of the block's slot 0 (`logical block * BLOCK_SIZE`); `head`: the query head;
#   `lo`, `hi`: the visible positions; `GROUP = nheads // nheads_k`;
# * `BLOCK_N`, `BLOCK_D`: the tile, powers of two `>= BLOCK_SIZE, HEAD_DIM` (`tl.arange` needs powers of two).
#
# `attend_block` returns the new `(m_i, l_i, acc)`. Read only the slots with `lo <= pos < hi` (and `i < BLOCK_SIZE`,
# `d < HEAD_DIM`): every other slot may hold anything, NaN included.
#
# One thing the check cannot see: the offset's integer width. Block tables are usually int32 (FlashAttention's
# `flash_api.cpp` refuses any other: "block_table must have dtype torch.int32"), and Triton passes an integer
# argument that fits in 32 bits, such as `stride_block`, as int32. Their product is then computed in int32, and in
# a pool of more than 2**31 elements (4 GiB of bfloat16, an ordinary KV cache) it wraps around to a negative
# offset: the load reads the wrong memory. Production kernels therefore compute the offset in int64,
# `block_id.to(tl.int64) * stride_block`; do the same. The check's pools hold a few thousand elements, so an int32
# offset passes here: this line is yours to get right without a test.
#
# At the end each split stores its normalised output `o = acc / l_i` and `lse = m_i + log(l_i)` (a split that held
# no block stores `o = 0`, `lse = -inf`), and a second pass combines the splits of each (row, head) one after
# another, starting from an empty part, with your **`merge(lse_a, o_a, lse_b, o_b) -> (lse, o)`**: `lse_x` float32
# scalars, `o_x` `(BLOCK_D,)`. Two empty parts must merge to an empty part, without a NaN.
#
# <details><summary>Hint 1: the masks and the loads</summary>
#
# `offs_n = tl.arange(0, BLOCK_N)`, `pos = start + offs_n`, `seen = (offs_n < BLOCK_SIZE) & (pos >= lo) & (pos < hi)`.
# Build a `(BLOCK_N, BLOCK_D)` block of offsets with `offs_n[:, None] * stride_slot + offs_d[None, :]` and load with
# `mask=seen[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0`. Mask the loads, not only the scores: a masked
# score gives `p = 0`, but `0 * NaN` is still NaN. Written one slot at a time instead, keep the mask a vector:
# in Triton's CPU interpreter a vector of booleans `&` a scalar boolean comes out int32, which `tl.load` refuses
# ("mask has unsupported dtype"); `tl.where(inside, offs_d < HEAD_DIM, False)` broadcasts the slot's test.
#
# </details>
#
# <details><summary>Hint 2: the online softmax</summary>
#
# Scores `s = tl.sum(q[None, :] * k, 1)`, `-inf` where not `seen`. Then `m_new = tl.maximum(m_i, tl.max(s, 0))`,
# `alpha = tl.exp(m_i - m_new)`, `p = tl.exp(s - m_new)`, and both running quantities are rescaled:
# `l_i * alpha + tl.sum(p, 0)` and `acc * alpha + tl.sum(p[:, None] * v, 0)`. The skeleton calls `attend_block` only
# on blocks holding at least one visible key, so `m_new` is finite.
#
# </details>
#
# <details><summary>Hint 3: the merge</summary>
#
# With `m = max(lse_a, lse_b)`: `wa = exp(lse_a - m)`, `wb = exp(lse_b - m)`, `lse = m + log(wa + wb)` and
# `o = (o_a * wa + o_b * wb) / (wa + wb)`. When both parts are empty, `m = -inf` and `lse_a - m` is `-inf - -inf = NaN`:
# use 0 for `m` there (`tl.where(m == float("-inf"), 0.0, m)`), and divide by 1 where `wa + wb == 0`.
#
# </details>

# %% swkv={"exercise": "12", "role": "answer"}
@triton.jit
def attend_block(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """Fold pool block block_id (positions start ..) into (m_i, l_i, acc), reading only lo <= pos < hi."""
    ### BEGIN SOLUTION
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    pos = start + offs_n
    seen = (offs_n < BLOCK_SIZE) & (pos >= lo) & (pos < hi)
    rows = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + offs_n * stride_slot
    ptrs = rows[:, None] + offs_d[None, :]
    mask = seen[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + ptrs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=mask, other=0.0).to(tl.float32)
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)
    ### END SOLUTION


@triton.jit
def merge(lse_a, o_a, lse_b, o_b):
    """Merge two partial results (lse, normalised o) by log-sum-exp; an empty part is (-inf, 0)."""
    ### BEGIN SOLUTION
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    total = wa + wb
    some = total > 0
    o = (o_a * wa + o_b * wb) / tl.where(some, total, 1.0)
    return tl.where(some, m + tl.log(tl.where(some, total, 1.0)), float("-inf")), o
    ### END SOLUTION


# %% swkv={"exercise": "12", "points": 3, "role": "check"}
check_paged_decode_kernel(attend_block, merge)

# %% [markdown]
# Your two functions inside the whole kernel, on a batch of three rows (GQA, window 20, blocks of 16, 3 splits),
# beside the reference:

# %%
g = torch.Generator().manual_seed(0)
seqlens, W, bs, H, Hk, D = [37, 5, 64], 20, 16, 4, 2, 16
width = max(-(-n // bs) for n in seqlens)
k_cache = torch.randn(len(seqlens) * width, bs, Hk, D, generator=g)
v_cache = torch.randn(len(seqlens) * width, bs, Hk, D, generator=g)
table = torch.randperm(len(seqlens) * width, generator=g).view(len(seqlens), width)
q = torch.randn(len(seqlens), 1, H, D, generator=g)
mine = decode_launch(q, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32), table, W, 1 / math.sqrt(D), 3,
                     attend=attend_block, merge=merge)
ref = paged_attention(q, k_cache, v_cache, torch.tensor(seqlens), table, W)
print("out", tuple(mine.shape), "| max |yours - paged_attention| < 1e-5:", bool((mine - ref).abs().max() < 1e-5))

# %% [markdown]
# ### Interview follow-up
#
# A decode step has one query per sequence. Why does FlashAttention split the keys of *one* query across several
# thread blocks for decoding (split-KV, "flash-decoding") when it never does for a long prefill, and when does the
# split stop paying?
#
# <details><summary>One good answer</summary>
#
# Prefill has many queries: `batch * heads * ceil(seqlen_q / kBlockM)` tiles of queries already fill every
# streaming multiprocessor. A decode step has `batch * heads` query rows, one each; with batch 1 and 32 heads
# that is 32 thread blocks on a GPU with 132 SMs, each walking all of its keys alone, so most of the chip idles
# while the step is bound by reading the KV cache. Splitting the keys of each row over `num_splits` programs
# multiplies the parallelism; each writes a partial output and its log-sum-exp, and a small second kernel merges
# them exactly (the `merge` you wrote is associative). It costs that second launch and `num_splits` partial
# outputs in float32, so it pays when `batch * heads` is small against the SM count and the context is long;
# FlashAttention's `num_splits_heuristic` (`csrc/flash_attn/flash_api.cpp` lines 281-306 at commit 0251105a) uses one
# split when the tiles already fill 80 % of the SMs it is given (line 283), and otherwise the split count whose last
# wave of thread blocks is fullest. A sliding window caps the keys
# per row at `W`, so the useful number of splits is bounded by the window's blocks, not by the sequence length.
#
# </details>
