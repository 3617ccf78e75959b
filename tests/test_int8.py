"""Specification of the int8 cache: the ring's positions, values within half a quantisation step.

Quantisation is symmetric absmax per token and head: ``scale = absmax / 127``,
``q = round(x / scale)`` in [-127, 127], so every element comes back within
``scale / 2 = absmax / 254`` of what went in (plus the output dtype's own rounding).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swkv_teach as sw
from swkv_teach import Int8RingBufferKVCache, RingBufferKVCache
from swkv_teach.caches.int8 import dequantize_int8, quantize_int8

B, H, D = 2, 3, 8
EPS = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def stream(T, seed, dtype=torch.float32, device="cpu", batch=B):
    g = torch.Generator().manual_seed(seed)
    # one loud head and token among quiet ones: a scale per tensor would flatten the quiet ones
    scale = torch.rand(batch, H, T, 1, generator=g) * 10 ** torch.randint(-3, 3, (batch, H, T, 1), generator=g)
    k = torch.randn(batch, H, T, D, generator=g) * scale
    v = torch.randn(batch, H, T, D, generator=g) * scale
    return k.to(device=device, dtype=dtype), v.to(device=device, dtype=dtype)


def bound(x):
    """Half a quantisation step per token and head, plus the rounding of x's dtype, ``(..., 1)``."""
    absmax = x.double().abs().amax(-1, keepdim=True)
    return absmax / 254 * (1 + 1e-6) + absmax * EPS[x.dtype]


def assert_within_half_a_step(got, exact):
    assert got.dtype == exact.dtype and got.shape == exact.shape
    err = (got.double() - exact.double()).abs()
    assert bool((err <= bound(exact)).all()), f"max error / bound = {(err / bound(exact).clamp_min(1e-300)).max()}"


# ------------------------------------------------------------------ quantise / dequantise
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_round_trip_is_within_half_a_step_per_token_and_head(dtype):
    k, _ = stream(50, 0, dtype)
    q, scale = quantize_int8(k)
    assert q.dtype == torch.int8 and q.shape == k.shape
    assert scale.dtype == torch.float32 and scale.shape == (B, H, 50, 1)
    assert int(q.abs().max()) == 127, "each row's largest element maps to ±127"
    assert bool((q != -128).all())
    torch.testing.assert_close(scale, k.float().abs().amax(-1, keepdim=True) / 127, rtol=1e-6, atol=0)
    assert_within_half_a_step(dequantize_int8(q, scale, dtype), k)


def test_rounding_is_to_nearest_not_toward_zero():
    x = torch.tensor([[127.0, 0.6, -0.6, 1.5, -126.4, 0.49]])  # scale 1
    q, scale = quantize_int8(x)
    assert scale.item() == 1.0
    assert q.tolist() == [[127, 1, -1, 2, -126, 0]]


def test_the_largest_magnitude_maps_to_127_never_to_an_overflowing_128():
    x = torch.tensor([[-3.0, 1.0, 3.0], [-2.0, 0.5, 1.0]])
    q, _ = quantize_int8(x)
    assert q.tolist() == [[-127, 42, 127], [-127, 32, 64]]


def test_an_all_zero_token_stays_zero_without_dividing_by_zero():
    x = torch.zeros(1, 2, 3, 4)
    x[0, 1, 2] = torch.tensor([0.0, -2.0, 1.0, 0.5])
    q, scale = quantize_int8(x)
    assert bool(torch.isfinite(scale).all()) and scale[0, 0].abs().sum() == 0
    assert q[0, 0].abs().sum() == 0, "an all-zero row gets q 0 (the docstring's promise), not whatever 0 / 0 becomes"
    back = dequantize_int8(q, scale)
    assert bool((back[0, 0] == 0).all()) and bool(torch.isfinite(back).all())
    assert_within_half_a_step(back, x)


def test_integer_input_is_refused():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_int8(torch.ones(2, 3, dtype=torch.long))


# ------------------------------------------------------------------ the edges of the dtypes (issue 24)
TINY = 2.0**-149  # float32's smallest subnormal


