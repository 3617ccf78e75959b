"""Specification of ``paged_attention``: FlashAttention's paged ``flash_attn_with_kvcache``, as a reference.

The oracle here shares no code with the function: each row's keys are laid out densely in
position order, and every query's softmax is written out in float64 over the keys
``p - W < j <= p`` (query ``i`` of row ``b`` at ``p = cache_seqlens[b] - seqlen_q + i``), with
query head ``h`` reading key head ``h // group``. The pool the function reads is built so that
anything it must not read is poison: every slot holding no key of any query's window is NaN,
and every block-table entry no query needs is -1 or a number far outside the pool.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swkv_teach.attention import paged_attention
from tests.paged_pools import poisoned_pool

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def oracle(q, dense_k, dense_v, seqlens, W, scale=None):
    """Float64 attention written out: ``q`` (B, Tq, H, D); ``dense_k[b]`` (seqlen_b, Hk, D) in position order."""
    B, Tq, H, D = q.shape
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Tq, H, D, dtype=torch.float64)
    for b in range(B):
        k, v = dense_k[b].double(), dense_v[b].double()
        group = H // k.shape[1]
        for i in range(Tq):
            p = seqlens[b] - Tq + i
            lo = 0 if W is None else max(0, p - W + 1)
            for h in range(H):
                kk, vv = k[lo : p + 1, h // group], v[lo : p + 1, h // group]
                w = torch.softmax((kk @ q[b, i, h].double()) * scale, dim=0)
                out[b, i, h] = w @ vv
    return out


def build(seqlens, Tq, W, bs, Hk, D, dtype, seed, junk):
    """A poisoned pool holding each row's keys (every row read by its last ``Tq`` queries), its block table, and the
    dense keys for the oracle: :func:`tests.paged_pools.poisoned_pool`."""
    return poisoned_pool(seqlens, [Tq] * len(seqlens), W, bs, Hk, D, dtype, seed, junk)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    Tq=st.integers(1, 4),
    bs=st.sampled_from([1, 2, 3, 4, 5, 8, 16]),
    W=st.one_of(st.none(), st.integers(1, 12)),
    Hk=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2, 3]),
    D=st.sampled_from([2, 8]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    junk=st.sampled_from(["minus1", "huge"]),
    seed=st.integers(0, 2**16),
)
def test_equals_the_dense_oracle(data, batch, Tq, bs, W, Hk, group, D, dtype, junk, seed):
    """Ragged batches, every block size, MHA and GQA, poison everywhere the function must not look."""
    seqlens = [data.draw(st.integers(Tq, Tq + 30)) for _ in range(batch)]
    k_cache, v_cache, table, dense_k, dense_v = build(seqlens, Tq, W, bs, Hk, D, dtype, seed, junk)
    H = Hk * group
    q = torch.randn(batch, Tq, H, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    copies = [t.clone() for t in (q, k_cache, v_cache, table)]
    lens = torch.tensor(seqlens, dtype=torch.int32)
    out = paged_attention(q, k_cache, v_cache, lens, table, window_size=W)
    assert out.shape == q.shape and out.dtype == dtype
    expected = oracle(q, dense_k, dense_v, seqlens, W)
    err = (out.double() - expected).abs().max().item()
    assert err <= TOL[dtype], f"max |paged - oracle| = {err:.3g} > {TOL[dtype]} (seqlens {seqlens}, W={W}, bs={bs})"
    for before, after in zip(copies, (q, k_cache, v_cache, table)):
        assert torch.equal(before, after) or (before.isnan() == after.isnan()).all() and torch.equal(
            before.nan_to_num(), after.nan_to_num()
        ), "paged_attention modified one of its inputs"
    assert torch.equal(lens, torch.tensor(seqlens, dtype=torch.int32))


def test_docstring_example_by_hand():
    """block_size 2, W 3, cache_seqlens [5, 2]; keys all zero, so each query averages the values it sees.

    Value of position j = j: row 0's query (position 4) sees 2, 3, 4 -> 3.0; row 1's (position 1) sees
    0, 1 -> 0.5. Row 0's logical block 0 and row 1's blocks 1, 2 are -1: never read.
    """
    k_cache = torch.zeros(4, 2, 1, 1)
    v_cache = torch.full((4, 2, 1, 1), float("nan"))
    v_cache[2, 0], v_cache[2, 1] = 2.0, 3.0  # row 0, logical block 1: positions 2, 3
    v_cache[0, 0] = 4.0  # row 0, logical block 2: position 4
    v_cache[3, 0], v_cache[3, 1] = 0.0, 1.0  # row 1, logical block 0: positions 0, 1
    table = torch.tensor([[-1, 2, 0], [3, -1, -1]], dtype=torch.int32)
    out = paged_attention(torch.ones(2, 1, 1, 1), k_cache, v_cache, torch.tensor([5, 2]), table, window_size=3)
    assert out.flatten().tolist() == [3.0, 0.5]


@pytest.mark.parametrize("W, expected", [(2, 3.5), (3, 3.0), (4, 2.5), (None, 2.0)])
def test_window_boundary(W, expected):
    """One row of 5 keys, query at position 4: W - 1, W, W + 1 keys around W = 3, and no window (mean of 0..4)."""
    k_cache = torch.zeros(5, 1, 1, 1)
    v_cache = torch.arange(5.0).view(5, 1, 1, 1)
    table = torch.tensor([[4, 3, 2, 1, 0]])  # logical block i in pool block 4 - i, so position j holds 4 - j
    v_cache = v_cache.flip(0)
    out = paged_attention(torch.ones(1, 1, 1, 1), k_cache, v_cache, 5, table, window_size=W)
    assert out.item() == pytest.approx(expected)


def test_gqa_query_head_reads_kv_head_h_over_group():
    """4 query heads, 2 KV heads: heads 0, 1 read KV head 0, heads 2, 3 read KV head 1 (not h % 2)."""
    k_cache = torch.zeros(1, 1, 2, 2)
    v_cache = torch.tensor([[[[0.0, 0.0], [1.0, 1.0]]]])  # KV head 0 holds 0s, KV head 1 holds 1s
    out = paged_attention(torch.ones(1, 1, 4, 2), k_cache, v_cache, 1, torch.tensor([[0]]))
    assert out[0, 0, :, 0].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_several_queries_per_row_and_softmax_scale():
    """seqlen_q = 3 (a prefill chunk) and a non-default scale, against the oracle."""
    g = torch.Generator().manual_seed(3)
    seqlens, W, bs = [7, 3], 4, 2
    k_cache, v_cache, table, dk, dv = build(seqlens, 3, W, bs, 2, 4, torch.float32, 3, "minus1")
    q = torch.randn(2, 3, 2, 4, generator=g)
    out = paged_attention(q, k_cache, v_cache, torch.tensor(seqlens), table, W, softmax_scale=0.3)
    assert torch.allclose(out.double(), oracle(q, dk, dv, seqlens, W, scale=0.3), atol=1e-5)


def test_on_the_device(device):
    """Same answer on every available device."""
    seqlens, W, bs = [9, 4, 6], 5, 4
    k_cache, v_cache, table, dk, dv = build(seqlens, 1, W, bs, 2, 8, torch.float32, 5, "minus1")
    q = torch.randn(3, 1, 4, 8)
    out = paged_attention(q.to(device), k_cache.to(device), v_cache.to(device), torch.tensor(seqlens).to(device),
                          table.to(device), W)
    assert torch.allclose(out.cpu().double(), oracle(q, dk, dv, seqlens, W), atol=1e-5)


def _good():
    return dict(q=torch.randn(2, 1, 4, 8), k_cache=torch.randn(3, 4, 2, 8), v_cache=torch.randn(3, 4, 2, 8),
                cache_seqlens=torch.tensor([3, 2]), block_table=torch.tensor([[0], [1]]), window_size=2)


@pytest.mark.parametrize("change, error, words", [
    (dict(q=torch.randn(2, 4, 8)), ValueError, "q has 3 dims"),
    (dict(q=torch.randn(2, 1, 3, 8)), ValueError, "multiple of k_cache's nheads_k=2"),
    (dict(q=torch.randn(2, 1, 4, 6)), ValueError, "headdim=8 but q has headdim=6"),
    (dict(q=torch.ones(2, 1, 4, 8, dtype=torch.long)), TypeError, "q must be floating point"),
    (dict(v_cache=torch.randn(3, 2, 2, 8)), ValueError, "same shape"),
    (dict(k_cache=torch.randn(3, 4, 2, 8, dtype=torch.float64)), TypeError, "share one dtype"),
    (dict(block_table=torch.tensor([0, 1])), ValueError, "block_table must be a 2-D"),
    (dict(block_table=torch.tensor([[0.0], [1.0]])), TypeError, "integer block numbers"),
    (dict(block_table=torch.tensor([[0]])), ValueError, "block_table has 1 rows but q has batch=2"),
    (dict(cache_seqlens=torch.tensor([3])), ValueError, "(batch,) = (2,)"),
    (dict(cache_seqlens=torch.tensor([3.0, 2.0])), TypeError, "integer lengths"),
    (dict(cache_seqlens=torch.tensor([5, 2])), ValueError, "cache_seqlens[0] = 5"),
    (dict(cache_seqlens=torch.tensor([3, 0])), ValueError, "at least seqlen_q = 1"),
    (dict(block_table=torch.tensor([[0], [7]])), ValueError, "block_table[1, 0] = 7 is read"),
    (dict(block_table=torch.tensor([[-1], [1]])), ValueError, "block_table[0, 0] = -1 is read"),
    (dict(window_size=(1, 0)), TypeError, "pass W = left + 1"),
    (dict(window_size=0), ValueError, "window_size must be a positive int"),
    (dict(softmax_scale=-1.0), ValueError, "softmax_scale must be a positive number"),
])
def test_bad_input_is_named(change, error, words):
    args = {**_good(), **change}
    with pytest.raises(error) as info:
        paged_attention(**args)
    assert words in str(info.value), str(info.value)


def test_int_cache_seqlens_is_every_row():
    """``cache_seqlens`` may be one int, as in FlashAttention."""
    args = _good()
    a = paged_attention(**{**args, "cache_seqlens": 2})
    b = paged_attention(**{**args, "cache_seqlens": torch.tensor([2, 2])})
    assert torch.equal(a, b)


def bf16_bound(expected: torch.Tensor) -> torch.Tensor:
    """Per element: what computing in float32 and rounding once to bfloat16 can be off a float64 oracle.

    bfloat16 keeps 8 significant bits, so rounding ``x`` to nearest moves it by at most half a spacing,
    ``2**-8 * |x|``; the float32 arithmetic before it adds ~1e-6 on values of order one (1e-5 here).
    Scores, softmax or sums in bfloat16 round at every step and land many spacings away.
    """
    return expected.abs() * 2**-8 + 1e-5


@pytest.mark.parametrize("seqlens, Tq, W, D, scale", [
    ([70, 40], 1, None, 64, None),   # long contexts: many bf16 additions in the sums
    ([70, 40], 3, 33, 64, 4 / 8),    # a window, a chunk of queries, a peaked softmax
    ([9, 12, 30], 2, 5, 8, None),    # short windows, small head_dim
])
def test_bfloat16_is_computed_in_float32(seqlens, Tq, W, D, scale):
    """Guards the docstring's promise "scores, softmax and sums in float32" for bfloat16 inputs.

    Every element must be within one bfloat16 rounding of a float64 oracle on the same (bfloat16)
    numbers (:func:`bf16_bound`). The mutant that drops the ``.float()`` casts (scores, softmax and
    sums in the input dtype) lands up to ~20 bounds away on these cases; an averaged error or a
    fixed 2e-2 tolerance (the random test above) cannot see it.
    """
    k_cache, v_cache, table, dk, dv = build(seqlens, Tq, W, 4, 2, D, torch.bfloat16, 7, "minus1")
    q = torch.randn(len(seqlens), Tq, 4, D, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    out = paged_attention(q, k_cache, v_cache, torch.tensor(seqlens), table, W, softmax_scale=scale)
    assert out.dtype == torch.bfloat16
    expected = oracle(q, dk, dv, seqlens, W, scale)
    err = (out.double() - expected).abs()
    worst = (err / bf16_bound(expected)).max().item()
    assert worst <= 1, (f"an element is {worst:.1f} bfloat16 roundings off the float64 oracle: scores, softmax "
                        f"or sums were not computed in float32")


@pytest.mark.parametrize("Tq, lens", [(3, [2, 5]), (3, [5, 1]), (4, [3, 4])])
def test_cache_seqlens_shorter_than_seqlen_q_is_refused(Tq, lens):
    """Guards the refusal of ``cache_seqlens[b] < seqlen_q``: the queries' own keys are in the cache, so a
    shorter row would put its first queries at negative positions. (FlashAttention answers such rows;
    the course refuses them, as its docstring says.) The boundary ``cache_seqlens == seqlen_q`` is accepted.
    """
    bad = next(b for b, n in enumerate(lens) if n < Tq)
    args = dict(q=torch.randn(2, Tq, 2, 4), k_cache=torch.randn(4, 4, 2, 4), v_cache=torch.randn(4, 4, 2, 4),
                block_table=torch.tensor([[0, 1], [2, 3]]))
    with pytest.raises(ValueError) as info:
        paged_attention(cache_seqlens=torch.tensor(lens), **args)
    assert f"cache_seqlens[{bad}] = {lens[bad]}" in str(info.value) and "seqlen_q" in str(info.value)
    paged_attention(cache_seqlens=Tq, **args)  # exactly seqlen_q: every key is a query's own


@pytest.mark.parametrize("which, dtype", [("v_cache", torch.float64), ("v_cache", torch.bfloat16),
                                          ("k_cache", torch.float16), ("q", torch.float64)])
def test_one_dtype_for_q_and_both_caches(which, dtype):
    """Guards the refusal of mixed dtypes (FlashAttention requires one): a ``v_cache`` (or ``k_cache``, or ``q``)
    of another dtype is named, never silently cast."""
    args = _good()
    args[which] = args[which].to(dtype)
    with pytest.raises(TypeError, match="share one dtype"):
        paged_attention(**args)


@pytest.mark.parametrize("cu", [[0, 3, 2, 4], [0, 4, 1, 4], [1, 2, 4], [0, 2, 3]])
def test_cu_seqlens_q_must_start_at_0_never_decrease_and_end_at_total_q(cu):
    """Guards the varlen offsets' checks: a decreasing ``cu_seqlens_q`` would give a row a negative query count
    (its queries silently dropped, its output rows left uninitialised); one not starting at 0 or not ending at
    ``total_q`` (4 here) misplaces every row. Each is named."""
    B = len(cu) - 1
    with pytest.raises(ValueError, match="never decrease"):
        paged_attention(torch.randn(4, 2, 4), torch.randn(8, 4, 2, 4), torch.randn(8, 4, 2, 4),
                        torch.full((B,), 4), torch.arange(B)[:, None], cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
                        max_seqlen_q=4)
