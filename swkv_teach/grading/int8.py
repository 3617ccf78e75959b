"""Check for exercise 09: int8 quantisation of keys/values, one absmax scale per token and head.

``quantize(x)`` takes ``x`` ``(batch, heads, tokens, head_dim)`` (one token in the cache's
decode step, several in a chunk) and returns ``q`` int8 of the same shape and ``scale``
float32 ``(batch, heads, tokens, 1)``; ``dequantize(q, scale, dtype)`` returns ``q * scale``
in ``dtype``. The oracle is :func:`swkv_teach.caches.int8.quantize_int8` /
:func:`~swkv_teach.caches.int8.dequantize_int8`; ``q`` may differ from it only where
``x / scale`` lands on a rounding tie, so ``q`` is judged by the bound
``|x / scale - q| <= 1/2`` rather than by equality.

The scale and the products are computed in float32, as the statement says: ``absmax / 127``
divided in float16 or bfloat16 is off by up to 2**-11 or 2**-9, and is named as such. The
dequantised values may differ from the oracle's by two of ``dtype``'s rounding steps (a float64
product rounds differently from a float32 one), so a bfloat16 scale in ``dequantize`` passes
where it only costs bits; where it does harm it fails, named: a float16 scale underflows to 0
for quiet tokens (the float16-subnormal case).

Cases vary what the statement leaves free: batch != heads, one head, head_dims 2 to 16,
several tokens at once, float32/float16/bfloat16/float64, magnitudes from 1e-39 to 1e3
between tokens and heads (so one scale per tensor, or a floor on the scale, shows), float16
subnormals, rows whose largest magnitude is negative, exact ties, all-zero tokens and an
all-zero tensor. The library's own ``quantize_int8`` / ``dequantize_int8`` are refused as answers.
"""

from __future__ import annotations

import math

import torch
from torch.overrides import TorchFunctionMode

from swkv_teach.caches.int8 import QMAX, dequantize_int8, quantize_int8
from swkv_teach.device import device as pick_device
from swkv_teach.grading._own import is_own
from swkv_teach.grading._layout import LAYOUTS, laid_out, name_layout
from swkv_teach.grading._report import ExerciseFailed, call, fail, passed, show, learner_name as _name

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
EPS = {torch.float32: 2.0**-24, torch.float64: 2.0**-53, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def _cases():
    """(title, x) pairs, smallest and most telling first."""
    yield "a hand-made token (scale 3 / 127)", torch.tensor([[[[3.0, -1.5, 0.7, 0.0, -2.99]]]])
    yield "a row whose largest magnitude is negative", torch.tensor([[[[-4.0, 1.0, 2.0, -0.5]]]])
    ties = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -3.5]).view(1, 1, 1, 8)
    yield "exact ties at scale 1", ties
    g = torch.Generator().manual_seed(9)
    for i, (shape, dtype) in enumerate([((2, 3, 1, 8), torch.float32), ((1, 1, 1, 5), torch.float16),
                                        ((3, 1, 1, 16), torch.bfloat16), ((1, 4, 1, 2), torch.float64),
                                        ((2, 2, 6, 4), torch.float32), ((1, 2, 3, 12), torch.bfloat16)]):
        mag = 10.0 ** torch.randint(-3, 4, (*shape[:-1], 1), generator=g).double()
        x = torch.randn(shape, generator=g, dtype=torch.float64) * mag
        yield f"random {tuple(shape)} {str(dtype).replace('torch.', '')}, magnitudes 1e-3..1e3 per token and head", \
            x.to(dtype)
    z = torch.randn(2, 2, 2, 4, generator=g)
    z[0, 1, 0] = 0.0
    z[1, 0, 1] = 0.0
    yield "all-zero tokens among others", z
    tiny = torch.randn(1, 2, 4, 6, generator=g, dtype=torch.float64)
    tiny *= torch.tensor([1e-8, 1e-7, 3e-6, 1e-5, 1e-4, 1e-2, 1.0, 1e-6]).view(1, 2, 4, 1)
    yield "tiny magnitudes, 1e-8 to 1 per token and head", tiny.float()
    sub = torch.randn(2, 1, 3, 4, generator=g) * torch.tensor([1e-7, 1e-6, 3e-5, 1e-3, 1e-6, 0.0]).view(2, 1, 3, 1)
    yield "float16 subnormals (below 6.1e-5) and a zero token", sub.half()
    yield "an all-zero tensor", torch.zeros(1, 3, 2, 4, dtype=torch.bfloat16)
    # float32 rows far below 1e-8: an eps or floor on the scale (clamp_min(1e-30), finfo.tiny) rounds them to 0, and
    # x * (1 / scale) overflows once the scale is subnormal (1 / 7.9e-40 is inf): the scale is max|x| / 127 exactly
    deep = torch.tensor([1e-33, -5e-34, 2e-34, 0.0, 1e-37, 0.0, -5e-38, 3e-38, 0.5, -1.0, 0.25, 0.75,
                         2e-38, -1e-38, 5e-39, 1e-39], dtype=torch.float64).view(1, 2, 2, 4)
    yield "tiny float32 magnitudes, 1e-39 to 1e-33 (subnormal scales), beside a token of magnitude 1", deep.float()


