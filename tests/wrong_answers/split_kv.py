"""Wrong answers to exercise 12, attend_block and merge (@triton.jit).

Each entry is an object holding ``.attend_block`` and ``.merge``, one of them wrong (named and
documented by the entry), the other right and written here (the check refuses the library's own).
Shared pieces are jit helpers: ``_tile`` loads a block's keys and values right, ``_fold`` folds
them in right, so each wrong function differs from a right one in the one place its docstring names.
"""

import triton
import triton.language as tl

from tests.wrong_answers import wrong


@triton.jit
def _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
          GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_D: tl.constexpr):
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    seen = (n < BLOCK_SIZE) & (start + n >= lo) & (start + n < hi)
    ptrs = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + n[:, None] * stride_slot + d[None, :]
    mask = seen[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(K + ptrs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=mask, other=0.0).to(tl.float32)
    return k, v, seen


@triton.jit
def _fold(q, m_i, l_i, acc, k, v, seen):
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def right_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def right_merge(lse_a, o_a, lse_b, o_b):
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, m + tl.log(safe), float("-inf")), (o_a * wa + o_b * wb) / safe


def pair(bad, *, attend=None, merge=None):
    """An answer object: the wrong function given, the right one for the other; named and documented by ``bad``."""
    return type(bad.__name__, (), {"__doc__": bad.fn.__doc__, "attend_block": attend or right_attend,
                                    "merge": merge or right_merge})


