"""Attention with a sliding window: the full-sequence oracle, and decode over a cache.

Both follow the convention of :mod:`swkv_teach.masks` (query ``i`` sees keys
``i - W < j <= i``, plus the first ``num_sinks``). The oracle spells softmax
out by hand; the decode path uses PyTorch's fused
``scaled_dot_product_attention``. Tests check one against the other, so
neither is trusted alone. :func:`paged_attention` is what a paged kernel
(FlashAttention's ``flash_attn_with_kvcache`` with a ``block_table``, vLLM's
PagedAttention) computes, written with batched tensor ops.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from swkv_teach._validate import check_positive_int
from swkv_teach.masks import allowed, window_mask

__all__ = [
    "PagedPlan", "VarlenPlan", "attend_paged", "attention", "attention_with_cache", "cached_attention",
    "paged_attention", "paged_plan", "paged_varlen_plan", "sliding_window_attention",
]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention written out: ``softmax(q kᵀ / √d, masked) v``.

    Args:
        q: ``(..., q_len, head_dim)``; k, v: ``(..., k_len, head_dim)``.
        mask: bool ``(q_len, k_len)`` (or broadcastable), True where attention is allowed.
    Returns:
        ``(..., q_len, head_dim)``.
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., q_len, k_len)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def sliding_window_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: int, num_sinks: int = 0
) -> torch.Tensor:
    """The oracle: every query of a whole sequence at once, no cache.

    Args:
        q, k, v: ``(batch, heads, seq_len, head_dim)``, position ``t`` at index ``t``.
    Returns:
        ``(batch, heads, seq_len, head_dim)``.
    """
    pos = torch.arange(q.shape[-2], device=q.device)
    return attention(q, k, v, window_mask(pos, pos, window_size, num_sinks))


def cached_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    window_size: int,
    num_sinks: int = 0,
) -> torch.Tensor:
    """New queries over the keys/values a cache's ``update`` returned.

    Args:
        q: ``(batch, heads, tokens, head_dim)``, the new queries.
        k, v: ``(batch, kv_heads, n, head_dim)``, any order (a ring buffer's slot order is fine).
            ``kv_heads`` may divide ``heads`` (grouped-query attention): key/value head ``h``
            then serves query heads ``h * g .. h * g + g - 1`` with ``g = heads // kv_heads``,
            as Hugging Face's ``repeat_kv`` lays them out, without copying the keys ``g`` times.
        q_positions: ``(tokens,)`` absolute positions of the queries.
        k_positions: ``(n,)`` absolute positions of the keys, as the cache's ``positions``.
    Returns:
        ``(batch, heads, tokens, head_dim)``, via ``F.scaled_dot_product_attention``.
    """
    for name, pos, t in (("q_positions", q_positions, q), ("k_positions", k_positions, k)):
        if len(pos) != t.shape[-2]:
            which = "q" if name == "q_positions" else "k"
            raise ValueError(
                f"{name} must give one position per token of {which} ({t.shape[-2]}, shape {tuple(t.shape)}); "
                f"got {len(pos)} positions"
            )
    mask = window_mask(q_positions, k_positions, window_size, num_sinks).to(q.device)
    if k.shape[-3] != q.shape[-3]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attention_with_cache(query: torch.Tensor, cache) -> torch.Tensor:
    """The second seed's ``attention_with_cache`` demo, corrected: one query over an LRU cache.

    The seed's version had five bugs: it called ``np.softmax`` (NumPy has
    none), so it could not run; it transposed keys with a permutation of all
    axes instead of swapping the last two; its comment says ``Q @ K^T / sqrt(dk)``
    but the code never divides by ``sqrt(dk)``; it looked up ids
    ``range(max_window)``, i.e. the *oldest* ids, which eviction has removed;
    and its ``get`` calls promoted every key they read, so reading reordered
    what gets evicted (lesson 5 shows each). Here the keys are read with ``peek`` (no promotion), in
    the cache's own order.

    Args:
        query: ``(head_dim,)``.
        cache: an :class:`~swkv_teach.caches.lru.LRUKVCache` whose entries are ``(head_dim,)`` tensors.
    Returns:
        ``(head_dim,)``: zeros if the cache is empty.
    """
    entries = [cache.peek(i) for i in cache.ids()]
    if not entries:
        return torch.zeros_like(query)
    keys = torch.stack([torch.as_tensor(k, dtype=query.dtype, device=query.device) for k, _ in entries])  # (n, hd)
    values = torch.stack([torch.as_tensor(v, dtype=query.dtype, device=query.device) for _, v in entries])
    return attention(query[None, :], keys, values)[0]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens,
    block_table: torch.Tensor,
    window_size: int | None = None,
    softmax_scale: float | None = None,
    *,
    cu_seqlens_q: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Attention of a batch of sequences over keys in blocks of a shared pool: what a paged kernel computes.

    Layout and meaning are those of FlashAttention's ``flash_attn_with_kvcache``
    in paged mode (``flash_attn/flash_attn_interface.py``, commit 0251105a,
    lines 1485-1599), called with ``k=v=None`` (the new keys already written)
    and ``causal=True``:

    ======================  ======================================  ============================================
    here                    ``flash_attn_with_kvcache``              vLLM ``paged_attention_v1``
    ======================  ======================================  ============================================
    ``q``                   ``q`` (batch, seqlen, nheads, headdim)   ``query`` (num_seqs, num_heads, head_size):
                                                                    one query per sequence
    ``k_cache``/``v_cache``  same, "(num_blocks, page_block_size,     ``key_cache``/``value_cache``, laid out
                            nheads_k, headdim) if there's a          (num_blocks, num_kv_heads, head_size/x,
                            block_table" (line 1551)                 block_size, x) / (..., head_size, block_size)
    ``cache_seqlens``       ``cache_seqlens`` (line 1561)            ``seq_lens``
    ``block_table``         ``block_table`` (batch,                  ``block_tables``
                            max_num_blocks_per_seq) int32 (1568)
    ``window_size=W``       ``window_size=(W - 1, 0)`` (1542-1544)   none: lengths capped to the window, see below
    ``softmax_scale``       ``softmax_scale``, default               ``scale``
                            ``1/sqrt(headdim)`` (line 1597)
    ======================  ======================================  ============================================

    (vLLM: ``vllm/_custom_ops.py`` at commit 7bcae67b, ``paged_attention_v1``, line 33; the
    block layout from the argument comments of its CUDA kernel, ``csrc/attention/attention_kernels.cuh``.)
    That kernel takes no window: vLLM's v0 model runner made a sliding window out of shorter
    rows. In ``ModelRunner._prepare_decode`` (``vllm/worker/model_runner.py`` at commit
    587909ce) each decode row passes ``seq_len = min(seq_len, self.sliding_window)`` and only the
    last ``sliding_window // block_size`` entries of its table, ``block_table[-sliding_window_blocks:]``
    (the v0 block manager reused those blocks as a ring; later v0 releases capped the length at
    ``block_aligned_sliding_window + seq_len % block_size`` instead, in
    ``_compute_for_sliding_window``). Here the row keeps its true length and its whole table, and
    the window is a mask, as FlashAttention's.

    **Varlen queries** (the rows of one forward with different numbers of new tokens, e.g.
    decode rows beside prefill chunks): pass ``q`` as ``(total_q, nheads, headdim)``, row ``b``'s
    queries at ``q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]``, with ``cu_seqlens_q``
    ``(batch + 1,)`` int32 and ``max_seqlen_q`` the longest row's count, the layout of
    FlashAttention's ``flash_attn_varlen_func`` (``flash_attn/flash_attn_interface.py`` at
    commit 0251105a, lines 1391-1447: ``q`` line 1432, ``cu_seqlens_q`` 1435, ``max_seqlen_q``
    1439, ``block_table`` 1407). Its paged form (``mha_varlen_fwd``,
    ``csrc/flash_attn/flash_api.cpp`` lines 539-547: ``k`` "num_blocks x page_block_size x
    num_heads_k x head_size if there's a block_table", ``seqused_k`` "only this many elements
    of each batch element's keys are used") takes each row's key count as ``seqused_k``: that
    is ``cache_seqlens`` here. The result is ``(total_q, nheads, headdim)``; a row may have no
    queries (``cu_seqlens_q[b] == cu_seqlens_q[b + 1]``).

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``, the new queries of each sequence; or, with
            ``cu_seqlens_q``, ``(total_q, nheads, headdim)``, every row's queries one after another.
        k_cache, v_cache: ``(num_blocks, block_size, nheads_k, headdim)``, the pool; ``nheads`` a
            multiple of ``nheads_k``: query head ``h`` reads key/value head ``h // (nheads // nheads_k)``
            (FlashAttention's docstring: "head 0, 1, 2 of Q will attention to head 0 of K, V", line 1527).
            Any ``block_size`` works here; that FlashAttention build asks for a multiple of 256 (line 1552).
        cache_seqlens: ``(batch,)`` integers (or one int for all rows): tokens of each sequence in the
            cache, the new queries' own keys included.
        block_table: ``(batch, max_blocks_per_seq)`` integers: logical block ``i`` of row ``b`` (tokens
            ``i*block_size .. (i+1)*block_size - 1``) lives in pool block ``block_table[b, i]``. Entries
            for blocks no query reads (wholly outside every window, or past ``cache_seqlens``) are never
            looked at and may hold anything, -1 included (a freed block).
        window_size: ``W``: query ``i`` of row ``b`` sits at position ``p = cache_seqlens[b] - seqlen_q + i``
            and attends keys ``j`` with ``p - W < j <= p`` (:mod:`swkv_teach.masks`); None: causal only.
        softmax_scale: default ``1 / sqrt(headdim)``.
        cu_seqlens_q: ``(batch + 1,)`` integers, 0 first, non-decreasing, ``total_q`` last: row ``b``'s
            queries are ``q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]]``, the last ones of its
            ``cache_seqlens[b]`` positions (query ``i`` of the row at ``cache_seqlens[b] - n_b + i``).
        max_seqlen_q: the largest ``n_b`` (FlashAttention sizes its grid by it); required with
            ``cu_seqlens_q``, and must be at least every row's count.
    Returns:
        ``(batch, seqlen_q, nheads, headdim)`` (varlen: ``(total_q, nheads, headdim)``) in ``q``'s
        dtype; scores, softmax and sums in float32.

    Worked example, ``block_size = 2``, ``W = 3``, one query per row, ``cache_seqlens = [5, 2]``:
    row 0's query sits at position 4 and reads keys 2, 3, 4, i.e. logical blocks 1 and 2
    (``block_table[0, 1:3]``); ``block_table[0, 0]`` is never read and may be -1. Row 1's query
    (position 1) reads keys 0 and 1, logical block 0; its entries past block 0 are never read.

    How: each row reads the last ``seqlen_q + W - 1`` positions before its ``cache_seqlens`` (every
    key some query may see), gathered through the table in one indexing op, then one masked
    ``scaled_dot_product_attention`` over the batch. That gather is what a fused kernel does not
    do: it walks the table and reads each block in place, in on-chip tiles, never writing the
    window out (and splits long contexts over thread blocks). The result is the same.
    """
    if cu_seqlens_q is not None or max_seqlen_q is not None:
        _check_varlen_q(q, cu_seqlens_q, max_seqlen_q)
        W, scale = _check_paged(q[None], k_cache, v_cache, None, window_size, softmax_scale)
        plan = paged_varlen_plan(cu_seqlens_q, max_seqlen_q, cache_seqlens, block_table, k_cache.shape[1],
                                 k_cache.shape[0], W, q.device)
        return attend_paged(q, k_cache, v_cache, plan, scale)
    if isinstance(q, torch.Tensor) and q.dim() == 3:
        raise ValueError(f"q has 3 dims, shape {tuple(q.shape)}: varlen queries (total_q, nheads, headdim) need "
                         f"cu_seqlens_q and max_seqlen_q; otherwise pass q as (batch, seqlen_q, nheads, headdim)")
    W, scale = _check_paged(q, k_cache, v_cache, block_table, window_size, softmax_scale)
    plan = paged_plan(cache_seqlens, block_table, q.shape[1], k_cache.shape[1], k_cache.shape[0], W, q.device)
    return attend_paged(q, k_cache, v_cache, plan, scale)