def _floor(s: torch.Tensor, e: torch.Tensor, nonzero: torch.Tensor) -> float | None:
    """The constant ``c`` when ``s`` is ``max(e, c)`` on the non-zero rows (a clamp_min on the scale), else None."""
    off = nonzero & ~torch.isclose(s, e, rtol=1e-5, atol=0)
    if not bool(off.any()):
        return None
    c = s[off]
    if not bool((c == c[0]).all() and (c > e[off]).all()):
        return None
    kept = e[nonzero & ~off]
    above = bool((kept > c[0] * (1 + 1e-5)).any())  # a louder token kept its own scale: a floor, not one scale
    return float(c[0]) if above and bool((kept >= c[0] * (1 - 1e-6)).all()) else None


def _scale_hint(x: torch.Tensor, scale: torch.Tensor, nonzero: torch.Tensor, exp_scale: torch.Tensor) -> str:
    """Name the usual wrong scales, judged on the rows that are not all zero (and that tell them from right)."""
    x64, s, e = x.double(), scale.double(), exp_scale.double()
    absmax = x64.abs().amax(-1, keepdim=True)

    def near(cand, rtol=1e-3):
        cand = cand.expand_as(s)
        return bool(torch.allclose(s[nonzero], cand[nonzero], rtol=rtol, atol=0))

    def tells(cand):
        """A candidate names the bug only where it differs from the right scale (one row: per tensor == per row)."""
        return near(cand) and not bool(torch.allclose(cand.expand_as(e)[nonzero], e[nonzero], rtol=1e-5, atol=0))

    if x.dtype in (torch.float16, torch.bfloat16) and near((x.abs().amax(-1, keepdim=True) / QMAX).double(), 1e-6):
        kind = str(x.dtype).replace("torch.", "")
        return (f"the scale was computed in {kind}, x's own dtype: absmax / 127 divided in {kind} is off by up to "
                f"{2.0 ** (-11 if x.dtype == torch.float16 else -9):.0e} of itself, which shifts q by up to "
                f"{127 * 2.0 ** (-11 if x.dtype == torch.float16 else -9):.2f} of a step and breaks the half-step "
                "bound. Compute in float32: scale = x.float().abs().amax(dim=-1, keepdim=True) / 127.")
    if tells(x64.abs().amax().view(1, 1, 1, 1) / QMAX):
        return ("one scale for the whole tensor: a quiet token or head then gets a few levels only. "
                "Take absmax per token and head: x.float().abs().amax(dim=-1, keepdim=True).")
    if x.dim() == 4 and x.shape[1] > 1 and tells(x64.abs().amax(dim=(1, 3), keepdim=True) / QMAX):
        return ("one scale per token shared by all heads: each head of a token has its own absmax; reduce over "
                "head_dim only, x.float().abs().amax(dim=-1, keepdim=True).")
    c = _floor(s, e, nonzero)
    if c is not None:
        return (f"quiet tokens got scale {c:.3g} instead of absmax / 127: a floor on the scale (clamp_min, or max "
                f"with an eps) gives a token whose absmax is below 127 * {c:.3g} only a few levels, or none. Guard "
                "only the all-zero tokens: divide by torch.where(scale > 0, scale, torch.ones_like(scale)) and "
                "return scale itself.")
    if tells(absmax / 128):
        return ("scale = absmax / 128 maps the largest element to ±128, and int8 stops at 127: +128 overflows "
                "(wraps to -128). Use absmax / 127.")
    if tells(absmax / 255) or tells(absmax / 256):
        return "255 levels is the unsigned (uint8) range; symmetric int8 uses [-127, 127]: scale = absmax / 127."
    if tells(QMAX / absmax):
        return "the scale is inverted: scale = absmax / 127, so that q = x / scale lands in [-127, 127]."
    if tells(x64.amax(-1, keepdim=True) / QMAX):
        return "you took the max, not the max magnitude: a row like [-4, 1] needs x.abs().amax(dim=-1, keepdim=True)."
    d, sn = (s - e)[nonzero], s[nonzero]
    eps = d[sn.argmin()]  # read where float32 rounds least
    if bool(eps > 0) and bool(((d - eps).abs() <= 1e-3 * eps + 2 * sn * 2.0**-23).all()):
        return (f"an eps of {float(eps):.3g} was added to every scale: scale must be absmax / 127 exactly. Guard "
                "only the all-zero tokens: divide by torch.where(scale > 0, scale, torch.ones_like(scale)).")
    for half in (torch.float16, torch.bfloat16):
        rounded = exp_scale.to(half).double()
        if bool(torch.equal(s[nonzero], rounded[nonzero])) and not bool(torch.equal(rounded[nonzero], e[nonzero])):
            kind = str(half).replace("torch.", "")
            return (f"the scale was rounded to {kind} (returned scale equals absmax / 127 stored in {kind}): keep "
                    "the scales in float32, which is what makes q * scale accurate; they cost one number per token "
                    "and head.")
    if near(e):
        return ("scale is within 0.1 % of absmax / 127 but not equal: compute it in float32, "
                "scale = x.float().abs().amax(dim=-1, keepdim=True) / 127.")
    return "scale is absmax / 127 for each token and head: x.float().abs().amax(dim=-1, keepdim=True) / 127."


