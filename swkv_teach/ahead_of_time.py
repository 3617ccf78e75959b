"""A step compiled ahead of time: ``torch.export``, then AOTInductor, into a shared library, called without Python.

``torch.compile`` pays for every call in Python: dynamo checks its guards (hundreds of them for a model
passed in: every module attribute it read, every tensor's dtype, shape and strides) and the compiled
graph sits under eval-frame and AOT-autograd wrappers. On a CPU, for a step of a few dozen
microseconds, that is a fixed cost of the same order (on the bench's decoder about 25 µs a call,
measured with a trivial graph over the same inputs). AOTInductor compiles the same inductor graph into
a shared library, loaded once and then run by one call (its inputs flattened in Python, the whole step in
C++): no guards, no dynamo wrappers. It is PyTorch's way to
deploy a compiled model (``torch._inductor.aoti_compile_and_package`` and ``aoti_load_package``,
torch 2.13 ``torch/_inductor/__init__.py`` lines 57 and 241; ``load_constants``,
``torch/export/pt2_archive/_package.py`` lines 749-772), and the CPU's nearest thing to what a
CUDA graph does on a GPU: one call runs the whole step.

:class:`AheadOfTime` wraps a function ``fn(module, *inputs)`` so that it is called exactly like the
``torch.compile``-d one it replaces. The price is the one torch.compile's guards exist to avoid: the
library is specialised on the first call's shapes, dtypes and devices, and knows nothing of what
changed since; the caller promises the same kinds of inputs every time (:class:`~swkv_teach.compiled_ring.
CompiledRing` passes only its own tensors).
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from swkv_teach._quiet import import_cpp_extension_quietly

__all__ = ["AheadOfTime"]


class _Bound(nn.Module):
    """``fn`` with its module as a submodule: what ``torch.export`` takes (weights named ``m.<name>``)."""

    def __init__(self, fn: Callable, module: nn.Module):
        super().__init__()
        self.fn, self.m = fn, module

    def forward(self, *inputs):
        return self.fn(self.m, *inputs)


class AheadOfTime:
    """``fn(module, *inputs)`` exported and compiled by AOTInductor on its first call, then run as a library.

    - **Shapes**: the first call's inputs are the export's examples; every later call must pass tensors
      of the same shapes, strides, dtypes and devices. The library itself does not check (it reads
      whatever memory it is given), so this object does, whenever the inputs are not the very tensors
      of the call before (the steady state of a decode loop, which then costs nothing to check; a tensor
      changed in place by ``resize_`` or ``set_`` is not noticed there).
      Inputs are tensors or lists of tensors (flattened as export flattens them).
    - **In-place writes**: a tensor input that ``fn`` writes in place (a ring buffer's ``index_copy_``)
      is written in place by the library too: export records it as a mutated input.
    - **Weights**: the library reads the module's own parameter and buffer tensors, not copies
      (``load_constants(..., user_managed=True)``): weights changed in place (``load_state_dict``,
      an optimiser step) are seen at the next call. A parameter *replaced* by another tensor, or its
      ``.data`` swapped, is not: :meth:`current` says whether the module still holds the memory the
      library reads, and :meth:`reset` drops the library (the next call compiles again). This object
      keeps that memory alive (aliases of the tensors), so a stale library reads old weights, never
      freed memory. It serves the one module it was compiled for; another is refused.
    - **Per call**: no dynamo, no guards; ``AOTICompiledModel.__call__`` still flattens the inputs in
      Python before the library runs (a few microseconds).
    - ``options``: inductor configuration for the compile (``inductor_configs``), e.g. passes to turn on.

    Compiling takes seconds (about 10 to 20 on a 2-core CPU: a C++ build of the whole step); the package
    is written to a temporary folder and removed once loaded.
    """

    def __init__(self, fn: Callable, options: dict | None = None):
        self.fn, self.options = fn, dict(options or {})
        self._runner = None
        self._module: nn.Module | None = None  # the module it was compiled for
        self._weights: dict[str, torch.Tensor] = {}  # per constant name, an alias of the tensor the library reads
        self._kinds: list[tuple] = []  # per flattened input: (shape, strides, dtype, device) it was compiled for
        self._checked: list[torch.Tensor] = []  # the inputs of the last call that passed the check

    def __call__(self, module: nn.Module, *inputs):
        flat = _flatten(inputs)
        if self._runner is not None and module is not self._module:
            raise ValueError(f"module must be the {type(self._module).__name__} this step was compiled for (its "
                             f"weights are the library's); got another {type(module).__name__}: reset() first")
        if self._runner is None:
            self._compile(module, inputs)
            self._kinds, self._checked = [_kind(t) for t in flat], flat
        elif len(flat) != len(self._checked) or any(a is not b for a, b in zip(flat, self._checked)):
            self._check(flat)  # new tensors: the library reads whatever memory it is given, so check them first
        return self._runner(*inputs)

    def _check(self, flat: list) -> None:
        if len(flat) != len(self._kinds):
            raise ValueError(f"inputs must be the {len(self._kinds)} tensors the step was compiled for; "
                             f"got {len(flat)}")
        for i, t in enumerate(flat):
            got = _kind(t) if isinstance(t, torch.Tensor) else type(t).__name__
            if got != self._kinds[i]:
                want = self._kinds[i]
                raise ValueError(f"input {i} (flattened) must be a tensor of shape {want[0]}, strides {want[1]}, "
                                 f"{want[2]} on {want[3]} (what the step was compiled for); got "
                                 + (f"shape {got[0]}, strides {got[1]}, {got[2]} on {got[3]}"
                                    if isinstance(got, tuple) else got))
        self._checked = flat

    @property
    def compiled(self) -> bool:
        return self._runner is not None

    def current(self, module: nn.Module) -> bool:
        """Whether ``module`` is the one compiled for and still holds, under every name, the memory the library
        reads: a parameter replaced, or its ``.data`` swapped (``.double()`` then ``.float()`` does that), is not."""
        if self._runner is None:
            return True
        if module is not self._module:
            return False
        held = _constants(module)
        return all(name in held and _same_memory(held[name], t) for name, t in self._weights.items())

    def reset(self) -> None:
        """Forget the library: the next call exports and compiles again."""
        self._runner, self._module, self._weights, self._kinds, self._checked = None, None, {}, [], []

    def _compile(self, module: nn.Module, inputs: tuple) -> None:
        bound = _Bound(self.fn, module)
        # export traces outside inference mode (its example tensors are ordinary ones) and records no autograd
        if not hasattr(torch._inductor, "aoti_compile_and_package"):
            raise RuntimeError(f"compiling ahead of time needs torch._inductor.aoti_compile_and_package (AOTInductor "
                               f"packaging; torch 2.13 has it), which torch {torch.__version__} lacks")
        import_cpp_extension_quietly()  # inductor's C++ toolchain, without a CUDA build's stray warning
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # torch's own deprecation inside its packaging (a pickled LeafSpec, torch 2.13): nothing a caller can act on
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*", category=FutureWarning)
            program = torch.export.export(bound, tuple(inputs), strict=False)
            with tempfile.TemporaryDirectory(prefix="swkv_aot_") as folder:
                path = torch._inductor.aoti_compile_and_package(
                    program, package_path=str(Path(folder) / "step.pt2"), inductor_configs=self.options)
                runner = torch._inductor.aoti_load_package(path)
        # the module's own tensors as the library's constants, not the copies packed at compile time
        weights = _constants(module)
        missing = [name for name in runner.get_constant_fqns() if name not in weights]
        if missing:
            raise ValueError(f"the exported step reads constants the module does not name: {missing[:5]}")
        wanted = {name: weights[name] for name in runner.get_constant_fqns()}
        try:
            runner.load_constants(wanted, check_full_update=True, user_managed=True)
        except TypeError as e:  # an older AOTICompiledModel.load_constants, without user_managed
            raise RuntimeError(f"compiling ahead of time needs load_constants(..., user_managed=True) (torch 2.13 has "
                               f"it), which torch {torch.__version__} lacks: {e}") from e
        # aliases, not the parameters: they keep the very storage the library reads alive even if the module lets
        # go of it (a replaced parameter, a .data swap), so the worst a stale library can do is read old weights
        self._runner, self._module = runner, module
        self._weights = {name: t.detach() for name, t in wanted.items()}


def _flatten(inputs) -> list:
    """Tensors and lists of tensors, one level deep, as one list (the order export flattens them in)."""
    flat = []
    for x in inputs:
        if isinstance(x, (list, tuple)):
            flat.extend(x)
        else:
            flat.append(x)
    return flat


def _kind(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.device


def _constants(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers under the names the exported ``_Bound`` gives them (``m.<name>``),
    every name of a tied weight included (export may use either)."""
    named = (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False))
    return {f"m.{name}": t for name, t in named}


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.device == b.device)
