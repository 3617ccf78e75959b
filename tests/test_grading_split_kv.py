"""Exercise 12's check beyond the catalogue: the library's own answer is refused, a stub is reported as not
implemented (through Triton's interpreter, which wraps what a kernel raises), and a pass is one line."""

from __future__ import annotations

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
