"""Which Triton and NumPy the kernels run under: what cannot work is refused by name, before any kernel runs.

Triton before 3.8 turns one-element arrays into Python scalars in its interpreter, which NumPy refuses from
2.4 (measured: torch 2.11's Triton 3.6.0 under NumPy 2.4.1 fails every kernel test with "only 0-dimensional
arrays can be converted to Python scalars", and passes them under NumPy 2.1.3, Colab's).
"""

from __future__ import annotations

import pytest
import torch

from swkv_teach import kernels

pytestmark = pytest.mark.skipif(not kernels.available() or not kernels.interpreted(),
                                reason="needs Triton, run in its interpreter (no GPU)")


@pytest.fixture
def versions(monkeypatch):
    import numpy
    import triton

    def use(triton_version: str, numpy_version: str):
        monkeypatch.setattr(triton, "__version__", triton_version)
        monkeypatch.setattr(numpy, "__version__", numpy_version)
    return use


@pytest.mark.parametrize("triton_v, numpy_v, refused", [
    ("3.6.0", "2.4.1", True), ("3.7.1", "2.4.0", True), ("3.6.0", "2.1.3", False), ("3.6.0", "2.3.5", False),
    ("3.8.0", "2.4.6", False), ("3.9.0", "2.5.0", False), ("3.10.0", "2.4.0", False), ("3.6.0+git1a2b", "2.4.0rc1", True),
])
def test_old_triton_under_new_numpy_is_named(versions, triton_v, numpy_v, refused):
    versions(triton_v, numpy_v)
    problem = kernels.interpreter_problem()
    if refused:
        assert problem and f"Triton {triton_v}" in problem and f"NumPy {numpy_v}" in problem, problem
        assert "numpy<2.4" in problem, "it says what to do"
    else:
        assert problem is None, problem


def test_paged_decode_refuses_before_running_anything(versions):
    versions("3.6.0", "2.4.1")
    q = torch.randn(1, 2, 8)
    pool = torch.randn(2, 4, 1, 8)
    with pytest.raises(RuntimeError, match=r"Triton 3\.6\.0's interpreter fails under NumPy 2\.4\.1"):
        kernels.paged_decode(q, pool, pool, torch.tensor([3]), torch.tensor([[0]]), window_size=4)


def test_require_triton_returns_the_version_that_runs():
    import triton

    assert kernels.require_triton() == triton.__version__


def test_require_triton_refuses_what_cannot_run(versions):
    versions("3.6.0", "2.4.1")
    with pytest.raises(RuntimeError, match="numpy<2.4"):
        kernels.require_triton()


def test_without_triton_colab_installs_it_and_elsewhere_says_how(monkeypatch):
    """Colab's CPU runtime has no Triton: there it is pip-installed into the runtime; elsewhere nothing is."""
    import subprocess
    import sys

    calls = []
    monkeypatch.setattr(kernels, "available", lambda: bool(calls))  # missing until "pip" ran
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    with pytest.raises(ModuleNotFoundError, match="needs Triton"):
        kernels.require_triton()
    assert calls == [], "nothing is installed outside Colab"
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    kernels.require_triton()
    assert calls == [[sys.executable, "-m", "pip", "install", "-q", "triton"]]


def test_exercise_12s_check_blames_the_machine_not_the_answer(versions):
    from swkv_teach.grading import ExerciseFailed, check_paged_decode_kernel
    from swkv_teach.kernels.decode import attend_block, merge

    versions("3.6.0", "2.4.1")
    with pytest.raises(ExerciseFailed, match="cannot run here, whatever the answer") as failed:
        check_paged_decode_kernel(attend_block, merge)
    assert "numpy<2.4" in str(failed.value)