class PagedPlan(NamedTuple):
    """Where each row's keys lie and which queries see them: the same for every layer of one forward.

    ``slots`` ``(batch, L)``: flat pool slot (``block * block_size + offset``) of each key a row
    reads, its last ``L = seqlen_q + W - 1`` positions; ``mask`` ``(batch, 1, seqlen_q, L)`` bool.
    (mistral-inference likewise computes its cache metadata once per forward and hands it to
    every layer.)
    """

    slots: torch.Tensor
    mask: torch.Tensor


def paged_plan(cache_seqlens, block_table: torch.Tensor, seqlen_q: int, block_size: int, num_blocks: int,
               window_size: int | None = None, device=None) -> PagedPlan:
    """Check ``cache_seqlens`` and ``block_table`` (as :func:`paged_attention` means them) and plan the reads.

    Every table entry that some query reads must be a block of the pool (``0 .. num_blocks - 1``);
    the others are never looked at.
    """
    device = _check_table(block_table, window_size, device)
    table = block_table.to(device=device, dtype=torch.long)
    seqlens = _check_seqlens(cache_seqlens, table.shape[0], seqlen_q, block_size, table.shape[1], device)
    W, Tq, bs = window_size, seqlen_q, block_size
    span = table.shape[1] * bs  # positions a row's table can address
    L = span if W is None else min(span, Tq + W - 1)  # keys some query of a row may see: the last L positions
    j = seqlens[:, None] - L + torch.arange(L, device=device)  # (B, L) key positions, negative = none
    present = j >= 0
    jc = j.clamp(min=0)
    blocks = table.gather(1, jc // bs)  # (B, L): entries read only where present
    bad = present & ((blocks < 0) | (blocks >= num_blocks))
    if bool(bad.any()):
        b, i = (int(x) for x in torch.nonzero(bad)[0])
        raise ValueError(
            f"block_table[{b}, {int(jc[b, i]) // bs}] = {int(blocks[b, i])} is read (it holds key position "
            f"{int(j[b, i])}, inside row {b}'s windows) but is not a block of the pool (0..{num_blocks - 1})"
        )
    # flat pool slots; a position before 0 reads position 0's slot (masked out): when a row's span starts
    # before 0, position 0 is in its first query's window, so that slot holds a real key, never garbage
    slots = blocks * bs + jc % bs  # (B, L)
    p = seqlens[:, None] - Tq + torch.arange(Tq, device=device)  # (B, Tq) query positions
    pi, jj = p[:, :, None], j[:, None, :]
    see = (jj <= pi) if W is None else allowed(pi, jj, W)
    return PagedPlan(slots, (see & present[:, None, :])[:, None])  # mask (B, 1, Tq, L)


class VarlenPlan(NamedTuple):
    """A :func:`paged_varlen_plan`: the packed queries cut into tiles, in groups of one tile size.

    Group ``g``: ``index[g]`` ``(tiles, T)`` packed-query numbers of each tile (a tile shorter than
    ``T`` repeats its last query, whose output is dropped); ``plans[g]`` a :class:`PagedPlan` of
    ``tiles`` rows of ``T`` queries; ``real[g]`` ``(keep, dest)``: the real queries' places among
    the ``tiles * T`` outputs and their packed numbers.
    """

    index: tuple
    plans: tuple
    real: tuple


VARLEN_TILE = 16  # queries per tile of a multi-token row: each tile gathers T + W - 1 keys, not T * W


def paged_varlen_plan(cu_seqlens_q, max_seqlen_q: int, cache_seqlens, block_table: torch.Tensor, block_size: int,
                      num_blocks: int, window_size: int | None = None, device=None) -> VarlenPlan:
    """Plan varlen queries (:func:`paged_attention` with ``cu_seqlens_q``), checking the table entries read.

    A tile is up to ``T`` consecutive queries of one row, at positions ``p_first .. p_last``;
    it reads the ``L = T + W - 1`` positions ending at ``p_last`` (every key its queries may
    see), as a FlashAttention program reads one tile of queries against the keys of their
    windows. Rows of one query (decoding) are tiles of ``T = 1`` (``L = W``); longer rows (prefill
    chunks) are cut into tiles of ``T = min(VARLEN_TILE, longest)``; two groups, so a decode
    row pays for no padding and a prompt's keys are gathered about ``(T + W - 1) / T`` times,
    not ``W`` times. Without a window, ``L`` is the longest row. A key position a tile's queries
    never see (before 0, or before ``p_first - W + 1``) reads ``p_last``'s slot instead, masked
    out: nothing outside a window is ever gathered, so a block no query needs may be -1.

    Worked example, ``block_size = 2``, ``W = 3``, ``cache_seqlens = [5, 2]``,
    ``cu_seqlens_q = [0, 1, 3]``: row 0's one query (position 4) is a tile of 1 reading keys
    2, 3, 4; row 1's two queries (positions 0, 1) are a tile of 2 reading positions -3 .. 1,
    the negative ones masked.
    """
    device = _check_table(block_table, window_size, device)
    cu = [int(x) for x in cu_seqlens_q.tolist()]
    B = len(cu) - 1
    if block_table.shape[0] != B:
        raise ValueError(f"block_table has {block_table.shape[0]} rows but cu_seqlens_q describes batch={B} rows "
                         f"(batch + 1 = {B + 1} entries)")
    table = block_table.to(device=device, dtype=torch.long)
    counts = [b - a for a, b in zip(cu, cu[1:])]
    seqlens = _check_seqlens(cache_seqlens, B, 0, block_size, table.shape[1], device)
    lens = seqlens.tolist()
    for b in range(B):
        if lens[b] < counts[b]:
            raise ValueError(f"cache_seqlens[{b}] = {lens[b]}, but row {b} has {counts[b]} queries "
                             f"(cu_seqlens_q[{b + 1}] - cu_seqlens_q[{b}]); each row's length must be at least its "
                             f"query count (the new queries' own keys are in the cache)")
    longest_row = max(lens) if B else 1
    longest_q = max(counts) if B else 1
    index, plans, real = [], [], []
    for T in (1, min(VARLEN_TILE, longest_q)) if longest_q > 1 else (1,):
        tiles = []  # (row, first query's packed index, real queries in the tile)
        for b in range(B):
            if (counts[b] == 1) != (T == 1) or counts[b] == 0:
                continue
            tiles += [(b, cu[b] + s, min(T, counts[b] - s)) for s in range(0, counts[b], T)]
        if not tiles:
            continue
        rows = torch.tensor([t[0] for t in tiles], device=device)
        first = torch.tensor([t[1] for t in tiles], device=device)
        n_real = torch.tensor([t[2] for t in tiles], device=device)
        offs = torch.arange(T, device=device)
        idx = first[:, None] + torch.minimum(offs, n_real[:, None] - 1)  # (tiles, T): repeats the last real query
        row_start = torch.tensor([cu[t[0]] for t in tiles], device=device)
        p = seqlens[rows][:, None] - torch.tensor([counts[t[0]] for t in tiles], device=device)[:, None] + (
            idx - row_start[:, None])  # (tiles, T) query positions
        p_first, p_last = p[:, :1], p[:, -1:]
        L = max(1, longest_row if window_size is None else min(T + window_size - 1, longest_row))
        j = p_last - L + 1 + torch.arange(L, device=device)  # (tiles, L) key positions
        seen = j >= 0 if window_size is None else (j >= 0) & (j > p_first - window_size)
        jc = torch.where(seen, j, p_last)
        blocks = table[rows].gather(1, jc // block_size)  # (tiles, L)
        bad = (blocks < 0) | (blocks >= num_blocks)
        if bool(bad.any()):
            t, i = (int(x) for x in torch.nonzero(bad)[0])
            b = int(rows[t])
            raise ValueError(
                f"block_table[{b}, {int(jc[t, i]) // block_size}] = {int(blocks[t, i])} is read (it holds key "
                f"position {int(jc[t, i])}, inside row {b}'s windows) but is not a block of the pool "
                f"(0..{num_blocks - 1})"
            )
        pi, jj = p[:, :, None], j[:, None, :]
        see = (jj <= pi) if window_size is None else allowed(pi, jj, window_size)
        mask = (see & seen[:, None, :])[:, None]  # (tiles, 1, T, L)
        keep = torch.nonzero((offs[None, :] < n_real[:, None]).flatten())[:, 0]  # real queries among tiles * T
        index.append(idx)
        plans.append(PagedPlan(blocks * block_size + jc % block_size, mask))
        real.append((keep, idx.flatten()[keep]))
    return VarlenPlan(tuple(index), tuple(plans), tuple(real))


def _check_varlen_q(q, cu_seqlens_q, max_seqlen_q) -> None:
    if cu_seqlens_q is None or max_seqlen_q is None:
        missing = "cu_seqlens_q" if cu_seqlens_q is None else "max_seqlen_q"
        raise ValueError(f"varlen queries need both cu_seqlens_q and max_seqlen_q (FlashAttention's "
                         f"flash_attn_varlen_func); {missing} is missing")
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor shaped (total_q, nheads, headdim); got {type(q).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q has {q.dim()} dims, shape {tuple(q.shape)}; with cu_seqlens_q, expected 3: "
                         f"(total_q, nheads, headdim)")
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape[0] < 2:
        got = f"shape {tuple(cu_seqlens_q.shape)}" if isinstance(cu_seqlens_q, torch.Tensor) else repr(cu_seqlens_q)
        raise ValueError(f"cu_seqlens_q must be a (batch + 1,) integer tensor (int32 in FlashAttention), batch >= 1; "
                         f"got {got}")
    if cu_seqlens_q.is_floating_point() or cu_seqlens_q.dtype == torch.bool:
        raise TypeError(f"cu_seqlens_q must hold integer offsets; got dtype {cu_seqlens_q.dtype}")
    cu = cu_seqlens_q.tolist()
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens_q must start at 0, never decrease and end at total_q = {q.shape[0]} "
                         f"(q's first dim); got {cu}")
    if cu[-1] < 1:
        raise ValueError(f"q holds no queries (shape {tuple(q.shape)}); expected total_q >= 1")
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int):
        raise TypeError(f"max_seqlen_q must be an int (the longest row's query count); got "
                        f"{type(max_seqlen_q).__name__} {max_seqlen_q!r}")
    longest = max(b - a for a, b in zip(cu, cu[1:]))
    if max_seqlen_q < longest:
        raise ValueError(f"max_seqlen_q = {max_seqlen_q} but a row of cu_seqlens_q has {longest} queries; "
                         f"max_seqlen_q must be at least the longest row's count")


