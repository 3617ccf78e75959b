"""Name state shared between two instances of a learner's class, from evidence only.

Two live instances of a cache must hold nothing in common that either writes to. When
a check suspects sharing, :func:`shared_between` looks at two fresh instances (after
each was used) and names an attribute that is one and the same mutable object in
both (a list, dict, set, deque, or a tensor's memory), and where that object comes
from: a default argument of ``__init__`` (made once, when ``def`` ran), a class
attribute, or elsewhere (a module-level variable or a memo such as
``functools.lru_cache`` keyed on fewer arguments than make an instance). Nothing is
named when no such attribute is found: the caller then says plainly what differs.
"""

from __future__ import annotations

from collections import deque

import torch

__all__ = ["shared_between", "two_fresh"]

_MUTABLE = (list, dict, set, deque, bytearray)


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except Exception:
        return None


def _attrs(obj) -> dict:
    try:
        return dict(vars(obj))
    except TypeError:
        return {}


def _origin(cls, value) -> str:
    """Where the shared object comes from, as a sentence fragment."""
    init = getattr(cls, "__init__", None)
    fn = getattr(init, "__func__", init)
    defaults = list(getattr(fn, "__defaults__", None) or ()) + list((getattr(fn, "__kwdefaults__", None) or {}).values())
    for d in defaults:
        if d is value:
            code = getattr(fn, "__code__", None)
            names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount] if code else ()
            pos = dict(zip(names[len(names) - len(fn.__defaults__ or ()) - code.co_kwonlyargcount:], fn.__defaults__ or ())) \
                if code else {}
            arg = next((a for a, dv in {**pos, **(fn.__kwdefaults__ or {})}.items() if dv is value), "?")
            return (f"It is the default value of __init__'s argument `{arg}` (a mutable default argument): a default "
                    "is made once, when `def` runs, and every call that omits the argument gets that same object. "
                    f"Write {arg}=None and create a new one inside __init__")
    for klass in getattr(cls, "__mro__", ()):
        for name, v in vars(klass).items():
            if v is value:
                return (f"It is the class attribute {klass.__name__}.{name}, one object for every instance. "
                        "Create it in __init__ (self.x = ...)")
    return ("It comes from outside the instance (a module-level variable, or a memo such as functools.lru_cache or "
            "a dict keyed on fewer things than make an instance). Create each instance's own state in __init__ "
            "or on its first update")


def shared_between(cls, a, b) -> str | None:
    """A sentence naming an attribute ``a`` and ``b`` (two instances of ``cls``) share, or None."""
    va, vb = _attrs(a), _attrs(b)
    for name in va:
        if name not in vb:
            continue
        x, y = va[name], vb[name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if _storage(x) is not None and _storage(x) == _storage(y):
                return (f"Two instances hold the same tensor memory in self.{name}: what one writes, the other "
                        f"reads. {_origin(cls, x)}.")
        elif x is y and isinstance(x, _MUTABLE):
            return (f"Two instances hold the very same {type(x).__name__} in self.{name}: what one stores, the "
                    f"other sees. {_origin(cls, x)}.")
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            for i, (p, q) in enumerate(zip(x, y)):
                if isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor) and _storage(p) is not None \
                        and _storage(p) == _storage(q):
                    return (f"Two instances hold the same tensor memory in self.{name}[{i}]: what one writes, the "
                            f"other reads. {_origin(cls, x)}.")
    return None


def two_fresh(cls, args: tuple, use) -> str | None:
    """Make two instances ``cls(*args)``, ``use(instance)`` each, and name what they share (None if nothing, or
    if anything raises)."""
    made = []
    for _ in range(2):
        try:
            made.append(cls(*args))
        except Exception:
            return None
        try:
            use(made[-1])
        except Exception:
            pass  # what they hold is the evidence, not whether the use went well
    return shared_between(cls, *made)
