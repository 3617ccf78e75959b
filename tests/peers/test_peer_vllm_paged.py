"""vLLM's own paged-attention kernel tests, ported to :func:`swkv_teach.attention.paged_attention`.

Sources (vllm-project/vllm):

* ``tests/kernels/attention/test_flash_attn.py`` at commit 0001b995fda59101b71d7ac3a2821b1ce2f01473:
  ``ref_paged_attn`` (line 27) and the parametrisation of ``test_varlen_with_paged_kv``
  (``NUM_HEADS``, ``HEAD_SIZES``, ``BLOCK_SIZES``, ``SLIDING_WINDOWS``, ``seq_lens``, lines 15-24 and
  its decorators);
* ``tests/kernels/attention/test_triton_unified_attention.py`` at commit
  003ee61625d33ae27df77f97748cb5867d0747b6: its identical ``ref_paged_attn`` and the
  parametrisation of ``test_triton_unified_attn`` (3 head layouts, head sizes 128/256, windows
  None/64/128/256).

Kept: bfloat16 (upstream's only dtype), block size 16, a random block table over a 2048-block pool
(upstream's smaller pool; 32768 tests a CUDA index overflow), GQA/MQA, sliding windows as
``window_size = (W - 1, 0)``, i.e. the course's ``W``. Left out: soft-capping and fp8 queries
(the course has neither), ``fa_version``/``seq_threshold_3D`` (kernel choices), ``use_out``.

Upstream feeds all sequences at once, with ``cu_seqlens_q`` for their different query lengths
(``[(1, 1328), (5, 18), (129, 463)]``): so does :func:`course_varlen`, in one call. The same batch
also goes through the fixed-``seqlen_q`` form (:func:`course_rows`: one call per query length, rows
never interact), and both must agree with the oracle.

Judged by a float64 oracle, per element (:mod:`peer_bounds`), and by upstream's own
``assert_close(atol=1.5e-2, rtol=1e-2)`` against its bf16 reference. ``ref_paged_attn`` scales the
query in place and multiplies in bf16 before upcasting: that reference is itself up to a few
hundredths off the float64 oracle, more than the course (printed with ``-s``).
"""

from __future__ import annotations

import math

import pytest
import torch
from peer_bounds import worst_ratio

from swkv_teach.attention import paged_attention


