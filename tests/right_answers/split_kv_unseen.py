"""More right answers to exercise 12 (issue 37): a slot-by-slot loop with scalar masks, and a block folded in two
halves with a large finite negative mask, beside merges written as log-add-exp and by normalised weights."""

import triton
import triton.language as tl

from tests.right_answers import right


@triton.jit
def _attend_slot_by_slot(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                         stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """One slot at a time, an online softmax per key; the slot's scalar test broadcast to a lane mask by tl.where
    (a vector_bool & scalar_bool is int32 in the interpreter)."""
    d = tl.arange(0, BLOCK_D)
    lanes = d < HEAD_DIM
    base = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head
    for i in tl.static_range(BLOCK_SIZE):
        inside = (start + i >= lo) & (start + i < hi)
        mask = tl.where(inside, lanes, False)
        k = tl.load(K + base + i * stride_slot + d, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + base + i * stride_slot + d, mask=mask, other=0.0).to(tl.float32)
        s = tl.where(inside, tl.sum(q * k, 0), float("-inf"))
        m_new = tl.maximum(m_i, s)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - safe)
        p = tl.exp(s - safe)
        l_i = l_i * alpha + p
        acc = acc * alpha + p * v
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge_log_add_exp(lse_a, o_a, lse_b, o_b):
    big = tl.maximum(lse_a, lse_b)
    small = tl.minimum(lse_a, lse_b)
    empty = big == float("-inf")
    r = tl.exp(tl.where(empty, 0.0, small - big))  # the smaller part's weight against the larger's, at most 1
    a_big = lse_a >= lse_b
    wa = tl.where(a_big, 1.0, r)
    wb = tl.where(a_big, r, 1.0)
    o = tl.where(empty, o_a, (o_a * wa + o_b * wb) / (1.0 + r))
    return tl.where(empty, float("-inf"), big + tl.log(1.0 + r)), o


@right("check_paged_decode_kernel")
class SlotBySlotLogAddExp:
    """A slot-by-slot online softmax; a merge that weighs the smaller part against the larger (log-add-exp)."""

    attend_block = _attend_slot_by_slot
    merge = _merge_log_add_exp


@triton.jit
def _half(q, K, V, base, start, lo, hi, stride_slot, FIRST: tl.constexpr, HALF: tl.constexpr,
          BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    i = FIRST + tl.arange(0, HALF)
    d = tl.arange(0, BLOCK_D)
    ok = (i < BLOCK_SIZE) & (start + i >= lo) & (start + i < hi)
    ptr = base + i[:, None] * stride_slot + d[None, :]
    mask = ok[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(K + ptr, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptr, mask=mask, other=0.0).to(tl.float32)
    s = tl.where(ok, tl.sum(k * q[None, :], axis=1), -1.0e30)
    return s, v


@triton.jit
def _attend_two_halves(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                       stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                       HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The tile folded in two halves of BLOCK_N // 2 slots (one when BLOCK_N is 1), masked scores -1e30 (finite):
    exp(-1e30 - m) is 0 as long as a visible score exists, which the skeleton promises."""
    base = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head
    HALF: tl.constexpr = BLOCK_N // 2 if BLOCK_N > 1 else 1
    for first in tl.static_range(0, BLOCK_N, HALF):
        s, v = _half(q, K, V, base, start, lo, hi, stride_slot, first, HALF, BLOCK_SIZE, HEAD_DIM, BLOCK_D)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge_shares(lse_a, o_a, lse_b, o_b):
    m = tl.maximum(lse_a, lse_b)
    m0 = tl.where(m == float("-inf"), 0.0, m)
    ea = tl.exp(lse_a - m0)
    eb = tl.exp(lse_b - m0)
    total = ea + eb
    share_a = tl.where(total > 0, ea / tl.where(total > 0, total, 1.0), 0.0)
    share_b = tl.where(total > 0, 1.0 - share_a, 0.0)
    lse = tl.where(total > 0, m0 + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    return lse, share_a * o_a + share_b * o_b


@right("check_paged_decode_kernel")
class TwoHalvesAndShares:
    """The tile in two halves with a finite -1e30 mask; a merge by each part's share of the total weight."""

    attend_block = _attend_two_halves
    merge = _merge_shares