def _shape_hint(quantize, x: torch.Tensor, scale: torch.Tensor) -> str:
    """Name a wrong scale shape from this case and, when one row leaves it open, from a (2, 3, 4, 8) probe."""
    if tuple(scale.shape) == tuple(x.shape[:-1]):
        return ("keepdim is missing: amax(dim=-1) drops the head_dim axis, giving (batch, heads, tokens); the scale "
                "keeps it as size 1, (batch, heads, tokens, 1): x.float().abs().amax(dim=-1, keepdim=True).")
    probe_shape = None
    try:
        probe = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(3)).to(pick_device())
        got = quantize(probe)
        probe_shape = tuple(got[1].shape)
    except Exception:
        pass
    if probe_shape == (2, 3, 4):
        return "keepdim is missing: reduce with amax(dim=-1, keepdim=True), so the scale is (batch, heads, tokens, 1)."
    if scale.numel() == 1 and (x.shape[:-1].numel() > 1 or (probe_shape is not None and math.prod(probe_shape) == 1)):
        return ("one scale for the whole tensor: take absmax per token and head, "
                "x.float().abs().amax(dim=-1, keepdim=True).")
    if scale.dim() == x.dim() and scale.shape[-1] == x.shape[-1]:
        return ("a scale per channel (reduced over tokens, not head_dim): the scale of a token and head is the "
                "absmax over its head_dim, amax(dim=-1, keepdim=True).")
    return "one scale per token and head: reduce over head_dim only, keepdim=True."


class _CastWatch(TorchFunctionMode):
    """Records whether any float tensor holding NaN or ±inf was converted to an integer dtype.

    What such a cast gives is not defined (C++ leaves float-to-integer conversion of a value out of range undefined,
    and PyTorch inherits it: pytorch/pytorch#180159, where CPU and CUDA disagree, and #87556): NaN becomes 0 in int8
    on x86 today, something else elsewhere. So an all-zero row divided by its zero scale (0 / 0 = NaN) is judged by
    this, not by the int8 it happens to become.
    """

    def __init__(self):
        super().__init__()
        self.bad = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.bad is None and isinstance(out, torch.Tensor) and not out.is_floating_point() \
                and out.dtype != torch.bool and not out.is_complex():
            for a in list(args) + list((kwargs or {}).values()):
                if isinstance(a, torch.Tensor) and a.is_floating_point() and a.shape == out.shape \
                        and not bool(torch.isfinite(a).all()):
                    self.bad = (getattr(func, "__name__", str(func)), int((~torch.isfinite(a)).sum()))
                    break
        return out


