"""Exercises 08 (paged window) and 09 (int8 quantisation): right answers written differently pass, and the
catalogue's wrong answers (tests/wrong_answers/paged.py, int8.py) are each rejected naming their bug
(that part runs in tests/test_grading.py with the whole catalogue; here, its size and a few specifics)."""

from __future__ import annotations

import functools
from collections import deque

import pytest
import torch

import swkv_teach
from swkv_teach.caches.int8 import dequantize_int8, quantize_int8
from swkv_teach.grading import ExerciseFailed
from swkv_teach.grading.int8 import check_int8_quantize
from swkv_teach.grading.paged import check_paged_window
from tests.wrong_answers import load
from tests.wrong_answers.int8 import deq, right_quantize
from tests.wrong_answers.paged import PagedBase

CATALOGUE = load()


def passes(check, *answer, capsys):
    check(*answer)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


def test_each_catalogue_is_large():
    per = {}
    for w in CATALOGUE:
        per[w.check] = per.get(w.check, 0) + 1
    assert per["check_paged_window"] >= 19 and per["check_int8_quantize"] >= 22, per


# ------------------------------------------------------------------ exercise 08, right answers
class DictOfLogicalBlocks:
    """Recomputes the logical blocks the window needs every step; a dict maps logical -> pool block."""

    def __init__(self, pool, window_size):
        self.pool, self.W, self.n, self.blocks = pool, window_size, 0, {}

    def append(self):
        bs = self.pool.block_size
        self.n += 1
        need = range(max(0, self.n - self.W) // bs, (self.n - 1) // bs + 1)
        for logical in [b for b in self.blocks if b not in need]:
            self.pool.give(self.blocks.pop(logical))
        if need[-1] not in self.blocks:
            self.blocks[need[-1]] = self.pool.take()
        return self.blocks[need[-1]], (self.n - 1) % bs

    @property
    def block_table(self):
        return [self.blocks[b] for b in sorted(self.blocks)]

    @property
    def positions(self):
        return torch.arange(max(0, self.n - self.W), self.n)  # a tensor is fine too

    def reset(self):
        for b in list(self.blocks.values()):
            self.pool.give(b)
        self.blocks, self.n = {}, 0


class DequeTupleTable(PagedBase):
    """A deque popped from the left, block_table handed out as a tuple (immutable: no copy needed)."""

    def __init__(self, pool, window_size):
        super().__init__(pool, window_size)
        self.table = deque()

    @property
    def block_table(self):
        return tuple(self.table)

    def free_old(self):
        while self.table and self.first < self.first_needed():
            self.pool.give(self.table.popleft())
            self.first += 1

    def reset(self):
        while self.table:
            self.pool.give(self.table.pop())  # newest first: the order blocks go back in is free
        self.seen = self.first = 0


@pytest.mark.parametrize("answer", [PagedBase, DictOfLogicalBlocks, DequeTupleTable])
def test_paged_window_accepts_right_answers(answer, capsys):
    passes(check_paged_window, answer, capsys=capsys)


@pytest.mark.parametrize("answer", [swkv_teach.PagedKVCache, type("Sub", (swkv_teach.PagedKVCache,), {})],
                         ids=["itself", "subclass"])
def test_paged_window_refuses_the_librarys_own_cache(answer):
    with pytest.raises(ExerciseFailed, match="library's own PagedKVCache"):
        check_paged_window(answer)


def test_paged_window_reads_the_table_again_after_changing_what_it_got():
    """A caller may change the list block_table returned: a fresh list each read passes, the instance's own fails."""
    from tests.wrong_answers.paged import HandsOutItsOwnTable

    with pytest.raises(ExerciseFailed, match="your own list") as info:
        check_paged_window(HandsOutItsOwnTable)
    assert "after 1 token" in str(info.value), "caught at the first step"


def test_paged_window_failure_shows_the_case_and_the_block_counts():
    from tests.wrong_answers.paged import FreedOneTokenLate

    with pytest.raises(ExerciseFailed) as info:
        check_paged_window(FreedOneTokenLate)
    msg = str(info.value)
    assert "window_size=3" in msg and "block_size=2" in msg and "after 5 tokens" in msg
    assert "expected: 2" in msg and "blocks  : 3" in msg and "tokens 0..1" in msg


# ------------------------------------------------------------------ exercise 09, right answers
def quantize_by_reciprocal(x):
    """Multiplies by 127 / absmax in float64, clamps the absmax from below instead of masking zeros (at 1e-300, far
    below any float32 or float16 value, so no row's scale is floored: a clamp at 1e-30 is the eps the statement
    forbids, and fails on the check's 1e-37 rows)."""
    absmax = torch.maximum(x.amax(-1, keepdim=True), -x.amin(-1, keepdim=True)).double()
    q = (x.double() * (127.0 / absmax.clamp_min(1e-300))).round().clamp(-127, 127).to(torch.int8)
    return q, (absmax / 127).float()


def dequantize_with_mul(q, scale, dtype):
    return torch.mul(q.to(torch.float64), scale.to(torch.float64)).to(dtype)


class AsAClass:
    """Both functions as static methods of one class, passed as one object."""

    @staticmethod
    def quantize(x):
        scale = x.detach().float().abs().max(dim=-1, keepdim=True).values / 127
        return torch.where(scale == 0, 0.0, x.float() / scale).round().to(torch.int8), scale

    @staticmethod
    def dequantize(q, scale, dtype):
        return (q * scale).to(dtype)


def quantize_round_half_up(x):
    """floor(x / scale + 0.5) in float64: ties go up instead of to even, every element still within half a step."""
    scale = x.float().abs().amax(dim=-1, keepdim=True) / 127
    q = torch.floor(x.double() / torch.where(scale > 0, scale, 1).double() + 0.5)
    return q.to(torch.int8), scale


def quantize_zero_rows_scale_one(x):
    """All-zero rows get scale 1 (any finite scale is allowed), the rest absmax / 127 via torch.max."""
    absmax = x.detach().float().abs().max(dim=-1, keepdim=True).values
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


def wraps_the_library(x):
    """A function of one's own that calls the library: not the oracle object itself, so it is judged."""
    return quantize_int8(x)


@pytest.mark.parametrize("answer", [(right_quantize, deq), (quantize_by_reciprocal, dequantize_with_mul), (AsAClass,),
                                    (quantize_round_half_up, deq), (quantize_zero_rows_scale_one, deq),
                                    (wraps_the_library, deq)],
                         ids=lambda a: "-".join(f.__name__ for f in a))
def test_int8_accepts_right_answers(answer, capsys):
    passes(check_int8_quantize, *answer, capsys=capsys)


@pytest.mark.parametrize("answer", [(quantize_int8, dequantize_int8), (right_quantize, dequantize_int8),
                                    (functools.partial(quantize_int8), deq)], ids=["both", "dequantize", "partial"])
def test_int8_refuses_the_librarys_own_functions(answer):
    with pytest.raises(ExerciseFailed, match="library's own"):
        check_int8_quantize(*answer)


def test_int8_cases_reach_quiet_tokens_subnormals_and_zeros():
    """A floor on the scale as low as 1e-6 shows (rows down to 1e-8), float16 subnormals are there, and zeros."""
    from swkv_teach.grading.int8 import _cases

    xs = [x for _, x in _cases()]
    absmax = [x.double().abs().amax(-1) for x in xs]
    assert min(float(a[a > 0].min()) for a in absmax if bool((a > 0).any())) < 1e-6 * 127 / 100
    assert any(x.dtype == torch.float16 and bool(((x.abs() < 2.0**-14) & (x != 0)).any()) for x in xs)
    assert any(bool((x == 0).all()) for x in xs) and any(bool((a == 0).any() & (a > 0).any()) for a in absmax)
    assert {x.dtype for x in xs} == {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def test_int8_needs_both_functions():
    with pytest.raises(ExerciseFailed, match="expected two functions"):
        check_int8_quantize(quantize_int8)
