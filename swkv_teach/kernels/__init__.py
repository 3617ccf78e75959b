"""Triton kernels: the one package of swkv_teach that imports ``triton``.

:func:`paged_decode` is the decode step of :func:`swkv_teach.attention.paged_attention`
(one query per sequence) written as a split-KV ("flash-decoding") Triton kernel; lesson 11
builds it up and exercise 12 has you write its inner loop and its combine.

Where it runs. With a CUDA GPU, Triton compiles the kernel for it. Without one, importing this
package sets ``TRITON_INTERPRET=1`` (unless you set it yourself) *before* any kernel is defined,
so Triton runs the same kernel in its interpreter on CPU tensors, program after program, in
NumPy: exact enough to test against the reference, far too slow to time.
:func:`interpreted` says which of the two you get.

Importing :mod:`swkv_teach` never imports Triton; this package imports it only when a kernel is
first called, so without Triton installed the call says how to install it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import torch

from swkv_teach.kernels._mode import interpreted

__all__ = ["INSTALL_HINT", "available", "interpreted", "interpreter_problem", "paged_decode", "require_triton"]

INSTALL_HINT = ("paged_decode needs Triton (Linux): pip install 'swkv-teach[test]', or pip install triton "
                "(Colab's GPU runtime ships it already)")

# Triton decides compiled-or-interpreted when each @triton.jit function is defined (triton 3.9:
# runtime/jit.py, ``jit`` reads ``knobs.runtime.interpret`` in its decorator), its own library
# (tl.sum, tl.zeros, ...) included, so the variable must be set before anything imports triton:
# ``import swkv_teach`` imports this package first thing for that reason.
if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def available() -> bool:
    """True when Triton is installed (the kernels can run)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except ValueError:  # a module set to None in sys.modules (how tests hide an installed package)
        return False


def require_triton() -> str:
    """Make sure Triton can run the kernels here; returns its version, or raises saying what to do.

    Lesson 11 and exercise 12 call it first. On Google Colab's CPU runtime, which ships no Triton, it
    pip-installs one (Colab's GPU runtime has the Triton its torch pins: nothing is installed there);
    elsewhere a missing Triton raises with :data:`INSTALL_HINT`. Then :func:`interpreter_problem` is checked.
    """
    if not available():
        if "google.colab" not in sys.modules:
            raise ModuleNotFoundError(INSTALL_HINT)
        print("Installing Triton into this Colab runtime (its CPU runtime has none) ...")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "triton"], capture_output=True, text=True)
        importlib.invalidate_caches()
        if done.returncode != 0 or not available():
            raise ModuleNotFoundError(f"pip install triton failed here:\n{done.stderr[-1500:]}\n{INSTALL_HINT}")
    import triton

    problem = interpreter_problem()
    if problem:
        raise RuntimeError(problem)
    return triton.__version__


def _version(text: str) -> tuple[int, int]:
    major, minor = (text.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def interpreter_problem() -> str | None:
    """Why Triton's interpreter cannot run the kernels with the Triton and NumPy installed, or None.

    Triton before 3.8 turns one-element arrays into Python scalars in its interpreter (triton 3.6
    ``runtime/interpreter.py`` line 888), which NumPy deprecated in 1.25 and refuses from 2.4
    ("only 0-dimensional arrays can be converted to Python scalars"). torch 2.11's CUDA build, Colab's,
    pins Triton 3.6.0; Colab ships NumPy 2.1.3, where it works (tested: CI's Colab pass).
    """
    if not interpreted() or not available():
        return None
    import numpy
    import triton

    if _version(triton.__version__) < (3, 8) and _version(numpy.__version__) >= (2, 4):
        return (f"Triton {triton.__version__}'s interpreter fails under NumPy {numpy.__version__} (it turns "
                "one-element arrays into Python scalars, which NumPy refuses from 2.4): pip install 'numpy<2.4' "
                "(Colab ships 2.1.3), or use a torch whose Triton is 3.8 or newer")
    return None


def paged_decode(q, k_cache, v_cache, cache_seqlens, block_table, window_size=None, softmax_scale=None,
                 num_splits=None):
    """One decode step of paged sliding-window attention in Triton: see :func:`swkv_teach.kernels.decode.paged_decode`."""
    try:
        import triton.language as tl
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != "triton":
            raise
        raise ModuleNotFoundError(INSTALL_HINT) from None
    if interpreted() and type(tl.standard.sum).__name__ != "InterpretedFunction":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set, so its own functions (tl.sum, "
                           "...) cannot run in the interpreter: import swkv_teach before triton (or torch._inductor), "
                           "or start Python with TRITON_INTERPRET=1 set")
    problem = interpreter_problem()
    if problem:
        raise RuntimeError(problem)
    from swkv_teach.kernels.decode import paged_decode as run

    return run(q, k_cache, v_cache, cache_seqlens, block_table, window_size, softmax_scale, num_splits)