def _check_quantize(quantize, x: torch.Tensor, title: str, qn: str,  # noqa: C901 (one check after another)
                    layout: str | None = None):
    xd = x.to(pick_device(), copy=True)  # the learner's tensors live on the notebook's device
    if layout:
        xd = laid_out(xd, layout)
    with _CastWatch() as watch:
        got = call(title, f"{qn}(x)", quantize, xd)
    if watch.bad is not None and bool(torch.isfinite(x).all()):
        head = (f"{qn}(x) converted {watch.bad[1]} NaN or infinite value(s) to an integer type (through torch's "
                f"`{watch.bad[0]}`); x holds none, so they came from the scale: ")
        undefined = "What NaN or inf becomes in int8 is not defined (0 on x86 today, not everywhere)."
        if bool((x.abs().amax(-1) == 0).any()):
            raise fail(title, head + "x has an all-zero row, whose absmax is 0, and 0 / 0 is NaN.", undefined,
                       hint="guard the all-zero rows: divide by torch.where(scale > 0, scale, torch.ones_like(scale)) "
                       "(x / 1 = 0 there) and return scale itself (0 for those rows).")
        raise fail(title, head + "no row is all zeros here, but the quietest rows have subnormal scales (absmax / 127 "
                   "below 1.2e-38), whose reciprocal 1 / scale overflows to inf, or a scale that rounded to 0.",
                   undefined, hint="divide by the scale itself, x / scale (never x * (1 / scale)), with the scale "
                   "computed in float32 as absmax / 127.")
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise fail(title, f"{qn}(x) returned {show(got)}; expected (q, scale), two tensors.")
    q, scale = got
    want = (*x.shape[:-1], 1)
    if scale.dtype == torch.int8 and q.dtype != torch.int8 and tuple(scale.shape) == tuple(x.shape) \
            and tuple(q.shape) == want:
        raise fail(title, f"{qn}(x) returned (scale, q): the first tensor has shape {tuple(q.shape)} "
                   f"({str(q.dtype)[6:]}), the second is int8 of x's shape {tuple(x.shape)}.",
                   hint="return q first, then scale: `return q, scale`, in the order dequantize(q, scale, dtype) "
                   "takes them.")
    if not torch.equal(xd.cpu(), x):
        raise fail(title, f"{qn}(x) modified its input x in place.",
                   hint="x.div_(scale) writes into the caller's keys: use x / scale.")
    if q.dtype != torch.int8:
        hint = ("uint8 is unsigned: keys and values are signed, so symmetric int8 in [-127, 127]."
                if q.dtype == torch.uint8 else
                "round first, then .to(torch.int8): a rounded float still takes 2-4 bytes per element.")
        raise fail(title, "q has the wrong dtype.", expected="torch.int8", got=str(q.dtype), what="q dtype", hint=hint)
    if tuple(q.shape) != tuple(x.shape):
        raise fail(title, f"q has shape {tuple(q.shape)}; expected x's shape {tuple(x.shape)}.")
    if tuple(scale.shape) != want:
        raise fail(title, "scale has the wrong shape.", expected=want, got=tuple(scale.shape), what="scale shape",
                   hint=_shape_hint(quantize, x, scale))
    if scale.dtype != torch.float32:
        raise fail(title, "scale has the wrong dtype.", expected="torch.float32", got=str(scale.dtype),
                   what="scale dtype", hint="keep the scales in float32 whatever x's dtype: a bfloat16 scale "
                   "carries 8 bits and would cost more error than the int8 data.")
    exp_q, exp_scale = quantize_int8(x)
    absmax = x.double().abs().amax(-1, keepdim=True)
    zero = absmax == 0
    nonzero = ~zero
    scale, q = scale.cpu(), q.cpu()
    if not bool(torch.isfinite(scale).all()) or not bool((q[zero.expand_as(q)] == 0).all()):
        raise fail(title, "an all-zero token came back with a non-finite scale or a non-zero q.",
                   expected="scale finite (0 will do) and q all 0", got=f"scale {show(scale[zero])}",
                   hint="an all-zero token divides by zero: x / 0 is nan. Divide by 1 where the scale is 0 "
                   "(torch.where(scale > 0, scale, 1)) or clamp it from below.")
    if not torch.allclose(scale.double()[nonzero], exp_scale.double()[nonzero], rtol=1e-5, atol=0):
        raise fail(title, "scale is not absmax / 127 per token and head.", expected=exp_scale, got=scale,
                   what="scale", hint=_scale_hint(x, scale, nonzero, exp_scale))
    if bool((q == -128).any()):
        raise fail(title, "q holds -128.", hint="int8 overflow at ±128: the symmetric range is [-127, 127]; "
                   "clamp(-127, 127) before .to(torch.int8), and scale = absmax / 127.")
    t = x.double() / torch.where(scale > 0, scale, torch.ones_like(scale)).double()
    err = (t - q.double()).abs()
    if bool((err > 0.5 + 1e-3).any()):
        i = int(err.flatten().argmax())
        if torch.equal(q.double(), torch.trunc(t)):
            hint = "rounding toward zero: .to(torch.int8) truncates 2.7 to 2. Call torch.round first."
        elif torch.equal(q.double(), torch.floor(t)):
            hint = "floor rounds -0.2 down to -1: round to nearest with torch.round."
        elif x.dtype in (torch.float16, torch.bfloat16) and torch.equal(
                q.double(), torch.round(x / torch.where(scale > 0, scale, 1).to(x.dtype)).clamp(-QMAX, QMAX).double()):
            kind = str(x.dtype).replace("torch.", "")
            hint = (f"the division x / scale ran in {kind}, x's own dtype, whose rounding moves x / scale by up to "
                    f"{127 * 2.0 ** (-11 if x.dtype == torch.float16 else -8):.2f} of a step: divide in float32, "
                    "x.float() / scale.")
        else:
            hint = "q = round(x / scale): each element within half a step of x / scale."
        raise fail(title, f"q is off by more than half a step at flat index {i}: x / scale = {t.flatten()[i]:.4f}, "
                   f"q = {int(q.flatten()[i])}.", hint=hint)
    return q, scale, exp_q, exp_scale


