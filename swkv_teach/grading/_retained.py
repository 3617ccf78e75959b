"""What a learner's object keeps alive, whatever holds it: for the bounded-memory checks.

:func:`retained` walks everything reachable from the object (its attributes, its
``__slots__``, the mutable attributes of its own class, and recursively every list,
tuple, set, dict, deque and plain object found there, a linked list's nodes
included) and sums two things a cache must keep flat once its window is full:

* the bytes of every tensor storage (each counted once, however many views share it),
* the items held in containers (a list of every position ever seen grows too).

A cache may hold any structure it likes; only growth over many steps, or more
tensor bytes than the window needs, is a failure.
"""

from __future__ import annotations

import types
from collections import deque
from dataclasses import dataclass, field

import torch

__all__ = ["Retained", "retained"]

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.Size,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type, property,
           staticmethod, classmethod, range)
_LIMIT = 200_000  # objects visited at most: a walk must stay fast however odd the object


@dataclass
class Retained:
    """Totals for one object: tensor storages (key ``(device, data_ptr)``), float bytes, container items."""

    storages: dict = field(default_factory=dict)  # (device, ptr) -> (nbytes, is_float, path, itemsize)
    items: int = 0
    containers: dict = field(default_factory=dict)  # path -> len, the biggest few kept for messages

    @property
    def float_bytes(self) -> int:
        return sum(n for n, is_float, _, _ in self.storages.values() if is_float)

    @property
    def float_elements(self) -> int:
        """Floating-point numbers held, whatever their precision (a float32 copy of float16 keys is one each)."""
        return sum(n // size for n, is_float, _, size in self.storages.values() if is_float)

    @property
    def all_bytes(self) -> int:
        return sum(n for n, _, _, _ in self.storages.values())


def _own_class_state(obj):
    """Mutable attributes defined on the object's own classes (not torch's, not the standard library's)."""
    for klass in type(obj).__mro__:
        mod = getattr(klass, "__module__", "") or ""
        if klass is object or mod.startswith(("torch", "builtins", "collections", "swkv_teach", "typing", "abc")):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("__") and isinstance(value, (list, dict, set, deque, torch.Tensor)):
                yield f"{klass.__name__}.{name}", value


def retained(obj, name: str = "self") -> Retained:
    """Walk ``obj`` and everything it references (see the module docstring)."""
    out = Retained()
    seen: set = set()
    stack = [(name, obj)]
    stack += list(_own_class_state(obj))
    visited = 0
    while stack and visited < _LIMIT:
        path, x = stack.pop()
        if id(x) in seen or isinstance(x, _LEAVES):
            continue
        seen.add(id(x))
        visited += 1
        try:
            _visit(out, stack, path, x)
        except Exception:  # an odd object must not crash the check: what it holds is simply not counted
            continue
    return out


def _visit(out: Retained, stack: list, path: str, x) -> None:
    """Count ``x`` and push what it references."""
    if type(x).__module__ == "numpy" and hasattr(x, "nbytes"):  # a numpy copy is memory too
        kind = getattr(getattr(x, "dtype", None), "kind", "")
        out.storages[("numpy", id(x))] = (int(x.nbytes), kind in ("f", "c"), path, max(1, int(x.itemsize)))
        return
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            return
        st = x.untyped_storage()
        key = (str(x.device), st.data_ptr())
        if key not in out.storages or out.storages[key][0] < st.nbytes():
            out.storages[key] = (st.nbytes(), x.is_floating_point() or x.is_complex(), path, x.element_size())
        return
    if isinstance(x, dict):
        out.items += len(x)
        out.containers[path] = len(x)
        for k, v in list(x.items()):
            stack.append((f"{path}[{k!r}]" if isinstance(k, (int, str)) else f"{path}[...]", v))
            if not isinstance(k, _LEAVES):
                stack.append((f"{path} (a key)", k))
    elif isinstance(x, (list, tuple, set, frozenset, deque)):
        out.items += len(x)
        out.containers[path] = len(x)
        stack += [(f"{path}[{i}]", v) for i, v in enumerate(list(x))]
    elif isinstance(x, torch.nn.Module):
        return  # a model the object was given is not the object's own memory
    if hasattr(x, "__dict__") and not isinstance(x, type):
        stack += [(f"{path}.{k}", v) for k, v in vars(x).items()]
    for klass in type(x).__mro__:
        for s in getattr(klass, "__slots__", ()):
            if isinstance(s, str) and hasattr(x, s) and s not in ("__dict__", "__weakref__"):
                stack.append((f"{path}.{s}", getattr(x, s)))


def growth(before: Retained, after: Retained) -> str | None:
    """Which container grew the most between two walks, as words (None if none grew)."""
    grew = [(after.containers[p] - before.containers.get(p, 0), p) for p in after.containers
            if after.containers[p] > before.containers.get(p, 0)]
    if not grew:
        return None
    n, path = max(grew)
    return f"{path} grew from {before.containers.get(path, 0)} to {after.containers[path]} items"

