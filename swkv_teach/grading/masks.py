"""Check for exercise 01: ``sliding_window_mask(seq_len, window_size) -> (T, T)`` bool mask.

The expected mask is the library's :func:`swkv_teach.masks.sliding_window_mask`
(the convention ``i - W < j <= i``). Cases run smallest first, so the first
failure is a mask small enough to print whole, side by side with the expected one;
then sequences of 16 to 24 tokens, and of 65 to 200 (past any fixed-size table, and past the 127 an
int8 index can count to). The bug is
named from the usual wrong masks (judged at ``seq_len=10, window_size=5`` first),
from a band that depends on the column or the row alone, and otherwise by the
first query row that differs.
"""

from __future__ import annotations

import torch

from swkv_teach.grading._own import refuse_library
from swkv_teach.grading._report import call, fail, grid, passed, show
from swkv_teach.masks import sliding_window_mask


LONG = (16, 20, 23, 24)
LONGER = (65, 129, 200)  # a table precomputed at 64 (or any size up to 200) is sliced too small; int8 indices wrap


def _cases():
    seen = set()
    for T in (*range(1, 10), *LONG, *LONGER):
        windows = (1, 2, 3, 5, 8, T - 1, T, T + 1) + ((7, 12, T // 2) if T in LONG else ())
        if T in LONGER:
            windows = (1, 5, 64, T - 1, T + 1)
        for W in windows:
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
        ((j <= i + 1) & (j > i - W + 1),
         "the band is shifted by one onto a future key: query i sees key i + 1 (which it must not) and loses "
         "key i - W + 1. Keep j <= i and j > i - W."),
        ((j < i) & (j >= i - W),
         "the band is shifted by one into the past: query i does not see itself (j = i) and sees key i - W, "
         "one too old. Keep j <= i and j > i - W."),
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
    # On a tiny case several wrong masks coincide (at T = 1 both shifted bands are all False): name one only
    # when it is the only one that fits.
    fits = [hint for candidate, hint in tests if torch.equal(got, candidate) and not torch.equal(candidate, right)]
    if len(fits) == 1:
        return fits[0]
    if fits:
        return None
    cols, rows = got.any(dim=0), got.any(dim=1)
    if torch.equal(got, causal & cols[None, :]) and not torch.equal(got, right):
        keys = torch.nonzero(cols).flatten().tolist()
        return (f"your window is cut by column only: every query sees the same keys {_span(keys)} (the last W of "
                "the whole sequence), whatever its row. The window slides with the query: key j is visible "
                "from row i when i - W < j <= i.")
    if torch.equal(got, right & rows[:, None]) and not torch.equal(got, right):
        return "some query rows are all False: every query sees at least itself (j = i)."
    return None


def _span(keys: list) -> str:
    return f"{keys[0]}..{keys[-1]}" if keys and keys == list(range(keys[0], keys[-1] + 1)) else str(keys)


def _first_row(got: torch.Tensor, exp: torch.Tensor) -> str:
    """Say what differs when no diagnosis fits: the first query row, keys expected vs got."""
    for i in range(exp.shape[0]):
        if not torch.equal(got[i], exp[i]):
            e = torch.nonzero(exp[i]).flatten().tolist()
            g = torch.nonzero(got[i]).flatten().tolist()
            return (f"row {i} (query {i}) should see keys {_span(e)} and sees {_span(g) if g else 'none'}; "
                    "mask[i, j] is True exactly when i - W < j <= i (rows are queries, columns keys).")
    return "mask[i, j] is True exactly when i - W < j <= i (rows are queries, columns keys)."


def _ignores_window(fn) -> str | None:
    """Two windows asked alternately, fn(12, 3), fn(12, 6), fn(12, 3), fn(12, 6): state kept between calls, or a
    mask that does not change with window_size (built once for the first window and sliced)."""
    try:
        outs = [fn(12, w) for w in (3, 6, 3, 6)]
        if not all(isinstance(o, torch.Tensor) and tuple(o.shape) == (12, 12) for o in outs):
            return None
        outs = [o.detach().cpu().bool() for o in outs]
    except Exception:
        return None
    if not (torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])):
        return ("asked fn(12, 3), fn(12, 6), fn(12, 3), fn(12, 6) in turn, your function gave different masks for "
                "the same arguments: it keeps state between calls. Build the mask from seq_len and window_size "
                "alone, at every call.")
    if torch.equal(outs[0], outs[1]) and not (_candidates(outs[0], 12, 3) or _candidates(outs[1], 12, 6)):
        sees = int(outs[0][-1].sum())
        return (f"window_size is ignored: fn(12, 3) and fn(12, 6) returned the same mask (the last query sees {sees} "
                "keys in both). A mask built once, for the first window_size seen, then sliced (a module-level "
                "variable, or a cache keyed on seq_len only)? Or a hard-coded window? Use window_size at every "
                "call.")
    return None


def _mask_hint(fn, got: torch.Tensor, T: int, W: int) -> str:
    """The bug's name, judged on a larger case first (W=5: a hard-coded 3 is not an off-by-one there),
    then on the failing case; the hint says which case it was judged on, so its numbers make sense.
    First of all: does the mask change with window_size at all, and only with the arguments?"""
    stale = _ignores_window(fn)
    if stale:
        return stale
    try:
        big = fn(10, 5)
        if isinstance(big, torch.Tensor) and big.dtype == torch.bool and tuple(big.shape) == (10, 10):
            hint = _candidates(big.cpu(), 10, 5)
            if hint:
                return f"{hint} (seen with seq_len=10, window_size=5)"
    except Exception:
        pass
    return _candidates(got, T, W) or _first_row(got, sliding_window_mask(T, W))


def check_sliding_window_mask(fn) -> None:
    """Exercise 01: compare ``fn(seq_len, window_size)`` with the library's mask for every small case."""
    refuse_library("check_sliding_window_mask", fn, sliding_window_mask, "sliding_window_mask")
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
            rows = []
            if T <= 12:
                left, right = grid(exp, "expected"), grid(got, "got")
                width = max(len(r) for r in left) + 4
                rows = ["rows are queries i, columns keys j, 1 = may attend:"]
                rows += [a.ljust(width) + b for a, b in zip(left, right)]
            else:
                rows = [f"({T} x {T}: too big to print; every smaller case passed)"]
            raise fail(case, *rows, hint=_mask_hint(fn, got, T, W))
        n += 1
    passed(f"{name} matches the window convention i - W < j <= i on all {n} cases "
           f"(seq_len 1..9, {', '.join(map(str, LONG + LONGER))}; windows 1, 2, 3, 5, 8, T - 1, T, T + 1 and more).")


__all__ = ["check_sliding_window_mask"]