def attend_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: PagedPlan,
                 softmax_scale: float | None = None) -> torch.Tensor:
    """The attention half of :func:`paged_attention`, given a :func:`paged_plan` (no checks: the hot path).

    One gather of every row's keys through ``plan.slots`` (the copy a fused kernel avoids),
    then one masked ``scaled_dot_product_attention`` in float32. Shapes as :func:`paged_attention`.
    With a :class:`VarlenPlan` (:func:`paged_varlen_plan`), ``q`` is packed: ``(total_q, nheads,
    headdim)``, or ``(1, total_q, nheads, headdim)`` as a decoder layer hands it
    (:meth:`Block.forward_paged <swkv_teach.model.Block.forward_paged>`); each group of tiles is
    one gather and one SDPA call.
    """
    if isinstance(plan, VarlenPlan):  # packed varlen queries, (total_q, H, D) or (1, total_q, H, D)
        flat = q.reshape(-1, *q.shape[-2:])
        if len(plan.plans) == 1 and plan.index[0].shape[1] == 1:  # decode rows only: tiles are the queries, in order
            return attend_paged(flat[:, None], k_cache, v_cache, plan.plans[0], softmax_scale).view(q.shape)
        out = torch.empty_like(flat)
        for index, sub, (keep, dest) in zip(plan.index, plan.plans, plan.real):
            y = attend_paged(flat[index], k_cache, v_cache, sub, softmax_scale)  # (tiles, T, H, D)
            out.index_copy_(0, dest, y.flatten(0, 1).index_select(0, keep))
        return out.view(q.shape)
    B, Tq, H, D = q.shape
    n_blocks, bs, Hk, _ = k_cache.shape
    k = k_cache.reshape(n_blocks * bs, Hk, D)[plan.slots]  # (B, L, Hk, D)
    v = v_cache.reshape(n_blocks * bs, Hk, D)[plan.slots]
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(),
        attn_mask=plan.mask, scale=softmax_scale, enable_gqa=H != Hk,
    )  # (B, H, Tq, D) float32
    return out.transpose(1, 2).to(q.dtype)



