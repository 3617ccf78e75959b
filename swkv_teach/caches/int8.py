"""An 8-bit sliding-window cache: keys and values stored as int8, one scale per token and head.

Quantisation (symmetric, absmax, per token and head)::

    scale = max_d |x[..., d]| / 127                    one float32 per (batch, head, token)
    q     = round(x / scale)                           int8 in [-127, 127]
    x_hat = q * scale                                  |x_hat - x| <= scale / 2 = absmax / 254

127, not 128: ``absmax / 128`` would map the largest element to ±128, and +128
does not fit in int8 (it wraps to -128). Rounding to nearest is what buys the
half-step bound; truncation toward zero (``.to(torch.int8)`` alone) errs by up
to a whole step. A scale per token and head, rather than one per tensor, keeps
one loud token or head from flattening every other to a few levels.

Memory per stored token and head: ``head_dim`` bytes plus a 4-byte scale, for
keys and for values, against ``4 * head_dim`` in float32 or ``2 * head_dim``
in float16. With ``head_dim = 128`` that is 132 / 512 bytes: 26 % of float32,
52 % of float16.

Hugging Face's ``QuantizedCache`` (transformers ``cache_utils.py``) quantises
differently: per channel in groups of ``q_group_size=64`` (quanto or HQQ
backends, ``nbits=4`` by default), keys and values both; KIVI (Liu et al.,
2024), which it cites, quantises keys per channel but values per token, and the
class's docstring says it departs from the paper there. It keeps the most recent
tokens (fewer than ``residual_length=128``) in full precision, re-quantising
everything together each time that buffer fills.

The cache stores its int8 data and its scales in two
:class:`~swkv_teach.caches.RingBufferKVCache` (slot ``p % W``, the same
positions), and dequantises what ``update`` returns to the input dtype: a
fused kernel would dequantise inside attention instead. That read of the whole
window, int8 in and float out, is what a step costs beyond the ring's; it is
not kept between steps (a float copy of the window would undo the saving).

Window convention: :mod:`swkv_teach.masks`.
"""

from __future__ import annotations

import torch

from swkv_teach._validate import check_kv, check_positive_int
from swkv_teach.caches import _state
from swkv_teach.caches.base import KVCache
from swkv_teach.caches.ring import RingBufferKVCache, check_ring_state

QMAX = 127  # symmetric int8 range [-127, 127]: -128 is left unused so +absmax and -absmax round alike
# QMAX as a 0-dim float32 tensor: dividing by it divides by 127 exactly as by the Python number, without
# wrapping a number into a tensor on every call (~2 µs of a step's ~8 µs of quantising, CPU, torch 2.13)
_QMAX = torch.tensor(float(QMAX))


def _largest_scale() -> float:
    """The largest float32 scale ``s`` with ``127 * s`` finite: float32's max / 127 rounds *up*, and 127 times
    that overflows to inf, so a row holding float32's largest values would dequantise to inf."""
    s = torch.tensor(torch.finfo(torch.float32).max / QMAX, dtype=torch.float32)
    while torch.isinf(s * QMAX):
        s = torch.nextafter(s, torch.zeros(()))
    return s.item()


