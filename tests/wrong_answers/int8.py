"""Wrong answers to exercise 09, quantize(x) -> (q, scale) and dequantize(q, scale, dtype).

The check takes the two functions, or one object holding both as ``.quantize`` and
``.dequantize``; each entry here is such an object, made by :func:`pair` from one wrong
function and a right one, and named and documented by the wrong one.
"""

import torch

from swkv_teach.caches.int8 import dequantize_int8, quantize_int8
from tests.wrong_answers import wrong


def _absmax(x):
    return x.float().abs().amax(dim=-1, keepdim=True)


def _q(x, scale):
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x.float() / safe).clamp(-127, 127).to(torch.int8)


def deq(q, scale, dtype):
    return (q.float() * scale).to(dtype)


def pair(quantize, dequantize=deq):
    """A wrong answer as an object with .quantize and .dequantize, named and documented by the wrong one."""
    bad = quantize if dequantize is deq else dequantize
    return type(bad.__name__, (), {"__doc__": bad.__doc__, "quantize": staticmethod(quantize),
                                    "dequantize": staticmethod(dequantize)})


def right_quantize(x):
    scale = _absmax(x) / 127
    return _q(x, scale), scale


def per_tensor(x):
    """One scale for the whole tensor (x.abs().max()), broadcast to every token and head."""
    scale = (x.float().abs().max() / 127).expand(*x.shape[:-1], 1).contiguous()
    return _q(x, scale), scale


def per_tensor_scalar(x):
    """One scalar scale for the whole tensor, returned as a 0-d tensor."""
    scale = x.float().abs().max() / 127
    return _q(x, scale), scale


def per_channel(x):
    """absmax over the tokens axis (dim=-2), one scale per head_dim channel."""
    scale = x.float().abs().amax(dim=-2, keepdim=True) / 127
    return _q(x, scale), scale


def toward_zero(x):
    """Rounds toward zero: (x / scale).to(torch.int8) truncates."""
    scale = _absmax(x) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x.float() / safe).to(torch.int8), scale


def floor_rounding(x):
    """torch.floor instead of torch.round: -0.2 becomes -1."""
    scale = _absmax(x) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.floor(x.float() / safe).clamp(-127, 127).to(torch.int8), scale


def overflow_128(x):
    """scale = absmax / 128: the largest element maps to 128, which wraps to -128 in int8."""
    scale = _absmax(x) / 128
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x.float() / safe).to(torch.int16).to(torch.int8), scale


def over_255(x):
    """absmax / 255: the uint8 range used for a signed int8."""
    scale = _absmax(x) / 255
    return _q(x, scale), scale


def inverted(x):
    """scale = 127 / absmax, the multiplier where the divisor belongs."""
    absmax = _absmax(x)
    scale = torch.where(absmax > 0, 127 / absmax, torch.zeros_like(absmax))
    return torch.round(x.float() * torch.where(absmax > 0, 127 / absmax, 0 * absmax)).clamp(-127, 127).to(torch.int8), scale


def max_not_absmax(x):
    """x.amax(dim=-1) where x.abs().amax(dim=-1) belongs: a row led by a negative value gets a wrong scale."""
    scale = x.float().amax(dim=-1, keepdim=True) / 127
    return _q(x, scale.abs()), scale


def zero_divides(x):
    """No guard for an all-zero token: 0 / 0 is nan."""
    scale = _absmax(x) / 127
    return torch.nan_to_num(torch.round(x.float() / scale), nan=0.0).clamp(-127, 127).to(torch.int8), \
        torch.where(scale > 0, scale, torch.full_like(scale, float("nan")))


def rounded_float(x):
    """Rounds but never casts: q stays a float tensor (4 bytes an element, no memory saved)."""
    scale = _absmax(x) / 127
    q = _q(x, scale).float()
    return q, scale


def as_uint8(x):
    """Shifts q by 128 into uint8 (an asymmetric layout) and returns that."""
    scale = _absmax(x) / 127
    return (_q(x, scale).to(torch.int16) + 128).to(torch.uint8), scale


