"""Refusing the library's own answer handed in as the learner's.

Every notebook imports :mod:`swkv_teach`, so ``SlidingWindowKVCache =
swkv_teach.SlidingWindowKVCache`` (or a subclass, a ``functools.partial``, a
class whose instances are, or hold, one of the library's caches) would pass a
check that compares with that very object. These guards are cheap (identity,
subclass, one level of attributes), not a proof: they catch the shortcut, not
a determined copy. Exercise 14's answers are functions that could call the
library's answer from inside; :func:`calls_to` watches for that while they run.
"""

from __future__ import annotations

import functools
import inspect
import sys
from contextlib import contextmanager

from swkv_teach.grading._report import fail, learner_name

__all__ = ["calls_to", "is_own", "kept_inside", "library_inside", "refuse_library"]


def is_own(answer, own) -> bool:
    """``answer`` is ``own`` itself, a subclass of it, or a ``functools.partial`` / ``functools.wraps`` of it."""
    for _ in range(8):
        if answer is own:
            return True
        if isinstance(answer, type) and isinstance(own, type):
            try:
                return issubclass(answer, own)
            except TypeError:
                return False
        answer = answer.func if isinstance(answer, functools.partial) else getattr(answer, "__wrapped__", None)
        if answer is None:
            return False
    return False


def refuse_library(check: str, answer, own, write: str) -> None:
    """Raise if ``answer`` is the library's ``own`` (itself, a subclass, a partial or wraps of it)."""
    if not is_own(answer, own):
        return
    kind = "class" if isinstance(own, type) else "function"
    raise fail(f"{check}({learner_name(answer)})",
               f"this is the library's own swkv_teach.{own.__name__} (or built on it), the very {kind} the check "
               "compares with: it passes by definition and shows nothing about your code.",
               hint=f"pass the {write} you wrote in the cell above. If you did write one, an import that ran after "
               f"it (from swkv_teach import {own.__name__} ...) replaced it: run your cell again.")


def _library_cache(x) -> bool:
    """One of the library's own caches (a learner's class built on the abstract KVCache is not)."""
    from swkv_teach.caches.base import KVCache

    return isinstance(x, KVCache) and type(x).__module__.startswith("swkv_teach.")


def kept_inside(obj, found) -> tuple[str, object] | None:
    """``(attribute name, value)`` of the first thing ``obj`` keeps, one attribute deep (looking into dicts, lists
    and tuples), for which ``found(value)`` is true; None if there is none or ``obj`` has no ``__dict__``."""
    try:
        items = vars(obj).items()
    except TypeError:
        return None
    for name, value in items:
        inner = list(value.values()) if isinstance(value, dict) else (
            list(value) if isinstance(value, (list, tuple)) else [value])
        for x in inner:
            if found(x):
                return name, x
    return None


def library_inside(obj) -> str | None:
    """Where ``obj`` is, or keeps (one attribute deep), one of the library's caches; None if it does not."""
    if _library_cache(obj):
        return f"your class made a {type(obj).__name__} from swkv_teach.caches"
    kept = kept_inside(obj, _library_cache)
    if kept is None:
        return None
    name, x = kept
    return f"your cache keeps the library's own {type(x).__name__} in self.{name} and hands it the work"


@contextmanager
def calls_to(*functions):
    """Record, while the ``with`` block runs, the names of ``functions`` that were called (by whatever name).

    A learner's function may call the library's answer from inside (``from swkv_teach.speculative import verify
    as v``, a module attribute, a closure): :func:`is_own` sees only what was handed in. A profile hook sees every
    Python call; a call is recorded when its code object is one of ``functions``'. The previous hook (a profiler,
    a debugger) is put back afterwards, even on error.
    """
    # a decorated function (torch.no_grad()) runs the decorator's wrapper first, whose code every function
    # decorated alike shares: watch the function underneath
    codes = {inspect.unwrap(f).__code__: f.__name__ for f in functions}
    hits: list = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            hits.append(codes[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield hits
    finally:
        sys.setprofile(previous)