def _check_table(block_table, window_size, device):
    """The checks both plans share: ``window_size`` a positive int or None, ``block_table`` a 2-D integer tensor.

    Returns the device the plan is made on (the table's unless one is given).
    """
    if window_size is not None:
        check_positive_int("window_size", window_size)
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        got = (f"shape {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor)
               else type(block_table).__name__)
        raise ValueError(f"block_table must be a 2-D integer tensor (batch, max_blocks_per_seq); got {got}")
    if block_table.is_floating_point() or block_table.dtype == torch.bool:
        raise TypeError(f"block_table must hold integer block numbers; got dtype {block_table.dtype}")
    return block_table.device if device is None else device

def _check_paged(q, k_cache, v_cache, block_table, window_size, softmax_scale):
    for name, t, dims in (("q", q, "(batch, seqlen_q, nheads, headdim)"),
                          ("k_cache", k_cache, "(num_blocks, block_size, nheads_k, headdim)"),
                          ("v_cache", v_cache, "(num_blocks, block_size, nheads_k, headdim)")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor shaped {dims}; got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} has {t.dim()} dims, shape {tuple(t.shape)}; expected 4: {dims}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point; got dtype {t.dtype}")
    if q.shape[1] < 1:
        raise ValueError(f"q holds no queries (shape {tuple(q.shape)}); expected seqlen_q >= 1 along dim 1")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if k_cache.shape[3] != q.shape[3]:
        raise ValueError(f"k_cache has headdim={k_cache.shape[3]} but q has headdim={q.shape[3]}")
    if q.shape[2] % k_cache.shape[2]:
        raise ValueError(f"q's nheads={q.shape[2]} must be a multiple of k_cache's nheads_k={k_cache.shape[2]}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must share one dtype (as FlashAttention requires); got {q.dtype}, "
                        f"{k_cache.dtype} and {v_cache.dtype}")
    if not (q.device == k_cache.device == v_cache.device):
        raise TypeError(f"q, k_cache and v_cache must be on one device; got {q.device}, {k_cache.device} and "
                        f"{v_cache.device}")
    if isinstance(block_table, torch.Tensor) and block_table.dim() == 2 and block_table.shape[0] != q.shape[0]:
        raise ValueError(f"block_table has {block_table.shape[0]} rows but q has batch={q.shape[0]}")
    if window_size is not None:
        if isinstance(window_size, (tuple, list)):
            raise TypeError(f"window_size is W, the keys each query sees (FlashAttention's (W - 1, 0)); got "
                            f"{window_size!r}: pass W = left + 1 for a (left, 0) window")
        check_positive_int("window_size", window_size)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) or not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be a positive number (default 1/sqrt(headdim)); got {softmax_scale!r}")
    return window_size, float(softmax_scale)


def _check_seqlens(cache_seqlens, B: int, Tq: int, block_size: int, width: int, device) -> torch.Tensor:
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((B,), cache_seqlens)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1 or cache_seqlens.shape[0] != B:
        got = f"shape {tuple(cache_seqlens.shape)}" if isinstance(cache_seqlens, torch.Tensor) else repr(cache_seqlens)
        raise ValueError(f"cache_seqlens must be one int or a (batch,) = ({B},) integer tensor; got {got}")
    if cache_seqlens.is_floating_point() or cache_seqlens.dtype == torch.bool:
        raise TypeError(f"cache_seqlens must hold integer lengths; got dtype {cache_seqlens.dtype}")
    seqlens = cache_seqlens.to(device=device, dtype=torch.long)
    span = width * block_size
    low, high = seqlens < Tq, seqlens > span
    if bool((low | high).any()):
        b = int(torch.nonzero(low | high)[0])
        raise ValueError(
            f"cache_seqlens[{b}] = {int(seqlens[b])}, but each row's length must be at least seqlen_q = {Tq} "
            f"(the new queries' own keys are in the cache) and at most max_blocks_per_seq * block_size = "
            f"{width} * {block_size} = {span}"
        )
    return seqlens