def test_a_subnormal_absmax_keeps_every_sign_and_stays_in_minus_127_127():
    """Regression (issue 24, the clamp removed): absmax = 190 subnormal steps, so absmax / 127 rounds to ONE step
    and x / scale = 190 > 127; without the clamp 190 wraps to -66 in int8, turning the loudest key negative."""
    x = torch.tensor([[190.0, -190.0, 95.0, 1.0, 0.0]]) * TINY
    assert x[0, 0].item() == 190 * TINY, "the test needs float32's subnormals (no flush-to-zero)"
    q, scale = quantize_int8(x)
    assert scale.item() == TINY, "190 / 127 = 1.5 steps, rounded to 1"
    assert q.tolist() == [[127, -127, 95, 1, 0]]


def test_a_token_whose_scale_underflows_to_zero_gets_q_zero():
    """absmax = 3 subnormal steps: absmax / 127 underflows to a scale of 0, and a scale of 0 means q 0 (as for an
    all-zero token), not x / 0 = inf clamped to +-127 (issue 24: the guard against dividing by zero removed)."""
    x = torch.tensor([[3.0, -2.0, 0.0]]) * TINY
    q, scale = quantize_int8(x)
    assert scale.item() == 0.0
    assert q.tolist() == [[0, 0, 0]]
    assert dequantize_int8(q, scale).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_subnormal_and_tiny_tokens_never_flip_a_sign(dtype):
    """Tokens whose absmax is 1..300 of the dtype's smallest subnormal steps, or its smallest normal."""
    smallest = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps  # the smallest subnormal
    steps = torch.tensor([1.0, 2.0, 3.0, 127.0, 128.0, 190.0, 254.0, 300.0])
    g = torch.Generator().manual_seed(0)
    signs = torch.where(torch.rand(len(steps), 6, generator=g) < 0.5, -1.0, 1.0)
    x = (steps[:, None] * signs * torch.rand(len(steps), 6, generator=g).clamp_min(0.1)).to(torch.float64)
    x[:, 0] = steps * signs[:, 0]  # each row's absmax, exactly
    x = torch.cat([x * smallest, torch.full((1, 6), torch.finfo(dtype).smallest_normal, dtype=torch.float64)])
    x = x.to(dtype)
    q, _ = quantize_int8(x)
    assert int(q.abs().max()) <= 127
    assert bool((torch.sign(q.double()) * torch.sign(x.double()) >= 0).all()), (x.tolist(), q.tolist())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_largest_finite_values_of_half_dtypes_come_back_finite_and_exact(dtype):
    big = torch.finfo(dtype).max
    x = torch.tensor([[big, -big, 0.0, big / 2]], dtype=dtype)
    q, scale = quantize_int8(x)
    assert q[0, :3].tolist() == [127, -127, 0]
    back = dequantize_int8(q, scale, dtype)
    assert bool(torch.isfinite(back).all()), back
    assert back[0, :3].tolist() == [big, -big, 0.0]
    assert_within_half_a_step(back, x)


