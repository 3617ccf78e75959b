"""Labelled keys and values, so a returned tensor says which tokens it holds.

Token ``p``'s key is ``p + 1`` plus a small offset unique to each (batch, head,
dim) coordinate, and its value is the negated key. Reading element
``[0, 0, t, 0]`` of anything a cache returns therefore tells the message
which position sits at index ``t`` (``"v3"`` for token 3's value where a
key belongs, ``"0"`` for a slot never written, ``"?"`` for anything else),
while the offsets make a mix-up of batch, heads or head_dim visible.
"""

from __future__ import annotations

import math

import torch

from swkv_teach.grading._report import call, fail, show

B, H, D = 2, 2, 3  # the default token shape: small but not square, so a wrong axis changes a shape
AXES = ("batch", "heads", "tokens", "head_dim")
STREAM = 1000  # instance i of an interleaved run is fed tokens labelled 1000 * i + p (runs stay under 1000 steps)
INSTANCES = "ABCDEFGH"


def token(p: int, dtype=torch.float32, device="cpu", shape=(B, H, D), base: int = 0,
          zero: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value of token ``p``, each ``(batch, heads, 1, head_dim)`` for ``shape = (batch, heads, head_dim)``.

    ``base`` shifts the label (``STREAM * i`` for the i-th of several live instances), ``zero`` makes
    both all zeros (a legitimate key and value a cache must not mistake for an empty slot).
    """
    b, h, d = shape
    off = (
        torch.arange(b, dtype=torch.float64).view(b, 1, 1) * 0.001
        + torch.arange(h, dtype=torch.float64).view(1, h, 1) * 0.1
        + torch.arange(d, dtype=torch.float64).view(1, 1, d) * 0.01
    )
    k = (base + p + 1 + off).unsqueeze(2)
    if zero:
        k = torch.zeros_like(k)
    return k.to(device=device, dtype=dtype), (-k).to(device=device, dtype=dtype)


def _label(r: int, base: int, prefix: str = ""):
    q = r - 1
    inst, p = divmod(q, STREAM)
    if inst * STREAM == base:
        return f"{prefix}{p}" if prefix else p
    return f"{prefix}{INSTANCES[inst] if inst < len(INSTANCES) else '?'}{p}"


def labels(t: torch.Tensor, values: bool = False, base: int = 0) -> list:
    """Which token sits at each index of dim 2 of a returned ``(B, H, n, D)`` tensor (keys, or values if ``values``).

    ``3``: token 3; ``"v3"``: token 3's value where a key belongs (``"k3"`` the other way round);
    ``"A3"``: token 3 fed to instance A of an interleaved run (another instance's token);
    ``"0"``: all zeros (an unwritten slot, or a zero token); ``"?"``: anything else.
    """
    col = t[0, 0, :, 0].detach().to("cpu", torch.float64)
    if values:
        col = -col
    out = []
    for x in col.tolist():
        if not math.isfinite(x):  # NaN or inf (e.g. an unwritten torch.empty slot): round() would raise
            out.append("?")
            continue
        r = round(x)
        if abs(x - r) > 1e-2:
            out.append("?")
        elif r > 0:
            out.append(_label(r, base))
        elif r < 0:
            out.append(_label(-r, base, "v" if not values else "k"))
        else:
            out.append("0")
    return out


def describe(x) -> str:
    if x is None:
        return "None"
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)} item{'s' if len(x) != 1 else ''}"
    if isinstance(x, torch.Tensor):
        return f"a single tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def unpack_kv(case: str, out, what: str = "update()") -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's ``(k, v)`` pair, or an ExerciseFailed saying what came back instead."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        hint = "return two tensors, `return k, v`: the cached keys and the cached values."
        if out is None:
            hint = "it returned nothing: end with `return self.k, self.v` (or your buffers' names)."
        raise fail(case, f"{what} returned {describe(out)}; expected a tuple (k, v) of two tensors.", hint=hint)
    if isinstance(out, list):
        raise fail(case, f"{what} returned a list [k, v]; expected a tuple (k, v), as the statement says.",
                   hint="`return self.k, self.v` (with a comma, no brackets) returns a tuple.")
    for name, t in zip("kv", out):
        if not isinstance(t, torch.Tensor):
            raise fail(case, f"{what} returned {name} = {show(t)} ({type(t).__name__}); expected a torch.Tensor.",
                       hint="return the tensors themselves, not lists or numbers.")
    return out[0], out[1]


def check_kind(case: str, k: torch.Tensor, v: torch.Tensor, like: torch.Tensor, what: str = "update()") -> None:
    """Same dtype and device as the tokens fed in, and a ``(batch, heads, ?, head_dim)`` layout."""
    for name, t in (("k", k), ("v", v)):
        if t.dtype != like.dtype:
            raise fail(case, f"{what} returned {name} with dtype {t.dtype}, but the tokens fed in were {like.dtype}.",
                       hint="a cache must not change dtype: no .float()/.half(), and create any buffer with "
                       "dtype=k_new.dtype.")
        if t.device != like.device:
            raise fail(case, f"{what} returned {name} on device {t.device}, but the tokens fed in were on {like.device}.",
                       hint="create any buffer on the tokens' device: torch.zeros(..., device=k_new.device).")
        if t.dim() != 4:
            stacked = t.dim() == 5 and t.shape[3] == 1 and t.shape[:2] == like.shape[:2] and t.shape[4] == like.shape[3]
            raise fail(case, f"{what} returned {name} with {t.dim()} dims, shape {tuple(t.shape)}; expected 4: "
                       "(batch, heads, tokens, head_dim).",
                       hint="torch.stack adds a new dim for the tokens, next to each token's own dim of size 1: join "
                       "them with torch.cat([...], dim=2) instead." if stacked else
                       "keep the 4-D layout; tokens live in dim 2.")
        for axis in (0, 1, 3):
            if t.shape[axis] != like.shape[axis]:
                raise fail(case, f"{what} returned {name} of shape {tuple(t.shape)}: dim {axis} ({AXES[axis]}) has size "
                           f"{t.shape[axis]}, expected {like.shape[axis]}.",
                           hint=f"tokens are stacked along dim 2 (batch, heads, tokens, head_dim); growing dim {axis} "
                           f"means concatenating along the wrong axis: use torch.cat([...], dim=2).")


NARROW = {torch.int8: "holds positions up to 127", torch.uint8: "holds positions up to 255",
          torch.int16: "holds positions up to 32767"}


def as_positions(case: str, got, what: str = "positions") -> list:
    """A learner's positions as a list of ints: a 1-D tensor of an integer dtype, nothing else.

    ``window_mask`` and the decoder's attention refuse float positions, and the decoder calls
    ``cache.positions.to(device)``, so a list or a float tensor would break there.
    """
    if isinstance(got, torch.Tensor):
        if got.dim() != 1:
            raise fail(case, f"{what} has shape {tuple(got.shape)}; expected a 1-D tensor (one position per key).")
        if got.is_floating_point() or got.is_complex() or got.dtype == torch.bool:
            raise fail(case, f"{what} has dtype {got.dtype}; positions must be an integer tensor.",
                       f"{what}: {show(got)}",
                       hint="window_mask and the decoder's attention refuse non-integer positions: build them with "
                       "torch.arange / torch.tensor(..., dtype=torch.long), not from float arithmetic.")
        if got.dtype in NARROW:
            raise fail(case, f"{what} has dtype {got.dtype}, which {NARROW[got.dtype]}: a conversation is longer "
                       "than that, and its positions would wrap around to wrong (negative) numbers.",
                       f"{what}: {show(got)}",
                       hint="keep positions in torch.long (int64), like torch.arange's default, or int32 at least.")
        return [int(x) for x in got.tolist()]
    if isinstance(got, (list, tuple, range)):
        raise fail(case, f"{what} is a Python {type(got).__name__} ({show(list(got))}); expected a 1-D integer tensor.",
                   hint="return torch.tensor(your_list, dtype=torch.long): the decoder calls "
                   "cache.positions.to(device), which a list does not have.")
    raise fail(case, f"{what} is {show(got)} ({type(got).__name__}); expected a 1-D tensor of ints.",
               hint="return torch.tensor([...], dtype=torch.long): the absolute position of each key update() returned.")


def read_positions(case: str, cache) -> list:
    return as_positions(case, call(case, "the positions property", lambda: cache.positions))


class Inputs:
    """Every key/value fed to a learner's cache, with a private copy to notice in-place writes."""

    def __init__(self):
        self.fed: list = []

    def add(self, p: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.fed.append((p, k, v, k.clone(), v.clone()))

    def check_untouched(self, case: str, last: int | None = None) -> None:
        """Every token fed is as it was (``last``: only the ``last`` most recent, the rest at a later full sweep)."""
        for p, k, v, k0, v0 in (self.fed if last is None else self.fed[-last:]):
            for name, t, t0 in (("k_new", k, k0), ("v_new", v, v0)):
                if t.shape != t0.shape:
                    raise fail(case, f"the {name} passed in for token {p} changed shape, from {tuple(t0.shape)} to "
                               f"{tuple(t.shape)}: your cache reshaped its caller's tensor in place.",
                               hint="squeeze_, unsqueeze_, transpose_, t_ and resize_ change the caller's tensor "
                               "itself; use the forms without the underscore (k_new.squeeze(2) returns a new view).")
            if not (torch.equal(k, k0) and torch.equal(v, v0)):
                raise fail(case, f"the k_new/v_new tensors passed in for token {p} were changed by your cache.",
                           hint="a cache must never write into its caller's tensors: if you store k_new itself and "
                           "later write into that storage in place (copy_, [...] =, +=), copy it first "
                           "(k_new.clone(), or torch.cat, which makes a new tensor).")


def sort_labels(labels_: list) -> list:
    """Labels sorted so that token 0 and a zero slot "0" stay apart."""
    return sorted(labels_, key=lambda x: (isinstance(x, str), str(x) if isinstance(x, str) else x))


def value_hint(vgot: list, kgot: list, vexp: list, k=None, v=None) -> str:
    """The hint for values that differ while the keys are right: ``vgot`` / ``vexp`` the labels of the values
    returned / expected, ``kgot`` of the keys returned; ``k``, ``v`` the tensors (to spot keys returned twice)."""
    if k is not None and v is not None and k.shape == v.shape and torch.equal(k, v):
        return "your values equal your keys: update() returns the keys twice (`return self.k, self.k`?)."
    if any(isinstance(g, str) and g.startswith("k") for g in vgot):
        return "the values you returned hold keys: are k and v swapped, or k returned twice?"
    if len(vgot) > len(vexp):
        return "your keys are right but your values are not evicted: slice self.v exactly as self.k."
    if vgot == kgot[::-1] or sorted(vgot, key=str) == sorted(vexp, key=str):
        return "keys and values are in different orders: update them the same way."
    return "your keys are right but your values are not: update and evict values exactly as keys."
