"""Inputs laid out in memory as a model makes them: the same numbers, not contiguous.

A model's keys are a view of a projection, ``proj(x).view(B, T, H, D).transpose(1, 2)``; a fused projection is
sliced, ``qkv[..., D:2 * D]``; a batch shared by several sequences is expanded, ``x[:1].expand(B, ...)``. None of
them is contiguous, so ``.view(-1, D)`` raises on them while ``.reshape(-1, D)`` (or working on the last dim
directly) does not. The checks that take tensors feed these beside contiguous ones: the statement says
nothing about memory layout, so an answer must not rely on it.
"""

from __future__ import annotations

import torch

from swkv_teach.grading._report import ExerciseFailed, rehint

__all__ = ["LAYOUTS", "NONCONTIG_HINT", "laid_out", "name_layout"]

# name -> what the message says about it
LAYOUTS = {
    "transposed": "transposed as a model makes it, proj(x).view(B, T, H, D).transpose(1, 2)",
    "sliced": "a slice of a fused projection, qkv[..., D:2 * D]",
    "expanded": "expanded over the batch, x[:1].expand(B, ...)",
    "strided": "every other entry of a longer tensor, buf[::2]",
}


def laid_out(x: torch.Tensor, how: str) -> torch.Tensor:
    """``x`` (a float or integer tensor, 2 or more dims but for ``"strided"``) with its values, laid out ``how``.

    ``"transposed"``: dims 1 and 2 swapped in memory (4-D: a model's (B, T, H, D) buffer seen as (B, H, T, D));
    ``"sliced"``: the middle third of a buffer three times wider in the last dim; ``"expanded"``: batch row 0
    expanded to the batch (so rows 1.. take row 0's values: feed the result to the oracle too);
    ``"strided"``: every other entry along dim 0 of a buffer twice as long (1-D positions too).
    """
    if how == "transposed":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "sliced":
        D = x.shape[-1]
        buf = torch.zeros(*x.shape[:-1], 3 * D, dtype=x.dtype, device=x.device)
        buf[..., D : 2 * D] = x
        return buf[..., D : 2 * D]
    if how == "expanded":
        return x[:1].expand(x.shape[0], *x.shape[1:])
    if how == "strided":  # any number of dims: every other entry along dim 0
        buf = torch.zeros(2 * x.shape[0], *x.shape[1:], dtype=x.dtype, device=x.device)
        buf[::2] = x
        return buf[::2]
    raise ValueError(f"how must be one of {sorted(LAYOUTS)}; got {how!r}")


NONCONTIG_HINT = ("{what} is not contiguous here ({layout}), and your code assumes it is: .view() needs contiguous "
                  "memory. Use .reshape() (it copies only when it must), or reduce over the dims directly "
                  "(amax(dim=-1, keepdim=True), mean(dim=(0, 1))) without flattening.")


def name_layout(e: ExerciseFailed, what: str, how: str) -> ExerciseFailed:
    """``e`` raised on an input laid out ``how`` (the contiguous one passed): say so in the hint."""
    return rehint(e, NONCONTIG_HINT.format(what=what, layout=LAYOUTS[how]),
                  f"(the same numbers in contiguous memory passed; here {what} is {LAYOUTS[how]})")