# ------------------------------------------------------------------ the inner loop
@triton.jit
def _fold_no_acc_rescale(q, m_i, l_i, acc, k, v, seen):
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def no_acc_rescale(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """The running sum is rescaled by exp(m_i - m_new) but the accumulator is not: acc + p @ v."""
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold_no_acc_rescale(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def _fold_no_sum_rescale(q, m_i, l_i, acc, k, v, seen):
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def no_sum_rescale(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """The accumulator is rescaled but the running sum is not: l_i + sum(p)."""
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold_no_sum_rescale(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def _fold_block_max(q, m_i, l_i, acc, k, v, seen):
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.max(s, 0)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def max_not_carried(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                    GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    """m_new is the new block's max alone, not max(m_i, block max): exact until a falling max overflows exp."""
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold_block_max(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def _fold_zero_scores(q, m_i, l_i, acc, k, v, seen):
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), 0.0)
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def masked_scores_zero(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """Slots outside the window score 0 instead of -inf, so each still adds exp(0 - m) to the sum."""
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold_zero_scores(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def window_drops_first_key(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                           stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Keys pos > lo instead of pos >= lo: the window's oldest key is lost (W - 1 keys)."""
    k, v, seen = _tile(K, V, block_id, start, head, lo + 1, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def window_one_key_too_many(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                            stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Keys pos >= lo - 1 (p - W <= j): one key older than the window is read (W + 1 keys)."""
    k, v, seen = _tile(K, V, block_id, start, head, lo - 1, hi, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def window_reads_slot_at_seqlen(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                                stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Keys pos <= hi instead of pos < hi: the slot at cache_seqlens, one past the window's last key, is read."""
    k, v, seen = _tile(K, V, block_id, start, head, lo, hi + 1, stride_block, stride_slot, stride_head,
                       GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def gqa_modulo(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
               GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """Query head h reads key/value head h % GROUP, not h // GROUP."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    seen = (n < BLOCK_SIZE) & (start + n >= lo) & (start + n < hi)
    ptrs = block_id.to(tl.int64) * stride_block + (head % GROUP) * stride_head + n[:, None] * stride_slot + d[None, :]
    mask = seen[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(K + ptrs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=mask, other=0.0).to(tl.float32)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def values_read_past_seqlen(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                            stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Scores are masked but the whole block of values is loaded: p = 0 times a NaN slot past cache_seqlens is NaN."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    seen = (n < BLOCK_SIZE) & (start + n >= lo) & (start + n < hi)
    ptrs = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + n[:, None] * stride_slot + d[None, :]
    k = tl.load(K + ptrs, mask=seen[:, None] & (d[None, :] < HEAD_DIM), other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=(n[:, None] < BLOCK_SIZE) & (d[None, :] < HEAD_DIM), other=0.0).to(tl.float32)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def loads_ignore_window_start(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                              stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Loads masked by pos < hi only; the scores by the window: a NaN slot before the window poisons acc."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    stored = (n < BLOCK_SIZE) & (start + n < hi)
    seen = stored & (start + n >= lo)
    ptrs = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + n[:, None] * stride_slot + d[None, :]
    mask = stored[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(K + ptrs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=mask, other=0.0).to(tl.float32)
    return _fold(q, m_i, l_i, acc, k, v, seen)


@triton.jit
def tile_slots_past_block_size(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                               stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """No slot < BLOCK_SIZE mask: with block_size 24 the tile's slots 24..31 read the next pool block."""
    n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    seen = (start + n >= lo) & (start + n < hi)
    ptrs = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + n[:, None] * stride_slot + d[None, :]
    mask = seen[:, None] & (d[None, :] < HEAD_DIM)
    k = tl.load(K + ptrs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + ptrs, mask=mask, other=0.0).to(tl.float32)
    return _fold(q, m_i, l_i, acc, k, v, seen)


wrong("check_paged_decode_kernel", "rescale", "accumulator")(pair(no_acc_rescale, attend=no_acc_rescale))
wrong("check_paged_decode_kernel", "rescale", "running sum")(pair(no_sum_rescale, attend=no_sum_rescale))
wrong("check_paged_decode_kernel", "max must be carried")(pair(max_not_carried, attend=max_not_carried))
wrong("check_paged_decode_kernel", "-inf", "exp(0 - m)")(pair(masked_scores_zero, attend=masked_scores_zero))
wrong("check_paged_decode_kernel", "off by one", "W - 1")(pair(window_drops_first_key, attend=window_drops_first_key))
wrong("check_paged_decode_kernel", "off by one", "W + 1")(pair(window_one_key_too_many, attend=window_one_key_too_many))
wrong("check_paged_decode_kernel", "one slot past", "cache_seqlens", "pos < hi, not pos <= hi")(
    pair(window_reads_slot_at_seqlen, attend=window_reads_slot_at_seqlen))
wrong("check_paged_decode_kernel", "head // GROUP", "h % 2")(pair(gqa_modulo, attend=gqa_modulo))
wrong("check_paged_decode_kernel", "past cache_seqlens", "mask the loads")(
    pair(values_read_past_seqlen, attend=values_read_past_seqlen))
wrong("check_paged_decode_kernel", "before the window", "mask the loads")(
    pair(loads_ignore_window_start, attend=loads_ignore_window_start))
wrong("check_paged_decode_kernel", "BLOCK_SIZE", "next pool block")(
    pair(tile_slots_past_block_size, attend=tile_slots_past_block_size))


# ------------------------------------------------------------------ the combine
@triton.jit
def merge_nan_when_both_empty(lse_a, o_a, lse_b, o_b):
    """No guard on the max: two empty parts give exp(-inf - -inf) = NaN (the combine starts from an empty part)."""
    m = tl.maximum(lse_a, lse_b)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    return m + tl.log(wa + wb), (o_a * wa + o_b * wb) / (wa + wb)


@triton.jit
def merge_unnormalised(lse_a, o_a, lse_b, o_b):
    """The outputs are weighted by exp(lse_x - max) but not divided by the sum of the weights."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    return tl.where(t > 0, m + tl.log(tl.where(t > 0, t, 1.0)), float("-inf")), o_a * wa + o_b * wb


@triton.jit
def merge_lse_is_the_max(lse_a, o_a, lse_b, o_b):
    """The merged lse is max(lse_a, lse_b) instead of their log-sum-exp (o is right)."""
    m = tl.maximum(lse_a, lse_b)
    s = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - s)
    wb = tl.exp(lse_b - s)
    t = wa + wb
    return m, (o_a * wa + o_b * wb) / tl.where(t > 0, t, 1.0)


@triton.jit
def merge_exp_before_max(lse_a, o_a, lse_b, o_b):
    """exp(lse_a) and exp(lse_b) taken directly: exp(1000) overflows, exp(-1000) underflows."""
    wa = tl.exp(lse_a)
    wb = tl.exp(lse_b)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, tl.log(safe), float("-inf")), (o_a * wa + o_b * wb) / safe


wrong("check_paged_decode_kernel", "-inf - -inf", "empty")(pair(merge_nan_when_both_empty, merge=merge_nan_when_both_empty))
wrong("check_paged_decode_kernel", "weighted", "sum to 1")(pair(merge_unnormalised, merge=merge_unnormalised))
wrong("check_paged_decode_kernel", "not the max")(pair(merge_lse_is_the_max, merge=merge_lse_is_the_max))
wrong("check_paged_decode_kernel", "overflow")(pair(merge_exp_before_max, merge=merge_exp_before_max))
