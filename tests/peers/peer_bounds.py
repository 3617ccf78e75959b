"""What the ported peers' cases are judged by: a float64 oracle and one rounding of the output dtype.

The peers judge their kernels against references computed in the kernels' own low precision
(FlashAttention's ``out_pt``, vLLM's ``ref_paged_attn`` scale the query and multiply in
bfloat16/float16 before upcasting) with loose tolerances (vLLM: ``atol=1.5e-2, rtol=1e-2``).
A bfloat16 reference can be further from the truth than the course's function, which computes
in float32 and rounds once (measured on vLLM's decode cases below: up to ~0.03 for vLLM's
reference against ~0.004 for the course). So every ported case is judged against the same
reference evaluated in float64 on the same (already rounded) inputs, per element, by
:func:`rounding_bound`: what one rounding to the output dtype can move a value.
"""

from __future__ import annotations

import torch

# unit roundoff: half the spacing between 1 and the next number (8, 11 and 24 significant bits)
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def rounding_bound(expected: torch.Tensor, dtype: torch.dtype, slack: float = 1e-5) -> torch.Tensor:
    """Per element: ``|x - round(x)| <= UNIT[dtype] * |x|``; ``slack`` covers the float32 arithmetic before
    that rounding (~1e-6 on values of order one; float16's subnormals below 6e-5 round to 6e-8, inside it)."""
    return expected.abs() * UNIT[dtype] + slack


def worst_ratio(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> float:
    """The largest ``|got - expected| / rounding_bound``: at most 1 when ``got`` is one rounding off."""
    err = (got.double() - expected.double()).abs()
    return float((err / rounding_bound(expected.double(), dtype)).max())