_SCALE_MAX = _largest_scale()


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``x`` ``(..., head_dim)`` with one absmax scale per row (per token and head for KV).

    Returns ``q`` int8 shaped like ``x`` and ``scale`` float32 ``(..., 1)``, with
    ``q * scale`` within ``scale / 2 = absmax / 254`` of ``x`` (before the
    output dtype's own rounding). An all-zero row gets scale 0 and q 0.
    """
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor to quantise; got dtype {x.dtype}")
    q, scale = _quantize_rows(x)
    return q.to(torch.int8), scale


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_int8`'s ``q`` still in floating point (whole numbers in [-127, 127]), and ``scale``.

    The cache copies ``q`` straight into its int8 buffer: the copy converts, exactly, so no int8 temporary.
    """
    x32 = x if x.dtype is torch.float32 else x.to(torch.float32)
    scale = torch.linalg.vector_norm(x32, float("inf"), dim=-1, keepdim=True).div_(_QMAX)  # (..., 1) absmax / 127
    scale.clamp_(max=_SCALE_MAX)  # only float32's very largest rows: q * scale must stay finite
    xw, sw = (x, scale.double()) if x.dtype == torch.float64 else (x32, scale)
    # a zero row divides 0 by 0 (nan) and becomes 0, as does ±inf from a scale that underflowed to 0;
    # the clamp matters only for subnormal scales, whose rounding can push |x / scale| past 127.5
    return torch.div(xw, sw).nan_to_num_(0.0, 0.0, 0.0).round_().clamp_(-QMAX, QMAX), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` in ``dtype``: ``q`` int8 ``(..., head_dim)``, ``scale`` ``(..., 1)``.

    Computed in float32 (float64 for a float64 ``dtype``) and rounded once to ``dtype``. Converting
    first and scaling in place is two passes, yet faster on CPU than one mixed ``int8 * float`` multiply.
    """
    work = torch.float64 if dtype == torch.float64 else torch.float32
    return q.to(work).mul_(scale.to(work)).to(dtype)


class Int8RingBufferKVCache(KVCache):
    """Sliding-window cache of ``window_size`` tokens stored as int8 plus one float32 scale per token and head.

    Same interface and same returned positions as
    :class:`~swkv_teach.caches.RingBufferKVCache` (slot order for one token,
    the last ``W - 1`` stored then the chunk for chunks); the keys and values
    come back dequantised to the dtype of the first update, each element
    within ``absmax / 254`` of the original (plus that dtype's rounding),
    where ``absmax`` is the largest magnitude of that token and head.

    Layout: keys and values share one int8 buffer ``(2B, H, W, D)`` (keys in rows ``:B``, values
    in ``B:``) and one float32 scale buffer ``(2B, H, W, 1)``; the two rings (``_data`` for the
    int8, ``_scales`` for the scales) hold halves of them as their ``k_buf``/``v_buf`` views and
    keep the slots, positions and chunks. One token is quantised, written and dequantised for
    keys and values together: one copy per buffer, one conversion and one scaling for the window.
    """

    def __init__(self, window_size: int):
        self.window_size = check_positive_int("window_size", window_size)
        self._data = RingBufferKVCache(window_size)  # int8 keys and values (B, H, W, D): views of _q
        self._scales = RingBufferKVCache(window_size)  # float32 scales (B, H, W, 1): views of _s
        self.reset()

    # a one-token update returns the ring's filled slots: every key inside the window (base.py)
    one_token_in_window = True

    def _allocate(self, B: int, H: int, D: int, device: torch.device) -> None:
        W = self.window_size
        self._q = torch.zeros(2 * B, H, W, D, dtype=torch.int8, device=device)  # keys [:B], values [B:]
        self._s = torch.zeros(2 * B, H, W, 1, dtype=torch.float32, device=device)
        self._data._adopt(self._q[:B], self._q[B:])
        self._scales._adopt(self._s[:B], self._s[B:])
        # one (2B, H, 1, ·) view per slot, made once: a step writes keys and values with one copy
        self._q_slots = self._q.split(1, dim=2)
        self._s_slots = self._s.split(1, dim=2)

    def _set_like(self, like: torch.Tensor | None) -> None:
        """Remember the layout of one token, ``(B, H, 1, D)`` in the dtype ``update`` returns (None: empty)."""
        self._like = like  # for check_kv and the state's layout
        self._one_token = None if like is None else like.shape
        self._dtype = None if like is None else like.dtype
        self._device = None if like is None else like.device

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantise and store ``(batch, heads, tokens, head_dim)`` keys/values; return ``(k, v)`` dequantised.

        Keys and values are quantised together (one pass over ``cat((k_new, v_new))``: the scales
        are per row, so stacking changes nothing). One token is written into its slot of both
        buffers with one copy each, and the window is dequantised for keys and values at once;
        a chunk goes through the rings' chunk path and comes back as they return it.
        After the first update a one-token step skips the checks when shape, dtype and device
        match what the cache holds (as the ring does).
        """
        # fast path: one token shaped, typed and placed like what the cache holds (_one_token is None
        # until the first update, so that one is checked); attribute reads only, as in the ring
        if not (
            type(k_new) is torch.Tensor
            and type(v_new) is torch.Tensor
            and k_new.shape == self._one_token
            and v_new.shape == self._one_token
            and k_new.dtype is self._dtype
            and v_new.dtype is self._dtype
            and k_new.device == self._device
            and v_new.device == self._device
        ):
            check_kv(k_new, v_new, self._like)
            if not k_new.is_floating_point():
                raise TypeError(f"k_new must be floating point to quantise to int8; got dtype {k_new.dtype}")
            if self._like is None:
                B, H, _, D = k_new.shape
                self._allocate(B, H, D, k_new.device)
                self._set_like(torch.empty(B, H, 1, D, dtype=k_new.dtype, device=k_new.device))
            if k_new.shape[2] > 1:
                return self._update_chunk(k_new, v_new)
        # one token, written here rather than by the rings: safe because their k_buf/v_buf are views of _q and _s
        # (their chunk path, positions, ordered() and state read what this writes) and both are advanced by one;
        # tests/test_int8_fast_path.py breaks if either stops holding
        x = torch.cat((k_new, v_new))  # (2B, H, 1, D): keys then values, as the buffers hold them
        q, scale = _quantize_rows(x.detach() if x.requires_grad else x)  # (2B, H, 1, D) whole numbers, (2B, H, 1, 1)
        slot = self._data._claim_slot()
        self._scales._claim_slot()
        self._q_slots[slot].copy_(q)  # to int8, exactly: q holds whole numbers in [-127, 127]
        self._s_slots[slot].copy_(scale)
        filled = self._data._seen
        qw, sw = (self._q, self._s) if filled >= self.window_size else (self._q[:, :, :filled], self._s[:, :, :filled])
        if self._dtype is torch.float32:  # dequantize_int8 for float32, its no-op casts left out
            return qw.float().mul_(sw).chunk(2)
        return dequantize_int8(qw, sw, self._dtype).chunk(2)

    def _update_chunk(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat((k_new, v_new))  # (2B, H, T, D): keys then values, quantised in one pass
        q, scale = quantize_int8(x.detach() if x.requires_grad else x)  # int8 (2B, H, T, D), float32 (2B, H, T, 1)
        rk, rv = self._data.update(*q.chunk(2))
        rsk, rsv = self._scales.update(*scale.chunk(2))
        dtype = self._like.dtype
        return dequantize_int8(rk, rsk, dtype), dequantize_int8(rv, rsv, dtype)

    @property
    def positions(self) -> torch.Tensor:
        """Absolute position of each key the last ``update`` returned, in the order returned."""
        return self._data.positions

    @property
    def seen(self) -> int:
        return self._data.seen

    @property
    def nbytes(self) -> int:
        """Bytes held: the int8 keys and values plus their float32 scales."""
        return self._data.nbytes + self._scales.nbytes

    def stored_positions(self) -> torch.Tensor:
        """Absolute positions of the stored tokens, chronologically (matching :meth:`ordered`)."""
        return self._data.stored_positions()

    @property
    def buffers(self) -> tuple:
        """The four tensors it holds: int8 keys and values ``(B, H, W, D)``, float32 scales ``(B, H, W, 1)``."""
        return self._data.k_buf, self._data.v_buf, self._scales.k_buf, self._scales.v_buf

    def ordered(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A chronological, dequantised copy of the stored keys and values."""
        if self._like is None:
            raise RuntimeError("the cache is empty: call update() before ordered()")
        (qk, qv), (sk, sv) = self._data.ordered(), self._scales.ordered()
        return dequantize_int8(qk, sk, self._like.dtype), dequantize_int8(qv, sv, self._like.dtype)

    def reset(self) -> None:
        self._data.reset()
        self._scales.reset()
        self._q = self._s = None
        self._q_slots = self._s_slots = ()
        self._set_like(None)

    def __len__(self) -> int:
        return len(self._data)

    # ------------------------------------------------ persistence (caches/_state.py)
    # the int8 data and its scales as stored (re-quantising dequantised values would not round-trip);
    # the layout's dtype is the one update returns, not int8
    _state_keys = ("seen", "positions", "k", "v", "k_scale", "v_scale")

    def _config(self) -> dict:
        return {"window_size": self.window_size}

    def _state_layout(self) -> list | None:
        return _state.layout(self._like)

    def _stats_extra(self) -> dict:
        return {"scale_bytes": self._scales.nbytes}

    def _state(self) -> dict:
        d, s = self._data, self._scales
        return {"seen": d.seen, "positions": _state.copy(d.positions), "k": _state.copy(d.k_buf),
                "v": _state.copy(d.v_buf), "k_scale": _state.copy(s.k_buf), "v_scale": _state.copy(s.v_buf)}

    def _check_state(self, sd: dict) -> None:
        as_stored = {"k": (None, torch.int8), "v": (None, torch.int8),
                     "k_scale": (1, torch.float32), "v_scale": (1, torch.float32)}
        if sd["layout"] is not None:
            as_stored["k"] = as_stored["v"] = (sd["layout"][2], torch.int8)
        check_ring_state(self, sd, tuple(as_stored), sd["layout"], as_stored)

    def _load_state(self, sd: dict) -> None:
        device = self._like.device if self._like is not None else None
        self.reset()
        if sd["k"] is None:
            return
        B, H, D, dt = sd["layout"]
        self._allocate(B, H, D, sd["k"].device if device is None else device)
        for buf, name in ((self._data.k_buf, "k"), (self._data.v_buf, "v"),
                          (self._scales.k_buf, "k_scale"), (self._scales.v_buf, "v_scale")):
            buf.copy_(sd[name])
        self._data._resume(sd["seen"], sd["positions"])
        self._scales._resume(sd["seen"], sd["positions"])
        self._set_like(torch.empty(B, H, 1, D, dtype=_state.dtype_from_name(dt), device=self._q.device))