def ref_paged_attn(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale, sliding_window=None,
                   score_dtype=torch.float32):
    """vLLM's ``ref_paged_attn`` (test_flash_attn.py:27), soft-capping left out. ``score_dtype`` is upstream's
    ``.float()``; float64 (with float64 inputs) makes it the oracle."""
    num_seqs = len(query_lens)
    block_tables = block_tables.cpu().numpy()
    _, block_size, num_kv_heads, head_size = key_cache.shape
    outputs = []
    start_idx = 0
    for i in range(num_seqs):
        query_len = query_lens[i]
        kv_len = int(kv_lens[i])
        q = query[start_idx : start_idx + query_len]
        q *= scale  # in place, in the query's dtype: upstream's
        num_kv_blocks = (kv_len + block_size - 1) // block_size
        block_indices = block_tables[i, :num_kv_blocks]
        k = key_cache[block_indices].view(-1, num_kv_heads, head_size)[:kv_len]
        v = value_cache[block_indices].view(-1, num_kv_heads, head_size)[:kv_len]
        if q.shape[1] != k.shape[1]:
            k = torch.repeat_interleave(k, q.shape[1] // k.shape[1], dim=1)
            v = torch.repeat_interleave(v, q.shape[1] // v.shape[1], dim=1)
        attn = torch.einsum("qhd,khd->hqk", q, k).to(score_dtype)
        empty_mask = torch.ones(query_len, kv_len)
        mask = torch.triu(empty_mask, diagonal=kv_len - query_len + 1).bool()
        if sliding_window is not None:
            sliding_window_mask = torch.triu(empty_mask, diagonal=kv_len - (query_len + sliding_window) + 1).bool()
            mask |= sliding_window_mask.logical_not()
        attn.masked_fill_(mask, float("-inf"))
        attn = torch.softmax(attn, dim=-1).to(v.dtype)
        outputs.append(torch.einsum("hqk,khd->qhd", attn, v))
        start_idx += query_len
    return torch.cat(outputs, dim=0)


def course_varlen(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale, sliding_window):
    """The batch as upstream passes it: packed queries, ``cu_seqlens_q``, ``max_seqlen_q``."""
    cu = torch.tensor([0] + list(query_lens), dtype=torch.int32).cumsum(dim=0, dtype=torch.int32)
    return paged_attention(query, key_cache, value_cache, torch.as_tensor(kv_lens), block_tables,
                           window_size=sliding_window, softmax_scale=scale, cu_seqlens_q=cu,
                           max_seqlen_q=max(query_lens))


def course_rows(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale, sliding_window):
    """The same batch through the fixed-``seqlen_q`` form: one call per distinct query length."""
    out = torch.empty_like(query)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(query_lens):
        groups.setdefault(n, []).append(i)
    for n, rows in groups.items():
        q = torch.stack([query[starts[i] : starts[i + 1]] for i in rows])  # (rows, n, heads, head_size)
        got = paged_attention(q, key_cache, value_cache, torch.tensor([int(kv_lens[i]) for i in rows]),
                              block_tables[rows], window_size=sliding_window, softmax_scale=scale)
        for j, i in enumerate(rows):
            out[starts[i] : starts[i + 1]] = got[j]
    return out


def run_case(seq_lens, num_heads, head_size, sliding_window, block_size=16, num_blocks=2048,
             dtype=torch.bfloat16, scale=None, upstream_check=True):
    """Upstream's body on the CPU; returns (course's worst error in rounding bounds, upstream reference's).

    ``upstream_check``: also upstream's ``assert_close`` against its bf16 reference (off for unusual scales,
    where that reference itself strays: 0.066 from the float64 oracle on one random case, the course 0.004).
    """
    torch.manual_seed(0)
    query_lens = [x[0] for x in seq_lens]
    kv_lens = [x[1] for x in seq_lens]
    num_query_heads, num_kv_heads = num_heads
    scale = head_size**-0.5 if scale is None else scale
    query = torch.randn(sum(query_lens), num_query_heads, head_size, dtype=dtype)
    key_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_size, dtype=dtype)
    value_cache = torch.randn_like(key_cache)
    kv_lens_t = torch.tensor(kv_lens, dtype=torch.int32)
    max_num_blocks_per_seq = (max(kv_lens) + block_size - 1) // block_size
    block_tables = torch.randint(0, num_blocks, (len(seq_lens), max_num_blocks_per_seq), dtype=torch.int32)

    output = course_varlen(query, key_cache, value_cache, query_lens, kv_lens_t, block_tables, scale, sliding_window)
    rows = course_rows(query, key_cache, value_cache, query_lens, kv_lens_t, block_tables, scale, sliding_window)
    ref_output = ref_paged_attn(query.clone(), key_cache, value_cache, query_lens, kv_lens_t, block_tables, scale,
                                sliding_window)
    oracle = ref_paged_attn(query.double(), key_cache.double(), value_cache.double(), query_lens, kv_lens_t,
                            block_tables, scale, sliding_window, score_dtype=torch.float64)
    if upstream_check:
        torch.testing.assert_close(output, ref_output, atol=1.5e-2, rtol=1e-2)  # upstream's criterion
    assert worst_ratio(rows, oracle, dtype) <= 1, "the fixed-seqlen_q form is off the float64 oracle"
    print(f"max |error| vs float64: course {(output.double() - oracle).abs().max():.4f}, "
          f"vLLM's reference {(ref_output.double() - oracle).abs().max():.4f}")
    return worst_ratio(output, oracle, dtype), worst_ratio(ref_output, oracle, dtype)


VARLEN, DECODE = [(1, 1328), (5, 18), (129, 463)], [(1, 523), (1, 37), (1, 2011)]


@pytest.mark.parametrize("sliding_window", [None, 256])
@pytest.mark.parametrize("head_size", [40, 72, 80, 128, 256])
@pytest.mark.parametrize("num_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("seq_lens", [VARLEN, DECODE], ids=["varlen", "decode"])
def test_varlen_with_paged_kv(seq_lens, num_heads, head_size, sliding_window):
    """vLLM test_flash_attn.py::test_varlen_with_paged_kv (bf16, no soft-cap, 2048 blocks)."""
    ours, theirs = run_case(seq_lens, num_heads, head_size, sliding_window)
    print(f"worst error in bf16 rounding bounds: course {ours:.2f}, vLLM's reference {theirs:.2f}")
    assert ours <= 1, f"{ours:.1f} bf16 rounding bounds off the float64 oracle"


@pytest.mark.parametrize("sliding_window", [None, 64, 128, 256])
@pytest.mark.parametrize("head_size", [128, 256])
@pytest.mark.parametrize("num_heads", [(4, 4), (8, 2), (5, 1)])
@pytest.mark.parametrize("seq_lens", [VARLEN, DECODE], ids=["varlen", "decode"])
def test_triton_unified_attn(seq_lens, num_heads, head_size, sliding_window):
    """vLLM test_triton_unified_attention.py::test_triton_unified_attn (bf16, no soft-cap, no fp8, 2048 blocks)."""
    ours, theirs = run_case(seq_lens, num_heads, head_size, sliding_window)
    assert ours <= 1, f"{ours:.1f} bf16 rounding bounds off the float64 oracle"


def test_random_ragged_batches_with_unusual_scales():
    """Beyond upstream: 40 seeded ragged batches (1-4 rows of 1-9 queries over 1-300 keys, every window size
    around the lengths, 1-16 blocks, scales 0.02-3), float32 and bfloat16, against the float64 oracle."""
    g = torch.Generator().manual_seed(30)
    worst_theirs = 0.0
    for case in range(40):
        pick = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))  # noqa: E731
        rows, bs = pick(1, 4), [1, 2, 5, 16][pick(0, 3)]
        seq_lens = []
        for _ in range(rows):
            q_len = pick(1, 9)
            seq_lens.append((q_len, pick(q_len, 300)))
        W = [None, 1, 2, pick(1, 64), pick(1, 400)][pick(0, 4)]
        heads = [(4, 4), (6, 2), (5, 1)][pick(0, 2)]
        dtype = [torch.float32, torch.bfloat16][case % 2]
        scale = math.exp(float(torch.empty(1).uniform_(math.log(0.02), math.log(3.0), generator=g)))
        torch.manual_seed(case)
        if dtype is torch.bfloat16:
            ours, theirs = run_case(seq_lens, heads, 8 * pick(1, 8), W, block_size=bs, num_blocks=pick(40, 800),
                                    dtype=dtype, scale=scale, upstream_check=False)
            worst_theirs = max(worst_theirs, theirs)
        else:
            ours = _float32_case(seq_lens, heads, W, bs, scale)
        assert ours <= 1, f"case {case}: {ours:.1f} rounding bounds off (seq_lens {seq_lens}, W={W}, scale {scale:.3g})"
    print(f"vLLM's bf16 reference: worst {worst_theirs:.1f} bf16 rounding bounds off the float64 oracle")