def test_the_largest_finite_float32_comes_back_finite():
    """Regression (issue 24): float32's max: the scale fl(max / 127) rounds up, and 127 * scale in float32 was inf,
    not max. The scale is now capped at the largest float32 whose 127 multiple is finite."""
    big = torch.finfo(torch.float32).max
    x = torch.tensor([[big, -big, 1.0]])
    q, scale = quantize_int8(x)
    assert q[0, :2].tolist() == [127, -127]
    back = dequantize_int8(q, scale, torch.float32)
    assert bool(torch.isfinite(back).all()), back
    assert_within_half_a_step(back, x)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dequantisation_multiplies_in_float32_and_rounds_once_to_the_output_dtype(dtype):
    """Regression (issue 24): q.to(dtype) * scale.to(dtype) rounds the scale to 11 (8) bits first, then the product:
    two roundings. The exact product q * scale rounded once to the dtype is the specification."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 8, 64, generator=g) * 10 ** torch.randint(-3, 3, (4, 8, 1), generator=g)
    q, scale = quantize_int8(x.to(dtype))
    got = dequantize_int8(q, scale, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, (q.double() * scale.double()).to(dtype))


# ------------------------------------------------------------------ the cache vs the ring
def check_stream(W, chunks, dtype=torch.float32, device="cpu", batch=B):
    k, v = stream(sum(chunks), W * 100 + len(chunks), dtype, device, batch)
    q, ring = Int8RingBufferKVCache(W), RingBufferKVCache(W)
    start = 0
    for c in chunks:
        kk, vv = k[:, :, start : start + c], v[:, :, start : start + c]
        qk, qv = q.update(kk, vv)
        rk, rv = ring.update(kk, vv)
        assert q.positions.tolist() == ring.positions.tolist(), "same positions, same order as the ring"
        assert_within_half_a_step(qk, rk)
        assert_within_half_a_step(qv, rv)
        ok, ov = q.ordered()
        rok, rov = ring.ordered()
        assert_within_half_a_step(ok, rok)
        assert_within_half_a_step(ov, rov)
        assert q.stored_positions().tolist() == ring.stored_positions().tolist()
        assert q.seen == ring.seen and len(q) == len(ring)
        start += c
    return q


@settings(max_examples=60, deadline=None)
@given(W=st.integers(1, 9), chunks=st.lists(st.integers(1, 12), min_size=1, max_size=12),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
def test_any_chunking_returns_the_rings_keys_within_half_a_step(W, chunks, dtype):
    check_stream(W, chunks, dtype)


@pytest.mark.parametrize("offset", [-1, 0, 1])
@pytest.mark.parametrize("W", [1, 3, 8])
def test_boundary_lengths_on_every_device(W, offset, device):
    check_stream(W, [1] * max(1, W + offset) + [1] * (2 * W + 3), device=device, batch=1)
    check_stream(W, [2 * W + 3, 1, W + 1, 1], device=device)


def test_nbytes_counts_int8_data_and_float32_scales():
    W = 6
    cache = check_stream(W, [1] * 20)
    assert cache.nbytes == 2 * (B * H * W * D * 1) + 2 * (B * H * W * 4)
    assert cache.nbytes / (2 * B * H * W * D * 4) == (D + 4) / (4 * D), "(head_dim + 4) / (4 head_dim) of float32"
    assert cache.nbytes == sum(t.numel() * t.element_size() for t in cache.buffers)
    assert [t.dtype for t in cache.buffers] == [torch.int8, torch.int8, torch.float32, torch.float32]
    cache.reset()
    assert cache.nbytes == 0 and len(cache) == 0 and cache.seen == 0


def test_reset_starts_a_new_sequence_with_another_dtype_and_shape():
    cache = check_stream(3, [4, 1])
    cache.reset()
    x = torch.ones(1, 1, 2, 5, dtype=torch.float64)
    k, _ = cache.update(x, x)
    assert k.shape == (1, 1, 2, 5)
    assert_within_half_a_step(k, x)


@pytest.mark.parametrize("bad,match", [
    (lambda k: k.long(), "dtype torch.int64"),
    (lambda k: k.double(), "dtype torch.float64 but the cache holds torch.float32"),
    (lambda k: k[:, :1], "heads=1"),
    (lambda k: k[0], "has 3 dims"),
])
def test_bad_input_raises_naming_it_and_changes_nothing(bad, match):
    cache = Int8RingBufferKVCache(4)
    k, v = stream(5, 0)
    cache.update(k, v)
    before = cache.ordered(), cache.positions.clone(), cache.seen
    with pytest.raises((TypeError, ValueError), match=match):
        cache.update(bad(k[:, :, :1]), bad(v[:, :, :1]))
    after = cache.ordered(), cache.positions, cache.seen
    assert torch.equal(before[0][0], after[0][0]) and torch.equal(before[1], after[1]) and before[2] == after[2]


def test_the_first_update_must_be_floating_point():
    cache = Int8RingBufferKVCache(4)
    with pytest.raises(TypeError, match="floating point to quantise"):
        cache.update(torch.ones(1, 1, 1, 2, dtype=torch.long), torch.ones(1, 1, 1, 2, dtype=torch.long))
    assert cache.seen == 0 and cache.nbytes == 0


# ------------------------------------------------------------------ the decoder drives it unchanged
def test_the_decoder_runs_on_the_int8_cache_and_loses_little():
    decoder, tok = sw.load_pretrained()
    text = "def quantise(x):\n    scale = x.abs().max() / 127\n    return (x / scale).round()\n" * 2
    ids = torch.tensor([tok.encode(text)])
    ring = decoder.score(ids, cache="ring")
    for chunk in (1, 9):
        q = decoder.score(ids, cache="int8", chunk_size=chunk)
        assert q.shape == ring.shape and bool(torch.isfinite(q).all())
        diff = (q - ring).abs().max().item()
        assert 0 < diff < 0.5, diff  # lossy, but only a little
        nll = lambda logits: torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()  # noqa: E731
        assert abs(nll(q) - nll(ring)) < 0.02
        agree = (q.argmax(-1) == ring.argmax(-1)).float().mean().item()
        assert agree > 0.95, agree
