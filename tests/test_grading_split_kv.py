"""Exercise 12's check beyond the catalogue: the library's own answer is refused, a stub is reported as not
implemented (through Triton's interpreter, which wraps what a kernel raises), and a pass is one line."""

from __future__ import annotations

import re

import pytest

from swkv_teach.grading import ExerciseFailed, check_paged_decode_kernel
from swkv_teach.kernels import available

if not available():
    pytest.skip("exercise 12 needs Triton", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from swkv_teach.kernels import decode as kd  # noqa: E402
from tests.right_answers.split_kv import WhereMaskedLoads  # noqa: E402


@triton.jit
def stub_attend(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot, stride_head,
                GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                BLOCK_D: tl.constexpr):
    raise NotImplementedError("exercise 12: replace these two lines with your code")


def test_the_librarys_own_functions_are_refused():
    for attend, merge, name in ((kd.attend_block, WhereMaskedLoads.merge, "attend_block"),
                                (WhereMaskedLoads.attend_block, kd.merge, "merge")):
        with pytest.raises(ExerciseFailed, match=f"library's own swkv_teach.kernels.decode.{name}"):
            check_paged_decode_kernel(attend, merge)


def test_a_stub_is_reported_as_not_implemented_not_as_an_interpreter_error():
    with pytest.raises(ExerciseFailed, match="not implemented yet"):
        check_paged_decode_kernel(stub_attend, WhereMaskedLoads.merge)


def test_a_plain_python_function_is_told_to_use_triton_jit():
    with pytest.raises(ExerciseFailed, match="not a @triton.jit function"):
        check_paged_decode_kernel(lambda *a: a, WhereMaskedLoads.merge)


def test_the_two_functions_may_come_separately_or_on_one_object(capsys):
    check_paged_decode_kernel(WhereMaskedLoads.attend_block, WhereMaskedLoads.merge)
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("✅"), out


@triton.jit
def scalar_and_vector_mask(q, m_i, l_i, acc, K, V, block_id, start, head, lo, hi, stride_block, stride_slot,
                           stride_head, GROUP: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                           HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    d = tl.arange(0, BLOCK_D)
    base = block_id.to(tl.int64) * stride_block + (head // GROUP) * stride_head
    for i in tl.static_range(BLOCK_SIZE):
        inside = (start + i >= lo) & (start + i < hi)
        mask = (d < HEAD_DIM) & inside  # vector_bool & scalar_bool: int32 in the interpreter
        k = tl.load(K + base + i * stride_slot + d, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + base + i * stride_slot + d, mask=mask, other=0.0).to(tl.float32)
        s = tl.where(inside, tl.sum(q * k, 0), float("-inf"))
        m_new = tl.maximum(m_i, s)
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - safe)
        p = tl.exp(s - safe)
        l_i, acc, m_i = l_i * alpha + p, acc * alpha + p * v, m_new
    return m_i, l_i, acc


def test_a_slot_by_slot_mask_the_interpreter_makes_int32_is_explained():
    """A slot-by-slot answer whose lane mask is `vector_bool & scalar_bool`: Triton 3.9's interpreter makes it int32
    and tl.load refuses it ("mask has unsupported dtype"); the check says what happened and how to build the mask.
    Triton 3.8's interpreter (torch 2.14's pin) keeps the mask boolean: there the answer is right and must pass."""
    from swkv_teach.kernels import interpreted

    if not interpreted():
        pytest.skip("only Triton's CPU interpreter turns vector_bool & scalar_bool into int32")
    try:
        check_paged_decode_kernel(scalar_and_vector_mask, WhereMaskedLoads.merge)
    except ExerciseFailed as refused:
        assert re.search(r"(?s)unsupported dtype.*int32.*tl\.where\(inside, offs_d < HEAD_DIM", str(refused)), refused


def test_the_step_probe_agrees_with_the_librarys_attend_block_on_every_scenario():
    """The float64 fold the step probe compares with, and its pools that are views, match the kernel library's own
    attend_block block by block (the check refuses that function as an answer, so this is the only place it runs)."""
    import torch

    from swkv_teach.grading._split_kv_steps import check_steps, scenarios

    assert {case.layout for case in scenarios()} == {None, "fused", "heads first", "padded"}
    for case in scenarios():
        k, _ = case.pools()
        assert case.layout is None or k.stride() != case.k.stride(), case.layout  # a view, not a copy
    check_steps(kd.attend_block, torch.device("cpu"))
