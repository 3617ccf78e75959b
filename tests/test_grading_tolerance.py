"""Every check with a numeric tolerance: an answer just outside it fails, one just inside passes.

Regression (issue 24): the H2O check's tolerance loosened 100x passed every test,
because the tests only showed right answers passing. Here each tolerance is written
down as the specification (not read from the grader, which would move with it), and
each answer is the library's own result pushed by a known amount: 10x the tolerance
("outside", must fail) and 0.1x ("inside", must pass). A tolerance loosened 100x lets
the outside answer through, and these tests fail.

Where a second test of the same check would catch the same error anyway (the int8
round trip), the push is applied only where that second test is looser (float16 and
bfloat16 inputs), so each answer probes one tolerance.
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach import grading
from swkv_teach.caches.h2o import h2o_keep
from swkv_teach.caches.int8 import QMAX, dequantize_int8, quantize_int8
from swkv_teach.grading import ExerciseFailed

HALF = (torch.float16, torch.bfloat16)


def passes(check, *answer):
    check(*answer)


def fails(check, *answer, words=()):
    with pytest.raises(ExerciseFailed) as info:
        check(*answer)
    msg = str(info.value).lower()
    assert all(w in msg for w in words), info.value


# ------------------------------------------------------------------ exercise 05: logits within 1e-4 + 1e-3 |x|
DECODE_ATOL, DECODE_RTOL = 1e-4, 1e-3


def decode_pushed(factor):
    """A right decode (all tokens through each layer in turn) whose logits are moved by factor x the tolerance."""

    def decode_step(model, input_ids, caches):
        start = caches[0].seen
        positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
        x = model.embed(input_ids)
        for layer, cache in zip(model.layers, caches):
            q, k, v = layer.attn.qkv(layer.attn_norm(x), positions)
            k, v = cache.update(k, v)
            x = x + layer.attn.attend(q, k, v, positions, cache.positions.to(x.device))
            x = x + layer.mlp(layer.mlp_norm(x))
        logits = model.lm_head(model.norm(x))
        return logits + factor * (DECODE_ATOL + DECODE_RTOL * logits.abs())

    return decode_step


def test_decode_logits_ten_times_the_tolerance_off_fail():
    fails(grading.check_cached_decode, decode_pushed(10.0))


def test_decode_logits_a_tenth_of_the_tolerance_off_pass():
    passes(grading.check_cached_decode, decode_pushed(0.1))


# ------------------------------------------------------------------ exercise 10: scores rtol 1e-5, 2e-2 for half
def h2o_pushed(rel, only_half=False):
    """The library's H2O step with every returned score multiplied by (1 + rel): right positions, scores off."""

    def keep(scores, weights, positions, budget, recent):
        pos, sc = h2o_keep(scores, weights, positions, budget, recent)
        if only_half and weights.dtype not in HALF:
            return pos, sc
        return pos, sc * (1 + rel)

    return keep


def test_h2o_float32_scores_off_by_1e_4_fail():
    """1e-4 relative is 10x the float32 tolerance (rtol 1e-5): a float32 learner off by ~1e-4 is wrong."""
    fails(grading.check_h2o_keep, h2o_pushed(1e-4))


def test_h2o_float32_scores_off_by_1e_7_pass():
    passes(grading.check_h2o_keep, h2o_pushed(1e-7))


def test_h2o_half_scores_off_by_20_percent_fail():
    """With float16/bfloat16 weights the tolerance is rtol 2e-2: 0.2 (10x) must fail, on the half cases alone."""
    fails(grading.check_h2o_keep, h2o_pushed(0.2, only_half=True))


def test_h2o_half_scores_off_by_2e_3_pass():
    passes(grading.check_h2o_keep, h2o_pushed(2e-3, only_half=True))


# ------------------------------------------------------------------ exercise 09: int8
def int8_right_dequantize(q, scale, dtype=torch.float32):
    return (q.float() * scale.float()).to(dtype)


def int8_scale_pushed(rel):
    """Scale = absmax / 127 * (1 + rel) on float16/bfloat16 inputs, q rounded consistently with it."""

    def quantize(x):
        q, scale = quantize_int8(x)
        if x.dtype not in HALF:
            return q, scale
        scale = scale * (1 + rel)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(x.float() / safe).clamp(-QMAX, QMAX).to(torch.int8), scale

    return quantize


def test_int8_scale_off_by_1e_4_fails():
    """The scale must be absmax / 127 within rtol 1e-5; 1e-4 (10x) off fails even where the round trip allows it."""
    fails(grading.check_int8_quantize, int8_scale_pushed(1e-4), int8_right_dequantize, words=("scale",))


def test_int8_scale_off_by_1e_6_passes():
    passes(grading.check_int8_quantize, int8_scale_pushed(1e-6), int8_right_dequantize)


def int8_dequant_shifted(steps):
    """Dequantise to q * scale + steps * scale on float16/bfloat16 outputs (the tolerance: 1e-3 scale)."""

    def dequantize(q, scale, dtype=torch.float32):
        x = q.float() * scale.float()
        if dtype in HALF:
            x = x + steps * scale.float()
        return x.to(dtype)

    return dequantize


def int8_right_quantize(x):
    q, scale = quantize_int8(x)
    return q.clone(), scale.clone()


def test_int8_dequantisation_off_by_a_twentieth_of_a_step_fails():
    """1/20 of a step (50x the 1e-3 tolerance): 1/100 would be lost in the output's own rounding on the probes'
    half-precision elements (the tolerance adds 2 eps |x|), which sit at |q| >= 2 or so; at 1/20 the bfloat16
    probes' quiet elements (|q| <= 6) show it, and a tolerance loosened 100x (1/10 of a step) would let it pass."""
    fails(grading.check_int8_quantize, int8_right_quantize, int8_dequant_shifted(5e-2), words=("q * scale",))


def test_int8_dequantisation_off_by_a_ten_thousandth_of_a_step_passes():
    passes(grading.check_int8_quantize, int8_right_quantize, int8_dequant_shifted(1e-4))


def int8_dequant_scaled(rel):
    """Dequantise to q * scale * (1 + rel): inside the dequantisation tolerance for rel < 7e-6 (1e-3 / 127)."""

    def dequantize(q, scale, dtype=torch.float32):
        return (q.double() * scale.double() * (1 + rel)).to(dtype)

    return dequantize


def test_int8_round_trip_off_by_5e_6_relative_fails():
    """The round trip must stay within absmax / 254 * (1 + 1e-4) + 2 eps absmax (float32: ~5e-7 absmax of slack):
    5e-6 relative at the largest element (10x) fails, though each step alone is within its own tolerance."""
    fails(grading.check_int8_quantize, int8_right_quantize, int8_dequant_scaled(5e-6), words=("round trip",))


def test_int8_round_trip_off_by_5e_8_relative_passes():
    passes(grading.check_int8_quantize, int8_right_quantize, int8_dequant_scaled(5e-8))


def test_the_pushed_answers_are_the_library_when_not_pushed():
    """The pushes are the only difference: unpushed, each answer passes (so a failure above is the push's)."""
    passes(grading.check_cached_decode, decode_pushed(0.0))
    passes(grading.check_h2o_keep, h2o_pushed(0.0))
    passes(grading.check_int8_quantize, int8_scale_pushed(0.0), int8_dequant_shifted(0.0))
    assert torch.equal(int8_right_dequantize(torch.tensor([[3]], dtype=torch.int8), torch.tensor([[0.5]])),
                       dequantize_int8(torch.tensor([[3]], dtype=torch.int8), torch.tensor([[0.5]])))
