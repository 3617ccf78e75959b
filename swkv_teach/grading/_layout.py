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
}


def laid_out(x: torch.Tensor, how: str) -> torch.Tensor:
    """``x`` (any float or integer tensor of 2 or more dims) with the same values and the layout ``how``.

    ``"transposed"``: dims 1 and 2 swapped in memory (4-D: a model's (B, T, H, D) buffer seen as (B, H, T, D));
    ``"sliced"``: the middle third of a buffer three times wider in the last dim; ``"expanded"``: batch row 0
    expanded to the batch (``x`` itself must have equal batch rows: see :func:`expandable`).
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
    raise ValueError(f"how must be one of {sorted(LAYOUTS)}; got {how!r}")


NONCONTIG_HINT = ("{what} is not contiguous here ({layout}), and your code assumes it is: .view() needs contiguous "
                  "memory. Use .reshape() (it copies only when it must), or reduce over the last dim directly "
                  "(amax(dim=-1, keepdim=True)) without flattening.")


def name_layout(e: ExerciseFailed, what: str, how: str) -> ExerciseFailed:
    """``e`` raised on an input laid out ``how`` (the contiguous one passed): say so in the hint."""
    return rehint(e, NONCONTIG_HINT.format(what=what, layout=LAYOUTS[how]),
                  f"(the same numbers in contiguous memory passed; here {what} is {LAYOUTS[how]})")
