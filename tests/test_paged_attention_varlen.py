"""Specification of varlen ``paged_attention``: FlashAttention's ``flash_attn_varlen_func`` layout over a paged pool.

The oracle shares no code with the function: row ``b``'s keys are laid out densely in position order and
each query's softmax is written out in float64 over keys ``p - W < j <= p`` (query ``i`` of row ``b`` at
``p = cache_seqlens[b] - n_b + i``, ``n_b`` its query count), query head ``h`` reading key head ``h // group``.
Everything the function must not read is poison: slots holding no key of any query's window are NaN, and
table entries no query needs are -1 or far outside the pool.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swkv_teach.attention import paged_attention
from tests.paged_pools import poisoned_pool as build

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def oracle(q, cu, dense_k, dense_v, seqlens, W, scale=None):
    """Float64 attention written out; ``q`` (total_q, H, D), ``dense_k[b]`` (seqlen_b, Hk, D)."""
    total, H, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(total, H, D, dtype=torch.float64)
    for b in range(len(seqlens)):
        k, v = dense_k[b].double(), dense_v[b].double()
        group = H // k.shape[1]
        n = cu[b + 1] - cu[b]
        for i in range(n):
            p = seqlens[b] - n + i
            lo = 0 if W is None else max(0, p - W + 1)
            for h in range(H):
                w = torch.softmax((k[lo : p + 1, h // group] @ q[cu[b] + i, h].double()) * scale, dim=0)
                out[cu[b] + i, h] = w @ v[lo : p + 1, h // group]
    return out




@settings(max_examples=80, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 5),
    bs=st.sampled_from([1, 2, 3, 4, 5, 8, 16]),
    W=st.one_of(st.none(), st.integers(1, 12)),
    Hk=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 3]),
    D=st.sampled_from([2, 8]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    junk=st.sampled_from(["minus1", "huge"]),
    seed=st.integers(0, 2**16),
)
def test_equals_the_dense_oracle(data, batch, bs, W, Hk, group, D, dtype, junk, seed):
    """Rows of 0, 1 (decoding) and up to 40 queries (prefill chunks longer than a tile) side by side."""
    counts = [data.draw(st.sampled_from([0, 1, 1, 2, 3, 7, 17, 40])) for _ in range(batch)]
    if not sum(counts):
        counts[0] = 1
    seqlens = [c + data.draw(st.integers(0 if c else 1, 30)) for c in counts]
    k_cache, v_cache, table, dense_k, dense_v = build(seqlens, counts, W, bs, Hk, D, dtype, seed, junk)
    cu = [0]
    for c in counts:
        cu.append(cu[-1] + c)
    q = torch.randn(cu[-1], Hk * group, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    copies = [t.clone() for t in (q, k_cache, v_cache, table)]
    out = paged_attention(q, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32), table, window_size=W,
                          cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), max_seqlen_q=max(counts))
    assert out.shape == q.shape and out.dtype == dtype
    err = (out.double() - oracle(q, cu, dense_k, dense_v, seqlens, W)).abs().max().item()
    assert err <= TOL[dtype], f"max |varlen - oracle| = {err:.3g} (counts {counts}, seqlens {seqlens}, W={W}, bs={bs})"
    for before, after in zip(copies, (q, k_cache, v_cache, table)):
        assert torch.equal(before.nan_to_num(), after.nan_to_num()), "paged_attention modified one of its inputs"


def test_equals_the_batched_form_row_by_row():
    """A second method: each row through the (batch, seqlen_q, ...) form, alone; the varlen call gives the same."""
    seqlens, counts, W, bs = [9, 4, 30, 6], [1, 4, 20, 2], 5, 4
    k_cache, v_cache, table, _, _ = build(seqlens, counts, W, bs, 2, 8, torch.float32, 7, "minus1")
    cu = [0, 1, 5, 25, 27]
    q = torch.randn(27, 4, 8, generator=torch.Generator().manual_seed(8))
    out = paged_attention(q, k_cache, v_cache, torch.tensor(seqlens), table, W,
                          cu_seqlens_q=torch.tensor(cu, dtype=torch.int32), max_seqlen_q=20)
    for b in range(4):
        alone = paged_attention(q[cu[b] : cu[b + 1]][None], k_cache, v_cache, seqlens[b], table[b : b + 1], W)
        assert torch.allclose(out[cu[b] : cu[b + 1]], alone[0], atol=1e-6), f"row {b} differs from its batched form"


def test_worked_example_by_hand():
    """block_size 2, W 3, cache_seqlens [5, 2], cu_seqlens_q [0, 1, 3]; keys zero, so each query averages.

    Value of position j = j. Row 0's query (position 4) sees 2, 3, 4 -> 3.0; row 1's queries
    (positions 0, 1) see 0 -> 0.0 and 0, 1 -> 0.5. Row 0's block 0 and row 1's block 1 are -1.
    """
    k_cache = torch.zeros(4, 2, 1, 1)
    v_cache = torch.full((4, 2, 1, 1), float("nan"))
    v_cache[2, 0], v_cache[2, 1], v_cache[0, 0] = 2.0, 3.0, 4.0
    v_cache[3, 0], v_cache[3, 1] = 0.0, 1.0
    table = torch.tensor([[-1, 2, 0], [3, -1, -1]], dtype=torch.int32)
    out = paged_attention(torch.ones(3, 1, 1), k_cache, v_cache, torch.tensor([5, 2]), table, window_size=3,
                          cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), max_seqlen_q=2)
    assert out.flatten().tolist() == [3.0, 0.0, 0.5]


@pytest.mark.parametrize("W, expected", [(2, [2.5, 3.5]), (3, [2.0, 3.0]), (4, [1.5, 2.5]), (None, [1.5, 2.0])])
def test_window_boundary(W, expected):
    """One row of 5 keys, two queries at positions 3 and 4: W - 1, W, W + 1 around W = 3, and no window."""
    k_cache = torch.zeros(5, 1, 1, 1)
    v_cache = torch.arange(5.0).view(5, 1, 1, 1)
    out = paged_attention(torch.ones(2, 1, 1), k_cache, v_cache, torch.tensor([5]), torch.tensor([[0, 1, 2, 3, 4]]),
                          window_size=W, cu_seqlens_q=torch.tensor([0, 2], dtype=torch.int32), max_seqlen_q=2)
    assert out.flatten().tolist() == pytest.approx(expected)


def _good():
    return dict(q=torch.randn(3, 4, 8), k_cache=torch.randn(3, 4, 2, 8), v_cache=torch.randn(3, 4, 2, 8),
                cache_seqlens=torch.tensor([3, 2]), block_table=torch.tensor([[0], [1]]), window_size=2,
                cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32), max_seqlen_q=2)


@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.randn(1, 3, 4, 8)), ValueError, "q has 4 dims"),
    (dict(max_seqlen_q=None), ValueError, "max_seqlen_q is missing"),
    (dict(cu_seqlens_q=None), ValueError, "cu_seqlens_q is missing"),
    (dict(cu_seqlens_q=torch.tensor([[0, 1, 3]])), ValueError, "cu_seqlens_q must be a (batch + 1,)"),
    (dict(cu_seqlens_q=torch.tensor([0.0, 1.0, 3.0])), TypeError, "cu_seqlens_q must hold integer offsets"),
    (dict(cu_seqlens_q=torch.tensor([1, 2, 3])), ValueError, "must start at 0"),
    (dict(cu_seqlens_q=torch.tensor([0, 2, 1])), ValueError, "never decrease"),
    (dict(cu_seqlens_q=torch.tensor([0, 1, 2])), ValueError, "end at total_q = 3"),
    (dict(max_seqlen_q=1), ValueError, "max_seqlen_q = 1 but a row of cu_seqlens_q has 2 queries"),
    (dict(max_seqlen_q=2.0), TypeError, "max_seqlen_q must be an int"),
    (dict(block_table=torch.tensor([[0]])), ValueError, "block_table has 1 rows but cu_seqlens_q describes batch=2"),
    (dict(cache_seqlens=torch.tensor([3, 1])), ValueError, "cache_seqlens[1] = 1, but row 1 has 2 queries"),
    (dict(cache_seqlens=torch.tensor([3])), ValueError, "(batch,) = (2,)"),
    (dict(block_table=torch.tensor([[0], [7]])), ValueError, "block_table[1, 0] = 7 is read"),
    (dict(q=torch.randn(3, 3, 8)), ValueError, "multiple of k_cache's nheads_k=2"),
    (dict(q=torch.ones(3, 4, 8, dtype=torch.long)), TypeError, "q must be floating point"),
    (dict(window_size=0), ValueError, "window_size must be a positive int"),
])
def test_bad_input_is_named(change, error, words):
    args = {**_good(), **change}
    with pytest.raises(error) as info:
        paged_attention(**args)
    assert words in str(info.value), str(info.value)


def test_three_dim_q_without_cu_seqlens_is_named():
    args = {k: v for k, v in _good().items() if k not in ("cu_seqlens_q", "max_seqlen_q")}
    with pytest.raises(ValueError, match="need cu_seqlens_q and max_seqlen_q"):
        paged_attention(**args)


def test_on_the_device(device):
    seqlens, counts, W, bs = [9, 4, 26], [1, 3, 18], 5, 4
    k_cache, v_cache, table, dk, dv = build(seqlens, counts, W, bs, 2, 8, torch.float32, 5, "minus1")
    cu = [0, 1, 4, 22]
    q = torch.randn(22, 4, 8)
    out = paged_attention(q.to(device), k_cache.to(device), v_cache.to(device), torch.tensor(seqlens).to(device),
                          table.to(device), W, cu_seqlens_q=torch.tensor(cu, dtype=torch.int32).to(device),
                          max_seqlen_q=18)
    assert torch.allclose(out.cpu().double(), oracle(q, cu, dk, dv, seqlens, W), atol=1e-5)
