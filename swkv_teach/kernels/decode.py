"""Paged sliding-window decode attention as a split-KV ("flash-decoding") Triton kernel.

Computes what :func:`swkv_teach.attention.paged_attention` computes for one query per sequence
(``seqlen_q == 1``), same layout, same window convention (the query of row ``b`` sits at
``p = cache_seqlens[b] - 1`` and sees keys ``p - W < j <= p``), without ever gathering the window:

* **Pass 1, the splits.** Program ``(b, h, s)`` owns query head ``h`` of row ``b`` and split ``s``
  of that row's window. It walks the window's blocks through ``block_table``, loads each block's
  keys and values of key/value head ``h // (nheads // nheads_k)`` straight from the pool, and folds
  them into an online softmax (:func:`attend_block`: running max ``m``, running sum ``l``, an
  accumulator rescaled by ``exp(m_old - m_new)``). It writes its split's normalised output and
  log-sum-exp ``lse = m + log l`` (a split with no block writes ``o = 0, lse = -inf``).
* **Pass 2, the combine.** Program ``(b, h)`` merges the splits' ``(lse, o)`` pairs by log-sum-exp
  (:func:`merge`) and writes ``out`` in ``q``'s dtype.

**The grid depends on the window, not on the sequence length.** A window of ``W`` keys overlaps at
most ``span = (W + 2 * block_size - 2) // block_size`` blocks, so the grid is
``(batch, nheads, num_splits)`` with ``num_splits <= span`` and each split reading at most
``ceil(span / num_splits)`` blocks, whether the sequence holds 100 tokens or a million. Splits are
laid out from the row's newest block backwards, so a row whose window is cut short at position 0
has empty splits first (the case :func:`merge` must survive). Only the table entries of blocks that
overlap the window are loaded, and only the slots inside it: a freed block (-1) or garbage outside
the window is never touched. :func:`split_blocks` is the same index arithmetic in Python.

What this follows (all read at the commits named):

* Triton's tutorial ``python/tutorials/06-fused-attention.py`` (commit 003da478), ``_attn_fwd_inner``:
  the online update ``m_ij = max(m_i, rowmax)``, ``alpha = exp(m_i - m_ij)``, ``l_i = l_i * alpha + sum(p)``,
  ``acc = acc * alpha + p @ v``. (It uses ``exp2`` with ``log2 e`` folded into the scale; ``exp`` here.)
* FlashAttention ``csrc/flash_attn/src/flash_fwd_kernel.h`` (commit 0251105a):
  ``compute_attn_1rowblock_splitkv`` lines 535-544 clip each split's block range by the local window
  and let an empty split write ``0`` and ``lse = -inf`` (line 580); ``combine_attn_seqk_parallel``
  lines 1191-1204 combine the splits' LSEs, with the guard ``lse_max == -INFINITY ? 0`` against
  ``-inf - -inf``. FlashAttention splits ``seqlen_k`` (line 535), so with a local window most of its
  splits are empty; here the splits divide the window itself.
* vLLM ``vllm/attention/ops/triton_decode_attention.py`` (commit 0f490657): ``_fwd_kernel_stage1``
  (grid ``(batch, head, NUM_KV_SPLITS)``, ``cur_kv_head = cur_head // kv_group_num``, the page lookup
  ``kv_loc = page * PAGE_SIZE + offs_n % PAGE_SIZE``, stores ``acc / e_sum`` and ``e_max + log(e_sum)``)
  and ``_fwd_kernel_stage2`` (the sequential LSE combine, skipping empty splits). Its splits divide
  the whole sequence (``kv_len_per_split = cdiv(seq_len, NUM_KV_SPLITS)``), not a window.
* vLLM ``vllm/attention/ops/triton_unified_attention.py`` (commit 001ceb3e), ``kernel_unified_attention_2d``:
  "sliding-window tile pruning" (``tile_start = first_allowed_key // TILE_SIZE``), and
  ``m_j = tl.where(m_j > float("-inf"), m_j, 0.0)`` for rows a window masks entirely.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swkv_teach._validate import check_positive_int
from swkv_teach.attention import _check_paged, paged_plan
from swkv_teach.kernels._mode import interpreted

__all__ = ["attend_block", "attend_steps", "decode_launch", "default_num_splits", "merge", "merge_pairs",
           "paged_decode", "split_blocks", "window_span"]


# ------------------------------------------------------------------ the two pieces exercise 12 asks for
@triton.jit
def attend_block(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi,
                 stride_block, stride_slot, stride_head,
                 GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Fold one pool block into a running softmax; returns the new ``(m_i, l_i, acc)``.

    q: ``(BLOCK_D,)`` float32, already times ``softmax_scale``, zero past ``HEAD_DIM``.
    m_i, l_i: float32 scalars, the running max and sum (``-inf`` and 0 before the
    first block); acc: ``(BLOCK_D,)`` float32, ``sum_j exp(s_j - m_i) v_j`` so far.
    K, V: the pools' base pointers; pool block ``block_id`` holds key positions
    ``start .. start + BLOCK_SIZE - 1``, slot ``i`` at
    ``block_id * stride_block + i * stride_slot``, key/value head ``kvh`` at
    ``+ kvh * stride_head``, ``headdim`` contiguous.
    head: the query head; it reads key/value head ``head // GROUP``.
    lo, hi: the keys the query sees are positions ``lo <= j < hi``
    (``hi = cache_seqlens[b]``): nothing else may be read, a slot past ``hi`` may hold
    anything (NaN included).
    BLOCK_N, BLOCK_D: the tile, powers of two ``>= BLOCK_SIZE, HEAD_DIM``
    (``tl.arange`` needs them).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    pos = start + offs_n
    seen = (offs_n < BLOCK_SIZE) & (pos >= lo) & (pos < hi)  # (BLOCK_N,)
    rows = (block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head
            + offs_n * stride_slot)
    ptrs = rows[:, None] + offs_d[None, :]  # (BLOCK_N, BLOCK_D)
    load = seen[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + ptrs, mask=load, other=0.0).to(tl.float32)
    # masked: 0 * NaN would still be NaN
    v = tl.load(V + ptrs, mask=load, other=0.0).to(tl.float32)
    s = tl.where(seen, tl.sum(q[None, :] * k, 1), float("-inf"))  # (BLOCK_N,) scores
    # finite: the launcher calls this only on blocks the window overlaps
    m_new = tl.maximum(m_i, tl.max(s, 0))
    alpha = tl.exp(m_i - m_new)  # rescales what was summed under the old max
    p = tl.exp(s - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * v, 0)


@triton.jit
def merge(lse_a, o_a, lse_b, o_b):
    """Merge two partial softmaxes by log-sum-exp; returns ``(lse, o)``.

    ``o_x`` is a normalised output over some keys, ``lse_x = log sum_j exp(s_j)`` over
    them; an empty part is ``(lse = -inf, o = 0)``, and two empty parts merge to an
    empty part.
    """
    m = tl.maximum(lse_a, lse_b)
    # both empty: exp(-inf - -inf) would be NaN
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(lse_a - m)
    wb = tl.exp(lse_b - m)
    total = wa + wb
    some = total > 0
    o = (o_a * wa + o_b * wb) / tl.where(some, total, 1.0)
    return tl.where(some, m + tl.log(tl.where(some, total, 1.0)), float("-inf")), o


# ------------------------------------------------------------------ the skeleton that calls them
@triton.jit
def _split_kernel(Q, K, V, TABLE, SEQLENS, LSE, O, scale, window, blocks_per_split,
                  num_splits, stride_qb, stride_qh, stride_block, stride_slot,
                  stride_head, stride_tb, stride_tw, attend: tl.constexpr,
                  GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    # keys 0 .. hi - 1 are stored; the query sits at p = hi - 1
    hi = tl.load(SEQLENS + b)
    lo = tl.maximum(hi - window, 0)  # p - W < j  <=>  j >= hi - W
    first = lo // BLOCK_SIZE  # the window's oldest and newest logical blocks
    last = (hi - 1) // BLOCK_SIZE
    # splits from the newest block backwards: split num_splits - 1 ends at `last`
    end = last + 1 - (num_splits - 1 - s) * blocks_per_split
    begin = tl.maximum(end - blocks_per_split, first)
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h * stride_qh + offs_d,
                mask=offs_d < HEAD_DIM, other=0.0)
    q = q.to(tl.float32) * scale
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for lb in range(begin, end):  # no iteration at all for an empty split
        block_id = tl.load(TABLE + b.to(tl.int64) * stride_tb + lb * stride_tw)
        m_i, l_i, acc = attend(q, m_i, l_i, acc, K, V, block_id, lb * BLOCK_SIZE, h,
                               lo, hi, stride_block, stride_slot, stride_head,
                               GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
    part = (b * tl.num_programs(1) + h) * num_splits + s
    found = l_i > 0
    lse = tl.where(found, m_i + tl.log(tl.where(found, l_i, 1.0)), float("-inf"))
    tl.store(LSE + part, lse)
    tl.store(O + part.to(tl.int64) * BLOCK_D + offs_d, acc / tl.where(found, l_i, 1.0))


@triton.jit
def _combine_kernel(LSE, O, OUT, num_splits, stride_ob, stride_oh,
                    merge: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.full([], float("-inf"), tl.float32)
    o = tl.zeros([BLOCK_D], dtype=tl.float32)
    first = (b * tl.num_programs(1) + h) * num_splits
    for s in range(0, num_splits):
        part = first + s
        o_part = tl.load(O + part.to(tl.int64) * BLOCK_D + offs_d)
        lse, o = merge(lse, o, tl.load(LSE + part), o_part)
    out = OUT + b.to(tl.int64) * stride_ob + h * stride_oh + offs_d
    tl.store(out, o.to(OUT.dtype.element_ty), mask=offs_d < HEAD_DIM)


@triton.jit
def _is_f32(x):
    # 1 where x is float32, 0 otherwise, decided when the kernel is traced (a value's dtype is static)
    return tl.full([], 1 if x.dtype == tl.float32 else 0, tl.int32)


@triton.jit
def _merge_pairs_kernel(LSE_A, O_A, LSE_B, O_B, LSE, O, F32, merge: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0)
    offs_d = tl.arange(0, BLOCK_D)
    lse, o = merge(tl.load(LSE_A + i), tl.load(O_A + i * BLOCK_D + offs_d),
                   tl.load(LSE_B + i), tl.load(O_B + i * BLOCK_D + offs_d))
    tl.store(F32 + 2 * i, _is_f32(lse))
    tl.store(F32 + 2 * i + 1, _is_f32(o))
    tl.store(LSE + i, lse.to(tl.float32))
    tl.store(O + i * BLOCK_D + offs_d, o.to(tl.float32))


@triton.jit
def _attend_steps_kernel(Q, K, V, BLOCKS, STARTS, STATE0, M, L, ACC, F32, head, lo, hi,
                         stride_block, stride_slot, stride_head, attend: tl.constexpr, STEPS: tl.constexpr,
                         GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    offs_d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + offs_d)
    m_i = tl.load(STATE0)
    l_i = tl.load(STATE0 + 1)
    acc = tl.load(STATE0 + 2 + offs_d)
    for i in tl.static_range(STEPS):  # unrolled: each step's types are seen, even where a loop would refuse them
        m_i, l_i, acc = attend(q, m_i, l_i, acc, K, V, tl.load(BLOCKS + i), tl.load(STARTS + i), head, lo, hi,
                               stride_block, stride_slot, stride_head, GROUP, BLOCK_SIZE, BLOCK_N, HEAD_DIM, BLOCK_D)
        tl.store(F32 + 3 * i, _is_f32(m_i))
        tl.store(F32 + 3 * i + 1, _is_f32(l_i))
        tl.store(F32 + 3 * i + 2, _is_f32(acc))
        tl.store(M + i, m_i.to(tl.float32))
        tl.store(L + i, l_i.to(tl.float32))
        tl.store(ACC + i * BLOCK_D + offs_d, acc.to(tl.float32))


# ------------------------------------------------------------------ Python side
def attend_steps(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, blocks: list[int], starts: list[int],
                 head: int, group: int, lo: int, hi: int, state: tuple[float, float, torch.Tensor],
                 attend=attend_block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``attend`` on pool blocks ``blocks`` (key positions from ``starts``) one after another, from ``state``.

    ``q``: ``(BLOCK_D,)`` float32, already scaled, zero past headdim; ``k_cache``, ``v_cache``: pools
    ``(num_blocks, block_size, nheads_k, headdim)`` with any strides whose headdim is contiguous (the same for
    both); query ``head`` reads key/value head ``head // group``; ``state``: ``(m_i, l_i, acc (BLOCK_D,))`` before the first block. Returns ``m (n,)``, ``l (n,)``,
    ``acc (n, BLOCK_D)`` after each block, and ``(n, 3)`` int32 flags, 1 where ``m``, ``l``, ``acc`` stayed
    float32: how exercise 12's check looks at an ``attend_block`` one block at a time.
    """
    n, (BLOCK_D,) = len(blocks), q.shape
    dev = q.device
    state0 = torch.cat([torch.tensor([state[0], state[1]], dtype=torch.float32, device=dev),
                        state[2].to(device=dev, dtype=torch.float32)])
    m, l_ = torch.empty(n, device=dev), torch.empty(n, device=dev)
    acc = torch.empty(n, BLOCK_D, device=dev)
    f32 = torch.empty(n, 3, dtype=torch.int32, device=dev)
    _attend_steps_kernel[(1,)](
        q.float().contiguous(), k_cache, v_cache, torch.tensor(blocks, dtype=torch.int32, device=dev),
        torch.tensor(starts, dtype=torch.int32, device=dev), state0, m, l_, acc, f32, head, lo, hi,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), attend=attend, STEPS=n,
        GROUP=group,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_N=triton.next_power_of_2(k_cache.shape[1]), HEAD_DIM=k_cache.shape[3],
        BLOCK_D=BLOCK_D)
    return m, l_, acc, f32