def _check_dequantize(dequantize, x, exp_q, exp_scale, title: str, dn: str, layout: str | None = None):
    dtype = x.dtype
    dev = pick_device()
    q_in, s_in = exp_q.to(dev, copy=True), exp_scale.to(dev, copy=True)
    if layout:
        q_in, s_in = laid_out(q_in, layout), laid_out(s_in, layout)
    got = call(title, f"{dn}(q, scale, {dtype})", dequantize, q_in, s_in, dtype)
    if not isinstance(got, torch.Tensor):
        raise fail(title, f"{dn}(q, scale, dtype) returned {show(got)}; expected a tensor.")
    if got.dtype != dtype or tuple(got.shape) != tuple(x.shape):
        raise fail(title, f"{dn}(q, scale, {dtype}) returned the wrong dtype or shape.",
                   expected=(tuple(x.shape), str(dtype)), got=(tuple(got.shape), str(got.dtype)),
                   hint="return (q.float() * scale).to(dtype): the attention that reads the cache runs in the "
                   "keys' own dtype.")
    exp = dequantize_int8(exp_q, exp_scale, dtype)
    tol = exp_scale.double() * 1e-3 + exp.double().abs() * EPS[dtype] * 2
    if not bool(((got.double().cpu() - exp.double()).abs() <= tol).all()):
        with_div = (exp_q.double() / torch.where(exp_scale > 0, exp_scale, 1).double()).to(dtype)
        got = got.cpu()
        in_dtype = (exp_q.to(dtype) * exp_scale.to(dtype)).double()
        if torch.allclose(got.double(), with_div.double()):
            hint = "multiply by the scale, do not divide: x_hat = q * scale."
        elif dtype in (torch.float16, torch.bfloat16) and torch.allclose(got.double(), in_dtype, rtol=EPS[dtype], atol=0):
            kind = str(dtype).replace("torch.", "")
            hint = (f"the scale was rounded to {kind} before multiplying: {kind} " + (
                    "has no number between 0 and 6e-8, so a quiet token's scale (absmax / 127) becomes 0 or loses "
                    "its digits" if dtype == torch.float16 else "keeps 8 bits of it") +
                    ". Multiply in float32, then convert once: (q.float() * scale).to(dtype).")
        else:
            hint = "x_hat = q * scale (q cast to float first), then .to(dtype)."
        raise fail(title, f"{dn} does not return q * scale.", expected=exp, got=got, hint=hint)