def scale_in_x_dtype(x):
    """Keeps the scale in x's dtype (bfloat16: 8 bits of mantissa)."""
    scale = (_absmax(x) / 127).to(x.dtype)
    return _q(x, scale.float()), scale


def in_place(x):
    """x.div_(scale): quantises the caller's keys in place."""
    scale = _absmax(x) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).to(x.dtype)
    return torch.round(x.div_(safe)).clamp(-127, 127).to(torch.int8), scale


def deq_ignores_dtype(q, scale, dtype):
    """Returns float32 whatever dtype was asked for."""
    return q.float() * scale


def deq_divides(q, scale, dtype):
    """q / scale: undoes the multiplication the wrong way round."""
    return (q.float() / torch.where(scale > 0, scale, torch.ones_like(scale))).to(dtype)


W = "check_int8_quantize"
PerTensor = wrong(W, "one scale for the whole tensor")(pair(per_tensor))
PerTensorScalar = wrong(W, "one scale for the whole tensor", "scale shape")(pair(per_tensor_scalar))
PerChannel = wrong(W, "per channel")(pair(per_channel))
TowardZero = wrong(W, "rounding toward zero")(pair(toward_zero))
Floor = wrong(W, "floor")(pair(floor_rounding))
Overflow128 = wrong(W, "128", "overflow")(pair(overflow_128))
Over255 = wrong(W, "uint8", "127")(pair(over_255))
Inverted = wrong(W, "inverted")(pair(inverted))
MaxNotAbsmax = wrong(W, "max magnitude")(pair(max_not_absmax))
ZeroDivides = wrong(W, "all-zero token", "divides by zero")(pair(zero_divides))
RoundedFloat = wrong(W, "q dtype", "torch.int8")(pair(rounded_float))
AsUint8 = wrong(W, "uint8 is unsigned")(pair(as_uint8))
ScaleInXDtype = wrong(W, "scale dtype", "float32")(pair(scale_in_x_dtype))
InPlace = wrong(W, "modified its input")(pair(in_place))
DeqIgnoresDtype = wrong(W, "wrong dtype", "to(dtype)")(pair(right_quantize, deq_ignores_dtype))
DeqDivides = wrong(W, "multiply by the scale")(pair(right_quantize, deq_divides))


def clamped_scale(x):
    """scale = (absmax / 127).clamp_min(1e-6): a floor meant for zero rows squashes every quiet token."""
    scale = (_absmax(x) / 127).clamp_min(1e-6)
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


def eps_added(x):
    """scale = absmax / 127 + 1e-8: an eps on every scale instead of a guard for zero rows."""
    scale = _absmax(x) / 127 + 1e-8
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


