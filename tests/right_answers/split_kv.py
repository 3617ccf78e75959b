"""Right answers to exercise 12, attend_block and merge (@triton.jit), written unlike the library's.

The check takes the two functions, or one object holding both as ``.attend_block`` and ``.merge``.
"""

import triton
import triton.language as tl

from tests.right_answers import right

LOG2E = 1.4426950408889634


@triton.jit
def _attend_exp2(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """Base-2 exponentials (log2 e folded in, as Triton's tutorial does), the block's own softmax merged in."""
    slot = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    pos = start + slot
    ok = (slot < BLOCK_SIZE) & (pos >= lo) & (pos < hi)
    kvh = head // GROUP
    base = K + block_id.to(tl.int64) * stride_block + kvh * stride_head
    k = tl.load(base + slot[:, None] * stride_slot + d[None, :], mask=ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    s2 = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * 1.4426950408889634  # log2 units
    s2 = tl.where(ok, s2, -float("inf"))
    m_blk = tl.max(s2, axis=0)
    p = tl.math.exp2(s2 - m_blk)
    vbase = V + block_id.to(tl.int64) * stride_block + kvh * stride_head
    v = tl.load(vbase + slot[:, None] * stride_slot + d[None, :], mask=ok[:, None] & (d[None, :] < HEAD_DIM), other=0.0)
    acc_blk = tl.sum(p[:, None] * v.to(tl.float32), axis=0)
    l_blk = tl.sum(p, axis=0)
    m_blk = m_blk / 1.4426950408889634  # back to natural units, as the skeleton keeps m_i
    m = tl.maximum(m_i, m_blk)
    a = tl.exp(m_i - m)
    b = tl.exp(m_blk - m)
    return m, l_i * a + l_blk * b, acc * a + acc_blk * b


@triton.jit
def _merge_by_cases(lse_a, o_a, lse_b, o_b):
    """Empty parts handled by selection; the weight of b relative to a through a sigmoid."""
    a_empty = lse_a == -float("inf")
    b_empty = lse_b == -float("inf")
    safe_a = tl.where(a_empty, 0.0, lse_a)
    safe_b = tl.where(b_empty, 0.0, lse_b)
    big = tl.maximum(safe_a, safe_b)
    small = tl.minimum(safe_a, safe_b)
    both = big + tl.log(1.0 + tl.exp(small - big))
    w_b = tl.sigmoid(safe_b - safe_a)  # exp(b) / (exp(a) + exp(b))
    lse = tl.where(a_empty, lse_b, tl.where(b_empty, lse_a, both))
    o = tl.where(a_empty, o_b, tl.where(b_empty, o_a, o_a * (1.0 - w_b) + o_b * w_b))
    return lse, o


@right("check_paged_decode_kernel")
class Exp2AndSelectingMerge:
    """exp2 in the block, the block's own (m, l, acc) merged into the running one; a merge that selects."""

    attend_block = _attend_exp2
    merge = _merge_by_cases


@triton.jit
def _attend_where(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                  GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """Offsets from a 2-D index, loads masked by the window then zeroed with tl.where, the update as alpha/beta."""
    n = tl.arange(0, BLOCK_N)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    inside = (n < BLOCK_SIZE) & (start + n >= lo) & (start + n < hi)  # (BLOCK_N, 1)
    offs = block_id.to(tl.int64) * stride_block + n * stride_slot + (head // GROUP) * stride_head + d
    keep = inside & (d < HEAD_DIM)
    k = tl.where(keep, tl.load(K + offs, mask=keep), 0.0).to(tl.float32)
    v = tl.where(keep, tl.load(V + offs, mask=keep), 0.0).to(tl.float32)
    s = tl.sum(k * q[None, :], 1)
    s = tl.where(tl.sum(inside.to(tl.int32), 1) > 0, s, float("-inf"))
    m_new = tl.maximum(tl.max(s, 0), m_i)
    p = tl.exp(s - m_new)
    alpha = tl.exp(m_i - m_new)
    return m_new, alpha * l_i + tl.sum(p, 0), alpha * acc + tl.sum(v * p[:, None], 0)


@triton.jit
def _merge_normalised_weights(lse_a, o_a, lse_b, o_b):
    """Weights normalised first (they sum to 1), then lse from the max and the log of the sum."""
    m = tl.maximum(lse_a, lse_b)
    shift = tl.where(m > -float("inf"), m, 0.0)
    ea = tl.exp(lse_a - shift)
    eb = tl.exp(lse_b - shift)
    tot = ea + eb
    denom = tl.where(tot == 0.0, 1.0, tot)
    lse = tl.where(tot == 0.0, -float("inf"), shift + tl.log(denom))
    return lse, (ea / denom) * o_a + (eb / denom) * o_b


@right("check_paged_decode_kernel")
class WhereMaskedLoads:
    """2-D index tensors, masked loads zeroed by tl.where, weights normalised before the sum."""

    attend_block = _attend_where
    merge = _merge_normalised_weights


@triton.jit
def _attend_zero_p(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """Masked slots zeroed in p (not -inf in the scores); the max taken over the visible scores only."""
    i = tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_D)
    live = (i < BLOCK_SIZE) & (i >= lo - start) & (i < hi - start)
    kv = head // GROUP
    row = K + block_id.to(tl.int64) * stride_block + kv * stride_head
    k = tl.load(row + i[:, None] * stride_slot + j[None, :], mask=live[:, None] & (j < HEAD_DIM)[None, :], other=0.0)
    s = tl.sum(q[None, :] * k.to(tl.float32), axis=1)
    m_new = tl.maximum(m_i, tl.max(tl.where(live, s, -float("inf")), axis=0))
    p = tl.where(live, tl.exp(s - m_new), 0.0)
    vrow = V + block_id.to(tl.int64) * stride_block + kv * stride_head
    v = tl.load(vrow + i[:, None] * stride_slot + j[None, :], mask=live[:, None] & (j < HEAD_DIM)[None, :], other=0.0)
    scale_old = tl.exp(m_i - m_new)
    return m_new, l_i * scale_old + tl.sum(p, axis=0), acc * scale_old + tl.sum(v.to(tl.float32) * p[:, None], axis=0)


@triton.jit
def _merge_interpolate(lse_a, o_a, lse_b, o_b):
    """lse by log1p of the gap; o moved from o_a toward o_b by b's share, exp(lse_b - lse)."""
    hi = tl.maximum(lse_a, lse_b)
    lo = tl.minimum(lse_a, lse_b)
    gap = tl.where(lo == -float("inf"), -float("inf"), lo - hi)  # -inf when one part (or both) is empty
    lse = tl.where(hi == -float("inf"), -float("inf"), hi + tl.log(1.0 + tl.exp(gap)))
    share_b = tl.where(lse_b == -float("inf"), 0.0, tl.exp(lse_b - tl.where(lse == -float("inf"), 0.0, lse)))
    return lse, o_a + (o_b - o_a) * share_b


@right("check_paged_decode_kernel")
class ZeroedProbabilitiesAndInterpolation:
    """p zeroed where masked; a merge that interpolates from o_a toward o_b."""

    attend_block = _attend_zero_p
    merge = _merge_interpolate
