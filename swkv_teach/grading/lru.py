"""Check for exercise 04: the second seed's LRU cache, ``put(token_id, key, value)`` / ``get(token_id)``.

Every operation is mirrored on the library's :class:`~swkv_teach.caches.LRUKVCache`
(the oracle) and every ``get`` must return what the oracle's returns. Short
scripted scenarios come first, each aimed at one classic bug with its own hint
(no eviction, ``get`` not promoting, re-``put`` not promoting); then random
sequences for sizes 1, 2, 3, 5; then ``ValueError`` for ``max_size <= 0`` and
two independent instances. A plain ``dict`` (insertion-ordered) is as welcome
as an ``OrderedDict``.
"""

from __future__ import annotations

import random

from swkv_teach.caches import LRUKVCache
from swkv_teach.grading._report import call, fail, passed, show, learner_name as _name


class _Script:
    """The learner's cache and the oracle, driven together; remembers the operations for the message."""

    def __init__(self, cls, max_size: int, title: str):
        self.title = f"{title}: {_name(cls)}(max_size={max_size})"
        self.ops = [f"cache = {_name(cls)}({max_size})"]
        self.mine = call(self.title, f"{_name(cls)}({max_size})", cls, max_size)
        for m in ("put", "get"):
            if not callable(getattr(self.mine, m, None)):
                raise fail(self.title, f"{_name(cls)}({max_size}) gave a {type(self.mine).__name__} with no {m}() method.",
                           hint="pass the class itself to the check, with put(token_id, key, value) and get(token_id).")
        self.oracle = LRUKVCache(max_size)
        self.version: dict = {}

    def _case(self) -> str:
        ops = self.ops if len(self.ops) <= 14 else self.ops[:1] + ["..."] + self.ops[-12:]
        return self.title + "\n   " + "; ".join(ops)

    def put(self, token_id, fresh: bool = False) -> None:
        n = self.version.get(token_id, 0) + (1 if fresh else 0)
        self.version[token_id] = n
        key, value = f"k{token_id}" + "'" * n, f"v{token_id}" + "'" * n
        self.ops.append(f"put({token_id}, {key!r}, {value!r})")
        call(self._case(), f"put({token_id}, ...)", self.mine.put, token_id, key, value)
        self.oracle.put(token_id, key, value)

    def get(self, token_id, hint_hit: str | None = None, hint_miss: str | None = None, hint: str | None = None):
        self.ops.append(f"get({token_id})")
        case = self._case()
        got = call(case, f"get({token_id})", self.mine.get, token_id)
        exp = self.oracle.get(token_id)
        norm = tuple(got) if isinstance(got, (tuple, list)) and len(got) == 2 else got
        if norm == exp:
            return
        if exp is not None and not (isinstance(got, (tuple, list)) and len(got) == 2) and got is not None:
            raise fail(case, f"get({token_id}) returned {show(got)}; expected the pair (key, value).",
                       hint="return the stored (key, value) tuple for a hit, None for a miss.")
        if exp is None and not (isinstance(got, (tuple, list)) and len(got) == 2):
            h = (f"a miss must return None, not {show(got)} (no -1 or (None, None) sentinel as in some "
                 "LeetCode versions): callers test `if cache.get(i) is None`.")
        elif exp is None and token_id not in self.version:
            h = ("this cache was never given this id, yet it returned a value: state is shared between instances. "
                 "Create the dict in __init__ (self.cache = ...), not at class level.")
        elif exp is None:
            h = hint_hit or hint or "this id should have been evicted as the least recently used."
        elif got is None:
            h = hint_miss or hint or "this id should still be cached: something else was least recently used."
        else:
            h = hint or "a re-put must replace the stored key and value."
        raise fail(case, f"the last call, get({token_id}):", expected=exp if exp is not None else "None (a miss)",
                   got=got if got is not None else "None (a miss)", hint=h)


def _raises_for(cls, bad: int) -> None:
    case = f"{_name(cls)}(max_size={bad})"
    try:
        cls(bad)
    except ValueError:
        return
    except NotImplementedError:
        raise fail(case, "__init__ is not implemented yet (it raised NotImplementedError).") from None
    except Exception as e:
        raise fail(case, f"raised {type(e).__name__}: {e}; expected ValueError.",
                   hint="a size that is not positive is a bad value: raise ValueError (and say what you got).") from None
    raise fail(case, "did not raise; a cache that can hold nothing (or less) is a mistake worth reporting.",
               hint="in __init__: if max_size <= 0: raise ValueError(f'max_size must be positive; got {max_size}')")


def check_lru_cache(cls) -> None:
    """Exercise 04: ``cls(max_size)`` with ``put``/``get``, ``get`` promoting, ``ValueError`` for ``max_size <= 0``."""
    a = _Script(cls, 2, "two instances side by side")
    b = _Script(cls, 2, "two instances side by side (the second)")
    a.put(0)
    a.put(1)
    b.get(0)

    s = _Script(cls, 3, "eviction")
    for i in range(4):
        s.put(i)
    s.get(3, hint_miss="the wrong entry was evicted: the id just put is the most recently used; evict the least "
          "recently used (the front: popitem(last=False)), not the newest.")
    s.get(0, hint_hit="nothing was evicted: after a put makes the cache hold more than max_size, remove the least "
          "recently used entry (the first in insertion order: popitem(last=False) or next(iter(d))).")
    for i in (1, 2):
        s.get(i, hint_miss="the wrong entry was evicted: evict the least recently used (the front), not the newest.")

    s = _Script(cls, 1, "the smallest cache")
    s.put(0)
    s.put(1)
    s.get(0, hint_hit="a cache of size 1 holds one entry: evict once len > max_size.")
    s.get(1, hint_miss="the entry just put was evicted: evict the least recently used, not the newest.")

    s = _Script(cls, 3, "get promotes")
    for i in range(3):
        s.put(i)
    s.get(0)
    s.put(3)
    s.get(1, hint_hit="get(0) made 0 the most recently used, so put(3) must evict 1: get must promote the entry "
          "it returns (move_to_end, or pop and re-insert in a plain dict).")
    s.get(0, hint_miss="get(0) made 0 the most recently used, so it must survive put(3): promote on get.")

    s = _Script(cls, 3, "re-put refreshes")
    for i in range(3):
        s.put(i)
    s.put(0, fresh=True)
    s.put(3)
    s.get(1, hint_hit="put(0) again made 0 the most recently used, so put(3) must evict 1: a re-put must promote "
          "too (in a plain dict, assigning an existing key keeps its old place: pop it first).")
    s.get(0, hint_miss="put(0) again made 0 the most recently used, so it must survive put(3).",
          hint="a re-put must store the new key and value.")

    rng = random.Random(0)
    for size in (1, 2, 3, 5):
        s = _Script(cls, size, f"random operations #{size}")
        for _ in range(40):
            i = rng.randrange(size + 3)
            if rng.random() < 0.55:
                s.put(i, fresh=i in s.version)
            else:
                s.get(i)


    _raises_for(cls, 0)
    _raises_for(cls, -1)
    passed(f"{_name(cls)} evicts the least recently used and promotes on get and put, like the library's "
           "LRUKVCache (sizes 1, 2, 3, 5; 4 scenarios and 160 random operations; ValueError for max_size <= 0).")


__all__ = ["check_lru_cache"]