def merge_pairs(lse_a: torch.Tensor, o_a: torch.Tensor, lse_b: torch.Tensor, o_b: torch.Tensor,
                merge=merge, with_types: bool = False) -> tuple[torch.Tensor, ...]:
    """Run a ``merge`` on ``n`` pairs of partial results, one program each: ``lse_x`` ``(n,)``, ``o_x`` ``(n, d)``.

    ``d`` a power of two; float32. Returns the merged ``(lse (n,), o (n, d))``: how lesson 11 and
    exercise 12's check call a merge on its own; ``with_types``: also ``(n, 2)`` int32 flags, 1 where
    ``lse`` and ``o`` came back float32 (the combine's loop carries them float32).
    """
    n, d = o_a.shape
    args = [t.float().contiguous() for t in (lse_a, o_a, lse_b, o_b)]
    lse, o = torch.empty_like(args[0]), torch.empty_like(args[1])
    f32 = torch.empty(n, 2, dtype=torch.int32, device=o.device)
    _merge_pairs_kernel[(n,)](*args, lse, o, f32, merge=merge, BLOCK_D=d)
    return (lse, o, f32) if with_types else (lse, o)


def window_span(window_size: int | None, block_size: int, max_blocks_per_seq: int) -> int:
    """The most blocks one query's window can overlap: ``(W + 2 * bs - 2) // bs``, at most the table's width.

    ``W`` keys starting anywhere in a block reach ``ceil((W - 1) / bs)`` blocks past it. Without a
    window (None) a row may read its whole table.
    """
    if window_size is None:
        return max_blocks_per_seq
    return min(max_blocks_per_seq, (window_size + 2 * block_size - 2) // block_size)


def default_num_splits(rows_times_heads: int, span: int, device: torch.device) -> int:
    """How many splits when the caller does not say: enough programs to fill the GPU, at most ``span``.

    On CUDA, about two programs per streaming multiprocessor (FlashAttention's ``set_params_splitkv``
    sizes its splits for ``num_sm * 2``, ``csrc/flash_attn/flash_api.cpp`` line 335 at commit 0251105a).
    In the interpreter programs run one after another, so 2 splits only keep the combine exercised.
    """
    if device.type == "cuda" and not interpreted():
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(span, 64, -(-2 * sms // max(rows_times_heads, 1))))
    return min(span, 2)


def split_blocks(cache_seqlens, window_size: int | None, block_size: int, num_splits: int,
                 max_blocks_per_seq: int) -> torch.Tensor:
    """The logical blocks each split program reads: ``(batch, num_splits, 2)`` ``[begin, end)`` per split.

    The same index arithmetic as the kernel, in Python, for the lesson's figure and the tests:
    row ``b``'s window covers logical blocks ``lo // bs .. (seqlen - 1) // bs`` with
    ``lo = max(seqlen - W, 0)``; split ``s`` reads ``ceil(span / num_splits)`` of them, counted back
    from the newest. An empty split has ``begin >= end``.
    """
    seqlens = torch.as_tensor(cache_seqlens, dtype=torch.long).reshape(-1)
    span = window_span(window_size, block_size, max_blocks_per_seq)
    per = -(-span // num_splits)
    W = max_blocks_per_seq * block_size if window_size is None else window_size
    first = (seqlens - W).clamp(min=0) // block_size
    last = (seqlens - 1) // block_size
    s = torch.arange(num_splits)
    end = last[:, None] + 1 - (num_splits - 1 - s) * per
    begin = torch.maximum(end - per, first[:, None])
    return torch.stack([begin, end], dim=-1)


def decode_launch(q, k_cache, v_cache, cache_seqlens: torch.Tensor, block_table: torch.Tensor,
                  window_size: int | None, softmax_scale: float, num_splits: int,
                  attend=attend_block, merge=merge) -> torch.Tensor:
    """Launch the two passes, no checks (the hot path; :func:`paged_decode` checks first).

    ``cache_seqlens`` a ``(batch,)`` integer tensor and ``block_table`` ``(batch, max_blocks_per_seq)``
    integers, both on ``q``'s device; ``attend``/``merge``: ``@triton.jit`` functions with the
    signatures of :func:`attend_block` and :func:`merge` (exercise 12 passes its own).
    """
    B, _, H, D = q.shape
    n_blocks, bs, Hk, _ = k_cache.shape
    if q.stride(-1) != 1:
        q = q.contiguous()  # the kernel reads headdim as contiguous lanes
    if k_cache.stride(-1) != 1 or v_cache.stride() != k_cache.stride():
        # the kernel walks both pools with one set of strides over a contiguous headdim
        k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    span = window_span(window_size, bs, block_table.shape[1])
    per = -(-span // num_splits)
    window = block_table.shape[1] * bs if window_size is None else window_size  # no window: the whole table
    BLOCK_D = triton.next_power_of_2(D)
    lse = torch.empty(B, H, num_splits, device=q.device, dtype=torch.float32)
    o = torch.empty(B, H, num_splits, BLOCK_D, device=q.device, dtype=torch.float32)
    out = torch.empty(B, H, D, device=q.device, dtype=q.dtype)
    _split_kernel[(B, H, num_splits)](
        q, k_cache, v_cache, block_table, cache_seqlens, lse, o, softmax_scale, window, per, num_splits,
        q.stride(0), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), block_table.stride(1),
        attend=attend, GROUP=H // Hk, BLOCK_SIZE=bs, BLOCK_N=triton.next_power_of_2(bs), HEAD_DIM=D, BLOCK_D=BLOCK_D,
    )
    _combine_kernel[(B, H)](lse, o, out, num_splits, out.stride(0), out.stride(1),
                            merge=merge, HEAD_DIM=D, BLOCK_D=BLOCK_D)
    return out[:, None]  # (B, 1, H, D)


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens,
                 block_table: torch.Tensor, window_size: int | None = None, softmax_scale: float | None = None,
                 num_splits: int | None = None) -> torch.Tensor:
    """One decode step of paged sliding-window attention, in Triton.

    Args and result as :func:`swkv_teach.attention.paged_attention` with ``seqlen_q == 1``:
        q: ``(batch, 1, nheads, headdim)``.
        k_cache, v_cache: ``(num_blocks, block_size, nheads_k, headdim)``, the pool (any block size,
            any headdim: the kernel pads its tiles to powers of two and masks).
        cache_seqlens: ``(batch,)`` integers or one int, the new query's own key included.
        block_table: ``(batch, max_blocks_per_seq)`` integers; entries of blocks outside every window
            are never loaded and may hold anything.
        window_size: ``W``, the query at ``p`` sees ``p - W < j <= p``; None: every stored key.
        softmax_scale: default ``1 / sqrt(headdim)``.
        num_splits: programs per (row, head) in pass 1, at least 1 (more than the window's blocks
            leaves some empty); default :func:`default_num_splits`.
    Returns:
        ``(batch, 1, nheads, headdim)`` in ``q``'s dtype; scores, softmax and sums in float32.

    Runs compiled on CUDA tensors, or in Triton's interpreter (:func:`swkv_teach.kernels.interpreted`).
    """
    W, scale = _check_paged(q, k_cache, v_cache, block_table, window_size, softmax_scale)
    if q.shape[1] != 1:
        raise ValueError(f"q has seqlen_q={q.shape[1]} (shape {tuple(q.shape)}); paged_decode takes one query "
                         "per sequence, (batch, 1, nheads, headdim): use paged_attention for several")
    if q.device.type != "cuda" and not interpreted():
        raise ValueError(f"q is on {q.device}, but Triton compiles for the GPU here: move q, k_cache, v_cache to "
                         "cuda, or set TRITON_INTERPRET=1 before importing swkv_teach.kernels to run on the CPU")
    if num_splits is not None:
        check_positive_int("num_splits", num_splits)
    # the reference's own checks of cache_seqlens and block_table (lengths, every block read inside the pool)
    paged_plan(cache_seqlens, block_table, 1, k_cache.shape[1], k_cache.shape[0], W, q.device)
    B = q.shape[0]
    seqlens = torch.as_tensor(cache_seqlens, device=q.device).reshape(-1).expand(B).to(torch.int32)
    table = block_table.to(q.device)
    if table.dtype not in (torch.int32, torch.int64):
        table = table.to(torch.int64)
    if num_splits is None:
        num_splits = default_num_splits(B * q.shape[2], window_span(W, k_cache.shape[1], table.shape[1]), q.device)
    return decode_launch(q, k_cache, v_cache, seqlens.contiguous(), table, W, scale, num_splits)

