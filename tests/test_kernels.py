"""Specification of the Triton decode kernel ``swkv_teach.kernels.paged_decode``.

It must compute what ``paged_attention`` computes for one query per row (``paged_attention`` is
itself pinned to a float64 oracle in ``test_paged_attention.py``; here one case is also checked
against a float64 softmax written out). Pools are poisoned: every slot no window covers is NaN
and every table entry no window needs is -1 or a number far outside the pool, so a kernel that
reads one extra block or slot returns NaN. Without a GPU everything runs in Triton's
interpreter on the CPU (small shapes, a bounded number of examples); with CUDA the same cases
also run compiled.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from swkv_teach.attention import paged_attention
from swkv_teach.grading.split_kv import dense_reference
from swkv_teach.kernels import available, interpreted, paged_decode

if not available():
    pytest.skip("the kernels need Triton (pip install 'swkv-teach[test]' on Linux)", allow_module_level=True)

from swkv_teach.kernels.decode import split_blocks, window_span  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA and not interpreted() else [])
HEADS = {"MHA": (2, 2), "GQA": (4, 2), "MQA": (3, 1)}


def poisoned(seqlens, W, bs, Hk, D, dtype, seed, device="cpu"):
    """A pool holding each row's keys in shuffled blocks, NaN everywhere no window reaches; its table; dense keys."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // bs) for n in seqlens) + 1  # one table column past the longest row
    windows = [(0 if W is None else max(0, n - W), n) for n in seqlens]  # [lo, hi) per row
    needed = [list(range(lo // bs, (hi - 1) // bs + 1)) for lo, hi in windows]
    num_blocks = sum(map(len, needed)) + 2  # two spare blocks no row uses
    perm = torch.randperm(num_blocks, generator=g).tolist()
    k_cache = torch.full((num_blocks, bs, Hk, D), float("nan"))
    v_cache = torch.full((num_blocks, bs, Hk, D), float("nan"))
    junk = [-1, 2**40, num_blocks, -(2**31)]
    table = torch.tensor([[junk[(b + i) % len(junk)] for i in range(width)] for b in range(len(seqlens))])
    dense_k, dense_v = [], []
    for b, ((lo, hi), blocks) in enumerate(zip(windows, needed)):
        k = torch.randn(hi, Hk, D, generator=g).to(dtype)
        v = torch.randn(hi, Hk, D, generator=g).to(dtype)
        dense_k.append(k)
        dense_v.append(v)
        for lb in blocks:
            table[b, lb] = blk = perm.pop()
            for j in range(max(lb * bs, lo), min((lb + 1) * bs, hi)):  # only the window's keys are written
                k_cache[blk, j - lb * bs] = k[j].float()
                v_cache[blk, j - lb * bs] = v[j].float()
    k_cache, v_cache = k_cache.to(dtype).to(device), v_cache.to(dtype).to(device)
    return k_cache, v_cache, table.to(device), dense_k, dense_v


def check_case(seqlens, W, bs, heads, D, dtype, num_splits, seed, device="cpu"):
    H, Hk = HEADS[heads]
    k_cache, v_cache, table, dense_k, dense_v = poisoned(seqlens, W, bs, Hk, D, dtype, seed, device)
    q = torch.randn(len(seqlens), 1, H, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(device)
    got = paged_decode(q, k_cache, v_cache, torch.tensor(seqlens, device=device), table, W, num_splits=num_splits)
    assert got.shape == q.shape and got.dtype == dtype and got.device == q.device
    assert torch.isfinite(got).all(), "the kernel read a poisoned (NaN) slot or block"
    want = dense_reference(q.cpu(), dense_k, dense_v, W, bs)
    err = (got.cpu().float() - want.float()).abs().max().item()
    assert err <= TOL[dtype], (seqlens, W, bs, heads, D, dtype, num_splits, err)
    return err


@st.composite
def cases(draw):
    bs = draw(st.sampled_from([16, 32, 24]))  # 24: a block size no power of two, dividing no window below
    seqlens = draw(st.lists(st.integers(1, 3 * bs + 5), min_size=1, max_size=3))  # ragged rows
    stored = max(seqlens)
    W = draw(st.one_of(st.none(), st.integers(1, 8), st.just(stored), st.integers(stored + 1, stored + 40),
                       st.integers(1, stored)))
    return dict(seqlens=seqlens, W=W, bs=bs, heads=draw(st.sampled_from(sorted(HEADS))),
                D=draw(st.sampled_from([8, 16, 12])), dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
                num_splits=draw(st.integers(1, 8)), seed=draw(st.integers(0, 2**16)))


# no shrinking: the drawn shapes are already small, and shrinking through the interpreter takes minutes
@settings(max_examples=30, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.reuse, Phase.generate))
@given(cases())
def test_equals_paged_attention_and_reads_nothing_outside_the_windows(case):
    check_case(**case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("W", [15, 16, 17, 31, 32, 33])
def test_window_boundaries_at_block_edges(device, W):
    """W - 1, W, W + 1 around a block of 16 and rows ending on, before and after a block edge."""
    for dtype in (torch.float32, torch.bfloat16):
        check_case([32, 33, 48, 47], W, 16, "GQA", 16, dtype, num_splits=3, seed=W, device=device)


@pytest.mark.parametrize("num_splits", range(1, 9))
def test_every_number_of_splits_gives_the_same_answer(num_splits):
    """Splits 1..8 over windows of 1 to 5 blocks: more splits than blocks leaves the first ones empty."""
    check_case([70, 5, 64], 64, 16, "MQA", 8, torch.float32, num_splits, seed=num_splits)


def test_one_case_against_float64_written_out():
    """Independent of paged_attention: the softmax over keys p - W < j <= p in float64, head h reads h // 2."""
    seqlens, W, bs = [40, 9], 20, 16
    k_cache, v_cache, table, dense_k, dense_v = poisoned(seqlens, W, bs, 2, 8, torch.float32, 7)
    q = torch.randn(2, 1, 4, 8, generator=torch.Generator().manual_seed(3))
    got = paged_decode(q, k_cache, v_cache, torch.tensor(seqlens), table, W, num_splits=2)
    for b, n in enumerate(seqlens):
        lo = max(0, n - W)
        for h in range(4):
            k, v = dense_k[b][lo:n, h // 2].double(), dense_v[b][lo:n, h // 2].double()
            w = torch.softmax(k @ q[b, 0, h].double() / math.sqrt(8), dim=0)
            assert torch.allclose(got[b, 0, h].double(), w @ v, atol=1e-6)


def test_softmax_scale_and_an_int_cache_seqlens():
    seqlens, W, bs = [50, 50], 30, 16
    k_cache, v_cache, table, dense_k, dense_v = poisoned(seqlens, W, bs, 2, 8, torch.float32, 11)
    q = torch.randn(2, 1, 2, 8)
    got = paged_decode(q, k_cache, v_cache, 50, table, W, softmax_scale=0.3, num_splits=2)
    want = torch.stack([torch.softmax(dense_k[b][20:50].transpose(0, 1) @ q[b, 0, :, :, None] * 0.3, dim=1)
                        .transpose(1, 2) @ dense_v[b][20:50].transpose(0, 1) for b in range(2)])  # (B, H, 1, D)
    assert torch.allclose(got[:, 0], want[:, :, 0], atol=1e-5)


def test_views_a_caller_may_pass():
    """q with headdim not contiguous; k and v as views into one (blocks, block_size, 2, heads, dim) buffer;
    a transposed (non-contiguous) block table."""
    g = torch.Generator().manual_seed(4)
    kv = torch.randn(6, 16, 2, 2, 8, generator=g)
    q = torch.randn(2, 4, 1, 8, generator=g).transpose(1, 2)  # (B, 1, H, D) view
    q_odd = torch.randn(2, 1, 4, 8, 2, generator=g)[..., 0]  # headdim with stride 2
    table = torch.tensor([[3, 0], [5, 1], [2, 4]]).t()  # (2, 3) non-contiguous
    for qq in (q, q_odd):
        got = paged_decode(qq, kv[:, :, 0], kv[:, :, 1], torch.tensor([20, 30]), table, window_size=12, num_splits=2)
        want = paged_attention(qq.contiguous(), kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(),
                               torch.tensor([20, 30]), table.contiguous(), window_size=12)
        assert torch.allclose(got, want, atol=1e-5)


# ------------------------------------------------------------------ the grid
def test_the_grid_depends_on_the_window_not_the_sequence_length():
    """Rows of 100 and of a million and four tokens (same offset in their last block) get the same programs, each
    reading the same number of blocks: at most ceil(span / num_splits)."""
    W, bs, S = 64, 16, 4
    width = (10**6 + 4) // bs + 1
    short = split_blocks([100], W, bs, S, width)
    long = split_blocks([10**6 + 4], W, bs, S, width)
    assert short.shape == long.shape == (1, S, 2)
    reads = (short[..., 1] - short[..., 0]).clamp(min=0).tolist()
    assert reads == (long[..., 1] - long[..., 0]).clamp(min=0).tolist() == [[0, 1, 2, 2]]
    assert window_span(W, bs, width) == 5  # 64 keys starting mid-block reach 5 blocks of 16


@pytest.mark.parametrize("W,bs", [(1, 16), (16, 16), (17, 16), (24, 16), (40, 24), (None, 8)])
def test_splits_cover_exactly_the_blocks_the_window_overlaps(W, bs):
    seqlens = list(range(1, 70))
    width = -(-70 // bs)
    for S in (1, 2, 3, 8):
        ranges = split_blocks(seqlens, W, bs, S, width)
        for b, n in enumerate(seqlens):
            keys = range(0 if W is None else max(0, n - W), n)
            want = sorted({j // bs for j in keys})  # from positions, not from the kernel's arithmetic
            got = [lb for s in range(S) for lb in range(*ranges[b, s].tolist())]
            assert got == want, (n, S, got, want)


# ------------------------------------------------------------------ refusals
def small():
    k_cache = torch.randn(4, 16, 2, 8)
    return torch.randn(2, 1, 4, 8), k_cache, k_cache.clone(), torch.tensor([10, 20]), torch.tensor([[0, 1], [2, 3]])


@pytest.mark.parametrize("change,words", [
    (lambda a: {"q": torch.randn(2, 2, 4, 8)}, ["seqlen_q=2", "one query"]),
    (lambda a: {"q": torch.randn(2, 4, 8)}, ["q has 3 dims"]),
    (lambda a: {"v_cache": a["v_cache"].half()}, ["dtype"]),
    (lambda a: {"q": torch.randn(2, 1, 3, 8)}, ["nheads=3", "nheads_k=2"]),
    (lambda a: {"cache_seqlens": torch.tensor([10, 33])}, ["cache_seqlens[1] = 33"]),
    (lambda a: {"cache_seqlens": torch.tensor([0, 20])}, ["cache_seqlens[0] = 0"]),
    (lambda a: {"block_table": torch.tensor([[0, 1], [2, 9]])}, ["block_table[1, 1] = 9"]),
    (lambda a: {"block_table": torch.tensor([[0, 1], [2, -1]])}, ["block_table[1, 1] = -1"]),
    (lambda a: {"window_size": 0}, ["window_size"]),
    (lambda a: {"window_size": (3, 0)}, ["window_size"]),
    (lambda a: {"softmax_scale": -1.0}, ["softmax_scale"]),
    (lambda a: {"num_splits": 0}, ["num_splits"]),
    (lambda a: {"num_splits": 2.0}, ["num_splits"]),
])
def test_bad_input_is_refused_by_name(change, words):
    q, k, v, seqlens, table = small()
    args = dict(q=q, k_cache=k, v_cache=v, cache_seqlens=seqlens, block_table=table)
    args.update(change(args))
    with pytest.raises((ValueError, TypeError)) as info:
        paged_decode(**args)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_a_block_outside_the_window_may_be_anything():
    """The same table entry that was refused above is fine where the window does not reach it."""
    q, k, v, _, _ = small()
    out = paged_decode(q, k, v, torch.tensor([20, 20]), torch.tensor([[-1, 1], [2**40, 3]]), window_size=4)
    assert torch.isfinite(out).all()


# ------------------------------------------------------------------ where it runs
def test_without_a_gpu_the_course_runs_the_interpreter():
    if HAS_CUDA and os.environ.get("TRITON_INTERPRET") is None:
        pytest.skip("a GPU is present: Triton compiles")
    assert interpreted() and os.environ["TRITON_INTERPRET"] == "1"


def test_swkv_teach_imports_without_triton_and_paged_decode_says_how_to_install_it():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import swkv_teach, swkv_teach.kernels as k\n"
            "assert not k.available()\n"
            "try:\n    k.paged_decode(None, None, None, 1, None)\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install" in out.stdout and "triton" in out.stdout


def test_triton_imported_before_the_course_is_named_not_a_crash_inside_the_interpreter():
    """Triton's own tl.sum is compiled-or-interpreted when triton is imported: too late to switch after it."""
    code = ("import os, torch; os.environ.pop('TRITON_INTERPRET', None)\n"
            "import triton\n"
            "import swkv_teach.kernels as k\n"
            "assert k.interpreted()\n"
            "try:\n    k.paged_decode(None, None, None, 1, None)\nexcept RuntimeError as e:\n    print(e)\n")
    if HAS_CUDA:
        pytest.skip("with a GPU nothing is interpreted")
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "import swkv_teach before triton" in out.stdout, out.stdout


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: without one the kernel runs only in the interpreter")
def test_compiled_on_cuda_over_several_shapes():
    if interpreted():
        pytest.skip("TRITON_INTERPRET is set: nothing is compiled")
    for bs, heads, D, W, S in [(16, "GQA", 64, 100, 4), (32, "MQA", 128, 33, 8), (24, "MHA", 80, None, 3)]:
        for dtype in (torch.float32, torch.bfloat16):
            check_case([1, 77, 200], W, bs, heads, D, dtype, S, seed=bs, device="cuda")
