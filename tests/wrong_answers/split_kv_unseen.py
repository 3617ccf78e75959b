"""More wrong answers to exercise 12, written from the statement alone (issue 37), never from the check.

Scores at the extremes (a block whose visible scores are all very negative, splits whose log-sum-exps lie far
apart), pools that are views (a fused K/V pool, heads stored before slots, a padded head dim), loop-carried types
the compiler refuses, and slips in the exponentials, the scale, the addressing and the merge. Each entry pairs one
wrong function with a right other one; ``_load`` reads a block right, so a wrong function differs from a right one
in the place its docstring names.
"""

import triton
import triton.language as tl

from tests.wrong_answers import wrong
from tests.wrong_answers.split_kv import right_attend, right_merge

CHECK = "check_paged_decode_kernel"


def pair(bad, *, attend=None, merge=None):
    """An answer object named and documented by ``bad``: the wrong function given, the right one for the other."""
    return type(bad.__name__, (), {"__doc__": bad.fn.__doc__, "attend_block": attend or right_attend,
                                    "merge": merge or right_merge})


@triton.jit
def _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
          GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_D: tl.constexpr):
    i = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    ok = (i < BLOCK_SIZE) & (start + i >= lo) & (start + i < hi)
    off = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + i[:, None] * stride_slot + d[None, :]
    both = ok[:, None] & (d < HEAD_DIM)[None, :]
    return tl.load(K + off, mask=both, other=0.0).to(tl.float32), tl.load(V + off, mask=both, other=0.0).to(tl.float32), ok


