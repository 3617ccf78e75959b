"""FlashAttention's own ``test_flash_attn_kvcache`` cases, ported to :func:`swkv_teach.attention.paged_attention`.

Source: Dao-AILab/flash-attention at commit 0251105a2fb19d2957484b7f023cd8c115286ced,
``tests/test_flash_attn.py``: ``construct_local_mask`` (lines 182-214) and ``attention_ref``
(lines 217-300), the reference, ported with plain torch instead of einops; the parametrisation
and body of ``test_flash_attn_kvcache`` (lines 1857-2140) and ``_generate_block_kvcache``
(lines 2143-2166), drawn in the same order from the same seed (on the CPU, so the values are
not CUDA's, the cases are the same kind).

What applies to the course and is kept: paged KV (``paged_kv_block_size`` 256) and a
contiguous cache (None: one block per row, ``block_size = seqlen_k``), local windows (a random
``window_size``; ``causal`` makes the right side 0, so ``W = left + 1``), MHA/MQA/GQA (6 query
heads over 6, 1 or 3 KV heads), new tokens appended (``new_kv``: the course appends them with
:func:`~swkv_teach.caches.pool.write_to_blocks`, then attends over ``cache_seqlens + seqlen_new``),
``seqlen_new`` equal to or shorter than ``seqlen_q``, float16 (upstream's dtype) and bfloat16.
Left out: ``causal=False`` (the course is causal), ALiBi, rotary inside the kernel, left padding,
``cache_batch_idx``, ``num_splits`` (a kernel scheduling choice), the 20 000 and 128K lengths and
some head sizes (CPU time; the fast subset is below).

Where the two differ: when ``cache_seqlens + seqlen_new < seqlen_q`` FlashAttention answers, its
first queries sitting at negative positions with no key (zero rows); the course refuses such a
row (``paged_attention``'s docstring: each row's length is at least ``seqlen_q``). Those cases
check the refusal, then every other row alone against the reference.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from peer_bounds import worst_ratio

from swkv_teach.attention import paged_attention
from swkv_teach.caches.pool import write_to_blocks


def construct_local_mask(seqlen_q, seqlen_k, window_size=(-1, -1), key_padding_mask=None, device=None):
    """``construct_local_mask`` (flash-attention tests/test_flash_attn.py:182), no query padding or leftpad."""
    row_idx = torch.arange(seqlen_q, device=device, dtype=torch.long)[:, None]
    col_idx = torch.arange(seqlen_k, device=device, dtype=torch.long)
    sk = seqlen_k if key_padding_mask is None else key_padding_mask.sum(-1).view(-1, 1, 1, 1)
    sq = seqlen_q
    if window_size[0] < 0:
        return col_idx > row_idx + sk - sq + window_size[1]
    sk = torch.full_like(col_idx, seqlen_k) if key_padding_mask is None else sk
    return torch.logical_or(
        col_idx > torch.minimum(row_idx + sk - sq + window_size[1], sk),
        col_idx < row_idx + sk - sq - window_size[0],
    )


def attention_ref(q, k, v, key_padding_mask=None, causal=False, window_size=(-1, -1), upcast=True,
                  reorder_ops=False):
    """``attention_ref`` (flash-attention tests/test_flash_attn.py:217) without dropout, bias, softcap, padding
    of queries. q (batch, seqlen_q, nheads, d); k, v (batch, seqlen_k, nheads_k, d)."""
    if causal:
        window_size = (window_size[0], 0)
    dtype_og = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)  # repeat(k, "b s h d -> b s (h g) d")
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    d = q.shape[-1]
    if not reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k)
    else:
        scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(d))
    if key_padding_mask is not None:
        scores.masked_fill_(~key_padding_mask[:, None, None, :], float("-inf"))
    local = window_size[0] >= 0 or window_size[1] >= 0
    if local:
        local_mask = construct_local_mask(seqlen_q, seqlen_k, window_size, key_padding_mask, q.device)
        scores.masked_fill_(local_mask, float("-inf"))
    attention = torch.softmax(scores, dim=-1).to(v.dtype)
    if local:  # rows with no key at all: zeros, not NaN
        attention = attention.masked_fill(torch.all(local_mask, dim=-1, keepdim=True), 0.0)
    output = torch.einsum("bhts,bshd->bthd", attention, v)
    return output.to(dtype=dtype_og)


def _generate_block_kvcache(seqlen_k, paged_kv_block_size, batch_size, nheads_k, d, device, dtype):
    """``_generate_block_kvcache`` (flash-attention tests/test_flash_attn.py:2143): a 3x oversized pool, a random
    permutation as block table, and the same keys laid out densely."""
    num_blocks = math.ceil(seqlen_k / paged_kv_block_size) * batch_size * 3
    k_cache_paged = torch.randn(num_blocks, paged_kv_block_size, nheads_k, d, device=device, dtype=dtype)
    v_cache_paged = torch.randn(num_blocks, paged_kv_block_size, nheads_k, d, device=device, dtype=dtype)
    block_table = torch.randperm(num_blocks, dtype=torch.int32, device=device).view(batch_size, -1)
    k_cache, v_cache = (dense(p, block_table, seqlen_k) for p in (k_cache_paged, v_cache_paged))
    return k_cache, v_cache, block_table, k_cache_paged, v_cache_paged, num_blocks


def dense(pool, block_table, seqlen_k):
    """Each row's blocks one after another, cut at ``seqlen_k``: upstream's ``rearrange(pool[table.flatten()],
    "(b nblocks) block_size ... -> b (nblocks block_size) ...")[:, :seqlen_k]``."""
    return pool[block_table.long().flatten()].view(block_table.shape[0], -1, *pool.shape[2:])[:, :seqlen_k]


def run_case(seqlen_q, seqlen_k, d, paged_kv_block_size, seqlen_new_eq_seqlen_q, local, new_kv, mha_type, dtype):
    """One upstream case (causal=True, alibi=False, rotary_fraction=0, no leftpad, no batch_idx).

    Returns ``(worst, refused)``: the largest error in rounding bounds (:mod:`peer_bounds`) over the rows the
    course answers, and how many rows it refused (``cache_seqlens + seqlen_new < seqlen_q``).
    """
    device, causal = "cpu", True
    torch.random.manual_seed(0)
    batch_size, nheads = 2, 6
    nheads_k = nheads if mha_type == "mha" else (1 if mha_type == "mqa" else 3)
    window_size = (-1, -1) if not local else torch.randint(0, seqlen_k, (2,))
    q = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dtype)
    seqlen_new = seqlen_q if seqlen_new_eq_seqlen_q else torch.randint(1, seqlen_q + 1, (1,)).item()
    if new_kv:
        k = torch.randn(batch_size, seqlen_new, nheads_k, d, device=device, dtype=dtype)
        v = torch.randn(batch_size, seqlen_new, nheads_k, d, device=device, dtype=dtype)
    if paged_kv_block_size is None:
        k_cache = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        v_cache = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        # the course's pool for a contiguous cache: one block of seqlen_k tokens per row
        k_pool, v_pool = k_cache.clone(), v_cache.clone()
        block_table, bs = torch.arange(batch_size, dtype=torch.int32)[:, None], seqlen_k
    else:
        k_cache, v_cache, block_table, k_pool, v_pool, _ = _generate_block_kvcache(
            seqlen_k, paged_kv_block_size, batch_size, nheads_k, d, device, dtype)
        k_pool, v_pool, bs = k_pool.clone(), v_pool.clone(), paged_kv_block_size
    cache_seqlens = torch.randint(0 if new_kv else 1, (seqlen_k - seqlen_new + 1) if new_kv else (seqlen_k + 1),
                                  (batch_size,), dtype=torch.int32, device=device)
    arange = torch.arange(seqlen_k, device=device)[None, :]
    cache_seqlens_expanded = cache_seqlens[:, None]
    key_padding_mask = arange < cache_seqlens_expanded + (seqlen_new if new_kv else 0)
    k_cache_ref, v_cache_ref = k_cache.clone(), v_cache.clone()
    if new_kv:
        update_mask = torch.logical_and(cache_seqlens_expanded <= arange, arange < cache_seqlens_expanded + seqlen_new)
        k_cache_ref[update_mask] = k.reshape(-1, nheads_k, d)
        v_cache_ref[update_mask] = v.reshape(-1, nheads_k, d)
        # the course appends the new tokens itself, then attends over the longer rows
        pos = cache_seqlens.long()[:, None] + torch.arange(seqlen_new)  # (batch, seqlen_new)
        slots = block_table.long().gather(1, pos // bs) * bs + pos % bs
        write_to_blocks(k_pool, v_pool, slots, k.transpose(1, 2), v.transpose(1, 2))
        # upstream's check that the cache now holds the new tokens where they belong
        assert torch.equal(dense(k_pool, block_table, seqlen_k), k_cache_ref)
        assert torch.equal(dense(v_pool, block_table, seqlen_k), v_cache_ref)
    total = cache_seqlens.long() + (seqlen_new if new_kv else 0)
    W = None if not local else int(window_size[0]) + 1  # causal: (left, 0) is W = left + 1 keys

    # the float64 oracle: upstream's reference, evaluated in float64 on the same rounded inputs
    ref64 = attention_ref(q.double(), k_cache_ref.double(), v_cache_ref.double(), key_padding_mask, causal=causal,
                          window_size=window_size, upcast=False)
    rows = [b for b in range(batch_size) if total[b] >= seqlen_q]
    refused = batch_size - len(rows)
    if refused:
        with pytest.raises(ValueError, match="at least seqlen_q"):
            paged_attention(q, k_pool, v_pool, total, block_table, window_size=W)
        outs = [paged_attention(q[b : b + 1], k_pool, v_pool, total[b : b + 1], block_table[b : b + 1], window_size=W)
                for b in rows]
        if not rows:
            return 0.0, refused
        out = torch.cat(outs)
    else:
        out = paged_attention(q, k_pool, v_pool, total, block_table, window_size=W)
    ref64 = ref64[rows]
    worst = worst_ratio(out, ref64, dtype)
    # upstream's own criterion too: within 3x the error of a PyTorch reference in the low precision
    out_ref = attention_ref(q, k_cache_ref, v_cache_ref, key_padding_mask, causal=causal, window_size=window_size)[rows]
    out_pt = attention_ref(q, k_cache_ref, v_cache_ref, key_padding_mask, causal=causal, window_size=window_size,
                           upcast=False, reorder_ops=True)[rows]
    assert (out - out_ref).abs().max().item() <= 3 * (out_pt - out_ref).abs().max().item() + 1e-5
    return worst, refused


# the fast subset of upstream's grid (full grid: 11 length pairs, 6 head sizes)
LENGTHS = [(1, 128), (1, 339), (3, 799), (64, 256), (128, 128)]
HEAD_SIZES = [32, 59, 128]
OTHERS = list(itertools.product([None, 256], [True, False], [False, True], [False, True], ["mha", "mqa", "gqa"]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", HEAD_SIZES)
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
def test_flash_attn_kvcache(seqlen_q, seqlen_k, d, dtype):
    """Every (paged, seqlen_new == seqlen_q, local, new_kv, mha_type) of upstream's grid for one length pair and
    head size: each answered row within one rounding of the float64 oracle (and within upstream's own bound)."""
    refused = 0
    for paged, eq, local, new_kv, mha in OTHERS:
        if not new_kv and not eq:
            continue  # seqlen_new only matters with new keys: the same case as eq=True
        worst, n = run_case(seqlen_q, seqlen_k, d, paged, eq, local, new_kv, mha, dtype)
        refused += n
        assert worst <= 1, (f"{worst:.1f} rounding bounds off the float64 oracle: paged={paged}, "
                            f"seqlen_new_eq_seqlen_q={eq}, local={local}, new_kv={new_kv}, {mha}")
