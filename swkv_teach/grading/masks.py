"""Check for exercise 02: ``sliding_window_mask(seq_len, window_size) -> (T, T)`` bool mask.

The expected mask is the library's :func:`swkv_teach.masks.sliding_window_mask`
(the convention ``i - W < j <= i``). Cases run smallest first, so the first
failure is a mask small enough to print whole, side by side with the expected one.
"""

from __future__ import annotations

import torch

from swkv_teach.grading._report import call, fail, grid, passed, show
from swkv_teach.masks import sliding_window_mask


def _cases():
    seen = set()
    for T in range(1, 10):
        for W in (1, 2, 3, 5, 8, T - 1, T, T + 1):
            if W >= 1 and (T, W) not in seen:
                seen.add((T, W))
                yield T, W


def _candidates(got: torch.Tensor, T: int, W: int) -> str | None:
    """Name the bug when ``got`` is one of the usual wrong masks for ``(T, W)``."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    causal = j <= i
    right = causal & (j > i - W)
    tests = [
        (causal & (j > i - W + 1),
         f"off by one: each query sees W - 1 = {W - 1} keys; it should see W = {W}, itself included (i - W < j)."),
        (causal & (j >= i - W),
         f"off by one: each query sees W + 1 = {W + 1} keys; it should see W = {W} (j > i - W, strictly)."),
        ((i - j).abs() < W, "the band is not causal: a query must not see later keys (j <= i)."),
        ((i - j) < W, "not causal: i - j < W also holds for every later key (i - j is negative there); add j <= i."),
        ((i - j).abs() <= W, "the band is not causal (j <= i) and one key too wide."),
        (causal, "this is plain causal attention: add the window, j > i - W."),
        (right.T, "transposed: rows are queries i, columns are keys j."),
        (causal & (j > i - 3), "the window looks hard-coded to 3: use window_size."),
        (~right, "inverted: True must mean may attend."),
    ]
    for candidate, hint in tests:
        if torch.equal(got, candidate) and not torch.equal(candidate, right):
            return hint
    return None


def _mask_hint(fn, got: torch.Tensor, T: int, W: int) -> str:
    """The bug's name, judged on a larger case first (W=5: a hard-coded 3 is not an off-by-one there),
    then on the failing case; the hint says which case it was judged on, so its numbers make sense."""
    try:
        big = fn(10, 5)
        if isinstance(big, torch.Tensor) and big.dtype == torch.bool and tuple(big.shape) == (10, 10):
            hint = _candidates(big.cpu(), 10, 5)
            if hint:
                return f"{hint} (seen with seq_len=10, window_size=5)"
    except Exception:
        pass
    return _candidates(got, T, W) or "mask[i, j] is True exactly when i - W < j <= i (rows are queries, columns keys)."


def check_sliding_window_mask(fn) -> None:
    """Exercise 02: compare ``fn(seq_len, window_size)`` with the library's mask for every small case."""
    name = getattr(fn, "__name__", "your function")
    n = 0
    for T, W in _cases():
        case = f"{name}(seq_len={T}, window_size={W})"
        got = call(case, f"{name}({T}, {W})", fn, T, W)
        exp = sliding_window_mask(T, W)
        if not isinstance(got, torch.Tensor):
            raise fail(case, f"returned {show(got)} ({type(got).__name__}); expected a torch.Tensor of shape ({T}, {T}).",
                       hint="build it with torch operations and return the tensor.")
        if tuple(got.shape) != (T, T):
            raise fail(case, f"returned shape {tuple(got.shape)}; expected ({T}, {T}): one row per query, one "
                       "column per key.")
        if got.dtype != torch.bool:
            raise fail(case, f"returned dtype {got.dtype}; expected torch.bool (True = may attend).",
                       hint="PyTorch adds a float mask to the scores instead of masking with it, so 0/1 floats "
                       "would silently let every key through: compare with <= and combine with &.")
        got = got.cpu()
        if not torch.equal(got, exp):
            left, right = grid(exp, "expected"), grid(got, "got")
            width = max(len(r) for r in left) + 4
            rows = [a.ljust(width) + b for a, b in zip(left, right)]
            raise fail(case, "rows are queries i, columns keys j, 1 = may attend:", *rows,
                       hint=_mask_hint(fn, got, T, W))
        n += 1
    passed(f"{name} matches the window convention i - W < j <= i on all {n} cases "
           "(seq_len 1..9, windows 1, 2, 3, 5, 8 and T - 1, T, T + 1).")


__all__ = ["check_sliding_window_mask"]
