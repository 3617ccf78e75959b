"""Name state shared between two instances of a learner's class, from evidence only.

Two live instances of a cache must hold nothing in common that either writes to. When
a check suspects sharing, :func:`two_fresh` makes and uses one instance, then a second,
and names an attribute that is one and the same mutable object in both (a list, dict,
set, deque, or a tensor's memory) and that changed in the first while only the second
was made and used (so a constant both merely read is not blamed), and where that object
comes from: a default argument of ``__init__`` (made once, when ``def`` ran), a class
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


def _snapshot(value):
    """What ``value`` holds now, to tell later whether someone else wrote to it."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone())
    if isinstance(value, dict):
        return ("dict", [(k, id(v)) for k, v in value.items()])
    if isinstance(value, (list, tuple, deque)):
        return ("seq", [id(v) if not isinstance(v, torch.Tensor) else ("t", id(v), v.detach().clone()) for v in value])
    if isinstance(value, (set, bytearray)):
        return ("other", value.copy())
    return None


def _changed(before, value) -> bool:
    now = _snapshot(value)
    if before is None or now is None or before[0] != now[0]:
        return before is not None and now is not None
    if before[0] == "tensor":
        return not (before[1].shape == now[1].shape and torch.equal(before[1], now[1]))
    if before[0] == "seq":
        if len(before[1]) != len(now[1]):
            return True
        for x, y in zip(before[1], now[1]):
            if isinstance(x, tuple) and isinstance(y, tuple):
                if x[1] != y[1] or x[2].shape != y[2].shape or not torch.equal(x[2], y[2]):
                    return True
            elif x != y:
                return True
        return False
    return before[1] != now[1]


def _same_object(x, y) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return _storage(x) is not None and _storage(x) == _storage(y)
    if x is y and isinstance(x, _MUTABLE):
        return True
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return any(isinstance(p, torch.Tensor) and isinstance(q, torch.Tensor) and _storage(p) is not None
                   and _storage(p) == _storage(q) for p, q in zip(x, y))
    return False


def shared_between(cls, a, b, written=None) -> str | None:
    """A sentence naming an attribute ``a`` and ``b`` (two instances of ``cls``) share, or None.

    ``written``: the names of ``a``'s attributes that changed while only ``b`` was made and used; when given,
    only those count (a constant both merely read, such as a module-level table, is not shared *state*).
    """
    va, vb = _attrs(a), _attrs(b)
    for name in va:
        if name not in vb or (written is not None and name not in written):
            continue
        x, y = va[name], vb[name]
        if not _same_object(x, y):
            continue
        if isinstance(x, torch.Tensor):
            return (f"Two instances hold the same tensor memory in self.{name}: what one writes, the other "
                    f"reads. {_origin(cls, x)}.")
        if x is y:
            return (f"Two instances hold the very same {type(x).__name__} in self.{name}: what one stores, the "
                    f"other sees. {_origin(cls, x)}.")
        return (f"Two instances hold the same tensor memory in self.{name}: what one writes, the other reads. "
                f"{_origin(cls, x)}.")
    return None


def two_fresh(cls, args: tuple, use) -> str | None:
    """Make an instance ``cls(*args)`` and ``use(it, 0)``, then a second and ``use(it, 1)`` (the index, so the two
    are given different data and a write by the second shows in the first); name an attribute that both
    hold as one mutable object AND that changed in the first while only the second was made and used (None if
    nothing fits, or if the instances cannot be made)."""
    try:
        a = cls(*args)
    except Exception:
        return None
    try:
        use(a, 0)
    except Exception:
        pass  # what they hold is the evidence, not whether the use went well
    before = {name: _snapshot(v) for name, v in _attrs(a).items()}
    try:
        b = cls(*args)
    except Exception:
        return None
    try:
        use(b, 1)
    except Exception:
        pass
    written = {name for name, v in _attrs(a).items() if name in before and _changed(before[name], v)}
    return shared_between(cls, a, b, written)