# ------------------------------------------------------------------ scores at the extremes
@triton.jit
def max_over_raw_scores(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                        GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    """The block max is taken over the raw scores (a masked slot's 0 included); p is masked after the exp: when every
    visible score of a cut block is below about -87, exp(s - 0) underflows to 0 and the block's keys vanish."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.sum(q[None, :] * k, 1)
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.where(ok, tl.exp(s - m_new), 0.0)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def no_max_at_all(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                  GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """No max subtracted at all: m stays 0, p = exp(s); exact for small scores, inf/NaN once a score passes 88."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    p = tl.exp(s)
    return l_i * 0.0, l_i + tl.sum(p, 0), acc + tl.sum(p[:, None] * v, 0)


@triton.jit
def p_with_old_max(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """p = exp(s - m_i) with the max from before this block (the first block: the block's own max), then rescaled as
    if it were exp(s - m_new)."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    ref = tl.where(m_i == float("-inf"), m_new, m_i)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - ref)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def inverted_rescale(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """The rescale factor upside down: exp(m_new - m_i) instead of exp(m_i - m_new) (first block: 0 * inf)."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_new - m_i))
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def scaled_twice(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """The scores divided by sqrt(HEAD_DIM) although q already carries softmax_scale: scaled twice."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1) / tl.sqrt(HEAD_DIM * 1.0), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def exp2_without_log2e(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                       GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                       BLOCK_D: tl.constexpr):
    """exp2 where exp is meant, the scores not multiplied by log2(e): a softmax at temperature 1/ln 2."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def m_in_base2_units(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """exp2 with log2(e) folded in, right, but m_i kept in base-2 units: the stored lse = m_i + log(l_i) is off by
    m * (log2(e) - 1), so splits are merged with the wrong weights."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1) * 1.4426950408889634, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def pv_in_float16(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                  GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """p and v cast to float16 for the product p @ v (a tensor-core habit): the accumulator loses 3 digits."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    pv = tl.sum(p.to(tl.float16)[:, None] * v.to(tl.float16), 0).to(tl.float32)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + pv


@triton.jit
def state_in_float64(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """The sums taken in float64 for accuracy: l_i and acc leave the loop float64 where they came in float32, which
    Triton's compiler refuses (a loop-carried value may not change type); only the interpreter runs it."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new).to(tl.float64)
    p = tl.exp(s - m_new).to(tl.float64)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v.to(tl.float64), 0)


@triton.jit
def max_in_float64(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                   GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """Only the running max returned as float64 (the scores computed in double): a loop-carried type change."""
    k, v, ok = _load(K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    s = tl.where(ok, tl.sum(q.to(tl.float64)[None, :] * k.to(tl.float64), 1), float("-inf"))
    m_new = tl.maximum(m_i.to(tl.float64), tl.max(s, 0))
    alpha = tl.exp(m_i - m_new).to(tl.float32)
    p = tl.exp(s - m_new).to(tl.float32)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


# ------------------------------------------------------------------ the block's slots and its address
@triton.jit
def last_block_count_mod(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                         GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    """The last block's key count taken as hi % BLOCK_SIZE: 0 when cache_seqlens ends on a block edge, so that whole
    block (the newest keys, the query's own included) is dropped."""
    i = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    last = start + BLOCK_SIZE >= hi
    count = tl.where(last, hi % BLOCK_SIZE, BLOCK_SIZE)
    ok = (i < count) & (start + i >= lo)
    off = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + i[:, None] * stride_slot + d[None, :]
    both = ok[:, None] & (d < HEAD_DIM)[None, :]
    k = tl.load(K + off, mask=both, other=0.0).to(tl.float32)
    v = tl.load(V + off, mask=both, other=0.0).to(tl.float32)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def logical_block_address(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                          stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The pool block addressed by the logical block start // BLOCK_SIZE, not the block table's block_id."""
    return right_attend(q, m_i, l_i, acc, K, V, start // BLOCK_SIZE, start, head, lo, hi, stride_block, stride_slot,
                        stride_head, GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def head_stride_is_head_dim(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                            stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The head's offset hard-coded as kvh * HEAD_DIM (true of a contiguous pool only) instead of kvh * stride_head."""
    return right_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                        HEAD_DIM, GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def block_stride_from_slots(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                            stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The block stride hard-coded as BLOCK_SIZE * stride_slot: wrong on a fused K/V pool, whose blocks are twice
    as far apart."""
    return right_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, BLOCK_SIZE * stride_slot, stride_slot,
                        stride_head, GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def slot_stride_from_block(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                           stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """The slot stride derived as stride_block // BLOCK_SIZE instead of read from stride_slot."""
    return right_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block,
                        stride_block // BLOCK_SIZE, stride_head, GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)


@triton.jit
def no_lane_mask(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """Loads masked by slot only, not d < HEAD_DIM: with a head dim that is no power of two the lanes past HEAD_DIM
    read the next head (or the next slot, which may be NaN) into the tile."""
    i = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    ok = (i < BLOCK_SIZE) & (start + i >= lo) & (start + i < hi)
    off = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head + i[:, None] * stride_slot + d[None, :]
    k = tl.load(K + off, mask=ok[:, None], other=0.0).to(tl.float32)
    v = tl.load(V + off, mask=ok[:, None], other=0.0).to(tl.float32)
    s = tl.where(ok, tl.sum(q[None, :] * k, 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def head_not_grouped(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                     GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """The GROUP division forgotten: query head h reads key/value head h (past the last one when GROUP > 1)."""
    return right_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                        stride_head, 1, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)


# ------------------------------------------------------------------ the merge
@triton.jit
def merge_relative_to_a(lse_a, o_a, lse_b, o_b):
    """Weights taken relative to lse_a instead of the max: wb = exp(lse_b - lse_a) overflows once the parts' lse
    differ by more than ~88 (and an empty a gives -inf - -inf)."""
    a_empty = lse_a == float("-inf")
    ref = tl.where(a_empty, lse_b, lse_a)
    ref = tl.where(ref == float("-inf"), 0.0, ref)
    wa = tl.where(a_empty, 0.0, 1.0)
    wb = tl.exp(lse_b - ref)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, ref + tl.log(safe), float("-inf")), (o_a * wa + o_b * wb) / safe


@triton.jit
def merge_swapped_weights(lse_a, o_a, lse_b, o_b):
    """Each output weighted by the other part's weight: o_a * wb + o_b * wa."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, m + tl.log(safe), float("-inf")), (o_a * wb + o_b * wa) / safe


@triton.jit
def merge_lse_without_max(lse_a, o_a, lse_b, o_b):
    """The merged lse is log(wa + wb), the max m not added back (o is right)."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, tl.log(safe), float("-inf")), (o_a * wa + o_b * wb) / safe


@triton.jit
def merge_empty_lse_zero(lse_a, o_a, lse_b, o_b):
    """Two empty parts merge to lse = 0 (log of the guarded 1) instead of -inf: the empty part then weighs in with
    exp(0 - m) and output 0, shrinking the result."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return m + tl.log(safe), (o_a * wa + o_b * wb) / safe


@triton.jit
def merge_divides_by_zero(lse_a, o_a, lse_b, o_b):
    """The max guarded but not the division: two empty parts give o = 0 / 0 = NaN."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    return m + tl.log(t), (o_a * wa + o_b * wb) / t


@triton.jit
def merge_plain_average(lse_a, o_a, lse_b, o_b):
    """The outputs averaged where both parts hold keys, (o_a + o_b) / 2, ignoring how much each part weighs."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    both = (wa > 0) & (wb > 0)
    o = tl.where(both, (o_a + o_b) * 0.5, o_a + o_b)
    return tl.where(t > 0, m + tl.log(safe), float("-inf")), o


@triton.jit
def merge_in_base2(lse_a, o_a, lse_b, o_b):
    """The weights in base 2 (exp2(lse - m)) though lse is a natural log: the parts are weighed at the wrong
    temperature and the merged lse is m + log2(...)."""
    m = tl.maximum(lse_a, lse_b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.math.exp2(lse_a - m)
    wb = tl.math.exp2(lse_b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, m + tl.math.log2(safe), float("-inf")), (o_a * wa + o_b * wb) / safe


@triton.jit
def merge_in_float64(lse_a, o_a, lse_b, o_b):
    """The merge computed in float64 and returned so: lse and o change type inside the combine's loop."""
    a = lse_a.to(tl.float64)
    b = lse_b.to(tl.float64)
    m = tl.maximum(a, b)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(a - m)
    wb = tl.exp(b - m)
    t = wa + wb
    safe = tl.where(t > 0, t, 1.0)
    return tl.where(t > 0, m + tl.log(safe), float("-inf")), (o_a.to(tl.float64) * wa + o_b.to(tl.float64) * wb) / safe


# The words each rejection must hold: the bug, or the quantity that differs and where.
wrong(CHECK, "raw scores", "below about -87")(pair(max_over_raw_scores, attend=max_over_raw_scores))
wrong(CHECK, "no max was subtracted")(pair(no_max_at_all, attend=no_max_at_all))
wrong(CHECK, "the max from before this block")(pair(p_with_old_max, attend=p_with_old_max))
wrong(CHECK, "upside down", "exp(m_i - m_new)")(pair(inverted_rescale, attend=inverted_rescale))
wrong(CHECK, "scaled again", "softmax_scale")(pair(scaled_twice, attend=scaled_twice))
wrong(CHECK, "base 2", "log2(e)")(pair(exp2_without_log2e, attend=exp2_without_log2e))
wrong(CHECK, "base-2 units", "natural")(pair(m_in_base2_units, attend=m_in_base2_units))
wrong(CHECK, "float16", "float32")(pair(pv_in_float16, attend=pv_in_float16))
wrong(CHECK, "l_i and acc", "float32", "loop-carried")(pair(state_in_float64, attend=state_in_float64))
wrong(CHECK, "returned m_i in another type", "loop-carried")(pair(max_in_float64, attend=max_in_float64))
wrong(CHECK, "block's edge", "hi % BLOCK_SIZE")(pair(last_block_count_mod, attend=last_block_count_mod))
wrong(CHECK, "logical block", "block_id")(pair(logical_block_address, attend=logical_block_address))
wrong(CHECK, "view", "stride_head is not HEAD_DIM")(pair(head_stride_is_head_dim, attend=head_stride_is_head_dim))
wrong(CHECK, "view", "stride_block")(pair(block_stride_from_slots, attend=block_stride_from_slots))
wrong(CHECK, "view", "stride_slot is not")(pair(slot_stride_from_block, attend=slot_stride_from_block))
wrong(CHECK, "HEAD_DIM")(pair(no_lane_mask, attend=no_lane_mask))
wrong(CHECK, "head // GROUP")(pair(head_not_grouped, attend=head_not_grouped))
wrong(CHECK, "relative to one part", "88")(pair(merge_relative_to_a, merge=merge_relative_to_a))
wrong(CHECK, "expected lse", "weighted by exp(lse_x - lse)")(pair(merge_swapped_weights, merge=merge_swapped_weights))
wrong(CHECK, "expected lse", "m + log(")(pair(merge_lse_without_max, merge=merge_lse_without_max))
wrong(CHECK, "empty", "-inf")(pair(merge_empty_lse_zero, merge=merge_empty_lse_zero))
wrong(CHECK, "empty", "NaN")(pair(merge_divides_by_zero, merge=merge_divides_by_zero))
wrong(CHECK, "expected lse", "weighted by exp(lse_x - lse)")(pair(merge_plain_average, merge=merge_plain_average))
wrong(CHECK, "expected lse", "m + log(")(pair(merge_in_base2, merge=merge_in_base2))
wrong(CHECK, "merge returned lse and o in another type", "loop-carried")(pair(merge_in_float64, merge=merge_in_float64))