def _float32_case(seq_lens, heads, W, bs, scale):
    """float32, head_dim 16, distinct blocks per row: the course's worst error in float32 rounding bounds (varlen
    and fixed forms) against the float64 oracle."""
    q_lens, kv_lens = [x[0] for x in seq_lens], torch.tensor([x[1] for x in seq_lens])
    per_row = -(-int(kv_lens.max()) // bs)
    num_blocks = len(seq_lens) * per_row + 3  # distinct blocks per row, three never read
    query = torch.randn(sum(q_lens), heads[0], 16)
    k, v = torch.randn(num_blocks, bs, heads[1], 16), torch.randn(num_blocks, bs, heads[1], 16)
    table = torch.randperm(num_blocks)[: len(seq_lens) * per_row].view(len(seq_lens), per_row)
    out = course_varlen(query, k, v, q_lens, kv_lens, table, scale, W)
    assert worst_ratio(course_rows(query, k, v, q_lens, kv_lens, table, scale, W), oracle_of(query, k, v, q_lens,
                       kv_lens, table, scale, W), torch.float32) <= 1
    return worst_ratio(out, oracle_of(query, k, v, q_lens, kv_lens, table, scale, W), torch.float32)


def oracle_of(query, k, v, q_lens, kv_lens, table, scale, W):
    return ref_paged_attn(query.double(), k.double(), v.double(), q_lens, kv_lens, table, scale, W,
                          score_dtype=torch.float64)