def _layouts(quantize, dequantize, x: torch.Tensor, case: str, qn: str, dn: str) -> None:
    """The same case with x (and then q and scale) not contiguous: transposed, sliced, expanded over the batch."""
    for how, text in LAYOUTS.items():
        xl = x[:1].expand(3, *x.shape[1:]).contiguous() if how == "expanded" else x
        title = f"{case}, every input {text}"
        try:
            _, _, eq, es = _check_quantize(quantize, xl, title, qn, how)
            _check_dequantize(dequantize, xl, eq, es, title, dn, how)
        except ExerciseFailed as e:
            if " raised " in str(e):
                raise name_layout(e, "the input", how) from None
            raise


def check_int8_quantize(quantize, dequantize=None) -> None:
    """Exercise 09: ``quantize(x) -> (q int8, scale float32 (..., 1))`` and ``dequantize(q, scale, dtype)``.

    Pass the two functions, or one object (a class, a module) holding both as ``.quantize`` and ``.dequantize``.
    """
    if dequantize is None:
        quantize, dequantize = getattr(quantize, "quantize", quantize), getattr(quantize, "dequantize", None)
    if not callable(quantize) or not callable(dequantize):
        raise fail(f"check_int8_quantize({_name(quantize)}, {_name(dequantize)})",
                   "expected two functions: quantize(x) -> (q, scale) and dequantize(q, scale, dtype).",
                   hint="call check_int8_quantize(quantize, dequantize) with the functions themselves.")
    qn, dn = _name(quantize), _name(dequantize)
    for fn, lib in ((quantize, quantize_int8), (dequantize, dequantize_int8)):
        if is_own(fn, lib):
            raise fail(f"check_int8_quantize({qn}, {dn})", f"{_name(fn)} is the library's own {lib.__name__} "
                       "(swkv_teach.caches.int8), the very function the check compares with: it passes by "
                       "definition and shows nothing.", hint="write quantize and dequantize yourself and check those. If you did write them, "
                       "something run after them (an import of the same name) replaced them: run your cell again.")
    n = 0
    for title, x in _cases():
        case = f"{qn} / {dn} on {title}"
        _, _, exp_q, exp_scale = _check_quantize(quantize, x, case, qn)
        _check_dequantize(dequantize, x, exp_q, exp_scale, case, dn)
        xd = x.to(pick_device(), copy=True)
        back = call(case, f"{dn}(*{qn}(x), x.dtype)", lambda: dequantize(*quantize(xd), x.dtype))
        absmax = x.double().abs().amax(-1, keepdim=True)
        bound = absmax / 254 * (1 + 1e-4) + absmax * EPS[x.dtype] * 2
        if not bool(((back.double().cpu() - x.double()).abs() <= bound).all()):
            raise fail(case, "the round trip dequantize(quantize(x)) is further than absmax / 254 from x.",
                       hint="q = round(x / scale) with scale = absmax / 127 per token and head keeps every "
                       "element within half a step.")
        n += 1
        if x.dim() == 4 and x.shape[1] > 1 and x.shape[2] > 1:
            _layouts(quantize, dequantize, x, case, qn, dn)
    passed(f"{qn} / {dn} quantise to int8 with one absmax / 127 scale per token and head, within half a step, "
           f"on {n} cases (4 dtypes, head_dims 2-16, ties, zeros, magnitudes 1e-39..1e3, float16 subnormals; inputs "
           "transposed, sliced and expanded as a model makes them).")


__all__ = ["check_int8_quantize"]