def scale_divided_in_x_dtype(x):
    """The formula typed in x's dtype: x.abs().amax(...) / 127 in float16, .float() only at the end."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / safe).clamp(-127, 127).to(torch.int8), scale.float()


def divides_in_x_dtype(x):
    """Right float32 scale, but x / scale.to(x.dtype) divides in bfloat16/float16."""
    scale = _absmax(x) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / safe.to(x.dtype)).clamp(-127, 127).to(torch.int8), scale


def without_keepdim(x):
    """amax(dim=-1) without keepdim: scale (batch, heads, tokens), unsqueezed again only in dequantize."""
    scale = x.float().abs().amax(dim=-1) / 127
    return _q(x, scale.unsqueeze(-1)), scale


def deq_unsqueezes(q, scale, dtype):
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def all_heads(x):
    """One scale per token over every head (amax over heads and head_dim)."""
    scale = x.float().abs().amax(dim=(1, 3), keepdim=True).expand(*x.shape[:-1], 1).contiguous() / 127
    return _q(x, scale), scale


def deq_scale_in_dtype(q, scale, dtype):
    """Rounds the scale to dtype before multiplying: a float16 scale under 6e-8 is 0."""
    return q.to(dtype) * scale.to(dtype)


ClampedScale = wrong(W, "floor on the scale", "clamp_min")(pair(clamped_scale))
EpsAdded = wrong(W, "eps of 1e-08 was added")(pair(eps_added))
ScaleDividedInXDtype = wrong(W, "computed in float16", "float32")(pair(scale_divided_in_x_dtype))
DividesInXDtype = wrong(W, "division x / scale ran in", "x.float() / scale")(pair(divides_in_x_dtype))
WithoutKeepdim = wrong(W, "keepdim is missing")(pair(without_keepdim, deq_unsqueezes))
WithoutKeepdim.__name__, WithoutKeepdim.__doc__ = without_keepdim.__name__, without_keepdim.__doc__
AllHeads = wrong(W, "shared by all heads")(pair(all_heads))
DeqScaleInDtype = wrong(W, "rounded to float16 before multiplying")(pair(right_quantize, deq_scale_in_dtype))
LibraryFunctions = wrong(W, "library's own quantize_int8")(pair(quantize_int8, dequantize_int8))
LibraryFunctions.__name__ = "LibraryFunctions"
LibraryFunctions.__doc__ = "swkv_teach.caches.int8.quantize_int8 / dequantize_int8 handed in: the check's own oracle."


# ---------------------------------------------------------------- issue 18: holes and true diagnoses
def q_scale_swapped(x):
    """Returns (scale, q) instead of (q, scale)."""
    s = _absmax(x) / 127
    return s, _q(x, s)


def no_zero_guard(x):
    """No guard for an all-zero row: x / 0 is NaN, and NaN.to(int8) happens to be 0 on x86 (not defined elsewhere)."""
    s = _absmax(x) / 127
    return torch.round(x.float() / s).clamp(-127, 127).to(torch.int8), s


wrong("check_int8_quantize", "returned (scale, q)", "return q, scale")(pair(q_scale_swapped))
wrong("check_int8_quantize", "nan", "all-zero row", "torch.where(scale > 0")(pair(no_zero_guard))


# ---------------------------------------------------------------- issue 18: written as a learner would, unseen


def deq_no_cast(q, scale, dtype):
    """dequantize returns q.float() * scale and forgets .to(dtype)."""
    return q.float() * scale


def scale_rounded_to_half(x):
    """Returns scale.half().float() 'to save memory': the scale loses bits."""
    s = (_absmax(x) / 127).half().float()
    return _q(x, s), s


wrong("check_int8_quantize", "wrong dtype", ".to(dtype)")(pair(right_quantize, deq_no_cast))
wrong("check_int8_quantize", "rounded to float16", "float32")(pair(scale_rounded_to_half))


def scale_floored_at_1e_30(x):
    """`scale.clamp_min(1e-30)` "to avoid dividing by zero": rows quieter than 127e-30 get too few levels, or none."""
    scale = (_absmax(x) / 127).clamp_min(1e-30)
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


def multiplies_by_the_reciprocal(x):
    """`x * (1 / scale)`, zero rows guarded: 1 / scale overflows to inf for a subnormal scale (absmax < 1.5e-36)."""
    scale = _absmax(x) / 127
    inv = 1 / torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x.float() * inv).clamp(-127, 127).to(torch.int8), scale


wrong("check_int8_quantize", "floor on the scale", "1e-30")(pair(scale_floored_at_1e_30))
wrong("check_int8_quantize", "subnormal", "x / scale")(pair(multiplies_by_the_reciprocal))


def flattens_with_view(x):
    """Flattens with x.view(-1, D) to take one absmax per row: keys as a model makes them
    (proj.view(B, T, H, D).transpose(1, 2)) are not contiguous, and view raises on them."""
    rows = x.view(-1, x.shape[-1])
    scale = rows.float().abs().amax(dim=-1, keepdim=True).view(*x.shape[:-1], 1) / 127
    return _q(x, scale), scale


wrong("check_int8_quantize", "not contiguous", "transposed as a model makes it", ".reshape()")(pair(flattens_with_view))


def deq_flattens_with_view(q, scale, dtype):
    """dequantize flattens q with q.view(-1, D) and scale with scale.view(-1, 1): a q laid out as a model's keys
    (transposed) is not contiguous, and view raises."""
    D = q.shape[-1]
    return (q.view(-1, D).float() * scale.view(-1, 1)).view(q.shape).to(dtype)


wrong("check_int8_quantize", "not contiguous", ".reshape()")(pair(right_quantize, deq_flattens_with_view))
